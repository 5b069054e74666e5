"""Probe metrics (MCC, macro F1 against hand-computed values; the headline metric in tables and reports) and
the Nucleotide Transformer downstream tasks: a tiny fake copy of the dataset repository's layout, the
Hugging Face path with `load_dataset` replaced, label mapping, truncation counting, the bad-input messages,
and `seqdiff probe --benchmark nt/...` end to end."""

from __future__ import annotations

import numpy as np
import pytest

from seqdiff.probes.data import ProbeError
from seqdiff.probes.metrics import METRICS, score


# --------------------------------------------------------------------------------------------- metrics
def test_binary_mcc_and_macro_f1_by_hand():
    # true 0 0 1 1 1, predicted 0 1 1 1 0: for class 1 TP=2 TN=1 FP=1 FN=1
    y, p = np.array([0, 0, 1, 1, 1]), np.array([0, 1, 1, 1, 0])
    # MCC = (TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (2 - 1) / sqrt(3 * 3 * 2 * 2) = 1/6
    assert score("mcc", y, p, 2) == pytest.approx(1 / 6)
    # F1(class 1) = 2 * (2/3)(2/3) / (4/3) = 2/3; F1(class 0) = 2 * (1/2)(1/2) / 1 = 1/2; macro = 7/12
    assert score("f1_macro", y, p, 2) == pytest.approx(7 / 12)
    assert score("accuracy", y, p, 2) == pytest.approx(3 / 5)


def test_multiclass_mcc_and_macro_f1_by_hand():
    y, p = np.array([0, 1, 2, 0, 1, 2]), np.array([0, 1, 1, 0, 2, 2])
    # Gorodkin: (c s - sum_k p_k t_k) / sqrt((s^2 - sum p_k^2)(s^2 - sum t_k^2)), c = 4 correct, s = 6,
    # p = t = (2, 2, 2): (24 - 12) / sqrt(24 * 24) = 1/2
    assert score("mcc", y, p, 3) == pytest.approx(0.5)
    # F1: class 0 = 1, class 1 = class 2 = 1/2 (precision 1/2, recall 1/2): macro = 2/3
    assert score("f1_macro", y, p, 3) == pytest.approx(2 / 3)
    # a class of the benchmark that is neither true nor predicted counts as 0 in the macro mean
    assert score("f1_macro", y, p, 4) == pytest.approx(2 / 4)


def test_metric_edge_cases_and_unknown_name():
    y = np.array([0, 1, 0, 1])
    assert score("mcc", y, np.zeros(4, dtype=int), 2) == 0.0  # constant prediction: undefined, reported as 0
    assert score("mcc", y, 1 - y, 2) == pytest.approx(-1.0) and METRICS["mcc"].lowest == -1.0
    with pytest.raises(ProbeError, match=r"metric 'auc' is unknown; choose one of \['accuracy', 'f1_macro', 'mcc'\]"):
        score("auc", y, y, 2)


def row(model, probe, pretrained, mean, metric="accuracy"):
    r = {"model": model, "probe": probe, "pretrained": pretrained, "seeds": 2, "selected": [{"C": 1.0}] * 2,
         "test_accuracy_mean": 0.5, "test_accuracy_min": 0.4, "test_accuracy_max": 0.6, "metric": metric}
    r.update({f"test_{metric}_mean": mean, f"test_{metric}_min": mean - 0.01, f"test_{metric}_max": mean + 0.01})
    return r


def test_report_shows_the_headline_metric():
    from seqdiff.probes.report import format_row, goal_lines, table_lines

    rows = [row("mdlm", "frozen", True, 0.30, "mcc"), row("random", "frozen", False, 0.20, "mcc"),
            row("k-mer", "kmer", None, 0.40, "mcc"), row("mdlm", "finetune", True, 0.99, "mcc")]
    assert table_lines(rows)[0].startswith("| model | probe | seeds | test MCC x100 (mean [min, max])")
    assert format_row(rows[0]) == " 30.00  [ 29.00,  31.00]"  # the MCC, not the accuracy (50%)
    goals = goal_lines(rows)
    assert goals[0] == "mdlm frozen probe mcc 30.00 vs random-init frozen probe 20.00: beats it — met"
    assert goals[1].endswith("40.00: beats it — NOT met")
    assert len(goals) == 2  # the 96% fine-tuning target is an accuracy target: not checked on MCC
    # accuracy rows (and rows written before metrics existed) read as before
    old = row("mdlm", "frozen", True, 0.7)
    del old["metric"]
    assert table_lines([old])[0].startswith("| model | probe | seeds | test accuracy % (mean [min, max])")
    assert format_row(old) == " 70.00  [ 69.00,  71.00]"
