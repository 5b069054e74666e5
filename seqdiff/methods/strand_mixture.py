"""The strand mixture of a causal (AR) model: an exactly RC-invariant likelihood for any trained AR checkpoint.

A causal model cannot be reverse-complement (RC) equivariant per position (seqdiff.backbones.rc_equivariant:
on the other strand, the stream at base pair i has read the bases after i, which position i must predict).
Its strand symmetry is a property of whole sequences. With p the AR model and RC an involution of the
sequences of length n,

    q(x) = (p(x) + p(RC x)) / 2

is a normalized distribution (RC is a bijection, so p(RC .) sums to 1 too), q(RC x) = q(x) exactly, and its
likelihood is exact: log q(x) = logaddexp(log p(x), log p(RC x)) - log 2. By concavity of log,
-log q(x) <= (-log p(x) - log p(RC x)) / 2: on a test set closed under RC (chr20 tiles read on either strand
are equally likely data), the mixture is never worse on average than the plain model, and it gains at most
log 2 nats per sequence (when one strand is far likelier), so at most 1/n bits per base for windows of n bases.
It is Caduceus-Ph's post-hoc conjoining (Schiff et al. 2024) for a model whose output is a sequence probability
instead of per-position distributions; `loss` is differentiable, so the same objective can be trained.

Accounting: a row's mixture NLL is spread over its n scored tokens (bits per base = the mixture's total bits
over the total bases scored). The mixture needs whole sequences, so a row whose scored positions are not
exactly its real tokens (a context that is not scored, left padding) and packed rows are refused, each with
one message.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqdiff.backbones.rc_equivariant import check_complement, conjoin_loaded
from seqdiff.config import ConfigError
from seqdiff.methods.base import Batch, Method, MethodOutput


def rc_rows(ids: Tensor, real: Tensor, complement_ids: Tensor) -> Tensor:
    """Reverse complement of each row's real prefix (B, L), right padding left in place.

    real: (B, L) bool, True on each row's first n_b positions (right-padded rows; `check_whole_rows` checks)."""
    L = ids.shape[1]
    n = real.sum(1, keepdim=True)  # (B, 1)
    j = torch.arange(L, device=ids.device)[None, :]  # (1, L)
    src = torch.where(j < n, n - 1 - j, j)  # (B, L) position i of the RC row reads position n - 1 - i
    flipped = ids.gather(1, src)
    return torch.where(real, complement_ids.to(ids.device)[flipped], ids)


def check_whole_rows(batch: Batch, pad_id: int) -> Tensor:
    """The real-token mask (B, L) of a batch the mixture can score; refuses what it cannot (module doc)."""
    if batch.segment_ids is not None:
        raise ConfigError("the strand mixture scores whole sequences; packed rows (several documents per row) are "
                          "not supported")
    real = batch.input_ids != pad_id
    if batch.attention_mask is not None:
        real = real & batch.attention_mask.bool()
    if not torch.equal(batch.scored(pad_id), real):
        raise ConfigError("the strand mixture scores whole sequences: every real token of a row must be scored "
                          "(this batch leaves some unscored, e.g. a context)")
    n = real.sum(1, keepdim=True)
    if not torch.equal(real, torch.arange(real.shape[1], device=real.device)[None, :] < n):
        raise ConfigError("the strand mixture needs right-padded rows (real tokens first)")
    return real


class StrandMixture(Method):
    """An exact causal method scored as q(x) = (p(x) + p(RC x)) / 2 per row (module doc)."""

    causal = True
    exact_likelihood = True
    default_sampler = "ar"
    noise_level_input = False
    packable = False

    def __init__(self, inner: Method, complement_ids: Tensor):
        if not (inner.causal and inner.exact_likelihood and hasattr(inner, "token_nll")):
            raise ConfigError(f"the strand mixture is for an exact causal (AR) method, not {inner.name!r}")
        self.inner = inner
        self.name = inner.name  # the reports' method; the eval report records rc_conjoined
        for key in ("config", "vocab_size", "mask_id", "pad_id", "bos_id", "eos_id"):
            setattr(self, key, getattr(inner, key))
        self.complement_ids = check_complement(complement_ids, inner.vocab_size, "the strand mixture")

    def shift_right(self, x: Tensor, segment_ids: Tensor | None = None) -> Tensor:
        return self.inner.shift_right(x, segment_ids)

    def row_nll(self, backbone: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """(-log q of each row (B,) in float64, the real-token mask (B, L)); one batched pass of 2B rows."""
        batch = Batch.from_any(batch)
        real = check_whole_rows(batch, self.pad_id)
        x = batch.input_ids
        both = torch.cat([x, rc_rows(x, real, self.complement_ids)])  # (2B, L): the RC rows stay right-padded
        mask = None if batch.attention_mask is None else torch.cat([batch.attention_mask] * 2)
        per_token, _ = self.inner.token_nll(backbone, Batch(input_ids=both, attention_mask=mask))
        rows = per_token.double().sum(1)  # (2B,) -log p of each strand
        B = x.shape[0]
        return -(torch.logaddexp(-rows[:B], -rows[B:]) - math.log(2.0)), real

    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        mixture, real = self.row_nll(backbone, batch)
        num_tokens = real.sum().to(torch.float64)
        loss = (mixture.sum() / num_tokens.clamp(min=1)).float()
        return MethodOutput(loss=loss, nll_sum=mixture.detach().sum(), num_tokens=num_tokens)


def conjoin_strands(model, what: str = "--rc-conjoin"):
    """Both strands of a loaded checkpoint (seqdiff.checkpoint.LoadedModel), in place: a causal (AR) model scores
    the strand mixture (its method wrapped in StrandMixture), a diffusion model averages its denoiser's
    probabilities over the strands (seqdiff.backbones.rc_equivariant.conjoin_loaded). Refusals name `what`."""
    if not model.method.causal:
        return conjoin_loaded(model, what)
    complement = getattr(model.tokenizer, "complement_ids", None)
    if complement is None:
        raise ConfigError(f"{what} needs a tokenizer with a complement map (nucleotide); this "
                          f"{model.tokenizer.kind!r} model has none")
    model.method = StrandMixture(model.method, torch.as_tensor(complement))
    return model


__all__ = ["StrandMixture", "check_whole_rows", "conjoin_strands", "rc_rows"]
