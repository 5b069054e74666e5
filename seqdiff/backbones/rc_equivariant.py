"""Reverse-complement (RC) equivariance for any bidirectional backbone, by running it on both strands.

DNA is double-stranded: a sequence x and its reverse complement RC(x) (positions reversed, every base
replaced by its complement: A<->T, C<->G, N->N, specials MASK / PAD / BOS / EOS to themselves) describe the
same molecule. A model is RC-equivariant when f(RC x) = RC f(x): its prediction for the other strand is its
prediction for this strand, read backwards and complemented.

How RC acts on each output (the conventions the tests check)
- tokens (B, L): ids -> complement_ids[ids], then flip along L. The padding / attention mask (B, L) is
  flipped along L (a right-padded batch becomes left-padded; rotary positions are relative, so attention
  sees the same offsets).
- logits (B, L, V): flip along L and permute the vocabulary channels by the complement map,
  (RC o)[i, v] = o[L-1-i, complement(v)]. The map is an involution that fixes MASK, so SUBS is unaffected.
- hidden states (B, L, H), the strand average: flip along L only (the channels are strand-invariant).
  `strand_hidden_states` (B, L, 2H) = [this strand's state | the other strand's state at the same base
  pair]: RC flips along L and swaps the two halves.
- The MDLM loss of (x0, x_t, t) equals the loss of (RC x0, RC x_t, t): same noise, mapped by RC.

Design (and why not a channel-split transformer)
- One weight-shared network f (a DiT, or any backbone with the same interface) runs on x and on RC(x) in
  ONE batched pass (batch 2B), and the two outputs are combined per position after mapping the second back
  onto the first strand's frame: g(x) = combine(f(x), RC f(RC x)). Since RC is an involution and the
  combination is symmetric, g(RC x) = RC g(x) exactly (up to float summation order, which is the same here:
  a + b == b + a). This is Caduceus-PS (Schiff et al. 2024, arXiv:2403.03234) in its essentials: there the
  Mamba channels are split into a forward half and an RC half that never mix before the LM head, which sums
  the two halves' logits after complementing the second; with no mixing, that *is* a shared network on the
  two strands whose logits are summed. A genuinely channel-split transformer (one stream, weights constrained
  to commute with a channel flip) would need rotary attention that is equivariant under negating relative
  offsets and a flip-commuting adaLN; it saves nothing in FLOPs over the two-strand batch (the width is
  doubled instead of the batch) and is far easier to get subtly wrong, so we did not build it.
- Cost: twice the FLOPs and activation memory of the inner backbone per forward (batch 2B), the same
  parameters. `flops_per_token` reports the doubled figure.
- mode "shared" (model.rc_equivariant: shared, for training): combine = mean of the two strands' logits
  (a product of experts, as Caduceus-PS's head; up to the factor 1/2, which training absorbs). Works for any
  per-position output (MDLM / D3PM logits, SEDD log-scores).
- mode "conjoined" (Caduceus-Ph; post-hoc on any trained checkpoint, `--rc-conjoin`, or
  model.rc_equivariant: conjoined): combine = log of the mean of the two strands' *probabilities*,
  log((softmax f(x) + RC softmax f(RC x)) / 2), returned as normalized log-probabilities (used as logits).
  By Jensen, its cross-entropy at every position is at most the mean of the two strands' cross-entropies,
  so conjoining cannot worsen the average of the bounds on x and RC(x). Only for methods whose output is a
  distribution over clean tokens (mdlm, d3pm), not SEDD's scores.
- Causal (AR) backbones are refused: the other strand's stream at the base pair of position i has read the
  bases after i, which are what position i must predict. Strand symmetry for AR is a sequence-level
  mixture, p(x) = (p(x) + p(RC x)) / 2, not a per-position map (seqdiff.methods.strand_mixture; `seqdiff eval
  --rc-conjoin` and `seqdiff score --rc-conjoin` score it).
- State dict keys are the inner backbone's, prefixed "inner."; attributes the rest of seqdiff reads
  (config, vocab_size, causal, embed, blocks, head_parameters, ...) are forwarded to the inner backbone.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from seqdiff.config import ConfigError

RC_MODES = ("none", "shared", "conjoined")
"""Values of model.rc_equivariant."""
CONJOINABLE_METHODS = ("mdlm", "d3pm")
"""Methods whose backbone output is a distribution over clean tokens, so strand probabilities can be averaged."""


def rc_tokens(ids: Tensor, complement_ids: Tensor) -> Tensor:
    """Reverse complement of token ids (..., L): complement every id, flip along L."""
    comp = complement_ids.to(ids.device)
    return comp.gather(0, ids.reshape(-1)).reshape(ids.shape).flip(-1)


def rc_logits(logits: Tensor, complement_ids: Tensor) -> Tensor:
    """RC action on per-position vocabulary outputs (B, L, V): flip along L, permute channels by the complement."""
    return logits.flip(-2).index_select(-1, complement_ids.to(logits.device))


def rc_mask(mask: Tensor | None) -> Tensor | None:
    """RC action on a (B, L) padding / attention mask: flip along L."""
    return None if mask is None else mask.flip(-1)


def check_complement(complement_ids: Tensor | None, vocab_size: int, what: str) -> Tensor:
    """The complement map as a LongTensor (V,), checked to be an involution on [0, V); refusals name `what`."""
    if complement_ids is None:
        raise ConfigError(f"{what} needs a tokenizer with a complement map (data.tokenizer=nucleotide); "
                          "this tokenizer has none")
    comp = torch.as_tensor(complement_ids, dtype=torch.long).clone()
    if comp.shape != (vocab_size,):
        raise ConfigError(f"{what}: the complement map has {tuple(comp.shape)} entries, the vocabulary {vocab_size}")
    if bool((comp < 0).any() or (comp >= vocab_size).any()) or not torch.equal(comp[comp], torch.arange(vocab_size)):
        raise ConfigError(f"{what}: the tokenizer's complement map is not an involution of the vocabulary")
    return comp


class RCEquivariant(nn.Module):
    """Wraps a bidirectional backbone so that its logits and hidden states are RC-equivariant (see module doc)."""

    selects_outputs = False
    """Not forwarded to the inner backbone: a position's logits combine two strands' (i and L-1-i), so MDLM's
    method.head_at_masked computes every position here."""
    fuses_loss = False
    """Not forwarded either: the loss needs the combined logits, so method.fused_loss takes the plain path."""

    def __init__(self, inner: nn.Module, complement_ids: Tensor, mode: Literal["shared", "conjoined"] = "shared"
                 ) -> None:
        super().__init__()
        if mode not in ("shared", "conjoined"):
            raise ConfigError(f"model.rc_equivariant={mode!r} is not a wrapping mode; choose shared or conjoined")
        if getattr(inner, "causal", False):
            raise ConfigError(f"model.rc_equivariant={mode} needs a bidirectional model; a causal (AR) model's "
                              "other-strand stream would read the bases it must predict")
        comp = check_complement(complement_ids, inner.vocab_size, f"model.rc_equivariant={mode}")
        self.register_buffer("complement_ids", comp, persistent=False)  # before `inner`: not forwarded to it
        self.inner = inner
        self.mode = mode

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)  # parameters, buffers, submodules of the wrapper itself
        except AttributeError:
            return getattr(super().__getattr__("inner"), name)  # config, vocab_size, causal, embed, blocks, ...

    # ------------------------------------------------------------------------------------------------ batching
    def _both_strands(self, input_ids: Tensor, noise_level: Tensor | None, attention_mask: Tensor | None
                      ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Inputs for one pass over [x; RC x]: ids (2B, L), noise level (2B,) or as given, mask (2B, L)."""
        ids = torch.cat([input_ids, rc_tokens(input_ids, self.complement_ids)])  # (2B, L)
        if noise_level is not None and torch.is_tensor(noise_level) and noise_level.ndim == 1:
            noise_level = torch.cat([noise_level, noise_level])  # (2B,)
        if attention_mask is not None:
            attention_mask = torch.cat([attention_mask, rc_mask(attention_mask)])  # (2B, L)
        return ids, noise_level, attention_mask

    def strand_outputs(self, input_ids: Tensor, noise_level: Tensor | None = None,
                       attention_mask: Tensor | None = None, log_softmax: bool = False) -> tuple[Tensor, Tensor]:
        """(f(x), RC f(RC x)): both strands' logits (B, L, V), the second mapped onto x's frame.

        log_softmax: normalize each strand's output before mapping it (so that both strands are normalized
        with the same summation order, and the combination is symmetric bit for bit).
        """
        B = input_ids.shape[0]
        out = self.inner(*self._both_strands(input_ids, noise_level, attention_mask))  # (2B, L, V)
        if log_softmax:
            out = torch.log_softmax(out, dim=-1)
        return out[:B], rc_logits(out[B:], self.complement_ids)

    # ------------------------------------------------------------------------------------------------ public
    def forward(self, input_ids: Tensor, noise_level: Tensor | None = None, attention_mask: Tensor | None = None,
                kv_cache=None) -> Tensor:
        """RC-equivariant logits (B, L, V) in the inner backbone's output dtype (DiT: float32); conjoined:
        normalized log-probabilities."""
        if kv_cache is not None:
            raise ValueError("an RC-equivariant backbone is bidirectional: it has no kv_cache")
        conjoined = self.mode == "conjoined"
        a, b = self.strand_outputs(input_ids, noise_level, attention_mask, log_softmax=conjoined)  # (B, L, V) each
        if not conjoined:
            return 0.5 * (a + b)
        hi, lo = torch.maximum(a, b), torch.minimum(a, b)  # logaddexp written symmetric in (a, b), bit for bit
        return hi + torch.log1p(torch.exp(lo - hi)) - math.log(2.0)

    def strand_hidden_states(self, input_ids: Tensor, noise_level: Tensor | None = None,
                             attention_mask: Tensor | None = None, *, layer: int | None = None) -> Tensor:
        """(B, L, 2H): [state on this strand | state on the other strand at the same base pair].

        RC acts on it by flipping along L and swapping the two halves.
        """
        by_layer = {} if layer is None else {"layer": layer}  # backbones without intermediate layers take none
        h = self.inner.hidden_states(*self._both_strands(input_ids, noise_level, attention_mask), **by_layer)
        return self.pair_strands(h)  # (B, L, 2H)

    def hidden_states(self, input_ids: Tensor, noise_level: Tensor | None = None,
                      attention_mask: Tensor | None = None, *, kv_cache=None, layer: int | None = None) -> Tensor:
        """Strand-averaged hidden states (B, L, H) of the final layer (or after `layer` blocks).

        RC acts on them by flipping along L only: the features of a base pair do not depend on the strand read.
        """
        if kv_cache is not None:
            raise ValueError("an RC-equivariant backbone is bidirectional: it has no kv_cache")
        by_layer = {} if layer is None else {"layer": layer}
        h = self.inner.hidden_states(*self._both_strands(input_ids, noise_level, attention_mask), **by_layer)
        return self.combine_strands(h)  # (B, L, H)

    def combine_strands(self, h: Tensor) -> Tensor:
        """An inner module's output on the batch [x; RC x] (2B, L, H) -> the strand average (B, L, H), as in
        `hidden_states`; for readers that hook the inner modules (probes choosing a layer)."""
        B = h.shape[0] // 2
        return 0.5 * (h[:B] + h[B:].flip(-2))

    def pair_strands(self, h: Tensor) -> Tensor:
        """As `combine_strands`, but both strands side by side (B, L, 2H), as in `strand_hidden_states`."""
        B = h.shape[0] // 2
        return torch.cat([h[:B], h[B:].flip(-2)], dim=-1)

    def new_kv_cache(self, *args, **kwargs):
        raise ValueError("an RC-equivariant backbone is bidirectional: it has no kv_cache")

    def flops_per_token(self, seq_len: int, head_share: float = 1.0) -> int:
        """Twice the inner backbone's (both strands are computed, the head at every position: head_share ignored)."""
        return 2 * self.inner.flops_per_token(seq_len)


def wrap_rc(backbone: nn.Module, mode: str, complement_ids: Tensor | None) -> nn.Module:
    """`backbone` itself for mode "none", else wrapped in RCEquivariant (refusals name model.rc_equivariant)."""
    if mode not in RC_MODES:
        raise ConfigError(f"model.rc_equivariant={mode!r} is not allowed; choose one of {list(RC_MODES)}")
    if mode == "none":
        return backbone
    return RCEquivariant(backbone, complement_ids, mode=mode)


def conjoin_loaded(model, what: str = "--rc-conjoin"):
    """Caduceus-Ph on a loaded checkpoint (seqdiff.checkpoint.LoadedModel): its backbone, conjoined in place.

    Refuses a tokenizer without a complement map, a causal (AR) model, and methods whose output is not a
    distribution over clean tokens; each refusal names `what`. A model trained with
    model.rc_equivariant=shared is already equivariant; conjoining it leaves its predictions unchanged.
    """
    if model.method.causal:
        raise ConfigError(f"{what} needs a bidirectional (diffusion) model; this {model.method.name!r} model is "
                          "causal: its strand symmetry is the sequence-level mixture (p(x) + p(RC x)) / 2, which "
                          "`seqdiff eval --rc-conjoin` and `seqdiff score --rc-conjoin` score")
    if model.method.name not in CONJOINABLE_METHODS:
        raise ConfigError(f"{what} averages predicted probabilities: for methods {list(CONJOINABLE_METHODS)}, "
                          f"not {model.method.name!r}")
    complement = getattr(model.tokenizer, "complement_ids", None)
    if complement is None:
        raise ConfigError(f"{what} needs a tokenizer with a complement map (nucleotide); this "
                          f"{model.tokenizer.kind!r} model has none")
    device = next(model.backbone.parameters()).device
    model.backbone = RCEquivariant(model.backbone, complement, mode="conjoined").to(device).eval()
    return model


__all__ = ["CONJOINABLE_METHODS", "RCEquivariant", "RC_MODES", "check_complement", "conjoin_loaded", "rc_logits",
           "rc_mask", "rc_tokens", "wrap_rc"]
