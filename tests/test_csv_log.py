"""seqdiff.training.csv_log.read_metrics / metric_curve: the one reader of logs/metrics.csv."""

from __future__ import annotations

import math

import pytest

from seqdiff.training.csv_log import ResumableCSVLogger, metric_curve, read_metrics

CSV = """epoch,step,train/loss,val/nll,lr
0,0,3.5,,0.001
0,1,3.25,,0.001
0,1,,2.75,
0,2,nan,,0.001
0,3,3.0,2.5,
"""


def test_missing_cells_and_nan_are_missing_and_numbers_are_floats(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.csv").write_text(CSV)
    rows = read_metrics(tmp_path)
    assert len(rows) == 5
    assert rows[0] == {"epoch": 0.0, "step": 0.0, "train/loss": 3.5, "val/nll": None, "lr": 0.001}
    assert metric_curve(rows, "train/loss") == ([0, 1, 3], [3.5, 3.25, 3.0])  # the NaN of step 2 is missing
    assert metric_curve(rows, "val/nll") == ([1, 3], [2.75, 2.5])
    assert metric_curve(rows, "absent") == ([], [])
    assert read_metrics(tmp_path / "logs" / "metrics.csv") == rows  # the file itself is accepted too


def test_the_same_curves_as_pandas(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "metrics.csv"
    path.write_text(CSV)
    df = pd.read_csv(path)
    rows = read_metrics(path)
    for col in ("train/loss", "val/nll", "lr"):
        part = df[df[col].notna()]
        steps, values = metric_curve(rows, col)
        assert steps == [int(s) for s in part["step"]]
        assert all(math.isclose(a, float(b)) for a, b in zip(values, part[col], strict=True))


def test_a_resumed_log_keeps_the_rows_before_the_checkpoint_and_reads_in_order(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.csv").write_text(CSV)
    logger = ResumableCSVLogger(str(tmp_path), resume_step=2)  # the checkpoint was taken after step 1
    writer = logger.experiment  # trims the rows logged at steps >= 2
    assert metric_curve(read_metrics(tmp_path), "train/loss") == ([0, 1], [3.5, 3.25])
    writer.log_metrics({"train/loss": 2.875, "epoch": 0}, step=2)
    writer.log_metrics({"val/nll": 2.25, "train/loss": 2.5, "epoch": 0}, step=3)
    writer.save()
    rows = read_metrics(tmp_path)
    assert metric_curve(rows, "train/loss") == ([0, 1, 2, 3], [3.5, 3.25, 2.875, 2.5])
    assert metric_curve(rows, "val/nll") == ([1, 3], [2.75, 2.25])


def test_a_run_without_a_log_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_metrics(tmp_path)
