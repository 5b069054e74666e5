"""Probe data: splice-junction decoding (fixture slice and the real file), Genomic Benchmarks layout and
its offline paths, user CSV / TSV, truncation, splits, and the bad-input messages."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from seqdiff.probes import genomic_benchmarks as gb
from seqdiff.probes.benchmarks import load_benchmark
from seqdiff.probes.data import (
    Benchmark,
    LabeledSequences,
    ProbeError,
    read_table,
    stratified_split,
    stratified_subsample,
    truncate,
)
from seqdiff.probes.splice import TEST_SEED, decode_bits, default_path, load_splice, read_rda, splice_benchmark

SLICE = "tests/fixtures/splice_junctions_slice.csv"


def read_slice():
    with open(SLICE) as f:
        rows = list(csv.DictReader(f))
    bits = np.array([[int(b) for b in r["bits"]] for r in rows])
    return [int(r["row"]) for r in rows], [r["class"] for r in rows], bits


# ----------------------------------------------------------------------------------------------- splice
def test_decode_bits_closed_form():
    # A=100 C=010 G=001 T=000
    bits = np.array([[1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0], [0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0]])
    assert decode_bits(bits) == ["ACGT", "TGCA"]
    with pytest.raises(ProbeError, match="row 1 holds a base code outside"):
        decode_bits(np.array([[1, 0, 0], [1, 1, 0]]))
    with pytest.raises(ProbeError, match=r"must be \(N, 3 \* L\)"):
        decode_bits(np.zeros((2, 4)))


def test_splice_slice_decodes_to_real_splice_sites():
    """Donor (ei) sites: the intron starts with GT right after the midpoint; acceptor (ie) sites: the
    intron ends with AG right before it. Real data, so a wrong bit order or base code breaks this."""
    _, classes, bits = read_slice()
    seqs = decode_bits(bits)
    assert all(len(s) == 60 and set(s) <= set("ACGT") for s in seqs)
    ei = [s for s, c in zip(seqs, classes) if c == "ei"]
    ie = [s for s, c in zip(seqs, classes) if c == "ie"]
    assert all(s[30:32] == "GT" for s in ei)
    assert all(s[28:30] == "AG" for s in ie)


def needs_splice_file():
    assert default_path().is_file(), f"{default_path()}: requires_source('splice-junctions') did not fetch it"


@pytest.mark.requires_source("splice-junctions")
def test_real_splice_file_matches_slice_and_known_counts():
    needs_splice_file()
    rows, classes, bits = read_slice()
    all_bits, all_classes = read_rda(default_path())
    assert all_bits.shape == (3186, 180)
    assert np.array_equal(all_bits[np.array(rows) - 1], bits)
    assert [all_classes[r - 1] for r in rows] == classes
    bench = splice_benchmark(all_bits, all_classes, "DNA.rda")
    counts = np.bincount(np.concatenate([bench.train.labels, bench.test.labels]))
    assert bench.classes == ["ei", "ie", "n"] and counts.tolist() == [767, 765, 1654]
    # the documented held-out split: stratified, disjoint, and the same on every load
    assert abs(len(bench.test) - 1186) <= 1
    assert str(TEST_SEED) in bench.test_split
    frac = np.bincount(bench.test.labels) / counts
    assert np.allclose(frac, 1186 / 3186, atol=0.01)
    # consensus over the whole set: almost every donor has GT, every acceptor AG at the junction
    ei = [s for s, lab in zip(bench.train.sequences, bench.train.labels) if lab == 0]
    assert np.mean([s[30:32] == "GT" for s in ei]) > 0.98


def test_splice_bad_file(tmp_path):
    with pytest.raises(ProbeError, match="does not exist; fetch it"):
        load_splice(tmp_path / "DNA.rda")
    bad = tmp_path / "DNA.rda"
    bad.write_bytes(b"not R data")
    with pytest.raises(ProbeError, match="cannot be read as R data"):
        load_splice(bad)


# ---------------------------------------------------------------------------------- Genomic Benchmarks
def write_layout(root, name, splits):
    """splits: {split: {class: [seq, ...]}} -> root/name/split/class/i.txt"""
    for split, classes in splits.items():
        for cls, seqs in classes.items():
            folder = root / name / split / cls
            folder.mkdir(parents=True, exist_ok=True)
            for i, s in enumerate(seqs):
                (folder / f"{i}.txt").write_text(s + "\n")


def test_layout_classes_sorted_and_same_order_in_both_splits(tmp_path):
    name = "human_nontata_promoters"
    write_layout(tmp_path, name, {"train": {"positive": ["ACGT", "AAAA"], "negative": ["CCCC"]},
                                  "test": {"negative": ["GGGG"], "positive": ["TTTT"]}})
    bench = load_benchmark(name, data_dir=tmp_path)
    assert bench.classes == ["negative", "positive"]
    assert bench.train.labels.tolist() == [0, 1, 1] and bench.train.sequences[0] == "CCCC"
    assert dict(zip(bench.test.sequences, bench.test.labels.tolist())) == {"GGGG": 0, "TTTT": 1}
    assert bench.max_len == 251  # the recorded maximum, not the toy data's


def test_layout_bad_inputs(tmp_path):
    name = "human_enhancers_cohn"
    write_layout(tmp_path / "a", name, {"train": {"x": ["AC"], "y": ["GT"]}, "test": {"x": ["AC"]}})
    with pytest.raises(ProbeError, match="class folders differ"):
        load_benchmark(name, data_dir=tmp_path / "a")
    write_layout(tmp_path / "b", name, {"train": {"x": ["AC"], "y": ["GT"]}, "test": {"x": ["AC"]}})
    (tmp_path / "b" / name / "test" / "y").mkdir()
    with pytest.raises(ProbeError, match="class 'y' has no test examples"):
        load_benchmark(name, data_dir=tmp_path / "b")
    write_layout(tmp_path / "c", name, {"train": {"x": ["AC"], "y": ["GQ"]}, "test": {"x": ["AC"], "y": ["GT"]}})
    with pytest.raises(ProbeError, match=r"human_enhancers_cohn train: sequence 2 holds characters .*\['Q'\]"):
        load_benchmark(name, data_dir=tmp_path / "c")


def test_eight_datasets_with_max_lengths_and_aliases():
    assert len(gb.DATASETS) == 8
    assert gb.canonical_name("dummy_mouse_enhancers") == "dummy_mouse_enhancers_ensembl"
    assert all(d.max_len >= 200 for d in gb.DATASETS.values())
    with pytest.raises(ProbeError, match="not a Genomic Benchmarks dataset"):
        gb.canonical_name("human_everything")


def test_offline_paths_fail_with_one_clear_message(tmp_path, monkeypatch):
    monkeypatch.setattr(gb, "PACKAGE_CACHE", tmp_path)

    def offline(*args, **kwargs):
        raise ConnectionError("no network")

    # the real loaders, with their network calls replaced: each names what it tried
    with pytest.raises(ProbeError, match="could not download demo_human_or_worm"):
        gb.load_with_package("demo_human_or_worm", download=offline)
    with pytest.raises(ProbeError, match="cannot load katarinagresova/Genomic_Benchmarks_demo_human_or_worm"):
        gb.load_from_hf("demo_human_or_worm", load_dataset=offline)
    package, hf = gb.load_with_package, gb.load_from_hf
    monkeypatch.setattr(gb, "load_with_package", lambda name: package(name, download=offline))
    monkeypatch.setattr(gb, "load_from_hf", lambda name: hf(name, load_dataset=offline))
    with pytest.raises(ProbeError, match=r"no local copy .* pass --data-dir ROOT"):
        load_benchmark("demo_human_or_worm")


def test_hf_mirror_columns_and_package_layout(tmp_path):
    class Split:
        def __init__(self, seqs, labels):
            self.columns = {"seq": seqs, "label": labels}

        def __getitem__(self, key):
            return self.columns

    fake = {"train": Split(["ACGT", "GGCC"], [0, 1]), "test": Split(["TTAA"], [1])}
    bench = gb.load_from_hf("human_ocr_ensembl", load_dataset=lambda dataset_id: fake)
    assert bench.classes == ["0", "1"] and bench.train.labels.tolist() == [0, 1] and bench.max_len == 593
    write_layout(tmp_path, "demo_human_or_worm", {"train": {"human": ["AC"], "worm": ["GT"]},
                                                  "test": {"human": ["AA"], "worm": ["TT"]}})
    bench = gb.load_with_package("demo_human_or_worm",
                                 download=lambda name, version: tmp_path / name)
    assert bench.classes == ["human", "worm"] and len(bench.test) == 2


# ---------------------------------------------------------------------------------------- user tables
def test_user_csv_and_tsv(tmp_path):
    train = tmp_path / "mine.tsv"
    train.write_text("Sequence\tLabel\n" + "".join(f"ACGT{i % 4 * 'A'}\t{'yes' if i % 2 else 'no'}\n"
                                                   for i in range(20)))
    bench = load_benchmark(str(train))
    assert bench.name == "mine" and bench.classes == ["no", "yes"]
    assert len(bench.train) == 16 and len(bench.test) == 4 and "seed" in bench.test_split
    test = tmp_path / "mine_test.csv"
    test.write_text("seq,class\nACGTN,no\nacgtr,yes\n")
    bench = load_benchmark(str(train), test_file=test)
    assert len(bench.train) == 20 and bench.test.labels.tolist() == [0, 1]
    test.write_text("seq,class\nACGT,maybe\n")
    with pytest.raises(ProbeError, match=r"labels \['maybe'\] do not occur in the training classes"):
        load_benchmark(str(train), test_file=test)


def test_user_csv_bad_inputs(tmp_path):
    f = tmp_path / "d.csv"
    f.write_text("dna,label\nACGT,a\n")
    with pytest.raises(ProbeError, match="needs a sequence column"):
        read_table(f)
    f.write_text("seq,label\nACGT,a\nAC-GT,b\n")
    with pytest.raises(ProbeError, match=r"d.csv: sequence 2 holds characters outside .*\['-'\]"):
        read_table(f)
    with pytest.raises(ProbeError, match="does not exist"):
        load_benchmark(str(tmp_path / "missing.csv"))
    with pytest.raises(ProbeError, match="unknown benchmark 'splice2'"):
        load_benchmark("splice2")


# ------------------------------------------------------------------------------ truncation and splits
def test_truncation_rules_and_counts():
    seqs = ["ACGTACGTAC", "ACG"]
    assert truncate(seqs, 4, "center") == (["TACG", "ACG"], 1)  # start (10 - 4) // 2 = 3
    assert truncate(seqs, 4, "left") == (["ACGT", "ACG"], 1)
    assert truncate(seqs, 4, "right") == (["GTAC", "ACG"], 1)
    assert truncate(seqs, 10, "center") == (seqs, 0)
    with pytest.raises(ProbeError, match="truncation rule 'middle' is unknown"):
        truncate(seqs, 4, "middle")


def test_stratified_split_is_disjoint_seeded_and_per_class():
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    kept, held = stratified_split(labels, 0.1, seed=3)
    assert set(kept).isdisjoint(held) and len(kept) + len(held) == 100
    assert np.bincount(labels[held]).tolist() == [5, 3, 2]
    again = stratified_split(labels, 0.1, seed=3)
    assert np.array_equal(again[1], held)
    assert not np.array_equal(stratified_split(labels, 0.1, seed=4)[1], held)


@pytest.mark.parametrize("size", [6, 7, 10, 33, 100])
def test_stratified_subsample_keeps_class_shares_and_is_seeded(size):
    labels = np.array([0] * 50 + [1] * 30 + [2] * 20)
    idx = stratified_subsample(labels, size, seed=3)
    assert len(idx) == size == len(set(idx.tolist())) and np.all(np.diff(idx) > 0)
    counts = np.bincount(labels[idx], minlength=3)
    assert np.all(counts >= 2)  # a 90/10 split then still has every class in train and validation
    assert np.all(np.abs(counts - size * np.array([0.5, 0.3, 0.2])) <= 2)  # proportional, up to the floor of 2
    assert np.array_equal(stratified_subsample(labels, size, seed=3), idx)
    if size < 100:
        assert not np.array_equal(stratified_subsample(labels, size, seed=4), idx)


def test_stratified_subsample_refuses_sizes_it_cannot_draw():
    labels = np.array([0] * 5 + [1] * 5)
    with pytest.raises(ProbeError, match="train_size=3: needs at least 2 examples of each of the 2 classes"):
        stratified_subsample(labels, 3, seed=0)
    with pytest.raises(ProbeError, match="train_size=11: the training set has only 10 sequences"):
        stratified_subsample(labels, 11, seed=0)


def test_seed_split_of_a_small_draw_keeps_the_full_test_set():
    from seqdiff.probes.protocol import seed_split

    seqs = [f"{'ACGT'[i % 4]}{i:03b}".replace("0", "A").replace("1", "C") for i in range(100)]
    labels = np.array([0] * 60 + [1] * 40)
    bench = Benchmark(name="toy", classes=["a", "b"], train=LabeledSequences(seqs, labels),
                      test=LabeledSequences(seqs[:10], labels[:10] * 0 + np.array([0, 1] * 5)), max_len=8)
    split, _ = seed_split(bench, 2, context=8, train_size=20)
    assert len(split.train) + len(split.val) == 20 and len(split.test) == 10
    assert np.bincount(split.val.labels).tolist() == [1, 1]
    again, _ = seed_split(bench, 2, context=8, train_size=20)
    assert again.train.sequences == split.train.sequences
    assert seed_split(bench, 3, context=8, train_size=20)[0].train.sequences != split.train.sequences


def test_class_without_examples_in_a_split_is_refused():
    bench = Benchmark(name="toy", classes=["a", "b"], train=LabeledSequences(["AC", "GT"], [0, 1]),
                      test=LabeledSequences(["AC"], [0]), max_len=2)
    with pytest.raises(ProbeError, match=r"toy test split has no examples of class\(es\) \['b'\]"):
        bench.check()
