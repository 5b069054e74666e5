"""train.strategy=fsdp2 on CPU (gloo): sharded training follows one process, and its checkpoints resume.

Why AR for the parity test: its loss is a deterministic function of the weights and the batch (see
tests/test_ddp.py), so two processes that each hold half of every weight and train on half of the global
batch must follow the single-process run step for step, EMA included. Gradient clipping (train.grad_clip)
runs on the sharded gradients, so the test also covers the global norm across shards.
"""

import json
import os
import subprocess
import sys
import warnings

import pandas as pd
import pytest
import torch

from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import TrainConfig, load_run_config
from seqdiff.training.fsdp2 import FSDP2Strategy
from seqdiff.training.run import build_strategy, train
from tests.test_ddp import RECIPE, train_one_process_alongside

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", WANDB_MODE="offline", WANDB_SILENT="true")


def _train_cli(run_dir, *overrides, resume=False):
    cmd = [sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(run_dir), *(["--resume"] * resume),
           *overrides]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def test_fsdp2_is_built_by_seqdiff_and_runs_on_any_accelerator():
    strategy, accelerator = build_strategy(TrainConfig(strategy="fsdp2", accelerator="cpu"))
    assert isinstance(strategy, FSDP2Strategy) and accelerator == "cpu"
    assert strategy._save_distributed_checkpoint is False  # one whole-tensor file, what eval / sample read


def test_fsdp2_on_one_process_says_that_auto_is_faster():
    with pytest.warns(UserWarning, match="fsdp2 with one process shards nothing.*train.strategy=auto"):
        build_strategy(TrainConfig(strategy="fsdp2", devices=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_strategy(TrainConfig(strategy="fsdp2", devices=2))
        build_strategy(TrainConfig(strategy="fsdp2", devices=1, num_nodes=2))
        build_strategy(TrainConfig(strategy="auto", devices=1))


def test_two_process_fsdp2_matches_one_process(tmp_path):
    # method.fused_loss=true: the head's chunked loss inside the sharded root unit's forward, gradients included
    recipe = [*RECIPE, "train.ema_decay=0.9", "train.grad_clip=0.5", "method.fused_loss=true"]
    out = _train_cli(tmp_path / "fsdp2", *recipe, "train.strategy=fsdp2", "train.devices=2")
    assert "distributed_backend=gloo" in out

    single, _ = train_one_process_alongside(tmp_path / "fsdp2", recipe, tmp_path / "single")

    ckpt = torch.load(tmp_path / "fsdp2" / "checkpoints" / "last.ckpt", weights_only=False)
    assert ckpt["global_step"] == 3
    reference = torch.load(single.checkpoint, weights_only=False)
    for key in ("state_dict", "ema_state_dict"):  # whole tensors, equal to the single process's
        assert set(ckpt[key]) == set(reference[key])
        for name, value in reference[key].items():
            assert type(ckpt[key][name]) is torch.Tensor, name
            torch.testing.assert_close(ckpt[key][name], value, rtol=1e-4, atol=1e-5, msg=f"{key} {name}")
    # the EMA lags the weights, so they moved: the equality above is not two copies of the initialization
    assert not torch.allclose(ckpt["state_dict"]["backbone.output.weight"], ckpt["ema_state_dict"]["output.weight"])
    assert load_checkpoint(tmp_path / "fsdp2" / "checkpoints" / "last.ckpt").step == 3


def test_bd3lm_trains_under_fsdp2(tmp_path):
    """bd3lm's one pass over x_t + x_0 goes through the backbone's forward (its head on the x_t half), so the
    sharded root unit gathers its weights; reading the parts directly failed with mixed Tensor / DTensor."""
    recipe = [*RECIPE, "method.name=bd3lm", "method.block_size=4", "train.max_steps=2", "train.val_every=2",
              "train.checkpoint_every=2", "train.strategy=fsdp2", "train.devices=1"]
    for fused in ("false", "true"):  # in this process: one device needs no second one (and no second import)
        train(load_run_config(None, [*recipe, f"method.fused_loss={fused}"]), tmp_path / fused)
        assert load_checkpoint(tmp_path / fused / "checkpoints" / "last.ckpt").step == 2


@pytest.mark.slow  # 1-2 min of two-process training; test_two_process_fsdp2_matches_one_process stays fast
def test_fsdp2_run_resumes_to_the_uninterrupted_weights_and_logs_samples(tmp_path):
    """MDLM with EMA: a run stopped at step 2 and resumed to step 4 ends where an uninterrupted 4-step run
    ends (optimizer state, EMA shards, data position and noise all restored; a constant learning rate, so
    the schedule does not depend on max_steps); wandb's sample table comes from the gathered weights on
    rank 0."""
    recipe = [*RECIPE, "method.name=mdlm", "train.lr_schedule=constant", "train.val_every=2",
              "train.checkpoint_every=2", "train.ema_decay=0.9", "train.deterministic=true", "train.strategy=fsdp2",
              "train.devices=2"]
    whole = tmp_path / "whole"
    _train_cli(whole, *recipe, "train.max_steps=4", "train.wandb=true", "sample.steps=4", "sample.num_samples=2")
    tables = sorted((whole / "wandb").glob("offline-run-*/files/media/table/samples_*.table.json"))
    assert len(tables) == 2  # one per validation, at steps 2 and 4
    rows = [row for table in tables for row in json.loads(table.read_text())["data"]]
    assert sorted(step for step, _ in rows) == [2, 2, 4, 4] and all(text for _, text in rows)

    resumed = tmp_path / "resumed"
    _train_cli(resumed, *recipe, "train.max_steps=2")
    _train_cli(resumed, *recipe, "train.max_steps=4", resume=True)

    # the resumed run's log tells the same history (rank 0 alone trims and appends to metrics.csv)
    logged = [pd.read_csv(run / "logs" / "metrics.csv").dropna(subset=["train/loss"]) for run in (whole, resumed)]
    assert list(logged[1]["step"]) == [0, 1, 2, 3]
    assert list(logged[1]["train/loss"]) == list(logged[0]["train/loss"])
    a, b = (torch.load(run / "checkpoints" / "last.ckpt", weights_only=False) for run in (whole, resumed))
    assert a["global_step"] == b["global_step"] == 4
    for key in ("state_dict", "ema_state_dict"):
        for name, value in a[key].items():
            torch.testing.assert_close(b[key][name], value, rtol=0, atol=0, msg=f"{key} {name}")


def test_another_optimizer_layout_on_resume_and_float16_are_refused(tmp_path, capsys):
    """A DDP checkpoint's optimizer state is indexed by position; fsdp2 cannot read it (and the reverse)."""
    from seqdiff.cli import main
    from seqdiff.training.run import optimizer_layout

    recipe = [*RECIPE, "train.max_steps=1", "train.val_every=1", "train.checkpoint_every=1"]
    train(load_run_config(None, recipe), tmp_path / "r")
    before = sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir())
    assert main(["train", "--resume", "--run-dir", str(tmp_path / "r"), *recipe, "train.max_steps=2",
                 "train.strategy=fsdp2"]) == 2
    err = capsys.readouterr().err
    assert "train.strategy=auto" in err and "resume with train.strategy=auto" in err
    assert sorted(p.name for p in (tmp_path / "r" / "checkpoints").iterdir()) == before
    assert main(["train", "--run-dir", str(tmp_path / "r16"), *recipe, "train.strategy=fsdp2",
                 "train.precision=16-mixed"]) == 2
    assert "fsdp2 does not run with train.precision=16-mixed" in capsys.readouterr().err
    assert not (tmp_path / "r16").exists()
    assert optimizer_layout("ddp") == optimizer_layout("auto") != optimizer_layout("fsdp2") != optimizer_layout("fsdp")


_FUSED_DTENSOR_SCRIPT = r"""
import sys
import torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from seqdiff.optim import adamw_implementation
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
def build():
    torch.manual_seed(0)
    return fully_shard(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)))
model, twin = build(), build()
params = list(model.parameters())
assert all(isinstance(p, DTensor) for p in params)
assert adamw_implementation(params) == {"fused": True}, adamw_implementation(params)
assert adamw_implementation(params, fused=False) == {"foreach": True}
opts = [torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=True),
        torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.1, foreach=True)]
x = torch.randn(5, 8)
for _ in range(3):
    for m, opt in zip((model, twin), opts):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
for a, b in zip(model.parameters(), twin.parameters()):
    torch.testing.assert_close(a.full_tensor(), b.full_tensor(), rtol=1e-5, atol=1e-6)
dist.destroy_process_group()
print("ok")
"""


def test_fsdp2_shards_take_the_fused_adamw_and_step_like_foreach(tmp_path):
    """fsdp2's DTensor parameters get the fused AdamW (one kernel per local shard) and it steps as foreach does."""
    done = subprocess.run([sys.executable, "-c", _FUSED_DTENSOR_SCRIPT, str(tmp_path / "store")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]
