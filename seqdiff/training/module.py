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

Micro-batches (`train.micro_batch_size = m`): training_step splits its share of the batch into rows of m and
calls `backward` on each but the last itself (through the strategy, so a float16 loss scaler applies), weighting
micro-batch j by its share of the scored tokens, so the accumulated gradient is that of the unsplit per-token
mean; it returns the last one for Lightning's backward, clipping and optimizer step. Lightning would zero the
gradients between training_step and that backward, so `optimizer_zero_grad` leaves them alone on split steps
and training_step zeroes them before its first micro-batch. Gradient sync happens once: under DDP the earlier
backward passes run inside DDP's forward, before it expects gradients, so they accumulate locally and the last
backward all-reduces the sum; under fsdp2 `set_requires_gradient_sync(False)` keeps unsharded gradients until
the last micro-batch reduce-scatters them. Methods with `whole_batch_noise` (MDLM) draw the noise of the whole
batch for every micro-batch and score only its rows, so the step is the same whatever the split, up to the order
of float additions; other methods get the rows of the batch (AR has no noise; SEDD's times are then stratified
within each micro-batch: the same expected gradient, another coupling of its rows). Dropout masks do depend on
the split. Changing micro_batch_size on resume is allowed for the same reason (checkpoints do not depend on it).

The optimizer and its schedule come from seqdiff.optim (the one AdamW + warm-up builder, shared with probe
fine-tuning and NCE): AdamW is the fused kernel where torch has one for the parameters (CPU, CUDA), else the
foreach one (`adamw_implementation`): the same update, one kernel instead of a Python loop over parameters.

`train.compile` compiles the backbone in place (`nn.Module.compile`: parameter names and checkpoints unchanged)
after sharding; when Inductor cannot compile a tiny probe function on the device at setup (no C++ compiler, an
unsupported platform), the run warns in one line and stays eager.

`train.activation_checkpointing` recomputes each transformer block's activations in the backward pass
(seqdiff.backbones.checkpointing): the same gradients, less memory, about one more forward pass a step.

`train.frozen_parameters` (name patterns) switches `requires_grad` off for the backbone parameters it names, for
the whole run: autograd computes no gradient for them, the optimizer and the EMA never see them, and they keep
their initial weights bit for bit (e.g. `layers.*`: train a BERT's embeddings and head, keep its blocks).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import lightning as L
import torch

from seqdiff.backbones.checkpointing import set_activation_checkpointing
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, TrainConfig, from_dict
from seqdiff.data.blocks import step_generator
from seqdiff.methods import Batch, MethodOutput, build_model
from seqdiff.optim import (  # noqa: F401 (tests read adamw_implementation here)
    adamw_implementation,
    adamw_with_warmup,
    decay_groups,
    lightning_optimizers,
    lr_multiplier,
)
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
        set_activation_checkpointing(self.backbone, self.train_config.activation_checkpointing)
        self._eval_sums: dict[str, torch.Tensor] = {}
        self._split_step = False  # this step's gradients were accumulated over micro-batches by training_step
        self._compiled = False
        self._counts_checked = False  # micro-batches: the method's token counts were compared with the batch's

    def configure_model(self) -> None:
        """Shard the backbone under train.strategy=fsdp2 (Lightning sets the device mesh only then); compile it."""
        mesh = self._device_mesh
        if mesh is not None:
            from seqdiff.training.fsdp2 import shard_backbone

            shard_backbone(self.backbone, mesh["data_parallel"])
        if self.train_config.compile and not self._compiled:
            # the device the run trains on (the module may still be on the CPU when this hook runs)
            device = self.trainer.strategy.root_device if self._trainer is not None else self.device
            reason = compile_unavailable(device)
            if reason is None:
                if mesh is not None:  # fsdp2: per block, outside the sharding hooks (see compile_sharded)
                    from seqdiff.training.fsdp2 import compile_sharded

                    compile_sharded(self.backbone)
                else:
                    self.backbone.compile()
                self._compiled = True
            else:
                warnings.warn(f"train.compile=true: torch.compile is unavailable here ({reason}); training eagerly",
                              stacklevel=1)

    # ---------------------------------------------------------------- training
    def _step_generator(self, step: int) -> torch.Generator:
        # each process of a multi-process run draws its own noise
        generator = step_generator(self.train_config.seed + 1 + 1_000_033 * self.global_rank, step)
        if self.device.type != "cpu":
            generator = torch.Generator(self.device).manual_seed(generator.initial_seed())
        return generator

    def training_step(self, batch, batch_idx):
        step = self.global_step
        torch.manual_seed((self.train_config.seed * 7_919 + step) % (2**63))  # dropout, if any
        batch = Batch.from_any(batch)
        micro = self.train_config.micro_batch_size
        self._split_step = 0 < micro < batch.input_ids.shape[0]
        if self._split_step:  # loss: the last micro-batch's share to back-propagate; out: the whole batch's
            loss, out = self._accumulate(batch, micro, step)
        else:
            out = self.method.loss(self.backbone, batch, self._step_generator(step))
            loss = out.loss
        self.log("train/loss", out.loss, prog_bar=True)  # with several processes: process 0's share of the batch
        self.log("train/bits_per_token", out.nll_sum / out.num_tokens / math.log(2))
        groups = self.trainer.optimizers[0].param_groups
        self.log("lr", groups[0]["lr"])  # the head's when the groups are split (it comes first)
        body = [g["lr"] for g in groups if g.get("name") == "body"]
        if body:
            self.log("lr_backbone", body[0])
        return loss

    def _accumulate(self, batch: Batch, micro: int, step: int) -> tuple[torch.Tensor, MethodOutput]:
        """Forward and backward every micro-batch but the last; returns (the last one's weighted loss, for Lightning
        to back-propagate; the whole batch's loss and NLL, detached, for logging)."""
        rows = batch.input_ids.shape[0]
        if rows % micro != 0:
            raise ValueError(f"train.micro_batch_size={micro} does not divide this process's {rows} rows")
        slices = [slice(a, a + micro) for a in range(0, rows, micro)]
        scored = batch.scored(self.method.pad_id)  # (B, L)
        counts = [scored[s].sum().to(torch.float64) for s in slices]
        total = sum(counts[1:], counts[0]).clamp(min=1)
        whole = getattr(self.method, "whole_batch_noise", False)
        generator = self._step_generator(step)
        for p in self.parameters():  # optimizer_zero_grad skips split steps: zero before the first micro-batch
            p.grad = None
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        nll_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        share = None
        for j, rows_j in enumerate(slices):
            last = j == len(slices) - 1
            set_gradient_sync(self.backbone, last)
            if whole:  # the noise of the whole batch, every time: the split changes nothing
                out = self.method.loss(self.backbone, batch, self._step_generator(step), rows=rows_j)
            else:
                out = self.method.loss(self.backbone, slice_batch(batch, rows_j), generator)
            if not self._counts_checked and out.num_tokens.item() != counts[j].item():  # a device sync: first step
                raise RuntimeError(f"train.micro_batch_size: method {self.method.name} normalizes its loss by "
                                   f"{out.num_tokens.item()} tokens, not the {counts[j].item()} scored ones")
            share = out.loss * (counts[j] / total).to(out.loss.dtype)  # the unsplit per-token mean, summed over j
            loss_sum += share.detach().to(torch.float64)
            nll_sum += out.nll_sum
            if not last:
                with torch.autocast(self.device.type, enabled=False):
                    self.trainer.strategy.backward(share, None)
        self._counts_checked = True
        return share, MethodOutput(loss=loss_sum.float(), nll_sum=nll_sum, num_tokens=total)

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer) -> None:
        """Lightning zeroes gradients after training_step; on split steps they hold the earlier micro-batches."""
        if not self._split_step:
            optimizer.zero_grad()

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
        if cfg.freeze_backbone_steps == 0 and cfg.backbone_lr_scale == 1.0:
            groups = decay_groups(trainable(self.backbone), cfg.weight_decay)  # the layout earlier checkpoints hold
            lambdas = [lr_lambda(cfg)] * len(groups)
        else:
            head, body = self.head_and_body()
            head_groups = decay_groups(head, cfg.weight_decay, name="head", lr=cfg.lr)
            body_groups = decay_groups(body, cfg.weight_decay, name="body", lr=cfg.lr * cfg.backbone_lr_scale)
            groups = head_groups + body_groups
            lambdas = [lr_lambda(cfg)] * len(head_groups) + [backbone_lr_lambda(cfg)] * len(body_groups)
        return lightning_optimizers(*adamw_with_warmup(groups, lambdas, lr=cfg.lr, betas=cfg.betas,
                                                       fused=loss_scaler(self._trainer) is None))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip as Lightning does, except under bf16 autocast with the fused AdamW: Lightning's mixed-precision
        plugin refuses to clip whenever the optimizer could unscale gradients itself, a float16 loss-scaler
        concern that bf16 (no scaler, nothing to unscale) does not have. There the base precision plugin clips."""
        from lightning.pytorch.plugins.precision import MixedPrecision, Precision
        from lightning.pytorch.utilities import GradClipAlgorithmType

        plugin = self.trainer.precision_plugin
        if gradient_clip_val and isinstance(plugin, MixedPrecision) and plugin.scaler is None:
            algorithm = GradClipAlgorithmType((gradient_clip_algorithm or "norm").lower())
            Precision.clip_gradients(plugin, optimizer, gradient_clip_val, algorithm)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)


def loss_scaler(trainer) -> Any:
    """The float16 gradient scaler of the trainer's precision plugin, or None (float32, bf16: no scaler)."""
    plugin = getattr(trainer, "precision_plugin", None)  # trainer None: a module outside a Trainer (tests, tools)
    return getattr(plugin, "scaler", None)


def slice_batch(batch: Batch, rows: slice) -> Batch:
    """The rows of a batch (every per-row field)."""
    return Batch(**{k: getattr(batch, k)[rows] if getattr(batch, k) is not None else None for k in Batch.FIELDS})


def set_gradient_sync(backbone: torch.nn.Module, enabled: bool) -> None:
    """fsdp2: reduce-scatter gradients in this backward (True) or keep accumulating unsharded ones (False).
    Between micro-batches the gathered weights are kept too (`set_reshard_after_backward(False)`, FSDP2's
    recipe for accumulation): the next forward then skips its all-gather of every block, for the memory of one
    unsharded copy of the weights, which the unsharded gradients already take while they accumulate."""
    from seqdiff.training.fsdp2 import is_sharded

    if is_sharded(backbone):
        backbone.set_requires_gradient_sync(enabled)
        backbone.set_reshard_after_backward(enabled)


MICRO_BATCH_STRATEGIES = ("auto", "fsdp2", "single_device")
"""train.strategy values (besides ddp*) under which train.micro_batch_size is known to sync once per step."""


def check_micro_batch(cfg: TrainConfig, global_batch: int, world_size: int) -> str | None:
    """None, or why train.micro_batch_size cannot split this run's batch (checked before anything is written)."""
    m = cfg.micro_batch_size
    if m == 0:
        return None
    if cfg.strategy not in MICRO_BATCH_STRATEGIES and not cfg.strategy.startswith("ddp"):
        return (f"train.micro_batch_size={m} runs with train.strategy auto, ddp or fsdp2 (one gradient sync per "
                f"step), not {cfg.strategy}")
    per_process = global_batch // world_size
    if per_process % m != 0:
        return (f"train.micro_batch_size={m} must divide each process's share of the batch, data.batch_size="
                f"{global_batch} / {world_size} process(es) = {per_process}")
    return None


def compile_unavailable(device: torch.device) -> str | None:
    """None when torch.compile (Inductor) compiles and runs a tiny function on `device`; else the reason, one line."""
    try:
        fn = torch.compile(lambda x: torch.nn.functional.gelu(x) * 2 + 1, backend="inductor", fullgraph=True)
        x = torch.ones(8, device=device)
        if not torch.allclose(fn(x), torch.nn.functional.gelu(x) * 2 + 1):
            return "the compiled probe gave a wrong result"
    except Exception as e:  # any failure to compile means: stay eager
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"{type(e).__name__}: {first[:200]}"
    return None


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


def lr_lambda(cfg: TrainConfig):
    """Linear warm-up, then constant or cosine decay to zero at max_steps (a multiplier of cfg.lr)."""
    return lr_multiplier(cfg.warmup_steps, cfg.lr_schedule, cfg.max_steps)


def backbone_lr_lambda(cfg: TrainConfig):
    """The body's multiplier of its lr (train.lr * backbone_lr_scale): 0 while frozen, then its own linear
    warm-up over warmup_steps from the step it is released, times the head's decay."""
    return lr_multiplier(cfg.warmup_steps, cfg.lr_schedule, cfg.max_steps, start=cfg.freeze_backbone_steps)
