"""Order-k Markov chains over A, C, G, T: a classical yardstick for DNA language models.

A k-th order chain predicts a base from the k bases before it, with add-alpha smoothed counts
(alpha = 1/2 is the Krichevsky-Trofimov estimator). It gives the bits per base that short-range
composition alone explains, so a neural model's test bits per base can be read against it (human DNA
sits near 1.9 bits per base for k around 5-10; 2 bits is a uniform guess).

Conventions match the models' evaluation: sequences are scored segment by segment (a context never
crosses a segment boundary, like the evaluation tiles), N (id >= 4) is never scored and breaks the
context, and a base with fewer than k known bases before it is predicted by the chain of the order it
has (backoff to the available context), so that every non-N base is scored exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seqdiff.errors import SeqdiffError

ALPHABET = 4  # A, C, G, T are ids 0..3 in the nucleotide tokenizer; anything else is N


def _known_run(seg: np.ndarray) -> np.ndarray:
    """(n,) number of consecutive A/C/G/T bases immediately before each position (within the segment)."""
    known = seg < ALPHABET
    run = np.zeros(len(seg), dtype=np.int64)
    # run[i] = i - (index of the last unknown base before i) - 1, with -1 when there is none
    last_bad = np.where(~known, np.arange(len(seg)), -1)
    last_bad = np.maximum.accumulate(last_bad)
    run[1:] = np.arange(1, len(seg)) - last_bad[:-1] - 1
    return run


def _codes(seg: np.ndarray, order: int) -> np.ndarray:
    """(n,) base-4 code of seg[i - order .. i] for every i >= order (undefined where an N is involved)."""
    s = np.where(seg < ALPHABET, seg, 0).astype(np.int64)
    n = len(s)
    code = np.zeros(max(0, n - order), dtype=np.int64)
    for j in range(order + 1):
        code = code * ALPHABET + s[j: n - order + j]
    return np.concatenate([np.full(min(order, n), -1, dtype=np.int64), code])


def _usable(seg: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, codes) of the bases that have `order` known bases before them and are known themselves."""
    run = _known_run(seg)
    ok = (seg < ALPHABET) & (run >= order)
    return np.flatnonzero(ok), _codes(seg, order)


@dataclass
class MarkovChain:
    """Counts of (context, next base) for orders 0..order; `fit` then `bits_per_base`."""

    order: int
    alpha: float = 0.5

    def __post_init__(self):
        if self.order < 0 or self.alpha <= 0:
            raise SeqdiffError(f"order must be >= 0 and alpha > 0, got order={self.order}, alpha={self.alpha}")
        self.counts = [np.zeros(ALPHABET ** (o + 1), dtype=np.int64) for o in range(self.order + 1)]

    def fit(self, segments: Sequence[np.ndarray]) -> MarkovChain:
        """Count every (k+1)-mer of known bases inside each segment, for k = 0..order."""
        for seg in segments:
            seg = np.asarray(seg)
            for o in range(self.order + 1):
                pos, codes = _usable(seg, o)
                self.counts[o] += np.bincount(codes[pos], minlength=ALPHABET ** (o + 1))
        return self

    def log2_probs(self, o: int) -> np.ndarray:
        """(4^o, 4) log2 P(next base | context) of the order-o chain, add-alpha smoothed."""
        c = self.counts[o].reshape(-1, ALPHABET).astype(np.float64) + self.alpha
        return np.log2(c / c.sum(axis=1, keepdims=True))

    def score(self, segments: Sequence[np.ndarray]) -> tuple[float, int]:
        """(total bits, number of scored bases) over every known base of every segment."""
        tables = [self.log2_probs(o).reshape(-1) for o in range(self.order + 1)]
        bits, count = 0.0, 0
        for seg in segments:
            seg = np.asarray(seg)
            run = np.minimum(_known_run(seg), self.order)
            known = seg < ALPHABET
            for o in range(self.order + 1):
                pos = np.flatnonzero(known & (run == o))
                if pos.size:
                    bits -= float(tables[o][_codes(seg, o)[pos]].sum())
                    count += int(pos.size)
        return bits, count

    def bits_per_base(self, segments: Sequence[np.ndarray]) -> float:
        bits, count = self.score(segments)
        return bits / count if count else math.nan


__all__ = ["MarkovChain"]
