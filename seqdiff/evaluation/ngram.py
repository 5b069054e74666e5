"""Interpolated Witten-Bell n-gram model over token ids: the counting baseline a neural LM must beat.

An order-k model predicts a token from the k tokens before it. Witten-Bell smoothing (Witten & Bell 1991;
interpolated form as in Chen & Goodman 1998) mixes each order with the next lower one, in proportion to how
many distinct tokens have followed the context:

    P_k(w | h) = (c(h, w) + T(h) P_{k-1}(w | h')) / (c(h) + T(h))      if c(h) > 0, else P_{k-1}(w | h')
    P_0(w)     = (c(w) + T P_u(w)) / (N + T),  P_u(w) = 1 / V  (uniform)

where h' drops the oldest token of h, c(.) are training counts, T(h) is the number of distinct tokens seen
after h, N the number of training tokens and V the regular vocabulary (special ids are never predicted).
Every distribution sums to 1 over the V tokens (tested by enumeration), so bits per token are an exact
likelihood, comparable with AR's exact NLL and MDLM's bound.

Conventions match `seqdiff.evaluation.markov`: a token with fewer than k tokens before it (the start of a
text) is predicted by the order it has. Counting is vectorized (n-grams coded as base-V integers), so a few
million training characters take seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from seqdiff.errors import SeqdiffError


@dataclass
class _OrderCounts:
    """Sorted unique (context, token) codes with their counts, and per-context totals and type counts."""

    codes: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    context_totals: np.ndarray
    context_types: np.ndarray


def _codes(tokens: np.ndarray, length: int, vocab: int) -> np.ndarray:
    """(n - length + 1,) base-`vocab` code of every window tokens[i : i + length]."""
    n = len(tokens) - length + 1
    code = np.zeros(max(n, 0), dtype=np.int64)
    for j in range(length):
        code = code * vocab + tokens[j: j + n]
    return code


def _lookup(sorted_keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[k] where sorted_keys[k] == query, else 0."""
    if sorted_keys.size == 0:
        return np.zeros(len(queries), dtype=values.dtype)
    idx = np.clip(np.searchsorted(sorted_keys, queries), 0, sorted_keys.size - 1)
    return np.where(sorted_keys[idx] == queries, values[idx], 0)


@dataclass
class WittenBellNGram:
    """`fit(texts)` then `bits_per_token(texts)`; texts are int arrays of ids in [0, vocab_size)."""

    order: int
    """Tokens of context (order 4 = 5-grams)."""
    vocab_size: int
    """Regular vocabulary V: ids 0..V-1 are predicted; nothing else may occur in the texts."""
    _orders: list[_OrderCounts] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if self.order < 0 or self.vocab_size < 1:
            raise SeqdiffError(f"n-gram order must be >= 0 and vocab_size >= 1, got order={self.order}, "
                               f"vocab_size={self.vocab_size}")
        if self.vocab_size ** (self.order + 1) >= 2 ** 62:
            raise SeqdiffError(f"order {self.order} over {self.vocab_size} ids does not fit 64-bit n-gram codes")

    def _check(self, texts: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        for t in texts:
            t = np.asarray(t, dtype=np.int64)
            if t.size and (t.min() < 0 or t.max() >= self.vocab_size):
                raise SeqdiffError(f"n-gram: ids must lie in [0, {self.vocab_size}), found {t.min()}..{t.max()}")
            out.append(t)
        return out

    def fit(self, texts: Sequence[np.ndarray]) -> WittenBellNGram:
        texts = self._check(texts)
        V = self.vocab_size
        self._orders = []
        for k in range(self.order + 1):
            codes = np.concatenate([_codes(t, k + 1, V) for t in texts] or [np.zeros(0, np.int64)])
            uniq, counts = np.unique(codes, return_counts=True)
            ctx = uniq // V
            contexts, first = np.unique(ctx, return_index=True)
            totals = np.add.reduceat(counts, first) if counts.size else counts
            types = np.diff(np.append(first, len(uniq)))
            self._orders.append(_OrderCounts(uniq, counts, contexts, totals, types))
        return self

    def truncated(self, order: int) -> WittenBellNGram:
        """The fitted model of a lower `order`, sharing these counts: each order's counts do not depend on the
        highest order fitted, so this equals fitting `order` afresh (tested), without counting again."""
        if not 0 <= order <= len(self._orders) - 1:
            raise SeqdiffError(f"n-gram: order {order} is not among the fitted orders 0..{len(self._orders) - 1}")
        return WittenBellNGram(order, self.vocab_size, self._orders[:order + 1])

    def _probs(self, text: np.ndarray) -> np.ndarray:
        """(n,) P(text[i] | up to `order` tokens before it)."""
        *_, p = self._probs_by_order(text)  # the same array throughout: the last order's values
        return p

    def _probs_by_order(self, text: np.ndarray) -> Iterator[np.ndarray]:
        """(n,) P(text[i] | up to k tokens before it) for k = 0 .. order in turn (one array, updated in place:
        each order interpolates with the one before, so every lower order is on the way to the highest)."""
        V, n = self.vocab_size, len(text)
        p = np.full(n, 1.0 / V)  # the uniform base
        for k, oc in enumerate(self._orders):
            # context of position i: text[i-k : i]; positions i < k keep the lower order's probability
            full = _codes(text, k + 1, V)  # (n - k,) windows ending at i = k .. n-1
            ctx = full // V
            c_hw = _lookup(oc.codes, oc.counts, full).astype(np.float64)
            c_h = _lookup(oc.contexts, oc.context_totals, ctx).astype(np.float64)
            t_h = _lookup(oc.contexts, oc.context_types, ctx).astype(np.float64)
            lower = p[k:]
            seen = c_h > 0
            p[k:] = np.where(seen, (c_hw + t_h * lower) / np.where(seen, c_h + t_h, 1.0), lower)
            yield p

    def score(self, texts: Sequence[np.ndarray]) -> tuple[float, int]:
        """(total bits, number of tokens) over every token of every text."""
        if not self._orders:
            raise SeqdiffError("the n-gram model is not fitted: call fit() first")
        bits, count = 0.0, 0
        for t in self._check(texts):
            if t.size:
                bits -= float(np.log2(self._probs(t)).sum())
                count += int(t.size)
        return bits, count

    def bits_per_token(self, texts: Sequence[np.ndarray]) -> float:
        bits, count = self.score(texts)
        return bits / count if count else math.nan

    def bits_per_token_by_order(self, texts: Sequence[np.ndarray]) -> list[float]:
        """bits_per_token of every order 0 .. order (truncated(k) for each k), in one pass over the texts."""
        if not self._orders:
            raise SeqdiffError("the n-gram model is not fitted: call fit() first")
        bits, count = np.zeros(len(self._orders)), 0
        for t in self._check(texts):
            if t.size:
                for k, p in enumerate(self._probs_by_order(t)):
                    bits[k] -= float(np.log2(p).sum())
                count += int(t.size)
        return [b / count if count else math.nan for b in bits.tolist()]


__all__ = ["WittenBellNGram"]
