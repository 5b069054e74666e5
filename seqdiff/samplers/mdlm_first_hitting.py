"""First-hitting MDLM sampler: one denoiser call per revealed token, at the exact time of the reveal
(Zheng et al., ICLR 2025, "Masked diffusion models are secretly time-agnostic masked models and exploit
inaccurate categorical sampling", section 4.1).

In the continuous-time reverse process of a masked diffusion, each token still masked at time t was masked
at a time tau <= t of the forward process, with P(tau <= s | tau <= t) = (1 - alpha_s) / (1 - alpha_t); the n
masked tokens of a row are independent. The next reveal (going backward) is the latest of those n times:

    P(next reveal <= s) = ((1 - alpha_s) / (1 - alpha_t))^n   =>   1 - alpha_s = (1 - alpha_t) u^(1/n), u ~ U(0, 1),

which for the log-linear schedule (1 - alpha_t = (1 - eps) t) is s = t u^(1/n). Which token it is, is uniform
over the n masked positions (they are exchangeable), and its value is drawn from x_theta(x_t, s) at that
position -- the limit of the ancestral sampler's reveal in an infinitesimal step. So the sampler draws the
model's continuous-time reverse process exactly, with no time discretization at all: its law is the limit of
the ancestral sampler's as steps grow (tested), and its cost is one call per masked token whatever `steps`
says (`steps` is ignored). Time-agnostic (not time-conditioned) models do not even need the times; they are
drawn anyway so that time-conditioned models get the right noise level.

Schedules other than the log-linear one invert 1 - alpha by bisection in float64 (every schedule's 1 - alpha is
increasing in t). With alpha(0) < 1 a token may stay masked down to t = 0 (its forward masking time is an atom
at 0): when the drawn 1 - alpha_s falls below 1 - alpha(0), the row's remaining tokens are filled by the final
noise-removal step, as in the ancestral sampler.

All draws are float64 through the caller's generator: per event a (B,) uniform for the time, a (B, L) uniform
for the position and a categorical for the token. Rows advance together (one batched call per event); a row
with fewer masked tokens (different `given`) idles once it is done. Conditioning: `given` as in the ancestral
sampler (given tokens start revealed and are never touched). Temperature and top-p apply to x_theta before each
reveal (then the sampler is exact for the tempered model). Needs SUBS (zero MASK probability: without it, the
model's own MASK mass changes the reveal rate, which this construction does not account for).

Inside the blocks of BD3-LM (`reverse_process`, driven by seqdiff.samplers.bd3lm as `bd3lm_first_hitting`) each
block is the same process from t = 1 over the block's masked tokens, its denoiser reading the block after the
clean prefix: each block's conditional is drawn exactly, so the sequence is drawn from the model exactly too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.categorical import probs_from_logits, sample_categorical
from seqdiff.samplers.base import Denoiser, SampleOutput, Sampler, SamplerError
from seqdiff.schedules import LogLinearSchedule, NoiseSchedule


def time_of_mask_probability(schedule: NoiseSchedule, p: Tensor, iters: int = 60) -> Tensor:
    """t with 1 - alpha(t) = p (float64), for p in [1 - alpha(0), 1 - alpha(1)]: closed form for the log-linear
    schedule, bisection (to 2^-iters) for the others."""
    p = p.double()
    if isinstance(schedule, LogLinearSchedule):
        return (p / (1 - schedule.eps)).clamp(0.0, 1.0)
    lo, hi = torch.zeros_like(p), torch.ones_like(p)
    for _ in range(iters):
        mid = (lo + hi) / 2
        below = schedule.one_minus_alpha(mid) < p
        lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
    return (lo + hi) / 2


class MDLMFirstHittingSampler(Sampler):
    name = "first_hitting"
    methods = ("mdlm",)
    supports_top_p = True
    reads = frozenset()  # one denoiser call per reveal, at random times: `steps` sets nothing
    block_methods = ("bd3lm",)
    exact = True  # the continuous-time reverse process itself, no discretization

    def check_compatible(self) -> None:
        if not getattr(self.method, "subs", True):
            raise SamplerError("--sampler first_hitting needs a SUBS model (method.subs=true): without SUBS the "
                               "model's MASK probability changes the reveal times")

    def next_times(self, t: Tensor, n: Tensor, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """(B,) float64 times of the next reveal for rows at time t with n masked tokens, and a (B,) bool: the
        reveal falls below t = 0 (only for schedules with alpha(0) < 1; the row goes to noise removal)."""
        schedule = self.method.schedule
        u = 1 - torch.rand(t.shape, generator=generator, device=t.device, dtype=torch.float64)  # (0, 1]: log u finite
        # 1 - alpha_s = (1 - alpha_t) u^(1/n), in log space (u^(1/n) underflows nowhere for n <= L)
        p = schedule.one_minus_alpha(t) * torch.exp(torch.log(u) / n.clamp(min=1).double())
        floor = schedule.one_minus_alpha(torch.zeros_like(t))
        return time_of_mask_probability(schedule, torch.maximum(p, floor)), p <= floor

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        return self.reverse_from_masks(batch_size, seq_len, generator, given)

    @torch.no_grad()
    def reverse_process(self, x: Tensor, denoise: Denoiser, generator: torch.Generator | None) -> tuple[Tensor, int]:
        """The first-hitting process on x (B, n) from t = 1 (its MASK positions free): one call per reveal event."""
        method = self.method
        B, n_pos = x.shape
        t = torch.ones(B, dtype=torch.float64, device=x.device)  # (B,) each row's current time
        done = torch.zeros(B, dtype=torch.bool, device=x.device)  # rows past t = 0 (noise removal left)
        calls = 0
        while True:
            masked = x == method.mask_id  # (B, n)
            n = masked.sum(-1)  # (B,)
            active = (n > 0) & ~done
            if not active.any():
                break
            s, below_zero = self.next_times(t, n, generator)
            done |= active & below_zero
            active &= ~below_zero
            # which masked position: the argmax of uniforms over masked positions (uniform, float64)
            u = torch.rand((B, n_pos), generator=generator, device=x.device, dtype=torch.float64)
            pos = torch.where(masked, u, torch.full_like(u, -1.0)).argmax(-1)  # (B,)
            if not active.any():
                continue
            t = torch.where(active, s, t)
            rows = active.nonzero().flatten()
            logits = denoise(x[rows], t[rows], None if active.all() else active)  # (b, n, V): one call per event
            at = logits[torch.arange(len(rows), device=x.device), pos[rows]]  # (b, V)
            calls += 1
            x = x.clone()
            x[rows, pos[rows]] = sample_categorical(probs_from_logits(at, self.temperature, self.top_p), generator)
        if (x == method.mask_id).any():  # alpha(0) < 1: final noise removal at t = 0
            zero = torch.zeros(B, dtype=torch.float64, device=x.device)
            probs = probs_from_logits(denoise(x, zero, None), self.temperature)
            calls += 1
            x = method.fill_remaining(probs, x)
        return x, calls
