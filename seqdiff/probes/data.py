"""Labelled DNA sequences for classification probes: one container, the checks every loader shares,
the truncation rule, and a reader for user CSV / TSV files.

Every benchmark loader returns a `Benchmark`: train and test `LabeledSequences` whose labels index one
shared, sorted list of class names. The checks here are the ones the issue asks for: characters outside
the nucleotide alphabet are refused (naming the source, row and characters), a class without examples in
a split is refused, and sequences longer than a model's context are cut by a recorded rule and counted.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from seqdiff.probes.errors import ProbeError
from seqdiff.probes.metrics import get_metric
from seqdiff.tokenizers.nucleotide import BASES, IUPAC_AMBIGUOUS

ALPHABET = frozenset(BASES + IUPAC_AMBIGUOUS + BASES.lower() + IUPAC_AMBIGUOUS.lower())
"""Characters the nucleotide tokenizer accepts (IUPAC ambiguity codes read as N)."""


@dataclass
class LabeledSequences:
    sequences: list[str]
    labels: np.ndarray
    """int64 (N,): index into the benchmark's `classes`."""

    def __post_init__(self) -> None:
        self.labels = np.asarray(self.labels, dtype=np.int64)
        if len(self.sequences) != len(self.labels):
            raise ValueError(f"{len(self.sequences)} sequences but {len(self.labels)} labels")

    def __len__(self) -> int:
        return len(self.sequences)

    def subset(self, index: np.ndarray) -> LabeledSequences:
        return LabeledSequences([self.sequences[i] for i in index], self.labels[index])


@dataclass
class Benchmark:
    name: str
    classes: list[str]
    train: LabeledSequences
    test: LabeledSequences
    max_len: int
    """Length every model sees: longer sequences are cut to it by `truncation`."""
    truncation: str = "center"
    """Rule for sequences longer than the context: one of TRUNCATIONS."""
    source: str = ""
    """Where the data came from (file, package, dataset id), for the report."""
    test_split: str = "official"
    """'official', or how a held-out test split was made when the benchmark has none."""
    metric: str = "accuracy"
    """Headline test metric (a name in `metrics.METRICS`): the one tables and plots show; accuracy is always
    recorded too."""
    notes: list[str] = field(default_factory=list)

    def check(self) -> None:
        """Refuse a benchmark with fewer than two classes, a class absent from a split, or characters outside the
        alphabet."""
        get_metric(self.metric)
        if len(self.classes) < 2:
            raise ProbeError(f"{self.name}: {len(self.classes)} class(es) {self.classes}; a probe needs at least two "
                             "classes")
        for split_name, split in (("train", self.train), ("test", self.test)):
            counts = np.bincount(split.labels, minlength=len(self.classes))
            if len(counts) > len(self.classes):
                raise ProbeError(f"{self.name} {split_name}: label {len(counts) - 1} has no class name "
                                 f"({len(self.classes)} classes: {self.classes})")
            empty = [self.classes[i] for i, n in enumerate(counts) if n == 0]
            if empty:
                raise ProbeError(f"{self.name} {split_name} split has no examples of class(es) {empty}; every class "
                                 f"needs examples in both splits")
            check_alphabet(split.sequences, f"{self.name} {split_name}")


def check_alphabet(sequences: Sequence[str], where: str) -> None:
    """Raise ProbeError naming the first sequence (counted from 1) with characters outside the nucleotide alphabet."""
    for i, seq in enumerate(sequences):
        if not seq:
            raise ProbeError(f"{where}: sequence {i + 1} is empty")
        bad = set(seq) - ALPHABET
        if bad:
            raise ProbeError(f"{where}: sequence {i + 1} holds characters outside the nucleotide alphabet "
                             f"{sorted(bad)} (allowed: ACGTN and IUPAC codes, either case)")


# ------------------------------------------------------------------------------------------- truncation
def _center(seq: str, n: int) -> str:
    start = (len(seq) - n) // 2
    return seq[start:start + n]


TRUNCATIONS = {
    "center": _center,  # keep the middle: benchmarks centre their sequences on the feature (site, peak)
    "left": lambda seq, n: seq[:n],  # keep the start
    "right": lambda seq, n: seq[-n:],  # keep the end
}


def truncate(sequences: Sequence[str], max_len: int, rule: str) -> tuple[list[str], int]:
    """(sequences cut to at most max_len by `rule`, how many were cut)."""
    try:
        cut = TRUNCATIONS[rule]
    except KeyError:
        raise ProbeError(f"truncation rule {rule!r} is unknown; choose one of {sorted(TRUNCATIONS)}") from None
    if max_len < 1:
        raise ProbeError(f"max_len must be at least 1, got {max_len}")
    out, n_cut = [], 0
    for seq in sequences:
        if len(seq) > max_len:
            seq, n_cut = cut(seq, max_len), n_cut + 1
        out.append(seq)
    return out, n_cut


# --------------------------------------------------------------------------------------------- splits
def hf_split_columns(data, where: str, required: Sequence[str], splits: Sequence[str] = ("train", "test")
                     ) -> dict[str, dict[str, list]]:
    """{split: {column: values}} of a loaded Hugging Face DatasetDict, refusing a missing split or column with
    a message that names `where`."""
    out = {}
    for split in splits:
        if split not in data:
            raise ProbeError(f"{where} has no {split!r} split (splits: {list(data)})")
        columns = data[split][:]  # dict of column lists
        missing = [c for c in required if c not in columns]
        if missing:
            raise ProbeError(f"{where} {split}: no column {', '.join(missing)}; found {sorted(columns)}")
        out[split] = columns
    return out


def stratified_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(kept, held-out) index arrays; each class gives round(fraction * its count) examples (at least 1)."""
    rng = np.random.default_rng(seed)
    kept, held = [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_held = max(1, int(round(fraction * len(idx)))) if len(idx) > 1 else 0
        held.append(idx[:n_held])
        kept.append(idx[n_held:])
    return np.sort(np.concatenate(kept)), np.sort(np.concatenate(held))


def stratified_subsample(labels: np.ndarray, size: int, seed: int) -> np.ndarray:
    """Sorted indices of `size` examples drawn without replacement, each class in proportion to its count
    (largest remainders; every class keeps at least 2, so a 90/10 split still has it in train and validation).

    Why: the small-data check of a fine-tuning recipe (a labelled set of ~100 sequences) must keep the class
    balance of the full set, or a seed's accuracy measures which classes it happened to draw."""
    classes, counts = np.unique(labels, return_counts=True)
    if size < 2 * len(classes):
        raise ProbeError(f"train_size={size}: needs at least 2 examples of each of the {len(classes)} classes")
    if size > len(labels):
        raise ProbeError(f"train_size={size}: the training set has only {len(labels)} sequences")
    exact = counts * size / len(labels)
    take = np.maximum(np.floor(exact).astype(int), np.minimum(2, counts))
    for i in np.argsort(-(exact - np.floor(exact)), kind="stable"):  # largest remainders first
        if take.sum() >= size:
            break
        take[i] += take[i] < counts[i]
    while take.sum() > size:  # the floor of 2 per class overshot: trim the largest classes
        take[np.argmax(take)] -= 1
    rng = np.random.default_rng(seed)
    picked = [rng.permutation(np.flatnonzero(labels == c))[:n] for c, n in zip(classes, take, strict=True)]
    return np.sort(np.concatenate(picked))


# ------------------------------------------------------------------------------------- user CSV / TSV
SEQUENCE_COLUMNS = ("sequence", "seq")
LABEL_COLUMNS = ("label", "class", "y")


def read_table(path: str | Path) -> tuple[list[str], list[str]]:
    """(sequences, label strings) from a CSV / TSV with a header naming a sequence and a label column.

    The delimiter follows the suffix (.tsv / .tab: tab, else comma). Column names are matched without case:
    sequence or seq; label, class or y.
    """
    path = Path(path)
    delimiter = "\t" if path.suffix.lower() in (".tsv", ".tab") else ","
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f, delimiter=delimiter))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ProbeError(f"cannot read {path}: {e}") from e
    if not rows:
        raise ProbeError(f"{path} is empty")
    header = [h.strip().lower() for h in rows[0]]
    seq_col = next((header.index(c) for c in SEQUENCE_COLUMNS if c in header), None)
    label_col = next((header.index(c) for c in LABEL_COLUMNS if c in header), None)
    if seq_col is None or label_col is None:
        raise ProbeError(f"{path}: the header {rows[0]} needs a sequence column ({' or '.join(SEQUENCE_COLUMNS)}) "
                         f"and a label column ({', '.join(LABEL_COLUMNS)})")
    sequences, labels = [], []
    for line, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(seq_col, label_col):
            raise ProbeError(f"{path} line {line}: {len(row)} fields, expected at least {max(seq_col, label_col) + 1}")
        for col, what in ((seq_col, "sequence"), (label_col, "label")):
            if not row[col].strip():
                raise ProbeError(f"{path} line {line}: the {header[col]!r} cell is empty; every row needs a "
                                 f"{what} (remove the row or fill it in)")
        sequences.append(row[seq_col].strip())
        labels.append(row[label_col].strip())
    if not sequences:
        raise ProbeError(f"{path} holds a header but no rows")
    check_alphabet(sequences, str(path))
    return sequences, labels


def encode_labels(labels: Sequence[str], classes: Sequence[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """(int64 labels, sorted class names); with `classes`, a label outside them is refused."""
    classes = sorted(set(labels)) if classes is None else list(classes)
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(labels) - set(index))
    if unknown:
        raise ProbeError(f"labels {unknown[:5]} do not occur in the training classes {classes}")
    return np.array([index[label] for label in labels], dtype=np.int64), classes
