"""train.wandb=true: the (offline) wandb run records the resolved recipe and a table of samples; CSV logs stay."""

import json
import time

import pytest
import torch

from seqdiff.config import load_run_config
from seqdiff.training.run import train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"


def _eventually_contains(path, needle: bytes, patience_s: float = 60.0) -> bool:
    """wandb's service process may still be flushing the run record when finish() returns on a loaded
    machine: poll the file instead of reading it once."""
    deadline = time.monotonic() + patience_s
    while True:
        if needle in path.read_bytes():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def test_wandb_run_records_config_and_a_table_of_samples(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = load_run_config(None, [
            "model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
            f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
            "train.max_steps=2", "train.val_every=2", "train.val_batches=1", "train.progress_bar=false",
            "train.wandb=true", "sample.steps=4", "sample.num_samples=3", "model.cond_dim=77"])
        train(cfg, tmp_path / "r")
    finally:
        torch.set_num_threads(threads)
    (run,) = (tmp_path / "r" / "wandb").glob("offline-run-*")
    tables = list((run / "files" / "media" / "table").glob("samples_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"] == ["step", "sample"] and len(table["data"]) == 3
    assert all(step == 2 and 0 < len(text) <= 32 for step, text in table["data"])  # blocks of 32 tokens
    (record,) = run.glob("run-*.wandb")
    assert _eventually_contains(record, b"cond_dim")  # the recipe went into the run's config
    assert (tmp_path / "r" / "logs" / "metrics.csv").is_file()
