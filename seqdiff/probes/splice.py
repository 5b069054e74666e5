"""The primate splice-junction data set (StatLog DNA, UCI "Molecular Biology (Splice-junction Gene
Sequences)"): 3,186 sequences of 60 nt around a candidate splice site; classes ei (exon -> intron, donor),
ie (intron -> exon, acceptor) and n (neither).

Offline source: `DNA.rda` from the Debian package r-cran-mlbench (`seqdiff data fetch splice-junctions`),
read with the `rdata` package. The data frame holds 180 binary columns V1..V180, three per base in order:
A = 100, C = 010, G = 001, T = 000, and a factor `Class`.

The set has no official test split. We hold out a seeded, stratified 1,187 sequences (1,186, the size of the
StatLog test set, rounded per class) as the test split; the 1,999 others are the pool from which each probe
seed draws its 90/10 train / validation split.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np

from seqdiff.probes.data import Benchmark, LabeledSequences, ProbeError, encode_labels, stratified_split
from seqdiff.sources import data_dir

SEQ_LEN = 60
N_SEQUENCES = 3186
CLASSES = ["ei", "ie", "n"]
CODES = {(1, 0, 0): "A", (0, 1, 0): "C", (0, 0, 1): "G", (0, 0, 0): "T"}
TEST_SIZE = 1186
"""Held-out test sequences (as many as the StatLog test set; rounding per class gives 1,187)."""
TEST_SEED = 20_260_000
"""Seed of the held-out test split; fixed so every run and every model sees the same test sequences."""


def decode_bits(bits: np.ndarray) -> list[str]:
    """(N, 3 * L) 0/1 array -> N strings of L bases; a triple that is not a valid code is refused."""
    bits = np.asarray(bits, dtype=np.int64)
    if bits.ndim != 2 or bits.shape[1] % 3:
        raise ProbeError(f"splice-junction bits must be (N, 3 * L), got shape {bits.shape}")
    triples = bits.reshape(len(bits), -1, 3)  # (N, L, 3)
    code = triples @ np.array([4, 2, 1])  # A=4, C=2, G=1, T=0; anything else is invalid
    lookup = np.full(8, "?")
    lookup[[4, 2, 1, 0]] = ["A", "C", "G", "T"]
    if ((triples < 0) | (triples > 1)).any() or np.isin(code, [3, 5, 6, 7]).any():
        row = int(np.argwhere(np.isin(code, [3, 5, 6, 7]) | ((triples < 0) | (triples > 1)).any(-1))[0, 0])
        raise ProbeError(f"splice-junction row {row} holds a base code outside A=100, C=010, G=001, T=000")
    return ["".join(row) for row in lookup[code]]


def read_rda(path: str | Path) -> tuple[np.ndarray, list[str]]:
    """(bits (N, 180) int64, class strings) from mlbench's DNA.rda."""
    path = Path(path)
    if not path.is_file():
        raise ProbeError(f"{path} does not exist; fetch it with `seqdiff data fetch splice-junctions`")
    try:
        import rdata
    except ImportError as e:
        raise ProbeError("reading DNA.rda needs the `rdata` package (pip install rdata)") from e
    try:
        with warnings.catch_warnings():  # rdata warns once per factor column about an unknown string encoding
            warnings.simplefilter("ignore")
            frame = rdata.read_rda(str(path))["DNA"]
    except Exception as e:  # rdata raises many types for a foreign or truncated file
        raise ProbeError(f"{path} cannot be read as R data holding the mlbench DNA data frame: {e}") from e
    columns = [f"V{i}" for i in range(1, 3 * SEQ_LEN + 1)]
    missing = [c for c in columns + ["Class"] if c not in frame.columns]
    if missing:
        raise ProbeError(f"{path}: the DNA data frame lacks columns {missing[:5]}")
    bits = frame[columns].astype(int).to_numpy()
    return bits, [str(c) for c in frame["Class"]]


def default_path() -> Path:
    return data_dir() / "splice-junctions" / "DNA.rda"


def load_splice(path: str | Path | None = None, test_size: int = TEST_SIZE, seed: int = TEST_SEED) -> Benchmark:
    """The splice-junction benchmark with its documented held-out test split."""
    path = Path(path) if path is not None else default_path()
    bits, class_names = read_rda(path)
    return splice_benchmark(bits, class_names, str(path), test_size, seed)


def splice_benchmark(bits: np.ndarray, class_names: list[str], source: str, test_size: int = TEST_SIZE,
                     seed: int = TEST_SEED) -> Benchmark:
    """The benchmark from the decoded columns of DNA.rda (see `read_rda`)."""
    sequences = decode_bits(bits)
    labels, classes = encode_labels(class_names, CLASSES)
    data = LabeledSequences(sequences, labels)
    pool, test = stratified_split(labels, test_size / len(labels), seed)
    return Benchmark(
        name="splice", classes=classes, train=data.subset(pool), test=data.subset(test), max_len=SEQ_LEN,
        source=source,
        test_split=f"held out: {len(test)} sequences, stratified by class, numpy seed {seed} (no official split)",
    )
