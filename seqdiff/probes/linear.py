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
validation alongside C; and position-wise one-hot bases, the classic baseline for aligned sequences.

Small data sets (`folds` > 1): with a hundred training sequences a 10% validation split is ten sequences, and
the choice of C (or k, or the layer) made on them is mostly noise. Then the training and validation rows are
pooled, C is chosen by the mean accuracy of stratified K-fold cross-validation over them (each fold fits its own
scaler and row space, so nothing of a held-out fold leaks into its fit), and the chosen C is refit on all of
them: the standard small-sample protocol, which also fits on every row instead of 90% of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import numpy as np

from seqdiff.probes.errors import ProbeError

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
                       c_grid: Sequence[float] = C_GRID, reduce: bool = True, folds: int = 0,
                       weights: np.ndarray | None = None):
    """(fitted StandardScaler, fitted LogisticRegression, {"C": c, "val_accuracy": v}) for the C with the
    best validation accuracy; features/labels keyed train and val. `folds` > 1: C by cross-validation over
    train and val pooled, refit on both (module docstring); "val_accuracy" is then the mean fold accuracy.
    `weights` (F,): each standardized feature is multiplied by its weight before the fit (a smaller weight is a
    stronger penalty on that feature; 0 drops it); the returned model reads standardized features, the weights
    folded into its coefficients. `reduce=False` solves in the F features (the same solution, slower when F > rows;
    kept for its test)."""
    if folds > 1:
        rows = np.concatenate([features["train"], features["val"]])
        targets = np.concatenate([labels["train"], labels["val"]])
        scores = cross_validated_accuracy(rows, targets, seed, c_grid, folds, reduce, weights)
        best = int(np.argmax(scores))  # the first best: the smallest C among ties, as on a validation split
        fit = _ReducedFit(rows, reduce, weights)
        return fit.scaler, fit.export(fit.fit(targets, c_grid[best], seed)), {"C": c_grid[best],
                                                                              "val_accuracy": float(scores[best])}
    fit = _ReducedFit(features["train"], reduce, weights)
    val = fit.transform(features["val"])
    best = None
    for c in c_grid:
        model = fit.fit(labels["train"], c, seed)
        score = accuracy(model.predict(val), labels["val"])
        if best is None or score > best[0]:
            best = (score, c, model)
    score, c, model = best
    return fit.scaler, fit.export(model), {"C": c, "val_accuracy": score}


class _ReducedFit:
    """Standardized training rows, in the span of those rows when that is smaller (module docstring): fit
    logistic regressions there, then `export` one to read the full features."""

    def __init__(self, train: np.ndarray, reduce: bool = True, weights: np.ndarray | None = None):
        from sklearn.preprocessing import StandardScaler

        self.scaler = StandardScaler().fit(train)
        self.weights = weights
        rows = self._weighted(self.scaler.transform(train))
        self.basis = row_space(rows) if reduce else None
        self.rows = rows if self.basis is None else rows @ self.basis.T

    def _weighted(self, rows: np.ndarray) -> np.ndarray:
        return rows if self.weights is None else rows * self.weights

    def transform(self, features: np.ndarray) -> np.ndarray:
        """Standardized, weighted and, with a basis, in its coordinates (what a model from `fit` reads)."""
        rows = self._weighted(self.scaler.transform(features))
        return rows if self.basis is None else rows @ self.basis.T

    def fit(self, labels: np.ndarray, c: float, seed: int):
        from sklearn.linear_model import LogisticRegression

        return LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(self.rows, labels)

    def export(self, model):
        """The model reading the standardized full features: w = V^T a, times the feature weights."""
        if self.basis is not None:
            model.coef_ = model.coef_ @ self.basis
            model.n_features_in_ = self.basis.shape[1]
        if self.weights is not None:
            model.coef_ = model.coef_ * self.weights
        return model


def check_folds(labels: np.ndarray, folds: int) -> None:
    """Stratified K-fold needs K rows of every class; else one message naming the class."""
    classes, counts = np.unique(np.asarray(labels), return_counts=True)
    if len(counts) and counts.min() < folds:
        raise ProbeError(f"probe.cv_folds={folds}: {folds}-fold cross-validation needs at least {folds} training "
                         f"sequences of every class; class {classes[counts.argmin()]} has {counts.min()}: use "
                         "fewer folds or a larger --train-size")


def cross_validated_accuracy(rows: np.ndarray, labels: np.ndarray, seed: int, c_grid: Sequence[float],
                             folds: int, reduce: bool = True, weights: np.ndarray | None = None) -> np.ndarray:
    """(len(c_grid),) mean held-out accuracy of each C over stratified K-fold splits of `rows` (seeded); every
    fold standardizes and reduces on its own training part."""
    from sklearn.model_selection import StratifiedKFold

    labels = np.asarray(labels)
    check_folds(labels, folds)
    scores = np.zeros((folds, len(c_grid)))
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    for i, (fit_idx, held_idx) in enumerate(splitter.split(rows, labels)):
        fit = _ReducedFit(rows[fit_idx], reduce, weights)
        held = fit.transform(rows[held_idx])
        for j, c in enumerate(c_grid):
            scores[i, j] = accuracy(fit.fit(labels[fit_idx], c, seed).predict(held), labels[held_idx])
    return scores.mean(axis=0)


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
                 c_grid: Sequence[float] = C_GRID, folds: int = 0, weights: np.ndarray | None = None) -> Selected:
    """features/labels keyed train, val, test; the C with the best validation (or `folds`-fold
    cross-validation) accuracy is kept. `weights`: see fit_logistic_model."""
    scaler, model, choice = fit_logistic_model(features, labels, seed, c_grid, folds=folds, weights=weights)
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
             sizes: Sequence[int] = KMER_SIZES, c_grid: Sequence[float] = C_GRID, folds: int = 0) -> Selected:
    """k-mer frequencies + logistic regression; (k, C) chosen together on validation (or by `folds`-fold
    cross-validation)."""
    best = None
    for k in sizes:
        feats = {split: kmer_counts(seqs, k) for split, seqs in sequences.items()}
        result = fit_logistic(feats, labels, seed, c_grid, folds)
        if best is None or result.val_accuracy > best.val_accuracy:
            best = Selected(result.val_accuracy, result.test_accuracy, {"k": k, **result.choice}, result.test_pred)
    return best


def onehot_features(sequences: Sequence[str], length: int) -> np.ndarray:
    """(N, length * 4) float32: which of A, C, G, T sits at each position (column 4 i + base code), zeros for N,
    other codes and the positions past a sequence's end (shorter sequences are right-padded)."""
    out = np.zeros((len(sequences), length, 4), dtype=np.float32)
    for i, seq in enumerate(sequences):
        if len(seq) > length:
            raise ProbeError(f"sequence {i + 1} has {len(seq)} bases, more than the one-hot length {length}")
        codes = _BASE_CODE[np.frombuffer(seq.encode("ascii"), dtype=np.uint8)]
        real = np.flatnonzero(codes >= 0)
        out[i, real, codes[real]] = 1.0
    return out.reshape(len(sequences), length * 4)


def fit_onehot(sequences: dict[str, Sequence[str]], labels: dict[str, np.ndarray], seed: int,
               c_grid: Sequence[float] = C_GRID, folds: int = 0) -> Selected:
    """Position-wise one-hot bases + logistic regression, C chosen on validation (or by `folds`-fold
    cross-validation): the linear model of which base sits where, the classic baseline for aligned, fixed-length
    sequences such as splice junctions (a frozen probe of a network's token embeddings reads the same thing)."""
    length = max(len(s) for seqs in sequences.values() for s in seqs)
    feats = {split: onehot_features(seqs, length) for split, seqs in sequences.items()}
    return fit_logistic(feats, labels, seed, c_grid, folds)


def all_kmers(k: int) -> list[str]:
    """Every k-mer in column order of `kmer_counts` (for reading coefficients)."""
    return ["".join(p) for p in product("ACGT", repeat=k)]
