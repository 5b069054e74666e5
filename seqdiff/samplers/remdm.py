"""ReMDM: remasking of already decoded tokens during MDLM sampling (Wang, Schiff, Sahoo & Kuleshov 2025,
"Remasking discrete diffusion models with inference-time scaling", arXiv 2503.00307, section 3).

The reverse step from t to s (alpha_t < alpha_s) is replaced by a family of posteriors with the same marginals
q(x_s | x_0) as the forward process, indexed by a remasking probability sigma in [0, sigma_max],
sigma_max = min(1, (1 - alpha_s) / alpha_t):

    decoded token x_t = v:  x_s = MASK with probability sigma, else x_s = v;
    masked token:           revealed with probability (alpha_s - (1 - sigma) alpha_t) / (1 - alpha_t), to a token
                            drawn from x_theta; else it stays MASK (probability (1 - alpha_s - sigma alpha_t) /
                            (1 - alpha_t) >= 0 exactly when sigma <= sigma_max).

A position masked with probability 1 - alpha_t before the step is masked with probability
alpha_t sigma + (1 - alpha_s - sigma alpha_t) = 1 - alpha_s after it, whatever sigma (tested); sigma = 0 is the
MDLM ancestral step, and the sampler then draws exactly the ancestral sampler's tokens for the same generator
(one float64 uniform per position decides reveal or remask, then one categorical per revealed token -- the
ancestral sampler's draws). The schedules of sigma (`schedule`, with `eta`):

- cap:      sigma_t = min(eta, sigma_max)                     (eta in [0, 1])
- rescale:  sigma_t = eta sigma_max                           (eta in [0, 1])
- conf:     sigma_t^l = eta sigma_max softmax_l(-c_l) over the decoded positions l, c_l = x_theta's
            probability of the token when it was decoded: the least confident tokens are remasked first. Masked
            positions reveal at the MDLM rate (their sigma is 0), as in the reference code (so the marginal
            identity holds only approximately here: expected remasks per step are at most eta sigma_max). The
            reference code's conf has no eta (eta = 1 here).
- loop:     alpha is remapped: linear from 0 at t = 1 to alpha_on at t_on, held at alpha_on on [t_off, t_on],
            then linear to 1 at t = 0. Outside the band the steps are MDLM steps with that alpha; inside it
            alpha_s = alpha_t = alpha_on and sigma = eta: each step remasks decoded tokens with probability eta and
            reveals masked ones with probability eta alpha_on / (1 - alpha_on), so the expected number of masks
            stays L (1 - alpha_on) (tested). Needs eta <= (1 - alpha_on) / alpha_on. A step that straddles t_on or
            t_off is a plain MDLM step. Time-conditioned models see the time at which the model's own schedule
            has the remapped alpha (the reference passes the unmapped t; where they differ, ours is the one the
            denoiser was trained on).

Approximate: with a learned denoiser these are not the model's own reverse process (only with an exact
denoiser do they share its marginals). Given (prompt / infill) positions are never remasked. Temperature and
top-p apply to x_theta as in the ancestral sampler. Needs SUBS. No caching: remasking changes x_t at almost
every step, so every step calls the denoiser. `trace` keeps (t, mean masked fraction) after every step of the
last reverse process (the last `generate` call; under BD3-LM its last block).

Inside the blocks of BD3-LM (`reverse_process`, driven by seqdiff.samplers.bd3lm as `bd3lm_remdm`) each block runs
the same `steps` ReMDM steps over its own tokens; the block's given tokens are never remasked, and the clean prefix
(earlier blocks) is never remasked either: the block loop commits a block before the next one starts.
"""

from __future__ import annotations

import typing
from collections.abc import Callable

import torch
from torch import Tensor

from seqdiff.categorical import sample_categorical
from seqdiff.config import SampleConfig
from seqdiff.samplers.base import Denoiser, SampleOutput, SamplerError
from seqdiff.samplers.mdlm_ancestral import MDLMAncestralSampler
from seqdiff.samplers.mdlm_first_hitting import time_of_mask_probability

REMDM_SCHEDULES: tuple[str, ...] = typing.get_args(typing.get_type_hints(SampleConfig)["remdm_schedule"])
"""cap, rescale, conf, loop: the config's Literal is the one list."""


def sigma_max(a_t: Tensor, a_s: Tensor) -> Tensor:
    """min(1, (1 - alpha_s) / alpha_t), the largest remasking probability that keeps the marginals."""
    return torch.where(a_t > 0, ((1 - a_s) / a_t.clamp(min=1e-300)).clamp(max=1.0), torch.ones_like(a_t))


def loop_alpha(t: Tensor, t_on: float, t_off: float, alpha_on: float) -> Tensor:
    """ReMDM-loop's alpha(t): 0 -> alpha_on on [t_on, 1], alpha_on on [t_off, t_on], alpha_on -> 1 on [0, t_off]."""
    t = t.double()
    early = (1 - t) * alpha_on / (1 - t_on)
    late = 1 - t * (1 - alpha_on) / t_off
    return torch.where(t >= t_on, early, torch.where(t <= t_off, late, torch.full_like(t, alpha_on)))


def loop_band_steps(steps: int, t_on: float, t_off: float) -> int:
    """How many steps of the uniform grid lie wholly inside the loop band [t_off, t_on]."""
    grid = torch.linspace(1.0, 0.0, steps + 1, dtype=torch.float64)
    return int(((grid[:-1] <= t_on) & (grid[1:] >= t_off)).sum())


class ReMDMSampler(MDLMAncestralSampler):
    name = "remdm"
    reads = frozenset({"steps", "remdm_schedule", "remdm_eta", "remdm_t_on", "remdm_t_off", "remdm_alpha_on"})
    block_methods = ("bd3lm",)
    exact = False  # remasking posteriors share the marginals of an exact denoiser, not a learned one's process

    def __init__(self, method, backbone, steps: int = 128, temperature: float = 1.0, top_p: float = 1.0,
                 schedule: str = "cap", eta: float = 0.02, t_on: float = 0.55, t_off: float = 0.05,
                 alpha_on: float = 0.9):
        self.schedule, self.eta, self.t_on, self.t_off, self.alpha_on = schedule, eta, t_on, t_off, alpha_on
        self.trace: list[tuple[float, float]] = []
        super().__init__(method, backbone, steps=steps, temperature=temperature, top_p=top_p)
        check_remdm_options(schedule, eta, t_on, t_off, alpha_on, steps)

    def check_compatible(self) -> None:
        if not getattr(self.method, "subs", True):
            raise SamplerError("--sampler remdm needs a SUBS model (method.subs=true)")

    @classmethod
    def options_from_config(cls, cfg) -> dict:
        return {"schedule": cfg.remdm_schedule, "eta": cfg.remdm_eta, "t_on": cfg.remdm_t_on,
                "t_off": cfg.remdm_t_off, "alpha_on": cfg.remdm_alpha_on}

    def alphas(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(alpha(t), 1 - alpha(t), the time the denoiser is told) for (B,) float64 times."""
        sched = self.method.schedule
        if self.schedule != "loop":
            return sched.alpha(t), sched.one_minus_alpha(t), t
        a = loop_alpha(t, self.t_on, self.t_off, self.alpha_on)
        lo, hi = sched.one_minus_alpha(torch.zeros_like(t)), sched.one_minus_alpha(torch.ones_like(t))
        return a, 1 - a, time_of_mask_probability(sched, torch.minimum(torch.maximum(1 - a, lo), hi))

    def sigmas(self, t: Tensor, s: Tensor, a_t: Tensor, a_s: Tensor, decoded: Tensor, conf: Tensor
               ) -> tuple[Tensor, Tensor]:
        """Remasking probabilities (B, L) of decoded positions and (B, 1) of masked ones (their reveal rate)."""
        B = a_t.shape[0]
        cap = sigma_max(a_t, a_s)[:, None]  # (B, 1)
        if self.schedule == "cap":
            sig = torch.minimum(torch.full_like(cap, self.eta), cap)
        elif self.schedule == "rescale":
            sig = self.eta * cap
        elif self.schedule == "conf":
            logits = torch.where(decoded, -conf, torch.full_like(conf, float("-inf")))  # (B, L)
            any_decoded = decoded.any(-1, keepdim=True)
            share = torch.where(any_decoded, torch.softmax(torch.where(any_decoded, logits, 0.0), -1), 0.0)
            return self.eta * cap * share, torch.zeros((B, 1), dtype=torch.float64, device=a_t.device)
        else:  # loop: remask only in steps wholly inside [t_off, t_on], where alpha is flat
            band = ((t <= self.t_on) & (s >= self.t_off))[:, None]
            sig = torch.where(band, torch.full_like(cap, self.eta), torch.zeros_like(cap))
        return sig.expand_as(conf), sig

    def step(self, probs_at: Callable[[Tensor], Tensor], x: Tensor, fixed: Tensor, conf: Tensor, t: Tensor,
             s: Tensor, generator: torch.Generator | None) -> Tensor:
        """x_s from x_t (B, L) under the ReMDM posterior; updates `conf` (B, L) in place for revealed tokens.
        `probs_at`: flat positions (R,) -> x_theta's float64 probabilities there (R, V), asked only where the step
        reveals (as the MDLM ancestral sampler does; the nucleus filter's sort runs at those rows only)."""
        mask_id = self.method.mask_id
        a_t, one_minus_a_t, _ = self.alphas(t)
        a_s, _, _ = self.alphas(s)
        masked = x == mask_id
        decoded = ~masked & ~fixed
        sig_decoded, sig_masked = self.sigmas(t, s, a_t, a_s, decoded, conf)
        # the ancestral step's reveal probability when sigma = 0 (the same expression, so the same bits)
        reveal_p = ((a_s[:, None] - (1 - sig_masked) * a_t[:, None]) / one_minus_a_t[:, None]).clamp(0, 1)
        u = torch.rand(x.shape, generator=generator, device=x.device, dtype=torch.float64)  # one per position
        reveal = masked & (u < reveal_p)
        remask = decoded & (u < sig_decoded)
        xs = x.clone()
        if reveal.any():
            at = probs_at(reveal.flatten().nonzero()[:, 0])  # (R, V), row-major: the order of xs[reveal]
            drawn = sample_categorical(at, generator)
            xs[reveal] = drawn
            conf[reveal] = at.gather(-1, drawn[:, None])[:, 0]
        xs[remask] = mask_id
        return xs

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        return self.reverse_from_masks(batch_size, seq_len, generator, given)

    @torch.no_grad()
    def reverse_process(self, x: Tensor, denoise: Denoiser, generator: torch.Generator | None) -> tuple[Tensor, int]:
        """`steps` ReMDM steps on x (B, n) from t = 1; its tokens already revealed are given: never remasked."""
        method = self.method
        B = x.shape[0]
        fixed = x != method.mask_id  # (B, n) given (prompt / infill) positions
        conf = torch.zeros(x.shape, dtype=torch.float64, device=x.device)  # (B, n) confidence at decoding
        grid = self.time_grid(x.device)
        self.trace = []
        for i in range(self.steps):
            t = grid[i].expand(B)  # (B,)
            s = grid[i + 1].expand(B)
            x = self.step(self.probs_at(denoise(x, self.alphas(t)[2], None)), x, fixed, conf, t, s, generator)
            self.trace.append((float(grid[i + 1]), float((x == method.mask_id).double().mean())))
        calls = self.steps
        if (x == method.mask_id).any():  # noise removal for schedules with alpha(0) < 1
            calls += 1
            x = method.fill_remaining_at(self.probs_at(denoise(x, grid[-1].expand(B), None)), x)
        return x, calls

    def stats(self) -> dict:
        """The remasking schedule and its parameters, for the sample command and the reports."""
        out = {"remdm_schedule": self.schedule, "remdm_eta": self.eta}
        if self.schedule == "loop":
            out.update(remdm_t_on=self.t_on, remdm_t_off=self.t_off, remdm_alpha_on=self.alpha_on)
        return out


def check_remdm_options(schedule: str, eta: float, t_on: float, t_off: float, alpha_on: float, steps: int) -> None:
    """Refuse ReMDM options outside their ranges, one message naming the flag and what is allowed."""
    if schedule not in REMDM_SCHEDULES:
        raise SamplerError(f"--remdm-schedule (sample.remdm_schedule)={schedule!r} is unknown; choose one of "
                           f"{list(REMDM_SCHEDULES)}")
    if not 0.0 <= eta <= 1.0:
        raise SamplerError(f"--remdm-eta (sample.remdm_eta)={eta} must lie in [0, 1]")
    if schedule != "loop":
        return
    if not 0.0 < t_off < t_on < 1.0:
        raise SamplerError(f"--remdm-t-off / --remdm-t-on (sample.remdm_t_off, sample.remdm_t_on) = {t_off}, {t_on}: "
                           "the loop band needs 0 < t_off < t_on < 1")
    if not 0.0 < alpha_on < 1.0:
        raise SamplerError(f"--remdm-alpha-on (sample.remdm_alpha_on)={alpha_on} must lie in (0, 1)")
    bound = min(1.0, (1 - alpha_on) / alpha_on)
    if eta > bound:
        raise SamplerError(f"--remdm-eta (sample.remdm_eta)={eta} is too large for the loop with alpha_on={alpha_on}: "
                           f"allowed [0, {bound:.4g}] (= min(1, (1 - alpha_on) / alpha_on))")
    if loop_band_steps(steps, t_on, t_off) < 1:
        need = next(n for n in range(1, 100_000) if loop_band_steps(n, t_on, t_off) >= 1)
        raise SamplerError(f"--steps (sample.steps)={steps} leaves no step inside the loop band [{t_off}, {t_on}]: "
                           f"--sampler remdm --remdm-schedule loop needs --steps >= {need}")
