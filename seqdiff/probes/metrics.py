"""Test-set metrics of the probe protocol: a registry from name to `Metric`, so each benchmark declares the
metric it is judged by (its headline) and the protocol, the printed table and the report show that one.

Why more than accuracy: the Nucleotide Transformer tasks are judged by the Matthews correlation coefficient
(most tasks) or F1 (promoters, splice acceptors / donors), which do not reward predicting the majority class
on an unbalanced task. Every row records top-1 accuracy as well, whatever the headline.

Model selection (C, k, the fine-tuning epoch, the frozen probe's layer) stays on validation accuracy for
every metric; only the test-set score that is reported changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from seqdiff.probes.errors import ProbeError


def _accuracy(labels: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    return float((np.asarray(pred) == np.asarray(labels)).mean())


def _mcc(labels: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """Matthews correlation (Gorodkin's multi-class form for more than two classes); 0 when undefined
    (a constant prediction), as scikit-learn returns."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(labels, pred))


def _f1_macro(labels: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """Unweighted mean of the per-class F1 over every class of the benchmark (a class never predicted and never
    present scores 0, so the mean is always over `n_classes`)."""
    from sklearn.metrics import f1_score

    return float(f1_score(labels, pred, labels=list(range(n_classes)), average="macro", zero_division=0))


@dataclass(frozen=True)
class Metric:
    score: Callable[[np.ndarray, np.ndarray, int], float]
    """(true labels, predicted labels, number of classes) -> score; higher is better."""
    label: str
    """Column title in tables and plots (scores are shown x 100)."""
    lowest: float
    """Smallest possible score (plots start at or above it)."""
    unit: str = "%"
    """Printed after a score x 100 in sentences ("" for MCC, which is not a percentage)."""


METRICS: dict[str, Metric] = {
    "accuracy": Metric(_accuracy, "test accuracy %", 0.0),
    "mcc": Metric(_mcc, "test MCC x100", -1.0, unit=""),
    "f1_macro": Metric(_f1_macro, "test macro F1 %", 0.0),
}
DEFAULT_METRIC = "accuracy"


def get_metric(name: str) -> Metric:
    try:
        return METRICS[name]
    except KeyError:
        raise ProbeError(f"metric {name!r} is unknown; choose one of {sorted(METRICS)}") from None


def score(name: str, labels: np.ndarray, pred: np.ndarray, n_classes: int) -> float:
    """The metric called `name` of predictions `pred` against `labels`."""
    return get_metric(name).score(np.asarray(labels), np.asarray(pred), n_classes)
