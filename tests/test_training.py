import math

import lightning as L
import pandas as pd
import pytest
import torch

from seqdiff.config import load_run_config
from seqdiff.training.module import lr_lambda
from seqdiff.training.run import RunError, train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"


def tiny_config(**extra):
    overrides = [
        "model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
        "train.max_steps=8", "train.val_every=4", "train.val_batches=1", "train.checkpoint_every=4",
        "train.progress_bar=false", "train.warmup_steps=2", "train.lr_schedule=cosine", "train.lr=1e-3",
        "model.dropout=0.1",
    ]
    overrides += [f"{k}={v}" for k, v in extra.items()]
    return load_run_config(None, overrides)


class StopAt(L.Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def _losses(run_dir):
    df = pd.read_csv(run_dir / "logs" / "metrics.csv")
    df = df[df["train/loss"].notna()]
    return df.set_index("step")["train/loss"]


@pytest.mark.parametrize("method", ["mdlm", "ar"])
def test_resume_repeats_uninterrupted_run(tmp_path, method):
    cfg = tiny_config(**{"method.name": method, "train.log_every": 1})
    full = train(cfg, tmp_path / "full")
    part = train(cfg, tmp_path / "part", extra_callbacks=[StopAt(4)])
    assert part.trainer.global_step == 4
    resumed = train(cfg, tmp_path / "part", resume=True)
    assert resumed.trainer.global_step == 8
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    assert len(a) == 8
    torch.testing.assert_close(torch.tensor(b.loc[a.index].values), torch.tensor(a.values), rtol=1e-5, atol=1e-6)
    for (n, p), (_, q) in zip(full.module.backbone.named_parameters(), resumed.module.backbone.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)
    ema_a = torch.load(full.checkpoint, weights_only=False)["ema_state_dict"]
    ema_b = torch.load(resumed.checkpoint, weights_only=False)["ema_state_dict"]
    for n in ema_a:
        torch.testing.assert_close(ema_a[n], ema_b[n], rtol=1e-5, atol=1e-6)


def test_refuses_to_overwrite_or_resume_nothing(tmp_path):
    cfg = tiny_config(**{"train.max_steps": 2})
    with pytest.raises(RunError, match="no checkpoint"):
        train(cfg, tmp_path / "r", resume=True)
    train(cfg, tmp_path / "r")
    with pytest.raises(RunError, match="--resume"):
        train(cfg, tmp_path / "r")


def test_bad_data_fails_before_writing(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cfg = tiny_config(**{"data.train_file": str(empty)})
    with pytest.raises(ValueError, match="empty"):
        train(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
    cfg = tiny_config(**{"data.train_file": str(tmp_path / "missing.txt")})
    with pytest.raises(ValueError, match="missing.txt"):
        train(cfg, tmp_path / "r")
    cfg = tiny_config(**{"data.seq_len": 128})
    with pytest.raises(RunError, match="max_seq_len"):
        train(cfg, tmp_path / "r")


def test_training_lowers_the_loss(tmp_path):
    cfg = tiny_config(**{"train.max_steps": 60, "train.lr_schedule": "constant", "train.log_every": 1,
                         "train.val_every": 60, "model.dropout": 0.0})
    train(cfg, tmp_path / "r")
    losses = _losses(tmp_path / "r")
    assert losses.iloc[-10:].mean() < losses.iloc[:5].mean() - 0.3


def test_lr_schedule_shape():
    cfg = tiny_config(**{"train.max_steps": 100, "train.warmup_steps": 10}).train
    f = lr_lambda(cfg)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0) and f(55) == pytest.approx(0.5) and f(100) == pytest.approx(0.0, abs=1e-12)
    assert all(f(s) >= f(s + 1) for s in range(10, 100))
    assert math.isclose(f(32), 0.5 * (1 + math.cos(math.pi * 22 / 90)))


def test_wandb_logging_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = tiny_config(**{"train.max_steps": 2, "train.wandb": "true", "train.val_every": 2})
    train(cfg, tmp_path / "r")
    runs = list((tmp_path / "r" / "wandb").glob("offline-run-*"))
    assert runs, "an offline wandb run folder must be written"
    assert (tmp_path / "r" / "logs" / "metrics.csv").is_file()  # CSV logs always


def test_global_batch_is_split_across_processes():
    import numpy as np

    from seqdiff.data.blocks import RandomWindowBatches

    tokens = np.arange(1000)
    whole = RandomWindowBatches(tokens, 16, 8, seed=3).batch_at(5)["input_ids"]
    parts = [RandomWindowBatches(tokens, 16, 8, seed=3, rank=r, world_size=4).batch_at(5)["input_ids"]
             for r in range(4)]
    assert torch.equal(torch.cat(parts), whole)
    with pytest.raises(ValueError, match="does not divide"):
        RandomWindowBatches(tokens, 16, 6, seed=3, rank=0, world_size=4)


def test_time_conditioning_follows_the_method_unless_set(tmp_path):
    from seqdiff.checkpoint import load_checkpoint

    sedd = train(tiny_config(**{"method.name": "sedd", "train.max_steps": 1, "train.val_every": 1}), tmp_path / "s")
    assert sedd.module.model_config.time_conditioning is True
    assert load_checkpoint(tmp_path / "s").model_config.time_conditioning is True
    mdlm = train(tiny_config(**{"train.max_steps": 1, "train.val_every": 1}), tmp_path / "m")
    assert mdlm.module.model_config.time_conditioning is False
    from seqdiff.config import ConfigError

    with pytest.raises(ConfigError, match="time_conditioning=true"):
        train(tiny_config(**{"method.name": "sedd", "model.time_conditioning": "false"}), tmp_path / "x")
    assert not (tmp_path / "x").exists()  # refused before anything was written
