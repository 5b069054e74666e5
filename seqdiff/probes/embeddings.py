"""Sequence embeddings from a seqdiff backbone: mean of the hidden states over real positions only
(or, with `pool="flatten"`, every position's state side by side, padding zeroed).

Padding never enters the mean (the mask weights it out) and, through the attention mask, never changes
the real positions' states, so a sequence's embedding does not depend on what it is batched with.
A time-conditioned backbone (e.g. SEDD) is read at noise level 0: the probe sees clean sequences.

`mask_stride` K reads each position where it is masked instead: K passes, pass j masking every K-th real
position from j, and position i's states taken from the pass that masked it. Why: an MDLM denoiser (SUBS)
copies unmasked tokens to its output, so no loss ever trains its upper layers at unmasked positions, and a
clean sequence is a mask rate (0) it never trains on; at a masked position, with 1 - 1/K of the context
visible, its states are what it learned to predict from. Costs K forward passes.
With `rc_average`, the embedding is the mean of the sequence's and its reverse complement's
(the post-hoc strand symmetrization of Caduceus-Ph, applied to features). The reverse complement's states
are flipped back along the sequence first, so that position i of both strands is the same base pair: for the
mean this changes nothing, for `flatten` it keeps a feature at the offset where it occurs (before session 10
the flatten form averaged position i with position L - 1 - i, which made the features strand-invariant and
blurred every offset with its mirror image). With `rc_both` the two strands' features are kept side by side
instead of averaged (twice the features, nothing lost): for a plain model [features of x | features of RC(x)
flipped back], for an RC-equivariant backbone its `strand_hidden_states` [this strand | the other strand] in
place of their average. The average is strand-symmetric, which a strand-specific task (splice junctions are
annotated on the sense strand) may need to undo; the pair keeps both readings.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor, nn

from seqdiff.probes.data import ProbeError


def encode_batch(tokenizer, sequences: Sequence[str], length: int | None = None) -> tuple[Tensor, Tensor]:
    """(ids (B, L), mask (B, L) bool, True = real base), right-padded with PAD to `length` or the longest."""
    encoded = [tokenizer.encode(s) for s in sequences]
    L = length or max(len(e) for e in encoded)
    ids = torch.full((len(encoded), L), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(encoded), L), dtype=torch.bool)
    for i, e in enumerate(encoded):
        if len(e) > L:
            raise ProbeError(f"sequence {i + 1} has {len(e)} bases, more than the padded length {L}; truncate it first")
        ids[i, : len(e)] = torch.from_numpy(np.asarray(e, dtype=np.int64))
        mask[i, : len(e)] = True
    return ids, mask


def masked_mean(hidden: Tensor, mask: Tensor) -> Tensor:
    """Mean of hidden (B, L, H) over the positions where mask (B, L) is True -> (B, H)."""
    weights = mask.to(hidden.dtype).unsqueeze(-1)  # (B, L, 1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def masked_flatten(hidden: Tensor, mask: Tensor) -> Tensor:
    """Every position's state side by side, padding zeroed -> (B, L * H). Keeps where a feature occurs, which a
    mean throws away (splice sites sit at a fixed offset); needs one padded length for every batch."""
    return (hidden * mask.to(hidden.dtype).unsqueeze(-1)).flatten(1)


POOLINGS = {"mean": masked_mean, "flatten": masked_flatten}


def _flipped(hidden: Tensor, mask: Tensor, flip: bool) -> tuple[Tensor, Tensor]:
    """(hidden, mask), reversed along the sequence when `flip`."""
    return (hidden.flip(1), mask.flip(1)) if flip else (hidden, mask)


class BackboneEncoder(nn.Module):
    """(ids, mask) -> mean-pooled hidden states (B, H) of a backbone layer (None = the final layer), or of
    every layer at once with `all_layers` (B, n_layers + 1, H), for choosing the layer on validation."""

    def __init__(self, backbone: nn.Module, complement_ids: Tensor, layer: int | None = None,
                 rc_average: bool = False, all_layers: bool = False, pool: str = "mean",
                 length: int | None = None, concat_layers: bool = False, rc_both: bool = False,
                 mask_stride: int = 0, mask_id: int | None = None) -> None:
        super().__init__()
        if mask_stride and mask_id is None:
            raise ProbeError("mask_stride reads the states of masked positions: give the tokenizer's mask_id")
        if mask_stride == 1 or mask_stride < 0:
            raise ProbeError(f"mask_stride takes 0 (read the clean sequence) or K >= 2 passes, got {mask_stride}")
        if rc_average and rc_both:
            raise ProbeError("rc_average and rc_both exclude each other: average the two strands or keep both")
        if pool not in POOLINGS:
            raise ProbeError(f"pooling {pool!r} is unknown; choose one of {sorted(POOLINGS)}")
        if pool == "flatten" and length is None:
            raise ProbeError("flatten pooling needs the padded length of every batch")
        self.backbone = backbone
        self.layer = layer
        self.all_layers = all_layers or concat_layers
        self.concat_layers = concat_layers
        """Every layer side by side in one vector (B, (n_layers + 1) * F): the fine-tuning head of layer=concat."""
        self.rc_average = rc_average
        self.rc_both = rc_both
        self.strand_states = rc_both and hasattr(backbone, "strand_hidden_states")
        """An RC-equivariant backbone with rc_both: read its two strands' states instead of their average."""
        self.pool = POOLINGS[pool]
        self.length = length if pool == "flatten" else None
        """Pad every batch to this length (flatten pooling)."""
        self.register_buffer("complement_ids", complement_ids.clone(), persistent=False)
        self.out_features = backbone.config.hidden_size * (length if pool == "flatten" else 1)
        if concat_layers:
            self.out_features *= backbone.config.n_layers + 1
        if rc_both:
            self.out_features *= 2
        self.time_conditioned = bool(backbone.config.time_conditioning)
        if mask_stride and self.time_conditioned:
            raise ProbeError("mask_stride on a time-conditioned backbone would need the noise level of a 1/K mask "
                             "rate, which the probe does not know; read it clean (mask_stride 0)")
        self.mask_stride = mask_stride
        """K >= 2: read each position's states from a pass where it is masked (K passes, every K-th position
        masked in each): where a masked-diffusion denoiser computes its predictions (module docstring)."""
        self.mask_id = mask_id

    def _forward_states(self, ids: Tensor, mask: Tensor) -> list[Tensor]:
        """One pass: [(B, L, H) of the layer asked for], or with `all_layers` every candidate layer: the token
        embeddings, the outputs of blocks 1 .. n_layers - 1 and the final output (captured with forward hooks).
        Both strands of an RC-equivariant backbone with rc_both: 2H features."""
        noise = torch.zeros(ids.shape[0], device=ids.device) if self.time_conditioned else None
        attention_mask = None if bool(mask.all()) else mask  # full rows: the fast attention path
        states = self.backbone.strand_hidden_states if self.strand_states else self.backbone.hidden_states
        if not self.all_layers:
            return [states(ids, noise, attention_mask, layer=self.layer)]
        captured: list[Tensor] = []
        modules = [self.backbone.embed, *self.backbone.blocks[:-1]]
        hooks = [m.register_forward_hook(lambda module, args, out: captured.append(out)) for m in modules]
        try:
            final = states(ids, noise, attention_mask)
        finally:
            for h in hooks:
                h.remove()
        # an RC-equivariant backbone hooks 2B rows: averaged, or side by side with rc_both
        combine = getattr(self.backbone, "pair_strands" if self.strand_states else "combine_strands", None)
        if combine is not None:
            captured = [combine(h) for h in captured]
        return [*captured, final]

    def _states(self, ids: Tensor, mask: Tensor) -> list[Tensor]:
        """`_forward_states`; with `mask_stride` K, K passes, pass j masking the real positions j, j + K, ...,
        and each position's states taken from the pass that masked it."""
        if not self.mask_stride:
            return self._forward_states(ids, mask)
        phase = torch.arange(ids.shape[1], device=ids.device) % self.mask_stride
        out: list[Tensor] = []
        for j in range(self.mask_stride):
            masked = (phase == j)[None] & mask
            states = self._forward_states(torch.where(masked, self.mask_id, ids), mask)
            pick = (phase == j)[None, :, None]
            out = states if not out else [torch.where(pick, new, old) for new, old in zip(states, out)]
        return out

    def _pooled(self, ids: Tensor, mask: Tensor, flip_back: bool = False) -> Tensor:
        """Pooled states: (B, F) of one layer, or (B, n_layers + 1, F) with `all_layers`; with `flip_back`, the
        states (and mask) are reversed along the sequence before pooling (for the reverse-complement strand,
        whose position i is the base pair L - 1 - i)."""
        pooled = [self.pool(*_flipped(h.float(), mask, flip_back)) for h in self._states(ids, mask)]
        return torch.stack(pooled, dim=1) if self.all_layers else pooled[0]

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        """(B, H); with `all_layers`, (B, n_layers + 1, H) (see `_forward_states`)."""
        pooled = self._pooled(ids, mask)
        if self.rc_average or (self.rc_both and not self.strand_states):  # RC(x) through a plain backbone
            rc_ids = self.complement_ids[ids].flip(-1)  # PAD maps to PAD, so padding moves to the left
            other = self._pooled(rc_ids, mask.flip(-1), flip_back=True)
            pooled = 0.5 * (pooled + other) if self.rc_average else torch.cat([pooled, other], dim=-1)
        return pooled.flatten(1) if self.concat_layers else pooled


@torch.no_grad()
def embed_sequences(encoder: nn.Module, tokenizer, sequences: Sequence[str], batch_size: int = 64,
                    device: str | torch.device = "cpu") -> np.ndarray:
    """(N, H) float32 embeddings ((N, n_layers + 1, H) with all_layers), in batches sorted by length."""
    encoder.eval().to(device)
    order = np.argsort([len(s) for s in sequences], kind="stable")
    out = None
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        ids, mask = encode_batch(tokenizer, [sequences[i] for i in index], getattr(encoder, "length", None))
        pooled = encoder(ids.to(device), mask.to(device)).cpu().numpy()  # (B, H) or (B, n_layers + 1, H)
        if out is None:
            out = np.zeros((len(sequences), *pooled.shape[1:]), dtype=np.float32)
        out[index] = pooled
    return out
