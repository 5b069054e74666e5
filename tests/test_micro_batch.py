"""train.micro_batch_size: gradient accumulation that leaves the step unchanged.

A split step must reach the weights of the unsplit one (up to the order of float additions): AR because its
loss is deterministic; MDLM because every micro-batch draws the noise of the whole batch and scores its rows
(MDLM.loss(rows=...)), so the split sees the same times and masks. Under DDP and fsdp2 (gloo, two processes)
the gradients sync once, on the last micro-batch; the runs must still follow the unsplit single process.
"""

import os
import subprocess
import sys

import pandas as pd
import pytest
import torch

from seqdiff.cli import main
from seqdiff.config import MethodConfig, TrainConfig, load_run_config
from seqdiff.methods import MDLM, Batch
from seqdiff.training.module import check_micro_batch
from seqdiff.training.run import RunError, train
from tests.test_ddp import RECIPE
from tests.test_mdlm import TOK, TinyNet
from tests.test_training import StopAt

ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
MDLM_RECIPE = [r for r in RECIPE if r != "method.name=ar"] + ["method.name=mdlm"]


@pytest.mark.parametrize("pairs", [False, True], ids=["", "complementary"])
@pytest.mark.parametrize("sampling", ["mask_count", "antithetic_jitter", "antithetic"])
def test_rows_of_mdlm_loss_add_up_to_the_whole_batch(sampling, pairs):
    """sum_j loss(rows_j) * n_j / N is the whole batch's loss, with padding making the n_j unequal."""
    net = TinyNet(5)
    method = MDLM(MethodConfig(time_sampling=sampling, complementary_masks=pairs), TOK)
    x0 = torch.randint(0, 3, (6, 5), generator=torch.Generator().manual_seed(0))
    x0[1, 3:] = TOK.pad_id
    x0[4, 1:] = TOK.pad_id
    batch = Batch(x0)
    whole = method.loss(net, batch, torch.Generator().manual_seed(7))
    n = batch.scored(TOK.pad_id).sum().double()
    parts = [method.loss(net, batch, torch.Generator().manual_seed(7), rows=slice(a, a + 2)) for a in (0, 2, 4)]
    combined = sum(p.loss.double() * p.num_tokens / n for p in parts)
    torch.testing.assert_close(combined, whole.loss.double(), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(sum(p.nll_sum for p in parts), whole.nll_sum, rtol=1e-6, atol=1e-6)
    assert sum(p.num_tokens for p in parts) == whole.num_tokens


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]


def _losses(run_dir):
    log = pd.read_csv(run_dir / "logs" / "metrics.csv")
    return torch.tensor(log["train/loss"].dropna().values)


@pytest.mark.parametrize("recipe", [RECIPE, MDLM_RECIPE], ids=["ar", "mdlm"])
def test_split_step_reaches_the_unsplit_weights(tmp_path, recipe):
    opts = ["train.grad_clip=0.05"]  # clipping acts on the accumulated gradient: it must be the whole one
    train(load_run_config(None, [*recipe, *opts]), tmp_path / "whole")
    train(load_run_config(None, [*recipe, *opts, "train.micro_batch_size=1"]), tmp_path / "split")
    torch.testing.assert_close(_losses(tmp_path / "split"), _losses(tmp_path / "whole"), rtol=1e-5, atol=1e-6)
    whole, split = _weights(tmp_path / "whole"), _weights(tmp_path / "split")
    moved = 0
    for name, value in whole.items():
        torch.testing.assert_close(split[name], value, rtol=1e-4, atol=1e-5, msg=name)
    init = train(load_run_config(None, [*recipe, "train.max_steps=1", "train.lr=0"]), tmp_path / "init").module
    for name, value in init.state_dict().items():
        moved += not torch.allclose(value, whole[name])
    assert moved > 0  # the runs trained: the equality is not two copies of the initialization


def test_micro_batch_size_may_change_on_resume(tmp_path):
    """The step does not depend on the split, so a run resumed with another one follows the uninterrupted run."""
    recipe = [*MDLM_RECIPE, "train.max_steps=4", "train.checkpoint_every=2", "train.val_every=2"]
    train(load_run_config(None, recipe), tmp_path / "full")
    train(load_run_config(None, [*recipe, "train.micro_batch_size=2"]), tmp_path / "part",
          extra_callbacks=[StopAt(2)])
    train(load_run_config(None, [*recipe, "train.micro_batch_size=1"]), tmp_path / "part", resume=True)
    torch.testing.assert_close(_losses(tmp_path / "part"), _losses(tmp_path / "full"), rtol=1e-5, atol=1e-6)
    for name, value in _weights(tmp_path / "full").items():
        torch.testing.assert_close(_weights(tmp_path / "part")[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_a_micro_batch_that_does_not_divide_is_refused_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", "--run-dir", str(run), *RECIPE, "train.micro_batch_size=3"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "train.micro_batch_size=3" in err and "= 4" in err
    assert not run.exists()
    with pytest.raises(RunError, match="2 process"):  # per process: 4 / 2 = 2 rows, 4 cannot split them
        train(load_run_config(None, [*RECIPE, "train.micro_batch_size=4", "train.strategy=ddp", "train.devices=2"]),
              tmp_path / "r2")
    assert not (tmp_path / "r2").exists()
    assert "train.micro_batch_size must be >= 0" in _config_error(["train.micro_batch_size=-1"])
    assert "train.strategy auto, ddp or fsdp2" in check_micro_batch(TrainConfig(micro_batch_size=2, strategy="fsdp"),
                                                                  8, 1)
    assert check_micro_batch(TrainConfig(micro_batch_size=2, strategy="ddp"), 8, 2) is None


def _config_error(overrides):
    from seqdiff.config import ConfigError

    with pytest.raises(ConfigError) as e:
        load_run_config(None, [*RECIPE, *overrides])
    return str(e.value)


@pytest.mark.slow  # 20-25 s each; tests/test_ddp.py runs DDP with micro-batches in the default suite
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_processes_with_micro_batches_follow_one_unsplit_process(tmp_path, strategy):
    """2 processes x 2 micro-batches of 1 row each (AR): the weights of one process on the unsplit batch."""
    cmd = [sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(tmp_path / strategy), *RECIPE,
           f"train.strategy={strategy}", "train.devices=2", "train.micro_batch_size=1", "train.grad_clip=0.05"]
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    train(load_run_config(None, [*RECIPE, "train.grad_clip=0.05"]), tmp_path / "single")
    multi, single = _weights(tmp_path / strategy), _weights(tmp_path / "single")
    assert set(multi) == set(single)
    for name, value in single.items():
        torch.testing.assert_close(multi[name], value, rtol=1e-4, atol=1e-5, msg=name)
