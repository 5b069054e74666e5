"""seqdiff.training.throughput: the run logs its own tokens per second, seconds per step and (on a GPU under bf16)
MFU. Checked on a stand-in clock: every step takes 0.5 s and every validation pass 100 s, so the logged numbers
are known exactly, and the validation time must be left out."""

import types

import lightning as L
import pandas as pd
import pytest
import torch

import seqdiff.training.run as run
from seqdiff.config import load_run_config
from seqdiff.training.device_peaks import peak_bf16_flops
from seqdiff.training.run import train
from seqdiff.training.throughput import Throughput, run_peak_flops
from tests.test_ddp import RECIPE


class FakeTime(L.Callback):
    """A clock that a training step advances by `step_s` and a validation pass by `validation_s`."""

    def __init__(self, step_s: float = 0.5, validation_s: float = 100.0) -> None:
        self.now, self.step_s, self.validation_s = 1000.0, step_s, validation_s

    def __call__(self) -> float:
        return self.now

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.now += self.step_s

    def on_validation_start(self, trainer, pl_module) -> None:
        self.now += self.validation_s


@pytest.mark.parametrize("method", ["mdlm", "ar"])
def test_the_run_logs_tokens_per_second_without_the_validation_time(tmp_path, monkeypatch, method):
    clock, peak = FakeTime(), 1e12
    monkeypatch.setattr(run, "Throughput", lambda log_every: Throughput(log_every, peak_flops=peak, clock=clock))
    recipe = [r for r in RECIPE if r != "method.name=ar"] + [
        f"method.name={method}", "train.max_steps=6", "train.log_every=2", "train.val_every=3",
        "train.checkpoint_every=6"]
    result = train(load_run_config(None, recipe), tmp_path / "run", extra_callbacks=[clock])
    log = pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")
    perf = log.dropna(subset=["perf/tokens_per_s"])
    assert list(perf["step"]) == [1, 3, 5]  # every train.log_every steps (the CSV counts from 0)
    rows, seq_len = 4, 32  # data.batch_size, data.seq_len of RECIPE
    torch.testing.assert_close(torch.tensor(perf["perf/seconds_per_step"].values), torch.full((3,), 0.5),
                               check_dtype=False)  # two validation passes fell inside these windows: left out
    torch.testing.assert_close(torch.tensor(perf["perf/tokens_per_s"].values), torch.full((3,), rows * seq_len / 0.5),
                               check_dtype=False)
    module = result.module
    flops = module.backbone.flops_per_token(seq_len, module.method.head_share(module.backbone))
    assert (module.method.head_share(module.backbone) < 1) == (method == "mdlm")  # MDLM's head: masked positions
    torch.testing.assert_close(torch.tensor(perf["perf/mfu"].values),
                               torch.full((3,), flops * rows * seq_len / 0.5 / peak), check_dtype=False)


def test_no_mfu_where_the_peak_is_unknown(tmp_path):
    """The default on CPU: tokens per second and seconds per step, no MFU column."""
    recipe = [*RECIPE, "train.max_steps=2", "train.log_every=1", "train.val_every=2", "train.checkpoint_every=2"]
    train(load_run_config(None, recipe), tmp_path / "run")
    log = pd.read_csv(tmp_path / "run" / "logs" / "metrics.csv")
    assert (log["perf/tokens_per_s"].dropna() > 0).all() and len(log["perf/tokens_per_s"].dropna()) == 2
    assert "perf/mfu" not in log.columns


def _trainer(device: str, precision: str):
    return types.SimpleNamespace(strategy=types.SimpleNamespace(root_device=torch.device(device)),
                                 precision=precision)


def test_the_peak_is_the_devices_bf16_peak_only_on_cuda_under_bf16(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert run_peak_flops(_trainer("cuda", "bf16-mixed")) == peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert run_peak_flops(_trainer("cuda", "32-true")) is None  # a float32 run against a bf16 peak would read low
    assert run_peak_flops(_trainer("cpu", "bf16-mixed")) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert run_peak_flops(_trainer("cuda", "bf16-mixed")) is None  # not in the table
