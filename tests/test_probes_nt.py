"""Probe metrics (MCC, macro F1 against hand-computed values; the headline metric in tables and reports) and
the Nucleotide Transformer downstream tasks: a tiny fake copy of the dataset repository's layout, the
Hugging Face path with `load_dataset` replaced, label mapping, truncation counting, the bad-input messages,
and `seqdiff probe --benchmark nt/...` end to end."""

from __future__ import annotations

import numpy as np
import pytest

from seqdiff.probes import nucleotide_transformer as nt
from seqdiff.probes.benchmarks import BENCHMARKS, load_benchmark
from seqdiff.probes.data import ProbeError
from seqdiff.probes.metrics import METRICS, score
from tests import test_probes_models as probe_models


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


# ---------------------------------------------------------------------- Nucleotide Transformer tasks
dna_run = probe_models.dna_run  # the fixture: a 2-step MDLM on the chr20 slices (64-base context)
toy_sequences = probe_models.toy_sequences


def write_parquet(path, sequences, labels, task):
    """The repository's Parquet files: columns sequence, name, label, task."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    names = [f"seq{i}" for i in range(len(sequences))]
    pq.write_table(pa.table({"sequence": sequences, "name": names, "label": labels,
                             "task": [task] * len(sequences)}), path)


def write_fna(path, sequences, labels, width=None):
    """The repository's FASTA files: >NAME|LABEL, then the sequence (wrapped at `width` if given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, (seq, label) in enumerate(zip(sequences, labels)):
        lines.append(f">chr1:{100 * i}-{100 * i + len(seq)}|{label}")
        lines += [seq[j:j + width] for j in range(0, len(seq), width)] if width else [seq]
    path.write_text("\n".join(lines) + "\n")


def test_eighteen_tasks_per_collection_with_their_metrics():
    for collection in nt.COLLECTIONS.values():
        assert len(collection.tasks) == 18
        assert all(f"{collection.prefix}/{t}" in BENCHMARKS for t in collection.tasks)
    tasks = nt.ORIGINAL.tasks
    assert {t.metric for t in tasks.values() if t.name.startswith("H")} == {"mcc"}
    assert [t.name for t in tasks.values() if t.metric == "f1_macro"] == [
        "promoter_all", "promoter_no_tata", "promoter_tata", "splice_sites_acceptors", "splice_sites_donors"]
    assert tasks["splice_sites_all"].metric == "accuracy" and tasks["splice_sites_all"].num_classes == 3
    assert tasks["enhancers_types"].num_classes == 3 and tasks["H3K4me3"].seq_len == 500
    assert {t.metric for t in nt.REVISED.tasks.values()} == {"mcc"}


def test_parquet_layout_labels_metric_and_task_column(tmp_path):
    write_parquet(tmp_path / "H3" / "train.parquet", ["ACGT", "GGCC", "AATT"], [1, 0, 1], "H3")
    write_parquet(tmp_path / "H3" / "test.parquet", ["TTGA", "CCAA"], [0, 1], "H3")
    bench = load_benchmark("nt/H3", data_dir=tmp_path)
    assert bench.name == "nt/H3" and bench.classes == ["0", "1"] and bench.metric == "mcc"
    assert bench.train.sequences == ["ACGT", "GGCC", "AATT"] and bench.train.labels.tolist() == [1, 0, 1]
    assert bench.test.labels.tolist() == [0, 1] and bench.test_split.startswith("official")
    assert bench.max_len == 500 and bench.source == str(tmp_path / "H3")  # the documented length
    # a file that also holds other tasks' rows (a task column) keeps only this task's
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sequence": ["ACGT", "GGGG", "CCCC"], "label": [1, 0, 0], "task": ["H3", "H4", "H3"]}),
                   tmp_path / "H3" / "train.parquet")
    assert load_benchmark("nt/H3", data_dir=tmp_path).train.sequences == ["ACGT", "CCCC"]


def test_fasta_layout_three_classes_and_task_folder_as_data_dir(tmp_path):
    folder = tmp_path / "splice_sites_all"
    write_fna(folder / "train.fna", ["ACGTACGTAA", "GGCC", "TTTTGGGG"], [2, 0, 1], width=4)  # wrapped lines
    write_fna(folder / "test.fna", ["ACGA", "CCGG", "NNAC"], [0, 1, 2])
    for data_dir in (tmp_path, folder):
        bench = load_benchmark("nt/splice_sites_all", data_dir=data_dir)
        assert bench.classes == ["0", "1", "2"] and bench.metric == "accuracy" and bench.max_len == 400
        assert bench.train.sequences[0] == "ACGTACGTAA" and bench.train.labels.tolist() == [2, 0, 1]
    # Parquet comes first when a folder holds both (the current repository does)
    write_parquet(folder / "train.parquet", ["AAAA", "CCCC", "GGGG"], [0, 1, 2], "splice_sites_all")
    assert load_benchmark("nt/splice_sites_all", data_dir=tmp_path).train.sequences == ["AAAA", "CCCC", "GGGG"]


def test_csv_layout_and_f1_headline(tmp_path):
    folder = tmp_path / "promoter_tata"
    folder.mkdir()
    (folder / "train.csv").write_text("sequence,label\nACGT,0\nTATA,1\n")
    (folder / "test.csv").write_text("sequence,label\nGGCC,0\nTATAAA,1\n")
    bench = load_benchmark("nt/promoter_tata", data_dir=tmp_path)
    assert bench.metric == "f1_macro" and bench.test.labels.tolist() == [0, 1] and bench.max_len == 300


def test_truncation_to_the_context_is_counted(tmp_path):
    from seqdiff.probes.protocol import seed_split

    seqs, labels = toy_sequences(40, 12, seed=0)
    write_parquet(tmp_path / "H4" / "train.parquet", seqs[:30], labels[:30].tolist(), "H4")
    write_parquet(tmp_path / "H4" / "test.parquet", seqs[30:], labels[30:].tolist(), "H4")
    bench = load_benchmark("nt/H4", data_dir=tmp_path)
    split, n_cut = seed_split(bench, 0, context=8)
    assert n_cut == 40 and {len(s) for seqs in split.sequences().values() for s in seqs} == {8}
    assert split.test.sequences[0] == seqs[30][2:10]  # rule "center": start (12 - 8) // 2
    assert seed_split(bench, 0, context=12)[1] == 0


def test_bad_inputs_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(ProbeError, match=r"'nt/H3K4me9': 'H3K4me9' is not one of the 18 tasks .*did you mean "
                                         r"nt/H3K4me\d\?.*choose one of \['H3', 'H3K14ac'"):
        load_benchmark("nt/H3K4me9", data_dir=tmp_path)
    with pytest.raises(ProbeError, match=r"H3 does not exist; --data-dir must be a copy of "
                                         r"InstaDeepAI/nucleotide_transformer_downstream_tasks"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    folder = tmp_path / "H3"
    write_parquet(folder / "train.parquet", ["ACGT", "GGCC"], [0, 1], "H3")
    with pytest.raises(ProbeError, match=r"H3 has no test split: expected test.parquet or test.fna or test.csv"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"sequence": ["ACGT"], "class": [0]}), folder / "test.parquet")
    with pytest.raises(ProbeError, match=r"H3/test.parquet: no column label; found \['class', 'sequence'\]"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    write_parquet(folder / "test.parquet", ["ACGT", "GGCC"], [0, 2], "H3")
    with pytest.raises(ProbeError, match=r"H3/test.parquet: labels \[2\] outside 0..1 \(H3 has 2 classes\)"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    write_parquet(folder / "test.parquet", ["ACGT", "GGCC"], [0, 0], "H3")  # reuses Benchmark.check
    with pytest.raises(ProbeError, match=r"nt/H3 test split has no examples of class\(es\) \['1'\]"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    write_parquet(folder / "test.parquet", ["ACGT", "GG-C"], [0, 1], "H3")
    with pytest.raises(ProbeError, match=r"H3/test.parquet: sequence 2 holds characters outside .*\['-'\]"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    fna = tmp_path / "H4" / "train.fna"
    write_fna(fna, ["ACGT"], [0])
    fna.write_text(">chr1:0-4\nACGT\n")
    with pytest.raises(ProbeError, match=r"H4/train.fna line 1: header '>chr1:0-4' does not end in \|LABEL"):
        load_benchmark("nt/H4", data_dir=tmp_path)
    fna.write_text(">chr1:0-4|x\nACGT\n")
    with pytest.raises(ProbeError, match=r"H4/train.fna line 1: label 'x' of sequence 1 is not an integer"):
        load_benchmark("nt/H4", data_dir=tmp_path)


def test_hf_cache_path_is_offline_and_filters_the_task(monkeypatch):
    import datasets.config

    calls = []

    class Split:
        def __init__(self, **columns):
            self.columns = columns

        def __getitem__(self, key):
            return self.columns

    def cached(dataset_id, name):
        calls.append((dataset_id, name, datasets.config.HF_HUB_OFFLINE))
        return {"train": Split(sequence=["ACGT", "GGCC", "TTTT"], label=[0, 1, 1], task=["H4ac", "H4ac", "H4"]),
                "test": Split(sequence=["AAAA", "CCCC"], label=[1, 0], task=["H4ac", "H4ac"])}

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    bench = nt.load_nt_task("nt/H4ac", load_dataset=cached)
    assert calls == [("InstaDeepAI/nucleotide_transformer_downstream_tasks", "H4ac", True)]  # offline during it
    assert datasets.config.HF_HUB_OFFLINE is False  # and restored after
    assert bench.train.sequences == ["ACGT", "GGCC"] and bench.metric == "mcc" and "local cache" in bench.source

    def not_cached(dataset_id, name):
        raise ConnectionError("Couldn't reach the Hub (offline mode is enabled)")

    with pytest.raises(ProbeError, match=r"nt-revised/H3K9me3: no local copy .* not in the local Hugging Face cache.*"
                                         r"Pass --data-dir ROOT .*ROOT/H3K9me3/\{train,test\}.parquet"):
        nt.load_nt_task("nt-revised/H3K9me3", load_dataset=not_cached)
    task = nt.ORIGINAL.tasks["H4ac"]
    with pytest.raises(ProbeError, match=r"\(H4ac\) train: no column sequence, label; found \[\]"):
        nt.load_from_hf_cache(nt.ORIGINAL, task, lambda *a: {"train": Split(), "test": Split()})
    with pytest.raises(ProbeError, match=r"\(H4ac\) has no 'test' split \(splits: \['train'\]\)"):
        nt.load_from_hf_cache(nt.ORIGINAL, task, lambda *a: {"train": cached(*a)["train"]})


def test_mcc_rows_from_the_protocol(tmp_path):
    """The k-mer row on an MCC task: the headline MCC per seed, recomputed from the predictions by hand."""
    from seqdiff.probes.protocol import ProbeConfig, run_row

    seqs, labels = toy_sequences(60, 24, seed=4)
    write_parquet(tmp_path / "H3" / "train.parquet", seqs[:40], labels[:40].tolist(), "H3")
    write_parquet(tmp_path / "H3" / "test.parquet", seqs[40:], labels[40:].tolist(), "H3")
    bench = load_benchmark("nt/H3", data_dir=tmp_path)
    row = run_row("kmer", None, bench, ProbeConfig(seeds=2), log=lambda line: None)
    assert row["metric"] == "mcc" and len(row["test_mcc"]) == 2 and len(row["test_accuracy"]) == 2
    assert row["test_mcc_min"] <= row["test_mcc_mean"] <= row["test_mcc_max"] <= 1.0
    assert row["test_mcc_mean"] > 0.6  # GC content separates the toy classes


def test_probe_command_on_an_nt_task(dna_run, tmp_path, capsys):
    """`seqdiff probe CKPT --benchmark nt/H3 --data-dir COPY`: the MCC headline in the printed table, the
    Markdown and the plot; accuracy kept in the JSON; the 70-base sequences cut to the model's 64 and counted."""
    import json

    from seqdiff.cli import main

    seqs, labels = toy_sequences(60, 70, seed=5)
    write_fna(tmp_path / "copy" / "H3" / "train.fna", seqs[:40], labels[:40].tolist())
    write_fna(tmp_path / "copy" / "H3" / "test.fna", seqs[40:], labels[40:].tolist())
    out = tmp_path / "reports"
    assert main(["probe", str(dna_run / "mdlm"), "--benchmark", "nt/H3", "--data-dir", str(tmp_path / "copy"),
                 "--seeds", "2", "--skip", "finetune", "cnn", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "test MCC x100 mean [min, max] over seeds" in printed
    report = json.loads((out / "nt_H3.json").read_text())  # the slash of nt/H3 is not a folder
    assert report["benchmark"] == "nt/H3" and report["metric"] == "mcc" and "mcc on the test set" in report["protocol"]
    assert [(r["probe"], r["pretrained"]) for r in report["rows"]] == [("frozen", True), ("frozen", False),
                                                                      ("kmer", None), ("onehot", None)]
    frozen = report["rows"][0]
    assert frozen["context"] == 64 and frozen["truncated_sequences"] == 60
    assert len(frozen["test_mcc"]) == len(frozen["test_accuracy"]) == 2  # accuracy still recorded
    assert report["rows"][2]["test_mcc_mean"] > 0.6 and report["rows"][2]["context"] == 500
    assert any("HyenaDNA" in n for n in report["notes"])  # where the headline metric comes from
    md = (out / "nt_H3.md").read_text()
    assert md.startswith("# Probes on nt/H3") and "| model | probe | seeds | test MCC x100 (mean [min, max])" in md
    assert "frozen probe mcc" in md and "96% target" not in md
    assert (out / "nt_H3.png").stat().st_size > 1000
