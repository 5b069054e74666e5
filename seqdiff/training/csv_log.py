"""A CSV logger that keeps the metrics already written when a run is resumed.

Lightning's CSVLogger deletes metrics.csv when its folder is not empty. On resume we instead keep the
rows logged before the checkpoint's step and drop any logged after it (they will be logged again), so
logs/metrics.csv always tells the history of the run that the weights come from.
"""

from __future__ import annotations

import csv
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
            writer = csv.DictWriter(f, fieldnames=keys)
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
