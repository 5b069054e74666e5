"""A CSV logger that keeps the metrics already written when a run is resumed.

Lightning's CSVLogger deletes metrics.csv when its folder is not empty. On resume we instead keep the
rows logged before the checkpoint's step and drop any logged after it (they will be logged again), so
logs/metrics.csv always tells the history of the run that the weights come from.

`read_metrics` / `metric_curve` are the one reader of that file (the quickstart, the method comparison and
the experiments' curves): no pandas, a row per logged line, an empty cell (a metric not logged on that line)
or a NaN read as missing, the way pandas' read_csv + notna() read it before.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter


class _AppendingWriter(ExperimentWriter):
    def __init__(self, log_dir: str, keep_before_step: int | None):
        self._keep_before_step = keep_before_step
        super().__init__(log_dir=log_dir)

    def _check_log_dir_exists(self) -> None:
        path = Path(self.metrics_file_path)
        if not path.is_file():
            return
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            keys = list(reader.fieldnames or [])
            rows = [r for r in reader if self._keep(r)]
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted(keys))  # Lightning appends in sorted column order
            writer.writeheader()
            writer.writerows(rows)
        self._resumed_keys = sorted(keys)

    def _keep(self, row: dict) -> bool:
        if self._keep_before_step is None:
            return True
        try:
            return int(float(row.get("step") or 0)) < self._keep_before_step
        except ValueError:
            return True

    def log_metrics(self, metrics_dict, step=None) -> None:
        if getattr(self, "_resumed_keys", None) is not None and not self.metrics_keys:
            self.metrics_keys = list(self._resumed_keys)
        super().log_metrics(metrics_dict, step)


class ResumableCSVLogger(CSVLogger):
    """CSVLogger writing `<save_dir>/<name>/metrics.csv`; on resume keeps the rows before `resume_step`."""

    def __init__(self, save_dir: str, name: str = "logs", resume_step: int | None = None):
        super().__init__(save_dir=save_dir, name=name, version="")
        self._resume_step = resume_step

    @property
    @rank_zero_experiment
    def experiment(self):
        """The writer, on global rank 0 only: every other process gets Lightning's do-nothing experiment. Without
        this, each process of a resumed multi-process run rewrote metrics.csv at once and could corrupt it."""
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(self.log_dir, keep_before_step=self._resume_step)
        return self._experiment


METRICS_FILE = Path("logs") / "metrics.csv"
"""Where a run directory keeps its training and validation metrics."""

Row = dict[str, float | str | None]


def _cell(text: str | None) -> float | str | None:
    if text is None or text.strip() == "":
        return None
    try:
        value = float(text)
    except ValueError:
        return text if text.strip().lower() not in ("nan", "na", "n/a", "null", "none") else None
    return None if math.isnan(value) else value


def read_metrics(run_dir: str | Path) -> list[Row]:
    """The rows of `<run_dir>/logs/metrics.csv` (a path to the .csv itself is accepted too), in file order:
    column -> float, or None where the cell is empty or NaN. FileNotFoundError when the run has no log."""
    path = Path(run_dir)
    if path.suffix != ".csv":
        path = path / METRICS_FILE
    with open(path, newline="") as f:
        return [{k: _cell(v) for k, v in row.items() if k is not None} for row in csv.DictReader(f)]


def metric_curve(rows: list[Row], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of the rows that logged `key` ([], [] when the column is absent)."""
    steps, values = [], []
    for row in rows:
        value = row.get(key)
        if isinstance(value, float):
            steps.append(int(row["step"]))  # type: ignore[arg-type]
            values.append(value)
    return steps, values
