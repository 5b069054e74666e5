"""Noise schedules for absorbing-state (masked) diffusion.

A schedule gives, for t in [0, 1]:
  alpha(t)       probability that a token is still clean (unmasked) at time t; alpha(0) ~ 1, alpha(1) ~ 0
  d_alpha(t)     its time derivative (<= 0)
  sigma(t)       total noise, -log alpha(t)
  nelbo_weight   -alpha'(t) / (1 - alpha(t)) >= 0, the weight of the masked cross-entropy in the
                 continuous-time NELBO of MDLM (Sahoo et al. 2024, eq. 10; the paper writes it as
                 alpha'/(1-alpha) multiplying log-probabilities, which is the same quantity).

Each schedule computes 1 - alpha(t) in closed form so that the weight stays accurate near t = 0, where
it diverges like 1/t. Schedules are stateless; the registry SCHEDULES maps names to classes.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from seqdiff.config import ConfigError


class NoiseSchedule(ABC):
    name: str

    @abstractmethod
    def alpha(self, t: Tensor) -> Tensor:
        """Probability that a token is unmasked at time t."""

    @abstractmethod
    def d_alpha(self, t: Tensor) -> Tensor:
        """d alpha / dt."""

    @abstractmethod
    def one_minus_alpha(self, t: Tensor) -> Tensor:
        """1 - alpha(t), in a form that keeps precision near t = 0."""

    def sigma(self, t: Tensor) -> Tensor:
        """Total noise -log alpha(t) (what time-conditioned backbones see)."""
        return -torch.log(self.alpha(t))

    def nelbo_weight(self, t: Tensor) -> Tensor:
        """-alpha'(t) / (1 - alpha(t)): the continuous-time NELBO weight (non-negative)."""
        return -self.d_alpha(t) / self.one_minus_alpha(t)

    def mask_probability(self, t: Tensor) -> Tensor:
        """Probability that the forward process has masked a token by time t."""
        return self.one_minus_alpha(t)


class LogLinearSchedule(NoiseSchedule):
    """alpha(t) = 1 - (1 - eps) t: the MDLM default; sigma(t) = -log(1 - (1 - eps) t)."""

    name = "loglinear"

    def __init__(self, eps: float = 1e-3):
        self.eps = eps

    def alpha(self, t: Tensor) -> Tensor:
        return 1 - (1 - self.eps) * t

    def d_alpha(self, t: Tensor) -> Tensor:
        return torch.full_like(t, -(1 - self.eps))

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return (1 - self.eps) * t

    def nelbo_weight(self, t: Tensor) -> Tensor:
        return 1 / t  # (1 - eps) / ((1 - eps) t), exactly


class _SigmaSchedule(NoiseSchedule):
    """Schedules defined through sigma(t): alpha = exp(-sigma), weight = sigma' / expm1(sigma)."""

    def __init__(self, sigma_min: float = 1e-4, sigma_max: float = 20.0):
        self.sigma_min, self.sigma_max = sigma_min, sigma_max

    @abstractmethod
    def d_sigma(self, t: Tensor) -> Tensor: ...

    def alpha(self, t: Tensor) -> Tensor:
        return torch.exp(-self.sigma(t))

    def d_alpha(self, t: Tensor) -> Tensor:
        return -self.d_sigma(t) * torch.exp(-self.sigma(t))

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return -torch.expm1(-self.sigma(t))

    def nelbo_weight(self, t: Tensor) -> Tensor:
        return self.d_sigma(t) / torch.expm1(self.sigma(t))


class LinearSchedule(_SigmaSchedule):
    """sigma(t) = sigma_min + t (sigma_max - sigma_min): linear in total noise (SEDD's "linear")."""

    name = "linear"

    def sigma(self, t: Tensor) -> Tensor:
        return self.sigma_min + t * (self.sigma_max - self.sigma_min)

    def d_sigma(self, t: Tensor) -> Tensor:
        return torch.full_like(t, self.sigma_max - self.sigma_min)


class GeometricSchedule(_SigmaSchedule):
    """sigma(t) = sigma_min^(1-t) sigma_max^t (SEDD's "geometric")."""

    name = "geometric"

    def __init__(self, sigma_min: float = 1e-4, sigma_max: float = 20.0):
        super().__init__(sigma_min, sigma_max)
        self._log_ratio = math.log(sigma_max / sigma_min)

    def sigma(self, t: Tensor) -> Tensor:
        return self.sigma_min * torch.exp(t * self._log_ratio)

    def d_sigma(self, t: Tensor) -> Tensor:
        return self.sigma(t) * self._log_ratio


class CosineSchedule(NoiseSchedule):
    """alpha(t) = eps + (1 - eps) cos(pi t / 2); 1 - alpha = (1 - eps) 2 sin^2(pi t / 4) stays exact."""

    name = "cosine"

    def __init__(self, eps: float = 1e-3):
        self.eps = eps

    def alpha(self, t: Tensor) -> Tensor:
        return self.eps + (1 - self.eps) * torch.cos(math.pi / 2 * t)

    def d_alpha(self, t: Tensor) -> Tensor:
        return -(1 - self.eps) * (math.pi / 2) * torch.sin(math.pi / 2 * t)

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return (1 - self.eps) * 2 * torch.sin(math.pi / 4 * t) ** 2


class CosineSquaredSchedule(NoiseSchedule):
    """alpha(t) = eps + (1 - eps) cos^2(pi t / 2); 1 - alpha = (1 - eps) sin^2(pi t / 2)."""

    name = "cosine2"

    def __init__(self, eps: float = 1e-3):
        self.eps = eps

    def alpha(self, t: Tensor) -> Tensor:
        return self.eps + (1 - self.eps) * torch.cos(math.pi / 2 * t) ** 2

    def d_alpha(self, t: Tensor) -> Tensor:
        return -(1 - self.eps) * (math.pi / 2) * torch.sin(math.pi * t)

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return (1 - self.eps) * torch.sin(math.pi / 2 * t) ** 2


SCHEDULES: dict[str, type[NoiseSchedule]] = {
    cls.name: cls
    for cls in (LogLinearSchedule, LinearSchedule, GeometricSchedule, CosineSchedule, CosineSquaredSchedule)
}


def build_schedule(name: str) -> NoiseSchedule:
    if name not in SCHEDULES:
        raise ConfigError(f"method.schedule={name!r} is unknown; choose one of {sorted(SCHEDULES)}")
    return SCHEDULES[name]()


TIME_SAMPLINGS = ("antithetic_jitter", "antithetic", "uniform")
"""The time samplers of unit_times: per-stratum jitter, one shared offset over the strata, or i.i.d. uniform.
(method.time_sampling also takes mask_count, MDLM's draw of a number of masked tokens: seqdiff.methods.mdlm.)"""
AUTO_TIMES = "antithetic"
"""What method.time_sampling=auto draws where a method draws times (mdlm's own choice: MDLM.resolve_time_sampling)."""


def resolved_time_sampling(time_sampling: str) -> str:
    """method.time_sampling for a method that draws times: auto is AUTO_TIMES, any other name itself."""
    return AUTO_TIMES if time_sampling == "auto" else time_sampling


def unit_times(batch_size: int, time_sampling: str, generator: torch.Generator | None = None,
               device: torch.device | str | None = None) -> Tensor:
    """(B,) draws in [0, 1), one per row; methods map them to their times.

    antithetic_jitter: stratum i holds (u_i + i) / B with B independent u_i (stratified_times).
    antithetic:        the strata share one offset, (u + i / B) mod 1 (antithetic_times).
    uniform:           B i.i.d. uniforms.
    Each gives every row the uniform marginal on [0, 1), so each NELBO estimate is unbiased; they differ
    only in how the rows' times are coupled, hence in the variance of the batch mean.
    """
    if time_sampling == "antithetic_jitter":
        return stratified_times(batch_size, generator, device)
    if time_sampling == "antithetic":
        return antithetic_times(batch_size, generator, device, t_min=0.0)
    if time_sampling == "uniform":
        return torch.rand(batch_size, generator=generator, device=device)
    raise ValueError(f"time_sampling={time_sampling!r}; choose one of {list(TIME_SAMPLINGS)}")


def stratified_times(batch_size: int, generator: torch.Generator | None = None,
                     device: torch.device | str | None = None) -> Tensor:
    """Per-stratum jitter: t_i = (u_i + i) / B with independent u_i ~ U[0, 1), row i in stratum i.

    The MDLM reference's form. Row i alone is uniform on [i/B, (i+1)/B), and a row of a randomly ordered
    batch is uniform on [0, 1). For a smooth integrand f the variance of the batch mean is
    sum_i Var(f | stratum i) / B^2 = O(1/B^3), against O(1/B^2) for one shared offset (whose B times move
    together, so a non-periodic f keeps a first-order term) and 1/B for i.i.d. draws.
    """
    u = torch.rand(batch_size, generator=generator, device=device, dtype=torch.float64)  # (B,)
    t = (u + torch.arange(batch_size, device=device, dtype=torch.float64)) / batch_size
    return t.clamp(max=1.0 - 2.0**-24).float()  # float32 rounding must not reach 1 (the draw is in [0, 1))


def antithetic_times(batch_size: int, generator: torch.Generator | None = None,
                     device: torch.device | str | None = None, t_min: float = 1e-3) -> Tensor:
    """Low-discrepancy times: one uniform offset shared by B evenly spaced strata, t = (u + i/B) mod 1.

    Each stratum [i/B, (i+1)/B) holds exactly one sample, which lowers the variance of the NELBO estimate
    (Kingma et al. 2021). Times are then mapped to [t_min, 1] to keep away from the t = 0 singularity.
    """
    u = torch.rand((), generator=generator, device=device, dtype=torch.float64)
    t = (u + torch.arange(batch_size, device=device, dtype=torch.float64) / batch_size) % 1.0
    return (t_min + (1 - t_min) * t).float()
