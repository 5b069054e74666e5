"""Cached MDLM sampler: skip the denoiser while x_t has not changed (Sahoo et al. 2024, section 4.2).

Without time conditioning the SUBS denoiser x_theta(x_t) depends on x_t alone, so when a reverse step
reveals no token in a row, the previous output is still exact for that row: only rows that changed are
recomputed. With many steps (steps >= length) most steps reveal nothing and most calls are skipped. The
random draws are the same as the ancestral sampler's, so both give identical tokens for the same generator
(with or without `given` conditioning, which the ancestral sampler implements and this one inherits).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.samplers.base import SamplerError
from seqdiff.samplers.mdlm_ancestral import MaskedX0, MDLMAncestralSampler


class MDLMCachedSampler(MDLMAncestralSampler):
    name = "cached"
    reads = frozenset({"steps"})
    exact = True  # the ancestral sampler's draws, the same tokens

    def check_compatible(self) -> None:
        if getattr(self.backbone.config, "time_conditioning", False):
            raise SamplerError(
                "the cached sampler needs a model without time conditioning (its denoiser output changes with t "
                "even when x_t does not); use sample.sampler=ancestral for this checkpoint"
            )

    def denoise(self, xt: Tensor, t: Tensor, cache: dict) -> tuple[Tensor, int]:
        prev_x, prev_probs = cache.get("x"), cache.get("probs")
        if prev_x is None:
            probs = self.denoise_fresh(xt, t)
            calls = 1
        else:
            changed = (xt != prev_x).any(dim=-1)  # (B,) rows where a token was revealed
            probs, calls = prev_probs, 0
            if changed.any():
                probs = prev_probs.clone()
                probs[changed] = self.denoise_fresh(xt[changed], t[changed])
                calls = 1
        cache["x"], cache["probs"] = xt, probs
        return probs, calls

    def masked_x0(self, xt: Tensor, t: Tensor, cache: dict) -> tuple[MaskedX0, int]:
        """`denoise`'s reuse for the masked-position logits: rows that revealed nothing keep theirs (their masked
        positions are the same), changed rows are recomputed in one call."""
        prev_x, prev = cache.get("x"), cache.get("x0")
        changed = None if prev_x is None else (xt != prev_x).any(dim=-1)  # (B,)
        if changed is None or changed.all():
            x0, calls = MaskedX0(*self.method.denoise_masked(self.backbone, xt, t.float())), 1
        elif not changed.any():
            x0, calls = prev, 0
        else:
            x0, calls = self._merge(xt, t, changed, prev), 1
        cache["x"], cache["x0"] = xt, x0
        return x0, calls

    def _merge(self, xt: Tensor, t: Tensor, changed: Tensor, prev: MaskedX0) -> MaskedX0:
        """The changed rows' logits fresh (one call on those rows), the others' from `prev`, in position order."""
        B, L = xt.shape
        rows = changed.nonzero()[:, 0]  # (b,) the changed rows, increasing
        fresh = MaskedX0(*self.method.denoise_masked(self.backbone, xt[rows], t[rows].float()))
        index = (xt == self.method.mask_id).flatten().nonzero()[:, 0]  # (N,) every masked position now
        row_of = index // L
        from_fresh = changed[row_of]  # (N,)
        logits = torch.empty((len(index), fresh.logits.shape[-1]), dtype=fresh.logits.dtype, device=xt.device)
        logits[~from_fresh] = prev.at(index[~from_fresh]).to(logits.dtype)
        rank = torch.cumsum(changed, 0) - 1  # (B,) a changed row's place among the changed rows
        logits[from_fresh] = fresh.at(rank[row_of[from_fresh]] * L + index[from_fresh] % L)
        return MaskedX0(index, logits)

