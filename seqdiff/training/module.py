"""The LightningModule: a backbone + a method, nothing more. The math lives in the method.

Each training step draws its noise from a generator seeded by (seed, global step), and reseeds the global
RNG the same way (for dropout), so a run resumed from a checkpoint repeats an uninterrupted run exactly.

Head first, then everything (LP-FT; Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features",
arXiv:2202.10054): the backbone's `head_parameters()` are the output head, the rest is "the body".
- `train.freeze_backbone_steps = N`: for the first N optimizer steps the body's gradients are dropped
  (set to None) before clipping and the optimizer step, so AdamW neither moves them (no update, no weight
  decay) nor keeps state for them, and the clipping norm counts the head alone. Gradients are still
  computed (every strategy, DDP included, sees the same graph); the body's weights stay bit-identical.
- `train.backbone_lr_scale = s`: the body's parameter groups start at s * train.lr, the head's at train.lr.
- With either option the body follows its own multiplier: 0 before step N, then a fresh linear warm-up over
  train.warmup_steps (AdamW's first steps on newly trained weights are full-size), times the same decay as
  the head (constant, or cosine to zero at max_steps).
Without them the optimizer has the two groups it always had (decay / no decay), so old checkpoints resume.

`train.frozen_parameters` (name patterns) switches `requires_grad` off for the backbone parameters it names, for
the whole run: autograd computes no gradient for them, the optimizer and the EMA never see them, and they keep
their initial weights bit for bit (e.g. `layers.*`: train a BERT's embeddings and head, keep its blocks).
"""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch

from seqdiff.config import ConfigError, MethodConfig, ModelConfig, TrainConfig, from_dict
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
        freeze_parameters(self.backbone, self.train_config.frozen_parameters)
        self._eval_sums: dict[str, torch.Tensor] = {}

    def configure_model(self) -> None:
        """Shard the backbone under train.strategy=fsdp2 (Lightning sets the device mesh only then)."""
        mesh = self._device_mesh
        if mesh is not None:
            from seqdiff.training.fsdp2 import shard_backbone

            shard_backbone(self.backbone, mesh["data_parallel"])

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
        groups = self.trainer.optimizers[0].param_groups
        self.log("lr", groups[0]["lr"])  # the head's when the groups are split (it comes first)
        body = [g["lr"] for g in groups if g.get("name") == "body"]
        if body:
            self.log("lr_backbone", body[0])
        return out.loss

    def on_before_optimizer_step(self, optimizer) -> None:
        """During the frozen phase drop the body's gradients: AdamW skips parameters whose grad is None."""
        if self.global_step < self.train_config.freeze_backbone_steps:
            _, body = self.head_and_body()
            for p in body:
                p.grad = None

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
    def head_and_body(self) -> tuple[list[torch.nn.Parameter], list[torch.nn.Parameter]]:
        """The backbone's parameters split into (output head, the rest), each in `named_parameters` order."""
        if not hasattr(self.backbone, "head_parameters"):
            raise ConfigError(f"train.freeze_backbone_steps / train.backbone_lr_scale need a backbone with "
                              f"head_parameters(); {type(self.backbone).__name__} has none")
        head_ids = {id(p) for p in self.backbone.head_parameters()}
        head, body = [], []
        for p in trainable(self.backbone):
            (head if id(p) in head_ids else body).append(p)
        return head, body

    def configure_optimizers(self):
        cfg = self.train_config

        def split(params, **extra):  # weight decay for matrices only
            decay = [p for p in params if p.ndim >= 2]
            no_decay = [p for p in params if p.ndim < 2]
            return [g for g in ({"params": decay, "weight_decay": cfg.weight_decay, **extra},
                                {"params": no_decay, "weight_decay": 0.0, **extra}) if g["params"]]

        if cfg.freeze_backbone_steps == 0 and cfg.backbone_lr_scale == 1.0:
            groups = split(trainable(self.backbone))  # the layout every earlier checkpoint holds
            lambdas = [lr_lambda(cfg)] * len(groups)
        else:
            head, body = self.head_and_body()
            head_groups = split(head, name="head", lr=cfg.lr)
            body_groups = split(body, name="body", lr=cfg.lr * cfg.backbone_lr_scale)
            groups = head_groups + body_groups
            lambdas = [lr_lambda(cfg)] * len(head_groups) + [backbone_lr_lambda(cfg)] * len(body_groups)
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambdas)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def trainable(backbone: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: all but those `train.frozen_parameters` froze."""
    return [p for p in backbone.parameters() if p.requires_grad]


def freeze_parameters(backbone: torch.nn.Module, patterns: list[str]) -> list[str]:
    """Switch requires_grad off for every parameter whose name matches a pattern; returns the frozen names.

    A pattern that matches nothing is a typo, not a no-op: it fails, naming the pattern and a few real names.
    """
    from fnmatch import fnmatchcase

    names = [n for n, _ in backbone.named_parameters()]
    for pattern in patterns:
        if not any(fnmatchcase(n, pattern) for n in names):
            tops = sorted({n.split(".")[0] + (".*" if "." in n else "") for n in names})
            raise ConfigError(f"train.frozen_parameters: {pattern!r} matches no parameter of the "
                              f"{type(backbone).__name__} backbone (its names start with: {', '.join(tops)}; "
                              f"e.g. {names[0]!r})")
    frozen = []
    for name, p in backbone.named_parameters():
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            p.requires_grad_(False)
            frozen.append(name)
    if frozen and len(frozen) == len(names):
        raise ConfigError(f"train.frozen_parameters {patterns} freezes every parameter: nothing would train")
    return frozen


def _decay(cfg: TrainConfig, step: int) -> float:
    """After warm-up: 1 (constant) or the cosine from 1 at warmup_steps to 0 at max_steps."""
    if cfg.lr_schedule == "constant" or step < cfg.warmup_steps:
        return 1.0
    progress = (step - cfg.warmup_steps) / max(1, cfg.max_steps - cfg.warmup_steps)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def lr_lambda(cfg: TrainConfig):
    """Linear warm-up, then constant or cosine decay to zero at max_steps (a multiplier of cfg.lr)."""

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        return _decay(cfg, step)

    return factor


def backbone_lr_lambda(cfg: TrainConfig):
    """The body's multiplier of its lr (train.lr * backbone_lr_scale): 0 while frozen, then its own linear
    warm-up over warmup_steps from the step it is released, times the head's decay."""
    start = cfg.freeze_backbone_steps

    def factor(step: int) -> float:
        if step < start:
            return 0.0
        warm = min(1.0, (step - start + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0
        return warm * _decay(cfg, step)

    return factor
