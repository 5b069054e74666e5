"""AdamW with a linear learning-rate warm-up: the one optimizer set-up of training (training/module.py), probe
fine-tuning (probes/finetune.py) and the NCE energy (edlm/nce_train.py). A leaf module (torch only), so every
layer may use it.

- `adamw_with_warmup(groups, lambdas, lr=...)` -> (AdamW, LambdaLR). `groups` are parameter groups (dicts;
  a group's own `lr` / `weight_decay` win over the arguments) or plain parameters; `lambdas` is one
  multiplier for every group or one per group. Groups without parameters are dropped, with their multiplier.
- AdamW is the fused kernel where torch has one for every parameter (CPU, CUDA), else the foreach one
  (`adamw_implementation`): one kernel instead of torch's CPU default, a Python loop over parameters. The
  update is the same; foreach matches the loop bit for bit, fused within float rounding (about 1e-7 after
  a few steps), which is the only change it brought to fine-tuning and NCE (they used the loop before).
- `lr_multiplier(warmup_steps, schedule, max_steps, start)`: the multiplier of a group's lr at optimizer step
  s (LambdaLR's convention: s = 0 is the first step): 0 before `start`, then min(1, (s - start + 1) /
  warmup_steps) (1 when warmup_steps <= 0), times the decay of `schedule` (LR_SCHEDULES). The decay is
  counted from step 0, not from `start`: a group released late (LP-FT's body) warms up on its own, then
  follows the same decay as the others.
- `decay_groups(params, weight_decay)`: weight decay on matrices only (biases, norms' gains: none).

The multipliers are closures, not callable objects, on purpose: LambdaLR's state_dict saves a callable
object's attributes and load_state_dict writes them back, so a run resumed with a changed max_steps would
keep the old schedule; a closure is not saved, and the checkpoints written before this module keep their
layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

Multiplier = Callable[[int], float]


def constant_decay(step: int, warmup_steps: int, max_steps: int) -> float:
    """1 at every step."""
    return 1.0


def cosine_decay(step: int, warmup_steps: int, max_steps: int) -> float:
    """1 until warmup_steps, then the cosine from 1 at warmup_steps to 0 at max_steps (0 after it)."""
    if step < warmup_steps:
        return 1.0
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


LR_SCHEDULES: dict[str, Callable[[int, int, int], float]] = {"constant": constant_decay, "cosine": cosine_decay}
"""What follows the warm-up (train.lr_schedule): name -> decay(step, warmup_steps, max_steps)."""


def lr_multiplier(warmup_steps: int, schedule: str = "constant", max_steps: int = 0, start: int = 0) -> Multiplier:
    """The multiplier of a group's lr at each optimizer step (see the module docstring)."""
    if schedule not in LR_SCHEDULES:
        raise ValueError(f"lr schedule {schedule!r} is unknown; choose one of {sorted(LR_SCHEDULES)}")
    decay = LR_SCHEDULES[schedule]

    def factor(step: int) -> float:
        if step < start:
            return 0.0
        warm = min(1.0, (step - start + 1) / warmup_steps) if warmup_steps > 0 else 1.0
        return warm * decay(step, warmup_steps, max_steps)

    return factor


def decay_groups(params: Iterable[torch.nn.Parameter], weight_decay: float, **extra: Any) -> list[dict[str, Any]]:
    """Two parameter groups: matrices (ndim >= 2) with `weight_decay`, the rest without; empty ones dropped.
    `extra` goes into both (a group name, its own lr)."""
    params = list(params)
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay, **extra},
                        {"params": no_decay, "weight_decay": 0.0, **extra}) if g["params"]]


FUSED_ADAMW_DEVICES = ("cuda", "cpu")
"""Devices with a fused AdamW kernel in torch (one kernel for every parameter; on CPU about 2x faster than the
per-parameter loop, which is torch's CPU default)."""


def adamw_implementation(params: list[torch.Tensor], fused: bool = True) -> dict[str, bool]:
    """AdamW's keyword for the fastest implementation torch has for these parameters: fused where every one is a
    floating-point tensor on a FUSED_ADAMW_DEVICES device, fsdp2's DTensor shards included (DTensor runs the fused
    kernel on each local shard, where foreach over DTensors pays Python dispatch for every op), else foreach.
    Hugging Face's Trainer picks the fused AdamW by default too (torch >= 2.8). `fused=False` asks for foreach:
    under a float16 loss scaler the fused kernel unscales inside its step, after gradient clipping would have
    seen the scaled gradients, so Lightning refuses to clip with it."""
    from torch.distributed.tensor import DTensor

    floating = all(p.dtype.is_floating_point for p in params)
    devices = {p.device_mesh.device_type if isinstance(p, DTensor) else p.device.type for p in params}
    if fused and params and floating and devices <= set(FUSED_ADAMW_DEVICES):
        return {"fused": True}
    return {"foreach": True}


def adamw_with_warmup(groups: Iterable[dict[str, Any]] | Iterable[torch.nn.Parameter],
                      lambdas: Multiplier | Sequence[Multiplier], *, lr: float, weight_decay: float = 0.0,
                      betas: Sequence[float] = (0.9, 0.999), fused: bool = True
                      ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over `groups` and the LambdaLR that multiplies each group's lr by its multiplier at every step
    (`fused`: see adamw_implementation)."""
    groups = list(groups)
    if groups and not isinstance(groups[0], dict):  # plain parameters: one group, as torch makes of them
        groups = [{"params": groups}]
    per_group = list(lambdas) if isinstance(lambdas, Sequence) else [lambdas] * len(groups)
    if len(per_group) != len(groups):
        raise ValueError(f"{len(per_group)} lr multipliers for {len(groups)} parameter groups")
    kept = [(dict(g, params=list(g["params"])), f) for g, f in zip(groups, per_group)]
    kept = [(g, f) for g, f in kept if g["params"]]
    params = [p for g, _ in kept for p in g["params"]]
    optimizer = torch.optim.AdamW([g for g, _ in kept], lr=lr, betas=tuple(betas), weight_decay=weight_decay,
                                  **adamw_implementation(params, fused))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, [f for _, f in kept])


def lightning_optimizers(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler
                         ) -> dict[str, Any]:
    """What a LightningModule's configure_optimizers returns: the scheduler stepped after every optimizer step."""
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
