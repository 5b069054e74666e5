"""experiments.mask_count_moments: the per-row second moments of mask_count's laws and of the time-based
`antithetic` draw, computed from m2(k), against brute force over every masked set of a tiny row."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import integrate

from experiments.mask_count_moments import antithetic_second_moment, gains


def _row(n: int, seed: int = 0) -> np.ndarray:
    """Per-token gradient vectors (n, 3) that do not depend on the context: enough to check the bookkeeping."""
    return np.random.default_rng(seed).normal(size=(n, 3)) + np.array([0.5, 0.0, -0.2])


def _m2(g: np.ndarray) -> list[float]:
    """m2(k) = E||(n / k) sum_{i in S} g_i / n||^2 over the uniform k-subsets S, k = 1..n, enumerated."""
    n = len(g)
    return [float(np.mean([np.sum(g[list(s)].sum(0) ** 2) / k ** 2 for s in itertools.combinations(range(n), k)]))
            for k in range(1, n + 1)]


@pytest.mark.parametrize("n, t_min", [(4, 1e-3), (5, 0.05)])
def test_antithetic_second_moment_against_every_masked_set(n, t_min):
    """Time t ~ U[t_min, 1], every token masked with probability t, estimate (1 / t) sum_masked g_i / n:
    its second moment by quadrature over every subset, against the formula in k and m2(k)."""
    g = _row(n)

    def integrand(t: float) -> float:
        total = 0.0
        for bits in itertools.product((0, 1), repeat=n):
            k = sum(bits)
            estimate = (g * np.array(bits)[:, None]).sum(0) / (n * t)
            total += t ** k * (1 - t) ** (n - k) * float(np.sum(estimate ** 2))
        return total / (1 - t_min)

    brute = integrate.quad(integrand, t_min, 1, points=[0.01, 0.1], limit=200, epsabs=0, epsrel=1e-10)[0]
    assert antithetic_second_moment(np.array(_m2(g)), t_min) == pytest.approx(brute, rel=1e-6)


def test_gains_against_enumerated_laws():
    """The second moments for k uniform, k ~ q ∝ k^(-1/2) and the optimal q, with the weight 1 / (n q(k)) that keeps
    each unbiased, against their sums over k and the enumerated subsets; the optimal q is no worse than the others,
    and the ratios are the quotients of the variances."""
    n = 5
    g = _row(n, seed=1)
    m2 = _m2(g)
    mean_sq = 0.01  # the ratios subtract a given ||E g||^2
    out = gains(list(range(1, n + 1)), m2, mean_sq, n, t_min=1e-3)
    p = 1 / n
    q = np.array([k ** -0.5 for k in range(1, n + 1)])
    q /= q.sum()
    assert out["uniform_second_moment"] == pytest.approx(sum(p * m for m in m2))
    assert out["root_k_second_moment"] == pytest.approx(sum(q[k] * (p / q[k]) ** 2 * m2[k] for k in range(n)))
    best = np.sqrt(m2) / np.sum(np.sqrt(m2))
    assert out["optimal_second_moment"] == pytest.approx(sum(best[k] * (p / best[k]) ** 2 * m2[k] for k in range(n)))
    assert out["optimal_second_moment"] <= min(out["uniform_second_moment"], out["root_k_second_moment"]) + 1e-12
    anti = antithetic_second_moment(np.array(m2), 1e-3)
    assert out["antithetic_over_optimal"] == pytest.approx((anti - mean_sq) / (out["optimal_second_moment"] - mean_sq))
    assert out["antithetic_over_root_k"] == pytest.approx((anti - mean_sq) / (out["root_k_second_moment"] - mean_sq))


def test_antithetic_is_a_mixture_over_k_so_no_better_than_the_optimal_law():
    """Rao-Blackwell: the time draw conditioned on k is a mask_count law, so its second moment is at least the
    optimal law's (on an m2 that falls like 1 / k, as measured, and on a flat one)."""
    n = 64
    for m2 in (100.0 / np.arange(1, n + 1), np.ones(n)):
        out = gains(list(range(1, n + 1)), list(m2), 0.0, n)
        assert out["antithetic_second_moment"] >= out["optimal_second_moment"]
