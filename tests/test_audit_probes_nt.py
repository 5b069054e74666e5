"""`--benchmark nt/TASK` on malformed copies of the dataset: each refusal names the file that holds the problem."""

from __future__ import annotations

import pytest

from seqdiff.probes.benchmarks import load_benchmark
from seqdiff.probes.data import ProbeError
from tests.test_probes_nt import write_fna, write_parquet


def _table(path, columns):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def test_a_missing_sequence_cell_is_named_not_read_as_the_word_none(tmp_path):
    write_parquet(tmp_path / "H3" / "test.parquet", ["ACGT", "GGCC"], [0, 1], "H3")
    _table(tmp_path / "H3" / "train.parquet", {"sequence": ["ACGT", None, "GGCC"], "label": [0, 1, 1]})
    with pytest.raises(ProbeError, match=r"H3/train.parquet: sequence 2 is missing \(null\)"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    _table(tmp_path / "H3" / "train.parquet", {"sequence": [7, 8], "label": [0, 1]})
    with pytest.raises(ProbeError, match=r"H3/train.parquet: sequence 1 is not text \(int 7\)"):
        load_benchmark("nt/H3", data_dir=tmp_path)


def test_characters_outside_the_alphabet_and_empty_splits_name_the_file(tmp_path):
    write_parquet(tmp_path / "H3" / "test.parquet", ["ACGT", "GGCC"], [0, 1], "H3")
    write_parquet(tmp_path / "H3" / "train.parquet", ["ACGU", "GGCC"], [0, 1], "H3")
    with pytest.raises(ProbeError, match=r"H3/train.parquet: sequence 1 holds characters outside .*\['U'\]"):
        load_benchmark("nt/H3", data_dir=tmp_path)
    write_fna(tmp_path / "H4" / "train.fna", ["ACGT", "AC GT"], [0, 1])
    write_fna(tmp_path / "H4" / "test.fna", ["ACGT", "GGCC"], [0, 1])
    with pytest.raises(ProbeError, match=r"H4/train.fna: sequence 2 holds characters outside .*\[' '\]"):
        load_benchmark("nt/H4", data_dir=tmp_path)
    write_fna(tmp_path / "H4" / "train.fna", ["ACGT", ""], [0, 1])
    with pytest.raises(ProbeError, match=r"H4/train.fna: sequence 2 is empty"):
        load_benchmark("nt/H4", data_dir=tmp_path)
    import pyarrow as pa

    empty = {"sequence": pa.array([], pa.string()), "label": pa.array([], pa.int64())}
    _table(tmp_path / "H3" / "train.parquet", empty)
    with pytest.raises(ProbeError, match=r"H3/train.parquet holds no sequences"):
        load_benchmark("nt/H3", data_dir=tmp_path)


def test_the_offline_message_lists_every_layout_read(tmp_path):
    def not_cached(*args, **kwargs):
        raise FileNotFoundError("not in the cache")

    from seqdiff.probes.nucleotide_transformer import load_nt_task

    with pytest.raises(ProbeError, match=r"--data-dir ROOT .*ROOT/H3/\{train,test\}.parquet, .fna or .csv"):
        load_nt_task("nt/H3", load_dataset=not_cached)


def test_an_out_that_cannot_hold_the_report_is_refused_before_any_row_runs(tmp_path, monkeypatch, capsys):
    import seqdiff.probes.protocol as protocol
    from seqdiff.cli import main
    from tests.test_probes_nt import toy_sequences

    seqs, labels = toy_sequences(30, 20, seed=0)
    write_parquet(tmp_path / "copy" / "H3" / "train.parquet", seqs[:20], labels[:20].tolist(), "H3")
    write_parquet(tmp_path / "copy" / "H3" / "test.parquet", seqs[20:], labels[20:].tolist(), "H3")

    def no_rows(*args, **kwargs):
        raise AssertionError("a probe row ran before --out was checked")

    monkeypatch.setattr(protocol, "run_protocol", no_rows)
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    taken = tmp_path / "taken"
    (taken / "nt_H3.md").mkdir(parents=True)
    for out, said in ((a_file, "notes.txt is a file"), (a_file / "sub", "notes.txt is a file"),
                      (taken, "nt_H3.md is a folder")):
        assert main(["probe", "--benchmark", "nt/H3", "--data-dir", str(tmp_path / "copy"), "--seeds", "1",
                     "--skip", "frozen", "finetune", "onehot", "cnn", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    assert a_file.read_text() == "mine"
