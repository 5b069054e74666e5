"""Order-k Markov yardstick (seqdiff.evaluation.markov) against a brute-force count on tiny sequences."""

import math
from collections import Counter

import numpy as np
import pytest

from seqdiff.evaluation.markov import MarkovChain


def brute_force_bits(train, test, order, alpha):
    """Python loops: counts of (context, base) per order, then backoff scoring of every known base."""
    counts = [Counter() for _ in range(order + 1)]
    for seg in train:
        for i, b in enumerate(seg):
            if b >= 4:
                continue
            for o in range(order + 1):
                ctx = tuple(seg[i - o:i]) if i >= o else None
                if ctx is not None and all(c < 4 for c in ctx):
                    counts[o][ctx + (b,)] += 1
    bits, n = 0.0, 0
    for seg in test:
        for i, b in enumerate(seg):
            if b >= 4:
                continue
            o = 0
            while o < order and i - o - 1 >= 0 and seg[i - o - 1] < 4:
                o += 1
            ctx = tuple(seg[i - o:i])
            total = sum(counts[o][ctx + (x,)] for x in range(4)) + 4 * alpha
            bits -= math.log2((counts[o][ctx + (b,)] + alpha) / total)
            n += 1
    return bits, n


@pytest.mark.parametrize("order", [0, 1, 3])
def test_markov_bits_match_brute_force_with_n_and_segment_breaks(order):
    rng = np.random.default_rng(order)
    train = [rng.choice(5, size=n, p=[0.3, 0.2, 0.2, 0.25, 0.05]) for n in (40, 3, 57)]
    test = [rng.choice(5, size=n, p=[0.25, 0.25, 0.2, 0.2, 0.1]) for n in (30, 1, 12)]
    chain = MarkovChain(order, alpha=0.5).fit(train)
    bits, n = chain.score(test)
    ref_bits, ref_n = brute_force_bits([s.tolist() for s in train], [s.tolist() for s in test], order, 0.5)
    assert n == ref_n == sum(int((s < 4).sum()) for s in test)  # every known base scored once
    assert bits == pytest.approx(ref_bits, rel=1e-12)


def test_markov_closed_forms():
    # untrained chain: uniform, exactly 2 bits per base whatever the order
    assert MarkovChain(2).bits_per_base([np.array([0, 1, 2, 3, 4, 0])]) == pytest.approx(2.0)
    # a period-2 sequence is predictable from one base of context: order 1 approaches 0 bits, order 0 stays at 1
    seq = np.array([0, 2] * 5000)
    assert MarkovChain(0).fit([seq]).bits_per_base([seq]) == pytest.approx(1.0, abs=1e-3)
    assert MarkovChain(1).fit([seq]).bits_per_base([seq]) < 1e-3
    with pytest.raises(ValueError, match="order must be >= 0"):
        MarkovChain(-1)
