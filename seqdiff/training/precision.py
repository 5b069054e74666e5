"""`train.precision`: the Lightning precision a setting means on the device a run trains on.

`auto` is bf16 autocast on CUDA and float32 on CPU. `bf16-if-native` is bf16 autocast wherever the hardware
multiplies bf16 matrices itself (CUDA with bf16, x86 CPUs with avx512_bf16 or AMX: there a cpu-small training
step runs about twice as fast as in float32, reports/bench/README.md) and float32 elsewhere, where bf16 is
emulated and slower than float32. It is a separate setting, not what `auto` does on CPU, so that the same
recipe on the same machine keeps float32's numerics unless it asks for speed.
"""

from __future__ import annotations

import torch

PRECISIONS = ("auto", "32", "bf16-mixed", "16-mixed", "bf16-if-native")
"""The values of train.precision (seqdiff.config.TrainConfig.precision lists the same)."""


def uses_cuda(accelerator: str) -> bool:
    """Whether a Trainer with this accelerator setting runs on CUDA (auto: when a GPU is visible)."""
    if accelerator == "auto":
        return torch.cuda.is_available()
    return accelerator in ("gpu", "cuda")


def native_bf16(cuda: bool) -> bool:
    """Whether the device multiplies bf16 in hardware: a CUDA GPU with bf16, or a CPU with avx512_bf16 / AMX."""
    if cuda:
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private in torch 2.13; absent -> no
    return any(getattr(cpu, name, lambda: False)() for name in checks)


def resolve_precision(setting: str, accelerator: str = "auto") -> str:
    """The Lightning precision string for `setting` on the run's accelerator."""
    cuda = uses_cuda(accelerator)
    if setting == "auto":
        return "bf16-mixed" if cuda else "32-true"
    if setting == "bf16-if-native":
        return "bf16-mixed" if native_bf16(cuda) else "32-true"
    return "32-true" if setting == "32" else setting
