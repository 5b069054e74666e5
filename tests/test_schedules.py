import math

import pytest
import torch

from seqdiff.config import ConfigError
from seqdiff.schedules import SCHEDULES, LogLinearSchedule, antithetic_times, build_schedule


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_derivative_matches_autograd(name):
    sched = SCHEDULES[name]()
    t = torch.linspace(0.01, 0.99, 50, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(sched.alpha(t).sum(), t)
    torch.testing.assert_close(sched.d_alpha(t.detach()), grad, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_endpoints_and_consistency(name):
    sched = SCHEDULES[name]()
    t = torch.linspace(0.0, 1.0, 101, dtype=torch.float64)
    a = sched.alpha(t)
    assert abs(a[0].item() - 1) < 1e-3 and a[-1].item() <= 1.001e-3
    assert torch.all(a[1:] <= a[:-1]), "alpha must decrease"
    torch.testing.assert_close(sched.one_minus_alpha(t), 1 - a, rtol=1e-9, atol=1e-12)
    tt = t[1:-1]
    torch.testing.assert_close(sched.sigma(tt), -torch.log(sched.alpha(tt)), rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(sched.nelbo_weight(tt), -sched.d_alpha(tt) / (1 - sched.alpha(tt)), rtol=1e-6, atol=0)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_weight_accurate_near_zero(name):
    """Near t = 0 the naive 1 - alpha loses digits in float32; the schedule's own form must not."""
    sched = SCHEDULES[name]()
    t32 = torch.tensor([1e-6, 1e-5, 1e-4], dtype=torch.float32)
    ref = sched.nelbo_weight(t32.double())
    torch.testing.assert_close(sched.nelbo_weight(t32).double(), ref, rtol=1e-4, atol=0)


def test_loglinear_closed_form():
    sched = LogLinearSchedule(eps=1e-3)
    t = torch.tensor([0.25, 0.5, 1.0], dtype=torch.float64)
    torch.testing.assert_close(sched.alpha(t), 1 - 0.999 * t)
    torch.testing.assert_close(sched.nelbo_weight(t), 1 / t)
    torch.testing.assert_close(sched.sigma(t), -torch.log1p(-0.999 * t))


def test_antithetic_covers_strata():
    g = torch.Generator().manual_seed(0)
    for B in (1, 7, 64):
        t = antithetic_times(B, g, t_min=0.0).double()
        strata = torch.floor(t * B).long().sort().values
        assert torch.equal(strata, torch.arange(B)), "each stratum must hold exactly one time"
    t = antithetic_times(1000, g, t_min=1e-3)
    assert t.min() >= 1e-3 and t.max() <= 1.0
    assert abs(t.mean().item() - 0.5) < 2e-3  # antithetic: the mean is nearly exact


def test_unknown_schedule():
    with pytest.raises(ConfigError, match="loglinear"):
        build_schedule("nope")


def test_integral_of_weight_times_mask_probability():
    """int_0^1 w(t) (1 - alpha(t)) dt = alpha(0) - alpha(1): the NELBO of a perfect marginal denoiser."""
    for name, cls in SCHEDULES.items():
        sched = cls()
        n = 200_000
        t = (torch.arange(n, dtype=torch.float64) + 0.5) / n  # midpoint rule
        integral = (sched.nelbo_weight(t) * sched.one_minus_alpha(t)).mean().item()
        ends = sched.alpha(torch.tensor([0.0, 1.0], dtype=torch.float64))
        exact = (ends[0] - ends[1]).item()
        assert math.isclose(integral, exact, rel_tol=1e-4), name
