"""train.precision: mixed precision trains, with gradient clipping and the fastest AdamW that is correct for it.

- bf16 autocast has no loss scaler. Lightning's mixed-precision plugin still refused to clip gradients when the
  optimizer was torch's fused AdamW (our default), so every bf16-mixed run with train.grad_clip > 0 failed at its
  first step: on CUDA, where `precision: auto` means bf16-mixed, that is every GPU recipe. The module now clips
  through the base plugin there; the clipped gradient norm is checked here.
- float16 autocast has a loss scaler; the fused AdamW would unscale inside its step, after clipping saw the scaled
  gradients, so the module picks the foreach AdamW there and Lightning unscales before clipping. (Lightning runs
  `16-mixed` as bf16 on CPU, so that choice is checked on the module, with a float16 plugin.)
- `train.precision=32` on the command line (YAML reads a number) names the float32 setting.
"""

import lightning as L
import pytest
import torch

from seqdiff.config import ConfigError, load_run_config
from seqdiff.training.run import train
from tests.test_ddp import RECIPE

CLIP = 1e-3
"""Far below the gradient norm of a fresh model, so every step is clipped."""


class GradNorms(L.Callback):
    """The total gradient norm after clipping (Lightning leaves the step's gradients until the next closure)."""

    def __init__(self):
        self.norms, self.optimizers = [], []

    def on_train_batch_end(self, trainer, module, *args):
        grads = [p.grad for p in module.parameters() if p.grad is not None]
        self.norms.append(torch.linalg.vector_norm(torch.stack([g.float().norm() for g in grads])).item())
        self.optimizers.append(trainer.optimizers[0])


@pytest.mark.parametrize("precision", ["bf16-mixed", "32"])
def test_mixed_precision_trains_with_clipped_gradients(tmp_path, precision):
    norms = GradNorms()
    result = train(load_run_config(None, [*RECIPE, "method.name=mdlm", f"train.precision={precision}",
                                          f"train.grad_clip={CLIP}"]), tmp_path / "r", extra_callbacks=[norms])
    assert result.checkpoint.is_file()
    assert len(norms.norms) == 3
    assert all(0 < n <= CLIP * 1.01 for n in norms.norms), norms.norms
    assert norms.optimizers[0].defaults["fused"]  # the fast AdamW is kept


@pytest.mark.parametrize("precision, fused", [("16-mixed", False), ("bf16-mixed", True)])
def test_a_loss_scaler_gets_the_foreach_adamw(precision, fused):
    from types import SimpleNamespace

    from lightning.pytorch.plugins.precision import MixedPrecision

    from tests.test_optim import _training_module

    module = _training_module()
    module._trainer = SimpleNamespace(precision_plugin=MixedPrecision(precision, "cpu"))
    defaults = module.configure_optimizers()["optimizer"].defaults
    assert bool(defaults.get("fused")) is fused and bool(defaults.get("foreach")) is not fused


def linear_dtype_and_loss_dtype(tmp_path, precision: str) -> tuple[torch.dtype, torch.dtype]:
    """One MDLM training step at `precision`: the dtype a backbone Linear returns, and the loss's dtype."""
    seen = {}

    class Peek(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            def hook(mod, args, out):
                seen["out"] = out.dtype

            seen["handle"] = next(m for m in module.backbone.modules()
                                  if isinstance(m, torch.nn.Linear)).register_forward_hook(hook)

        def on_train_batch_end(self, trainer, module, outputs, *args):
            seen["handle"].remove()
            seen["loss"] = outputs["loss"].dtype

    train(load_run_config(None, [*RECIPE, "method.name=mdlm", f"train.precision={precision}", "train.max_steps=1"]),
          tmp_path / "r", extra_callbacks=[Peek()])
    return seen["out"], seen["loss"]


def test_bf16_mixed_runs_the_backbone_under_autocast(tmp_path):
    """The matmuls really run in bfloat16 (the point of the setting), the loss stays float32."""
    assert linear_dtype_and_loss_dtype(tmp_path, "bf16-mixed") == (torch.bfloat16, torch.float32)


@pytest.mark.parametrize("native", [True, False])
def test_bf16_if_native_follows_the_cpu(tmp_path, monkeypatch, native):
    """bf16 autocast on a CPU that multiplies bf16 in hardware, float32 on one that would emulate it."""
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, check, lambda: native, raising=False)
    expected = torch.bfloat16 if native else torch.float32
    assert linear_dtype_and_loss_dtype(tmp_path, "bf16-if-native") == (expected, torch.float32)


@pytest.mark.parametrize(("setting", "accelerator", "cuda", "native", "expected"), [
    ("auto", "cpu", False, True, "32-true"),  # auto stays float32 on CPU, even where bf16 is native
    ("auto", "auto", True, True, "bf16-mixed"),
    ("auto", "cpu", True, True, "32-true"),  # a GPU is visible, the run asked for the CPU
    ("32", "auto", True, True, "32-true"),
    ("bf16-mixed", "cpu", False, False, "bf16-mixed"),  # asked for explicitly: emulated or not
    ("bf16-if-native", "cpu", False, True, "bf16-mixed"),
    ("bf16-if-native", "cpu", False, False, "32-true"),
    ("bf16-if-native", "gpu", True, True, "bf16-mixed"),
    ("bf16-if-native", "gpu", True, False, "32-true"),  # a GPU without bf16 (before Ampere)
])
def test_resolve_precision(monkeypatch, setting, accelerator, cuda, native, expected):
    from seqdiff.training import precision

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: native)
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, check, lambda: native, raising=False)
    assert precision.resolve_precision(setting, accelerator) == expected


def test_the_precision_list_is_the_configs():
    import typing

    from seqdiff.config import TrainConfig
    from seqdiff.training.precision import PRECISIONS

    assert set(typing.get_args(typing.get_type_hints(TrainConfig)["precision"])) == set(PRECISIONS)


@pytest.mark.parametrize("value", ["32", "bf16-mixed", "bf16-if-native"])
def test_precision_from_the_command_line(value):
    assert load_run_config(None, [f"train.precision={value}"]).train.precision == value


def test_an_unknown_precision_is_refused():
    with pytest.raises(ConfigError, match="train.precision=64 is not allowed"):
        load_run_config(None, ["train.precision=64"])
