"""MDLM ancestral sampling: T reverse steps from the all-MASK sequence at t = 1 down to t = 0.

Each step calls the denoiser once on x_t and draws x_s ~ q(x_s | x_t, x_theta(x_t)) (Sahoo et al. 2024,
eq. 7). The time grid is uniform in t and ends at s = 0, where alpha(0) = 1 reveals every token for the
log-linear schedule; for schedules with alpha(0) < 1 a final noise-removal step fills any MASK left with
its most likely token.

Conditioning (prefix prompt or infilling at any positions): `given` (B, L) or (L,) long, -1 at free
positions and a token id where the token is given (the SEDD samplers' convention). Given positions start
unmasked; the reverse step never changes an unmasked token, so they are never changed and the denoiser sees
them as clean context at every step. With an exact denoiser this samples the exact conditional of the free
positions given the fixed ones (for any subset of positions, not only prefixes).

Decoding controls: temperature and nucleus (top-p) filtering apply to x_theta before each reveal.

Where the work goes (SUBS MDLM): a step reads x_theta only at the few positions it reveals, so the loop keeps
the denoiser's logits at the masked positions (`MaskedX0`) and makes float64 probabilities, temperature and the
nucleus filter (a sort over the vocabulary) only there. Materializing (B, L, V) float64 probabilities at every
step, as `denoise` does for the samplers that need them all, cost most of a sampling run at GPT-2's vocabulary.
The draws are the same, so the tokens are identical for the same generator (tests/test_samplers_lazy.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seqdiff.categorical import top_p_filter
from seqdiff.samplers.base import SampleOutput, Sampler


@dataclass
class MaskedX0:
    """x_theta(x_t) kept as the denoiser's SUBS logits at x_t's masked positions."""

    index: Tensor
    """(N,) flat positions b * L + i of the masked tokens, increasing."""
    logits: Tensor
    """(N, V) their logits, MASK at -inf."""

    def at(self, positions: Tensor) -> Tensor:
        """The logits at `positions` (R,), flat positions that are all in `index`: (R, V)."""
        return self.logits[torch.searchsorted(self.index, positions)]


class MDLMAncestralSampler(Sampler):
    name = "ancestral"
    methods = ("mdlm",)
    supports_top_p = True
    reads = frozenset({"steps"})
    exact = True  # the model's own discrete-time reverse process q(x_s | x_t, x_theta)

    def time_grid(self, device) -> Tensor:
        """(steps + 1,) times from 1 to 0."""
        return torch.linspace(1.0, 0.0, self.steps + 1, device=device, dtype=torch.float64)

    def denoise_fresh(self, xt: Tensor, t: Tensor) -> Tensor:
        """x_theta(x_t) as float64 (B, L, V), with temperature and the nucleus filter applied."""
        probs = self.method.denoise(self.backbone, xt, t.float(), self.temperature)
        return top_p_filter(probs, self.top_p) if self.top_p < 1.0 else probs

    def denoise(self, xt: Tensor, t: Tensor, cache: dict) -> tuple[Tensor, int]:
        """x_theta(x_t) and the number of backbone calls it took (overridden by the cached sampler)."""
        return self.denoise_fresh(xt, t), 1

    def masked_x0(self, xt: Tensor, t: Tensor, cache: dict) -> tuple[MaskedX0, int]:
        """x_theta(x_t) at the masked positions, and the backbone calls it took (the cached sampler reuses)."""
        return MaskedX0(*self.method.denoise_masked(self.backbone, xt, t.float())), 1

    @property
    def lazy(self) -> bool:
        """Whether `generate` keeps x_theta as masked-position logits (SUBS MDLM; D3PM's steps read it all)."""
        return bool(getattr(self.method, "reveals_by_position", False))

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        device, given = self.prepare(batch_size, seq_len, given)
        method = self.method
        x = self.masked_start(batch_size, seq_len, given, device)  # (B, L); given tokens stay revealed
        grid = self.time_grid(device)
        calls, cache = 0, {}
        for i in range(self.steps):
            t = grid[i].expand(batch_size)  # (B,)
            s = grid[i + 1].expand(batch_size)
            if self.lazy:
                x0, n = self.masked_x0(x, t, cache)
                x = method.reveal_step(self.probs_at(x0), x, t, s, generator)
            else:
                probs, n = self.denoise(x, t, cache)  # (B, L, V) float64
                x = method.reverse_step(probs, x, t, s, generator)
            calls += n
        if (x == method.mask_id).any():  # noise removal for schedules with alpha(0) < 1
            t = grid[-1].expand(batch_size)
            if self.lazy:
                x0, n = self.masked_x0(x, t, cache)
                x = method.fill_remaining_at(self.probs_at(x0), x)
            else:
                probs, n = self.denoise(x, t, cache)
                x = method.fill_remaining(probs, x)
            calls += n
        return SampleOutput(tokens=x, num_denoiser_calls=calls)
