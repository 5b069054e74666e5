"""Paired comparisons of two scorers on the same test items: a bootstrap interval and a non-inferiority test.

Design choices:
- Paired: item i is scored by both sides (before / after fine-tuning, a model and its baseline), so each
  bootstrap draw resamples items and takes the difference of the two means on the same resample; the
  item-to-item difficulty cancels out of the difference instead of widening its interval.
- Clustered when asked: with `groups` (e.g. the text each passage comes from) whole groups are resampled
  with replacement, since passages of one text are not independent; a draw's difference is then the mean
  over the passages of the drawn groups (a ratio estimator, weighting groups by their size), not the mean of
  group means.
- Percentile interval (the 2.5% and 97.5% quantiles of the draws), from a numpy Generator seeded by the
  caller, so a report's interval is reproducible from its JSON (seed and draws are inputs).
- Non-inferiority against a margin declared before the results: 'met' when the interval's lower end is above
  -margin (even if the difference is also significantly below 0), 'worse' when its upper end is below 0
  (and 'met' does not hold), 'inconclusive' otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

OUTCOMES = ("met", "worse", "inconclusive")
"""The outcomes of `noninferiority`."""


def bootstrap_differences(before: Sequence[float], after: Sequence[float], draws: int = 2000, seed: int = 0,
                          groups: Sequence | None = None) -> np.ndarray:
    """(draws,) mean(after) - mean(before) on paired resamples of the items (of whole groups, with `groups`)."""
    b, a = np.asarray(before, dtype=float), np.asarray(after, dtype=float)
    if b.shape != a.shape or b.ndim != 1 or len(b) == 0:
        raise ValueError(f"before and after must be two equally long, non-empty lists (got {b.shape} and {a.shape})")
    rng = np.random.default_rng(seed)
    if groups is None:
        idx = rng.integers(0, len(a), size=(draws, len(a)))  # (draws, N) items drawn
        return a[idx].mean(1) - b[idx].mean(1)
    if len(groups) != len(a):
        raise ValueError(f"groups must name the group of every item ({len(groups)} labels for {len(a)} items)")
    _, g = np.unique(np.asarray(groups), return_inverse=True)
    n_groups = g.max() + 1
    sums = np.bincount(g, weights=a - b, minlength=n_groups)  # (G,) summed differences per group
    sizes = np.bincount(g, minlength=n_groups).astype(float)  # (G,) items per group
    picks = rng.integers(0, n_groups, size=(draws, n_groups))  # (draws, G) groups drawn
    counts = np.stack([np.bincount(row, minlength=n_groups) for row in picks])  # (draws, G) times drawn
    return (counts @ sums) / (counts @ sizes)


def paired_bootstrap(before: Sequence[float], after: Sequence[float], draws: int = 2000, seed: int = 0,
                     groups: Sequence | None = None) -> list[float]:
    """95% percentile interval [lo, hi] of mean(after) - mean(before), from `bootstrap_differences`."""
    diffs = bootstrap_differences(before, after, draws=draws, seed=seed, groups=groups)
    return [float(np.quantile(diffs, 0.025)), float(np.quantile(diffs, 0.975))]


def noninferiority(interval: Sequence[float], margin: float) -> str:
    """The non-inferiority outcome ('met', 'worse' or 'inconclusive') of a 95% interval of after - before."""
    lo, hi = interval
    if lo > -margin:
        return "met"
    if hi < 0:
        return "worse"
    return "inconclusive"
