"""The LightningModule: a backbone + a method, nothing more. The math lives in the method.

Each training step draws its noise from a generator seeded by (seed, global step), and reseeds the global
RNG the same way (for dropout), so a run resumed from a checkpoint repeats an uninterrupted run exactly.
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch

from seqdiff.config import MethodConfig, ModelConfig, TrainConfig, from_dict
from seqdiff.data.blocks import step_generator
from seqdiff.methods import Batch, build_model
from seqdiff.tokenizers import tokenizer_from_dict


class SeqDiffModule(L.LightningModule):
    def __init__(self, model: dict[str, Any], method: dict[str, Any], train: dict[str, Any],
                 tokenizer: dict[str, Any], seq_len: int, data: dict[str, Any] | None = None):
        super().__init__()
        self.save_hyperparameters(logger=False)  # configs live in the checkpoint and config.yaml
        self.model_config: ModelConfig = from_dict(ModelConfig, model)
        self.method_config: MethodConfig = from_dict(MethodConfig, method)
        self.train_config: TrainConfig = from_dict(TrainConfig, train)
        self.tokenizer = tokenizer_from_dict(tokenizer)
        self.method, self.backbone, self.model_config = build_model(self.model_config, self.method_config,
                                                                    self.tokenizer)
        self._eval_sums: dict[str, torch.Tensor] = {}

    # ---------------------------------------------------------------- training
    def training_step(self, batch, batch_idx):
        step = self.global_step
        torch.manual_seed((self.train_config.seed * 7_919 + step) % (2**63))  # dropout, if any
        # each process of a multi-process run draws its own noise
        generator = step_generator(self.train_config.seed + 1 + 1_000_033 * self.global_rank, step)
        if self.device.type != "cpu":
            generator = torch.Generator(self.device).manual_seed(generator.initial_seed())
        out = self.method.loss(self.backbone, Batch.from_any(batch), generator)
        self.log("train/loss", out.loss, prog_bar=True)  # with several processes: process 0's share of the batch
        self.log("train/bits_per_token", out.nll_sum / out.num_tokens / math.log(2))
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return out.loss

    # ---------------------------------------------------------------- evaluation
    def _eval_step(self, batch, split: str, batch_idx: int):
        batch = Batch.from_any(batch)
        if batch.attention_mask is not None and bool(batch.attention_mask.all()):
            batch.attention_mask = None  # full blocks: take the fast attention path
        generator = step_generator(self.train_config.seed + 2, batch_idx)
        if self.device.type != "cpu":
            generator = torch.Generator(self.device).manual_seed(generator.initial_seed())
        nll_sum, count = self.method.nll(self.backbone, batch, generator)
        sums = self._eval_sums.setdefault(split, torch.zeros(2, dtype=torch.float64))
        sums += torch.stack([nll_sum.cpu(), count.cpu()])

    def _eval_end(self, split: str):
        sums = self._eval_sums.pop(split, torch.zeros(2, dtype=torch.float64))
        # exact over processes: add up NLL totals and token counts, then divide (not a mean of means)
        total, count = self.trainer.strategy.reduce(sums.to(self.device), reduce_op="sum").cpu()
        if count == 0:
            return
        nll = (total / count).item()
        self.log(f"{split}/nll", nll)
        self.log(f"{split}/bits_per_token", nll / math.log(2))

    def validation_step(self, batch, batch_idx):
        self._eval_step(batch, "val", batch_idx)

    def on_validation_epoch_end(self):
        self._eval_end("val")

    def test_step(self, batch, batch_idx):
        self._eval_step(batch, "test", batch_idx)

    def on_test_epoch_end(self):
        self._eval_end("test")

    # ---------------------------------------------------------------- optimization
    def configure_optimizers(self):
        cfg = self.train_config
        decay, no_decay = [], []
        for p in self.backbone.parameters():
            (decay if p.ndim >= 2 else no_decay).append(p)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr, betas=tuple(cfg.betas),
        )
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def lr_lambda(cfg: TrainConfig):
    """Linear warm-up, then constant or cosine decay to zero at max_steps (a multiplier of cfg.lr)."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.lr_schedule == "constant":
            return 1.0
        progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor
