"""The training bar counts global steps up to train.max_steps, also on a resumed run (Lightning's own bar lost its
total there: "Training: 75/?" mid-epoch, "4/?" after a finished run was resumed with more steps)."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

from seqdiff.cli import main

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=32", "data.seq_len=16", "data.batch_size=2",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.val_every=100", "train.warmup_steps=0", "train.log_every=1"]


def bar_lines(capfd) -> list[str]:
    out = capfd.readouterr()  # Lightning's bars write to stdout
    return [line for line in (out.out + out.err).replace("\r", "\n").splitlines() if "it/s" in line]


def interrupted_run(run, max_steps: int) -> int:
    """A run stopped by Ctrl-C after its first checkpoint (mid-epoch, as a user's interrupted run); its step."""
    proc = subprocess.Popen([sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(run), *RECIPE,
                             f"train.max_steps={max_steps}", "train.checkpoint_every=2", "train.progress_bar=false"],
                            env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "last.ckpt").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) != 0
    step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert 0 < step < max_steps
    return step


@pytest.mark.parametrize("first", ["finished", "interrupted"])
def test_resumed_bar_counts_from_the_restored_step_to_max_steps(tmp_path, capfd, first):
    run = tmp_path / "run"
    if first == "interrupted":  # resumed mid-epoch: Lightning calls no on_train_epoch_start
        total = 400
        step = interrupted_run(run, total)
    else:  # a finished 3-step run resumed with more steps: a new epoch, whose batch index starts again at 0
        total, step = 6, 3
        assert main(["train", "--run-dir", str(run), *RECIPE, "train.max_steps=3", "train.progress_bar=false"]) == 0
    capfd.readouterr()
    assert main(["train", "--resume", "--run-dir", str(run), f"train.max_steps={min(total, step + 3)}",
                 "train.progress_bar=true"]) == 0
    total = min(total, step + 3)
    lines = bar_lines(capfd)
    assert not [line for line in lines if re.search(r"\b[1-9]\d*/\?", line)], lines  # a position without a total
    assert "Epoch" in lines[-1] and f"{total}/{total}" in lines[-1], lines
    assert any(f"{step + 1}/{total}" in line for line in lines), lines  # counted from the restored step
