"""What every method provides: a training loss and a per-token NLL (bound) accumulated in float64.

Packed documents (data.text.block_mode=packed): a batch may carry `segment_ids` and `positions` (B, L); a
method that can train on them (`packable`) hands them to the backbone (`Batch.packing()`), which keeps
attention inside each document, and scores every token once, within its own document.
`seqdiff.methods.check_packing` refuses packing for a method or backbone that cannot.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from seqdiff.tokenizers.base import Tokenizer


@dataclass
class MethodOutput:
    loss: Tensor
    """Scalar to minimize: the per-token NLL (bound) averaged over scored tokens, in the model's dtype."""
    nll_sum: Tensor
    """Sum of per-token NLL (bound) terms over scored tokens, float64, detached (nats)."""
    num_tokens: Tensor
    """Number of scored tokens (float64)."""


@dataclass
class Batch:
    """A batch of token blocks. `loss_mask` marks the positions that are scored (default: all non-pad)."""

    input_ids: Tensor  # (B, L) long
    loss_mask: Tensor | None = None  # (B, L) bool
    attention_mask: Tensor | None = None  # (B, L) bool, True = real token
    segment_ids: Tensor | None = None  # (B, L) long, packed documents: the document of each token in its row
    positions: Tensor | None = None  # (B, L) long, packed documents: each token's place in its document

    @classmethod
    def from_any(cls, batch: Batch | dict | Tensor) -> Batch:
        if isinstance(batch, Batch):
            return batch
        if isinstance(batch, Tensor):
            return cls(input_ids=batch)
        # data modules may carry extra per-position fields (e.g. a soft-mask flag); methods ignore them
        return cls(**{k: batch[k] for k in cls.FIELDS if k in batch})

    FIELDS = ("input_ids", "loss_mask", "attention_mask", "segment_ids", "positions")
    """The per-position fields (each (B, L) or None)."""

    def packing(self, rows: slice | None = None) -> dict[str, Tensor]:
        """The backbone's keyword arguments for packed documents ({} for unpacked rows), of `rows` only if given."""
        if self.segment_ids is None:
            return {}
        pick = (lambda x: x) if rows is None else (lambda x: x[rows])  # noqa: E731
        return {"segment_ids": pick(self.segment_ids), "positions": pick(self.positions)}

    def scored(self, pad_id: int) -> Tensor:
        mask = self.input_ids != pad_id
        if self.loss_mask is not None:
            mask = mask & self.loss_mask
        if self.attention_mask is not None:
            mask = mask & self.attention_mask
        return mask


FUSED_LOSS_MIN_VOCAB = 4096
"""method.fused_loss=null fuses the head and its loss from this vocabulary size on (reports/bench/fused_loss)."""


class Method(ABC):
    """A method owns the math (corruption, parameterization, loss, bound, reverse step), not the loop."""

    name: ClassVar[str]
    causal: ClassVar[bool]
    """Whether the backbone must use causal attention (left-to-right factorization: only AR)."""
    exact_likelihood: ClassVar[bool]
    """Whether `nll` is the exact NLL (AR) rather than an upper bound (NELBO) estimated with random times."""
    default_sampler: ClassVar[str]
    """The sampler (seqdiff.samplers.SAMPLERS) `build_sampler` picks when sample.sampler is null."""
    default_time_conditioning: ClassVar[bool] = False
    """model.time_conditioning when the recipe leaves it null."""
    noise_level_input: ClassVar[bool] = True
    """Whether `loss`, `nll` and the samplers give the backbone a noise level (a time-conditioned one needs it)."""
    fusable_loss: ClassVar[bool] = False
    """Whether `loss` is a weighted cross-entropy of the backbone's head that it can ask for without the logits
    (method.fused_loss: mdlm with SUBS at the masked positions, ar); others need the logits themselves."""
    packable: ClassVar[bool] = False
    """Whether `loss` / `nll` take packed documents (Batch.segment_ids) and keep each document to itself."""
    own_keys: ClassVar[tuple[str, ...]] = ()
    """method.* keys that this method (and its subclasses) alone reads: set away from their defaults under another
    method they are ignored, which train and `seqdiff config` say (seqdiff.methods.foreign_keys)."""

    def __init__(self, config, tokenizer: Tokenizer):
        self.config = config
        self.vocab_size = tokenizer.vocab_size
        self.mask_id = tokenizer.mask_id
        self.pad_id = tokenizer.pad_id
        self.bos_id = tokenizer.bos_id
        self.eos_id = tokenizer.eos_id

    never_sampled: tuple[int, ...] = ()
    """Ids a reverse step gives probability 0 while `sampling_without` holds: generation only (the loss and every
    likelihood run outside it). MDLM's x_theta (subs_logits, the sparse head) and SEDD's step probabilities read
    it, and the AR sampler adds it to its own rule (MASK and PAD never)."""

    @contextlib.contextmanager
    def sampling_without(self, ids: set[int]) -> Iterator[None]:
        """Generate with the mass on `ids` moved to the other tokens (renormalized): special tokens a
        sample has no place for (PAD, never a training target; BOS / EOS inside an infill or in a model whose
        data never held them), which an undertrained model still gives mass and decoding would drop, leaving
        samples shorter than asked and infills out of line with their text. The MDLM reference sampler removes
        only MASK; for a model whose data never held these ids the two agree in the limit of training."""
        saved = self.never_sampled
        self.never_sampled = tuple(sorted(set(ids) - {self.mask_id}))
        try:
            yield
        finally:
            self.never_sampled = saved

    def head_share(self, backbone: nn.Module) -> float:
        """Expected share of the positions at which `loss` runs the backbone's output head (for FLOP counts)."""
        return 1.0

    def check_backbone(self, backbone: nn.Module) -> None:
        """Refuse a backbone this method cannot use (default: any backbone)."""
        return None

    def training_noise(self) -> dict | None:
        """What a training step draws, as method.time_sampling resolved (auto names no draw): {"time_sampling",
        "mask_count_law" (mask_count only, else None)}; None for a method that draws no noise level (AR)."""
        sampling = getattr(self, "time_sampling", None)
        if sampling is None:
            return None
        return {"time_sampling": sampling,
                "mask_count_law": getattr(self, "mask_count_law", None) if sampling == "mask_count" else None}

    def uses_fused_loss(self, backbone: nn.Module) -> bool:
        """Whether `loss` asks `backbone` for the head's cross-entropy instead of its logits (method.fused_loss;
        only methods whose loss is a weighted cross-entropy of the head, mdlm and ar, ask)."""
        mode = getattr(self.config, "fused_loss", False)
        if mode is False or not self.fusable_loss or not getattr(backbone, "fuses_loss", False):
            return False
        return mode is True or getattr(backbone, "vocab_size", 0) >= FUSED_LOSS_MIN_VOCAB

    def check_recipe(self, config) -> None:
        """Refuse a whole recipe (RunConfig) this method cannot train, before anything is written (default: any)."""
        return None

    @abstractmethod
    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        """One stochastic estimate of the per-token NLL (bound) of `batch`, differentiable."""

    def bound(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        """One draw of the reported bound; the training loss unless a method trains on something else
        (bd3lm: clipped mask rates in training, the whole range here)."""
        return self.loss(backbone, batch, generator)

    @torch.no_grad()
    def nll(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None,
            num_samples: int = 1) -> tuple[Tensor, Tensor]:
        """(sum of NLL terms in float64, number of scored tokens), averaged over `num_samples` draws of `bound`."""
        total = torch.zeros((), dtype=torch.float64)
        count = torch.zeros((), dtype=torch.float64)
        for _ in range(num_samples):
            out = self.bound(backbone, batch, generator)
            total = total + out.nll_sum.cpu()
            count = out.num_tokens.cpu()
        return total / num_samples, count

