"""Linear probes: standardized features -> scikit-learn logistic regression, the inverse regularization
strength C chosen by validation accuracy, then scored once on the test set.

With more features than training rows (flattened or concatenated layers: 10-50 k features for 2 k rows) the
regression is solved in the span of the training rows. This is exact, not an approximation: the data term
depends on w only through X w, so the part of w orthogonal to the rows only adds to the L2 penalty and is 0 at
the optimum; writing w = V^T a with V an orthonormal basis of the row span (from the SVD of X), ||w|| = ||a||
and X w = (X V^T) a, so the r-dimensional problem (r <= rows) is the same problem with the same optimum. The two
solves differ only where L-BFGS stops (its test is on the largest gradient coordinate, which the rotation
changes): within the solver's tolerance (tested). The coefficients are mapped back to the F features, so the
fitted model reads the full features as before; each fit works in r dimensions instead of F.

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
                       c_grid: Sequence[float] = C_GRID, reduce: bool = True):
    """(fitted StandardScaler, fitted LogisticRegression, {"C": c, "val_accuracy": v}) for the C with the
    best validation accuracy; features/labels keyed train and val. `reduce=False` solves in the F features
    (the same solution, slower when F > rows; kept for the test of that)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(features["train"])
    train, val = scaler.transform(features["train"]), scaler.transform(features["val"])
    basis = row_space(train) if reduce else None
    if basis is not None:  # the same problem in the span of the training rows (module docstring)
        train, val = train @ basis.T, val @ basis.T
    best = None
    for c in c_grid:
        model = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(train, labels["train"])
        score = accuracy(model.predict(val), labels["val"])
        if best is None or score > best[0]:
            best = (score, c, model)
    score, c, model = best
    if basis is not None:  # back to the F features: w = V^T a
        model.coef_ = model.coef_ @ basis
        model.n_features_in_ = basis.shape[1]
    return scaler, model, {"C": c, "val_accuracy": score}


def row_space(rows: np.ndarray) -> np.ndarray | None:
    """An orthonormal basis (r, F) of the span of `rows` (N, F), float64, when N < F (else None: nothing to
    gain). Directions with singular values below numpy's rank tolerance are dropped."""
    n, f = rows.shape
    if n >= f or n == 0:
        return None
    _, s, vt = np.linalg.svd(np.asarray(rows, dtype=np.float64), full_matrices=False)
    keep = s > (s[0] if len(s) else 0.0) * max(n, f) * np.finfo(np.float64).eps
    return vt[keep] if keep.any() else None


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
