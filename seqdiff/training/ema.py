"""Exponential moving average of the weights, as a Lightning callback.

decay_n = min(decay, (1 + n) / (10 + n)) after n updates (the usual warm-up, so early averages are not
dominated by the random initialization). The EMA weights are swapped in for validation and testing, saved
in every checkpoint under "ema_state_dict" (used by eval / sample / export), and restored on resume.
Under train.strategy=fsdp2 each process averages its own shards of the weights; checkpoints hold the
gathered whole tensors.
"""

from __future__ import annotations

import lightning as L
import torch

from seqdiff.training.fsdp2 import full_tensor, reshard, shard_like


class EMA(L.Callback):
    def __init__(self, decay: float = 0.9999):
        self.decay = decay
        self.num_updates = 0
        self.shadow: dict[str, torch.Tensor] | None = None
        self._backup: dict[str, torch.Tensor] | None = None

    @staticmethod
    def _params(pl_module) -> dict[str, torch.nn.Parameter]:
        reshard(pl_module.backbone)  # fsdp2: the shards, never gathered weights left by an evaluation forward
        return {n: p for n, p in pl_module.backbone.named_parameters() if p.requires_grad}

    def _ensure(self, pl_module) -> None:
        params = self._params(pl_module)
        if self.shadow is None:
            self.shadow = {n: p.detach().clone().float() for n, p in params.items()}
        else:  # after a restore the shadow may live on the CPU, and whole where the weights are sharded (fsdp2)
            self.shadow = {n: shard_like(v.to(params[n].device), params[n]) for n, v in self.shadow.items()}

    def on_fit_start(self, trainer, pl_module) -> None:
        self._ensure(pl_module)

    @torch.no_grad()
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._ensure(pl_module)
        self.num_updates += 1
        d = min(self.decay, (1 + self.num_updates) / (10 + self.num_updates))
        params = self._params(pl_module)
        names = list(self.shadow)
        torch._foreach_lerp_([self.shadow[n] for n in names], [params[n].detach().float() for n in names], 1 - d)

    # ---------------------------------------------------------------- swap for evaluation
    @torch.no_grad()
    def _swap_in(self, pl_module) -> None:
        if self.shadow is None or self._backup is not None:
            return
        params = self._params(pl_module)
        self._backup = {n: p.detach().clone() for n, p in params.items()}
        for n, p in params.items():
            p.copy_(self.shadow[n].to(p.dtype))

    @torch.no_grad()
    def _swap_out(self, pl_module) -> None:
        if self._backup is None:
            return
        for n, p in self._params(pl_module).items():
            p.copy_(self._backup[n])
        self._backup = None

    def on_validation_start(self, trainer, pl_module) -> None:
        self._swap_in(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        self._swap_out(pl_module)

    def on_test_start(self, trainer, pl_module) -> None:
        self._swap_in(pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        self._swap_out(pl_module)

    # ---------------------------------------------------------------- persistence
    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if self.shadow is not None:
            # whole tensors, gathered from the shards under fsdp2 (every process runs this hook)
            checkpoint["ema_state_dict"] = {n: full_tensor(v.detach()).cpu().clone() for n, v in self.shadow.items()}
            checkpoint["ema_num_updates"] = self.num_updates

    def on_load_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        if "ema_state_dict" in checkpoint:
            self.shadow = {n: v.clone() for n, v in checkpoint["ema_state_dict"].items()}
            self.num_updates = checkpoint.get("ema_num_updates", 0)
