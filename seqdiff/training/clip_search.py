"""The clip-range search of BD3-LM (Arriola et al. 2025, "var_min"), as a Lightning callback.

At the end of every validation (not the sanity check), for each candidate mask-rate range
[clip_min, clip_max] of `method.clip_search`, the variance of the training estimate of the block NELBO is
measured on the first `method.clip_search_batches` validation batches (seqdiff.methods.bd3lm.clip_variance);
the range of least variance becomes the training range of the following steps (`BD3LM.set_train_clip`).
Evaluation never clips. The choice is logged (clip/min, clip/max), made on process 0 and broadcast, and kept
in checkpoints (the callback's state), so a resumed run trains on the range it had chosen.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor

from seqdiff.config import ConfigError, MethodConfig
from seqdiff.methods import Batch
from seqdiff.methods.bd3lm import clip_variance


class ClipSearch(L.Callback):
    def __init__(self, candidates: list[list[float]], num_batches: int = 4, draws: int = 4, seed: int = 0):
        self.candidates = [(float(a), float(b)) for a, b in candidates]
        self.num_batches, self.draws, self.seed = num_batches, draws, seed
        self.best: tuple[float, float] | None = None
        self.variances: dict[tuple[float, float], float] = {}

    @property
    def state_key(self) -> str:
        return "ClipSearch"

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.best is not None:  # resumed: train on the range chosen before
            pl_module.method.set_train_clip(*self.best)

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        loader = trainer.val_dataloaders
        loader = loader[0] if isinstance(loader, (list, tuple)) else loader
        batches = []
        for i, batch in enumerate(loader):
            if i >= self.num_batches:
                break
            batches.append(_to_device(batch, pl_module.device))
        if not batches:
            return
        generator = torch.Generator(pl_module.device).manual_seed(self.seed + 1_000_003 * trainer.global_step)
        self.variances = clip_variance(pl_module.method, pl_module.backbone, batches, self.candidates, generator,
                                       self.draws)
        best = min(self.variances, key=self.variances.get)
        self.best = tuple(trainer.strategy.broadcast(best, src=0))
        pl_module.method.set_train_clip(*self.best)
        pl_module.log("clip/min", self.best[0])
        pl_module.log("clip/max", self.best[1])

    def state_dict(self) -> dict[str, Any]:
        return {"best": None if self.best is None else list(self.best)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        best = state_dict.get("best")
        self.best = None if best is None else (float(best[0]), float(best[1]))


def _to_device(batch, device) -> Batch:
    if isinstance(batch, dict):
        batch = {k: v.to(device) if isinstance(v, Tensor) else v for k, v in batch.items()}
    elif isinstance(batch, Tensor):
        batch = batch.to(device)
    return Batch.from_any(batch)


def clip_search_callback(config: MethodConfig, method, seed: int = 0) -> ClipSearch | None:
    """The callback for `method.clip_search` (None when it is empty); refused for methods without clipping."""
    if not config.clip_search:
        return None
    if not hasattr(method, "set_train_clip"):
        raise ConfigError(f"method.clip_search is for method.name=bd3lm (clipped schedules), not {config.name!r}")
    return ClipSearch(config.clip_search, config.clip_search_batches, seed=seed)


__all__ = ["ClipSearch", "clip_search_callback"]
