"""Two-process DDP on CPU (gloo) trains exactly like one process on the same global batch.

Why AR: its loss is a deterministic function of the weights and the batch. Each DDP process trains on its
half of the global batch (RandomWindowBatches.rank_slice) and the gradients are averaged, which for equal
token counts is the gradient of the global mean, so the weights follow the single-process run step for
step (up to the order of float additions). MDLM cannot match exactly: every process draws its own
masking noise and diffusion times (seeded by (seed, rank, step)), so the two runs see different, equally
distributed, Monte Carlo estimates of the same NELBO, and their losses and weights differ.

What is logged: Lightning logs `train/loss` from global rank 0 without a cross-process reduction, so in
a DDP run it is the loss of rank 0's half of the global batch; the reference below computes exactly that
half in the single-process run, with the same weights.
"""

import os
import subprocess
import sys

import lightning as L
import pandas as pd
import pytest
import torch

from seqdiff.cli import main
from seqdiff.config import load_run_config
from seqdiff.training.run import RunError, train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.checkpoint_every=3",
          "train.progress_bar=false", "train.log_every=1", "train.warmup_steps=1", "train.lr=1e-2",
          "model.dropout=0.0", "method.name=ar", "train.accelerator=cpu"]


class RankZeroShareLoss(L.Callback):
    """Before each step, the loss of rows [0, B/2) of the global batch: what DDP's rank 0 trains on."""

    def __init__(self):
        self.losses = []

    @torch.no_grad()
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        half = {"input_ids": batch["input_ids"][: batch["input_ids"].shape[0] // 2]}
        self.losses.append(pl_module.method.loss(pl_module.backbone, half).loss.item())


def train_one_process_alongside(multi_run, recipe, single_run):
    """Train `recipe` in one process; check that the 3-step multi-process run in `multi_run` logged, at each
    step, the loss of rank 0's half of the global batch under the single process's weights."""
    share = RankZeroShareLoss()
    single = train(load_run_config(None, recipe), single_run, extra_callbacks=[share])
    log = pd.read_csv(multi_run / "logs" / "metrics.csv")
    losses = log[log["train/loss"].notna()].set_index("step")["train/loss"]
    assert list(losses.index) == [0, 1, 2]
    torch.testing.assert_close(torch.tensor(losses.values), torch.tensor(share.losses, dtype=torch.float64),
                               rtol=1e-5, atol=1e-6)
    return single, share


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_two_process_ddp_matches_one_process(tmp_path, one_thread):
    """Each process also splits its half into micro-batches of one row (gradients synced once, on the last
    one) and clips the accumulated gradient: still the single process's unsplit steps
    (tests/test_micro_batch.py has the same claim for fsdp2, under the slow marker)."""
    recipe = [*RECIPE, "train.grad_clip=0.05"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(tmp_path / "ddp"), *recipe,
           "train.strategy=ddp", "train.devices=2", "train.micro_batch_size=1"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "distributed_backend=gloo" in proc.stdout + proc.stderr

    single, share = train_one_process_alongside(tmp_path / "ddp", recipe, tmp_path / "single")
    # the single process's logged loss is the mean over the two halves: a different number
    single_log = pd.read_csv(tmp_path / "single" / "logs" / "metrics.csv")
    global_losses = torch.tensor(single_log["train/loss"].dropna().values, dtype=torch.float64)
    assert not torch.allclose(global_losses, torch.tensor(share.losses, dtype=torch.float64), rtol=1e-4)

    ddp_ckpt = torch.load(tmp_path / "ddp" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ddp_ckpt["global_step"] == 3
    for name, p in single.module.backbone.state_dict().items():
        torch.testing.assert_close(ddp_ckpt["state_dict"]["backbone." + name], p, rtol=1e-4, atol=1e-5, msg=name)
    ema = ddp_ckpt["ema_state_dict"]
    for name, v in torch.load(single.checkpoint, weights_only=False)["ema_state_dict"].items():
        torch.testing.assert_close(ema[name], v, rtol=1e-4, atol=1e-5, msg=name)


def test_bad_multi_process_settings_fail_before_anything_is_written(tmp_path, capsys):
    def error(argv):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("error:") == 1
        return err

    run = str(tmp_path / "r")
    msg = error(["train", "--run-dir", run, *RECIPE, "data.batch_size=3", "train.strategy=ddp", "train.devices=2"])
    assert "data.batch_size=3" in msg and "2 training processes" in msg
    msg = error(["train", "--run-dir", run, *RECIPE, "train.strategy=dpd"])
    assert "train.strategy='dpd'" in msg and "ddp" in msg
    assert "train.num_nodes" in error(["train", "--run-dir", run, *RECIPE, "train.num_nodes=0"])
    assert not (tmp_path / "r").exists()
    with pytest.raises(RunError, match="must divide by the 4"):
        train(load_run_config(None, [*RECIPE, "data.batch_size=6", "train.strategy=ddp", "train.devices=2",
                                     "train.num_nodes=2"]), tmp_path / "r2")


@pytest.mark.slow  # about 40 s of two-process training; test_two_process_ddp_matches_one_process stays fast
def test_ddp_keeps_a_frozen_backbone_bit_for_bit(tmp_path, one_thread):
    """train.freeze_backbone_steps under DDP: the body's all-reduced gradients are dropped like one process's,
    so after the frozen steps it equals the single-process run's bit for bit (both are the initial weights)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    opts = ["train.max_steps=2", "train.freeze_backbone_steps=2", "train.weight_decay=0.1", "train.val_every=2",
            "train.checkpoint_every=2"]
    for name, extra in (("ddp", ["train.strategy=ddp", "train.devices=2"]), ("one", ["train.devices=1"])):
        cmd = [sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(tmp_path / name), *RECIPE, *opts, *extra]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    ddp, one = (torch.load(tmp_path / name / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
                for name in ("ddp", "one"))
    head = {"backbone.norm_final.weight", "backbone.norm_final.bias", "backbone.output.weight", "backbone.output.bias"}
    assert head <= set(ddp)
    for name in set(ddp) - head:
        assert torch.equal(ddp[name], one[name]), name
