"""SEDD analytic sampling: Tweedie tau-leaping (Lou et al. 2024, section 4).

From the base distribution at t = 1 (all MASK, or uniform tokens) down to t = 0 on a uniform time grid. A step
from total noise sigma_t to sigma_s changes each position independently (tau-leaping) with the probabilities
that would be exact for a single token given the true score:

    p(x_s = y | x_t) ∝ [exp(-(sigma_t - sigma_s) Q) s_theta(x_t, sigma_t)]_y * exp((sigma_t - sigma_s) Q)[x_t, y]

(closed forms per graph in seqdiff.methods.graphs). The last step goes to the data: on the absorbing graph it
leaves no MASK (its MASK probability is set to zero, SEDD's final denoising step). For data whose positions
are independent the step is exact, so the sampler reproduces such data for any number of steps.

Conditioning (prefix or any positions): `given` (B, L) or (L,) long, -1 at free positions and a token id
where the token is given. Given tokens are written before the first step and after every step, so they are
never changed and the score model sees them as clean context at every noise level.

Every draw is a float64 categorical through the generator passed to `generate`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.categorical import sample_categorical
from seqdiff.config import ConfigError
from seqdiff.samplers.base import SampleOutput, Sampler, SamplerError


class SEDDAnalyticSampler(Sampler):
    name = "analytic"
    methods = ("sedd",)
    reads = frozenset({"steps"})
    exact = False  # tau-leaping: positions move independently within a step (exact only for independent data)

    def check_compatible(self) -> None:
        try:
            self.method.check_backbone(self.backbone)
        except ConfigError as e:
            raise SamplerError(str(e)) from e
        if self.temperature != 1.0:
            raise SamplerError(f"sample.temperature={self.temperature}: the SEDD samplers only sample at temperature 1")

    def time_grid(self, device) -> Tensor:
        """(steps + 1,) float64 times from 1 to 0."""
        return torch.linspace(1.0, 0.0, self.steps + 1, device=device, dtype=torch.float64)

    def step_probs(self, log_score: Tensor, x: Tensor, t: Tensor, s: Tensor, final: bool) -> Tensor:
        """Unnormalized float64 (B, L, V) probabilities of x_s given x_t."""
        method = self.method
        return method.graph.tweedie_probs(log_score, x, method.sigma(t), method.sigma(s), final=final)

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        device, given = self.prepare(batch_size, seq_len, given)
        method = self.method
        fixed = None if given is None else given >= 0  # (B, L)
        x = method.graph.sample_limit((batch_size, seq_len), generator, device)  # (B, L)
        if fixed is not None:
            x = torch.where(fixed, given, x)
        grid = self.time_grid(device)
        for i in range(self.steps):
            t = grid[i].expand(batch_size)  # (B,)
            s = grid[i + 1].expand(batch_size)
            log_score = method.log_score(self.backbone, x, t)  # (B, L, V) float64
            probs = self.step_probs(log_score, x, t, s, final=i == self.steps - 1)
            if method.never_sampled:  # generating without specials that have no place (Method.sampling_without)
                probs = probs.index_fill(-1, torch.tensor(method.never_sampled, device=probs.device), 0.0)
            x = sample_categorical(probs, generator)
            if fixed is not None:
                x = torch.where(fixed, given, x)
        return SampleOutput(tokens=x, num_denoiser_calls=self.steps)
