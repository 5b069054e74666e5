"""`seqdiff probe` on inputs it cannot use: a user table of one class (or too few rows of each for the splits) is
refused with one line naming the file before any row runs; sequences too short for the CNN baseline leave its row
out with a note (or are refused when the CNN is the only row). No checkpoint is trained: the rows run here are the
k-mer baseline's, so every test takes about a second."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from seqdiff.probes.benchmarks import load_benchmark
from seqdiff.probes.cnn import MIN_INPUT_LEN, too_short
from seqdiff.probes.data import Benchmark, LabeledSequences, ProbeError
from seqdiff.probes.protocol import ProbeConfig, run_protocol


def write_table(path, labels, length=30, seed=0):
    rng = random.Random(seed)
    path.write_text("sequence,label\n" + "".join(f"{''.join(rng.choice('ACGT') for _ in range(length))},{y}\n"
                                                 for y in labels))
    return path


def run_cli(capsys, *args):
    from seqdiff.cli import main

    capsys.readouterr()
    code = main(["probe", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------------ classes
def test_one_class_table_is_refused_naming_the_file(tmp_path, capsys):
    table = write_table(tmp_path / "one.csv", ["x"] * 12)
    with pytest.raises(ProbeError, match=r"one.csv: all 12 rows have label 'x'; a probe needs at least two classes"):
        load_benchmark(str(table))
    other = write_table(tmp_path / "other.csv", ["x", "y"] * 3)
    with pytest.raises(ProbeError, match="all 12 rows have label 'x'"):  # a test file does not rescue it
        load_benchmark(str(table), test_file=other)
    code, _, err = run_cli(capsys, "--benchmark", table, "--seeds", "1", "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"{table}: all 12 rows have label 'x'" in err
    assert not (tmp_path / "out").exists()  # refused before any row ran or any report was written


def test_classes_too_small_for_the_splits_are_refused_naming_the_file(tmp_path):
    single = write_table(tmp_path / "single.csv", ["a"] * 10 + ["b"])
    with pytest.raises(ProbeError, match=r"single.csv: class\(es\) \['b'\] have a single row"):
        load_benchmark(str(single))
    # two rows of each class: one goes to the held-out test split, leaving the validation split empty
    pairs = write_table(tmp_path / "pairs.csv", ["a", "a", "b", "b"])
    with pytest.raises(ProbeError, match=r"pairs.csv: 4 rows, at most 2 of any class; .* at least 3 rows"):
        load_benchmark(str(pairs))
    write_table(pairs, ["a", "a", "a", "b", "b"])
    assert len(load_benchmark(str(pairs)).train) == 3  # 2 a (one of them for validation) + 1 b
    # with a test file: every training class needs its test rows, and the training rows a validation split
    train, test = write_table(tmp_path / "t.csv", ["a", "b"] * 3), write_table(tmp_path / "t_test.csv", ["a"] * 2)
    with pytest.raises(ProbeError, match=r"t_test.csv: no rows of class\(es\) \['b'\]"):
        load_benchmark(str(train), test_file=test)
    write_table(train, ["a", "b"])
    write_table(test, ["a", "b"])
    with pytest.raises(ProbeError, match=r"t.csv: 2 rows, at most 1 of any class; .* at least 2 rows of some"):
        load_benchmark(str(train), test_file=test)


def test_one_class_benchmarks_and_a_train_split_of_one_per_class_are_refused():
    one = Benchmark(name="toy", classes=["a"], train=LabeledSequences(["AC", "GT"], [0, 0]),
                    test=LabeledSequences(["AC"], [0]), max_len=2)
    with pytest.raises(ProbeError, match=r"toy: 1 class\(es\) \['a'\]; a probe needs at least two classes"):
        one.check()
    thin = Benchmark(name="toy", classes=["a", "b"], train=LabeledSequences(["AC", "GT"], [0, 1]),
                     test=LabeledSequences(["AC", "GT"], [0, 1]), max_len=2)
    thin.check()  # a loader's fixture may be this small; the protocol cannot run on it
    lines = []
    with pytest.raises(ProbeError, match="toy: the training split holds one sequence of each class"):
        run_protocol(thin, [], ProbeConfig(seeds=1), probes=(), baselines=("kmer",), log=lines.append)
    assert lines == []


def test_cv_folds_beyond_a_class_are_refused_before_any_row():
    labels = np.array([0] * 10 + [1] * 2)
    bench = Benchmark(name="toy", classes=["a", "b"], train=LabeledSequences(["ACGT"] * 12, labels),
                      test=LabeledSequences(["ACGT"] * 2, [0, 1]), max_len=4)
    lines = []
    with pytest.raises(ProbeError, match="probe.cv_folds=3: .* class 1 has 2"):
        run_protocol(bench, [], ProbeConfig(seeds=1, cv_folds=3), probes=(), baselines=("kmer",), log=lines.append)
    assert lines == []  # no row ran


# ------------------------------------------------------------------------------------- the CNN baseline
def test_cnn_minimum_length_matches_its_layers():
    assert MIN_INPUT_LEN == 57 and too_short(57) is None
    assert "at most 56 bases are too short" in too_short(56)


def test_short_sequences_skip_the_cnn_row_with_a_note(tmp_path, capsys):
    table = write_table(tmp_path / "short.csv", ["a", "b"] * 20, length=MIN_INPUT_LEN - 1)
    out = tmp_path / "out"
    code, printed, err = run_cli(capsys, "--benchmark", table, "--seeds", "1", "--skip", "onehot", "--out", out)
    assert code == 0 and "Traceback" not in err
    assert "CNN baseline row skipped: sequences of at most 56 bases are too short" in err
    report = json.loads((out / "short.json").read_text())
    assert [r["probe"] for r in report["rows"]] == ["kmer"]  # the other rows are all there
    assert len(report["notes"]) == 1 and report["notes"][0].startswith("CNN baseline row skipped")
    assert not any("PARTIAL" in n for n in report["notes"])
    assert "CNN baseline row skipped" in (out / "short.md").read_text()
    assert "cnn " not in printed and "kmer" in printed


def test_short_sequences_with_only_the_cnn_row_are_refused_up_front(tmp_path, capsys):
    table = write_table(tmp_path / "short.csv", ["a", "b"] * 20, length=MIN_INPUT_LEN - 1)
    code, _, err = run_cli(capsys, "--benchmark", table, "--skip", "kmer", "onehot", "--out", tmp_path / "out")
    assert code == 2 and "Traceback" not in err
    assert f"{table}: sequences of at most 56 bases are too short" in err and "the only row asked for" in err
    assert not (tmp_path / "out").exists()


def test_the_cnn_row_reads_sequences_long_enough(tmp_path):
    bench = load_benchmark(str(write_table(tmp_path / "long.csv", ["a", "b"] * 10, length=MIN_INPUT_LEN)))
    config = ProbeConfig(seeds=1)
    config.cnn.epochs = 1
    lines = []
    rows = run_protocol(bench, [], config, probes=(), baselines=("cnn",), log=lines.append)
    assert [r["probe"] for r in rows] == ["cnn"] and bench.notes == []


def test_nothing_to_run_is_refused(tmp_path):
    bench = load_benchmark(str(write_table(tmp_path / "t.csv", ["a", "b"] * 10)))
    with pytest.raises(ProbeError, match="no rows to run"):
        run_protocol(bench, [], ProbeConfig(seeds=1), probes=("frozen", "finetune"), baselines=())


# ------------------------------------------------------------------------------------------ layers
@pytest.mark.parametrize("layer", ["99", "-1", "2"])
def test_a_layer_the_model_lacks_is_refused_before_any_data_is_read(layer, tmp_path, capsys):
    """--layer takes 0 (the token embeddings) to n_layers (the last block's output): beyond that, one line naming
    the checkpoint and the layers it has, not a traceback after the benchmark was loaded."""
    from tests.test_variants import TOK, save_checkpoint  # a 1-layer DNA MDLM checkpoint

    ckpt = save_checkpoint(tmp_path / "dna.ckpt", TOK)
    table = write_table(tmp_path / "t.csv", ["x", "y"] * 12)
    code, _, err = run_cli(capsys, ckpt, "--benchmark", table, "--seeds", "1", "--layer", layer, "--out",
                           tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"probe.layer (--layer)={layer}: {ckpt} has layers 0 (the token embeddings) to 1" in err, err
    assert not (tmp_path / "out").exists()
