"""Cached MDLM sampler: skip the denoiser while x_t has not changed (Sahoo et al. 2024, section 4.2).

Without time conditioning the SUBS denoiser x_theta(x_t) depends on x_t alone, so when a reverse step
reveals no token in a row, the previous output is still exact for that row: only rows that changed are
recomputed. With many steps (steps >= length) most steps reveal nothing and most calls are skipped. The
random draws are the same as the ancestral sampler's, so both give identical tokens for the same generator
(with or without `given` conditioning, which the ancestral sampler implements and this one inherits).
"""

from __future__ import annotations

from torch import Tensor

from seqdiff.samplers.base import SamplerError
from seqdiff.samplers.mdlm_ancestral import MDLMAncestralSampler


class MDLMCachedSampler(MDLMAncestralSampler):
    name = "cached"
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
