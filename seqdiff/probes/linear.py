"""Linear probes: standardized features -> scikit-learn logistic regression, the inverse regularization
strength C chosen by validation accuracy, then scored once on the test set.

k-mer count features (k = 3..6) live here too: the classic alignment-free baseline, with k chosen on
validation alongside C.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np

C_GRID = (0.01, 0.1, 1.0, 10.0)
KMER_SIZES = (3, 4, 5, 6)
_BASE_CODE = np.full(256, -1, dtype=np.int64)
for _i, _b in enumerate("ACGT"):
    _BASE_CODE[ord(_b)] = _BASE_CODE[ord(_b.lower())] = _i


@dataclass
class Selected:
    """One seed's outcome: validation and test accuracy of the model chosen on validation."""

    val_accuracy: float
    test_accuracy: float
    choice: dict[str, Any] = field(default_factory=dict)
    test_pred: np.ndarray | None = None
    """(N_test,) predicted labels, for metrics other than accuracy (`metrics.METRICS`)."""


def accuracy(pred: np.ndarray, labels: np.ndarray) -> float:
    return float((np.asarray(pred) == np.asarray(labels)).mean())


def fit_logistic_model(features: dict[str, np.ndarray], labels: dict[str, np.ndarray], seed: int,
                       c_grid: Sequence[float] = C_GRID):
    """(fitted StandardScaler, fitted LogisticRegression, {"C": c, "val_accuracy": v}) for the C with the
    best validation accuracy; features/labels keyed train and val."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(features["train"])
    train, val = scaler.transform(features["train"]), scaler.transform(features["val"])
    best = None
    for c in c_grid:
        model = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(train, labels["train"])
        score = accuracy(model.predict(val), labels["val"])
        if best is None or score > best[0]:
            best = (score, c, model)
    score, c, model = best
    return scaler, model, {"C": c, "val_accuracy": score}


def fit_logistic(features: dict[str, np.ndarray], labels: dict[str, np.ndarray], seed: int,
                 c_grid: Sequence[float] = C_GRID) -> Selected:
    """features/labels keyed train, val, test; the C with the best validation accuracy is kept."""
    scaler, model, choice = fit_logistic_model(features, labels, seed, c_grid)
    pred = model.predict(scaler.transform(features["test"]))
    return Selected(choice["val_accuracy"], accuracy(pred, labels["test"]), {"C": choice["C"]}, test_pred=pred)


def kmer_counts(sequences: Sequence[str], k: int) -> np.ndarray:
    """(N, 4**k) float32 k-mer frequencies (counts / windows); windows holding N or other codes are skipped.

    Column index of a k-mer = its base-4 number with A=0, C=1, G=2, T=3, first base most significant.
    """
    out = np.zeros((len(sequences), 4**k), dtype=np.float32)
    weights = 4 ** np.arange(k - 1, -1, -1)
    for i, seq in enumerate(sequences):
        codes = _BASE_CODE[np.frombuffer(seq.encode("ascii"), dtype=np.uint8)]
        if len(codes) < k:
            continue
        windows = np.lib.stride_tricks.sliding_window_view(codes, k)  # (n_windows, k)
        windows = windows[(windows >= 0).all(axis=1)]
        if len(windows):
            out[i] = np.bincount(windows @ weights, minlength=4**k) / len(windows)
    return out


def fit_kmer(sequences: dict[str, Sequence[str]], labels: dict[str, np.ndarray], seed: int,
             sizes: Sequence[int] = KMER_SIZES, c_grid: Sequence[float] = C_GRID) -> Selected:
    """k-mer frequencies + logistic regression; (k, C) chosen together on validation."""
    best = None
    for k in sizes:
        feats = {split: kmer_counts(seqs, k) for split, seqs in sequences.items()}
        result = fit_logistic(feats, labels, seed, c_grid)
        if best is None or result.val_accuracy > best.val_accuracy:
            best = Selected(result.val_accuracy, result.test_accuracy, {"k": k, **result.choice}, result.test_pred)
    return best


def all_kmers(k: int) -> list[str]:
    """Every k-mer in column order of `kmer_counts` (for reading coefficients)."""
    return ["".join(p) for p in product("ACGT", repeat=k)]
