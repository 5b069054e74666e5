"""seqdiff.evaluation.stats: the paired (and clustered) bootstrap against the exact bootstrap distribution, which
a tiny case enumerates, and the non-inferiority rule."""

import itertools

import numpy as np
import pytest

from seqdiff.evaluation.stats import bootstrap_differences, noninferiority, paired_bootstrap


def _exact(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The support and CDF of a distribution given by equally likely outcomes."""
    support, counts = np.unique(np.round(values, 12), return_counts=True)
    return support, np.cumsum(counts) / len(values)


def _ecdf_distance(draws: np.ndarray, support: np.ndarray, cdf: np.ndarray) -> float:
    empirical = np.searchsorted(np.sort(np.round(draws, 12)), support, side="right") / len(draws)
    return float(np.abs(empirical - cdf).max())


def _exact_quantile(support: np.ndarray, cdf: np.ndarray, q: float) -> float:
    """The q-quantile of a discrete distribution, asserting the CDF does not pass near q (so that the quantile of
    many draws lands on the same support point)."""
    assert np.abs(cdf - q).min() > 0.01, "pick a case whose CDF steps clear of q"
    return float(support[np.searchsorted(cdf, q)])


def test_paired_draws_follow_the_enumerated_bootstrap_distribution():
    before = [0, 1, 1, 0, 0]  # one item gained, the rest unchanged
    after = [1, 1, 1, 0, 0]
    d = np.subtract(after, before)
    exact = [d[list(idx)].mean() for idx in itertools.product(range(5), repeat=5)]  # every resample, 5^5
    support, cdf = _exact(exact)
    draws = bootstrap_differences(before, after, draws=40_000, seed=3)
    assert draws.shape == (40_000,)
    assert _ecdf_distance(draws, support, cdf) < 0.01  # DKW: P(> 0.01) < 1e-3 for 40,000 draws
    assert draws.mean() == pytest.approx(d.mean(), abs=0.005)  # the bootstrap mean is the sample mean
    lo, hi = paired_bootstrap(before, after, draws=40_000, seed=3)
    assert [lo, hi] == pytest.approx([_exact_quantile(support, cdf, 0.025), _exact_quantile(support, cdf, 0.975)],
                                     abs=1e-12)


def test_grouped_draws_follow_the_enumerated_cluster_bootstrap_distribution():
    # three texts of 1, 2 and 3 passages; a draw is a multiset of 3 texts and its difference the passage mean
    before = [0, 1, 0, 1, 1, 0]
    after = [1, 1, 1, 0, 1, 1]
    groups = ["a", "b", "b", "c", "c", "c"]
    d = np.subtract(after, before)
    members = {g: [i for i, h in enumerate(groups) if h == g] for g in "abc"}
    exact = []
    for picked in itertools.product("abc", repeat=3):  # every draw of 3 groups with replacement, 3^3
        idx = [i for g in picked for i in members[g]]
        exact.append(d[idx].mean())
    support, cdf = _exact(exact)
    draws = bootstrap_differences(before, after, draws=40_000, seed=5, groups=groups)
    assert _ecdf_distance(draws, support, cdf) < 0.01
    assert draws.mean() == pytest.approx(np.mean(exact), abs=0.005)
    assert paired_bootstrap(before, after, draws=40_000, seed=5, groups=groups) == pytest.approx(
        [_exact_quantile(support, cdf, 0.025), _exact_quantile(support, cdf, 0.975)], abs=1e-12)


def test_the_interval_depends_only_on_the_seed_and_the_inputs():
    rng = np.random.default_rng(0)
    b, a = rng.random(50).tolist(), rng.random(50).tolist()  # scores, not only right / wrong
    assert paired_bootstrap(b, a, seed=7) == paired_bootstrap(b, a, seed=7)
    assert paired_bootstrap(b, a, seed=7) != paired_bootstrap(b, a, seed=8)


def test_mismatched_inputs_are_refused():
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_differences([1, 0], [1])
    with pytest.raises(ValueError, match="equally long"):
        bootstrap_differences([], [])
    with pytest.raises(ValueError, match="2 labels for 3 items"):
        bootstrap_differences([1, 0, 1], [1, 1, 1], groups=["a", "b"])


def test_paired_bootstrap():
    same = [True, False] * 50
    assert paired_bootstrap(same, same) == [0.0, 0.0]
    lo, hi = paired_bootstrap([False] * 100, [True] * 60 + [False] * 40)
    assert 0.5 < lo <= 0.6 <= hi < 0.7  # the difference is exactly 0.6 on the full set


def test_paired_bootstrap_by_groups_resamples_whole_texts():
    # every passage of text "a" gains, every passage of "b" loses: passage by passage the mean difference (0) is
    # pinned down, but with two texts a resample can hold only "a" (+1) or only "b" (-1)
    before = [False] * 50 + [True] * 50
    after = [True] * 50 + [False] * 50
    groups = ["a"] * 50 + ["b"] * 50
    lo, hi = paired_bootstrap(before, after)
    assert -0.25 < lo < 0 < hi < 0.25
    assert paired_bootstrap(before, after, groups=groups) == [-1.0, 1.0]
    # one group: every resample is the full set
    assert paired_bootstrap(before, after, groups=["a"] * 100) == [0.0, 0.0]
    # unequal group sizes: a draw's difference is the mean over its passages, not the mean of group means
    b, a = [False] * 30, [True] * 10 + [False] * 20
    lo, hi = paired_bootstrap(b, a, groups=["x"] * 10 + ["y"] * 20, draws=4000)
    assert lo == 0.0 and hi == 1.0  # only-y draws give 0, only-x draws give 1, mixed draws lie between


@pytest.mark.parametrize(("interval", "outcome"), [
    ([-0.015, 0.02], "met"),  # lower end above -0.02
    ([-0.019, -0.001], "met"),  # significantly below 0, yet within the margin
    ([-0.02, 0.03], "inconclusive"),  # on the margin: not above it
    ([-0.05, 0.03], "inconclusive"),
    ([-0.05, -0.001], "worse"),
    ([-0.30, -0.15], "worse"),
])
def test_noninferiority_outcomes(interval, outcome):
    assert noninferiority(interval, 0.02) == outcome
