"""Benchmark registry: `--benchmark NAME` -> a loader returning a checked `Benchmark`.

Names: `splice` (offline, real), the eight Genomic Benchmarks datasets (and their short aliases), the
Nucleotide Transformer downstream tasks `nt/TASK` and `nt-revised/TASK` (from a copy given by `data_dir` or the
local Hugging Face cache), or the path of a user CSV / TSV of sequence, label (a seeded held-out test split is
made unless `test_file` is given).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from seqdiff.probes import genomic_benchmarks as gb
from seqdiff.probes import nucleotide_transformer as nt
from seqdiff.probes.data import Benchmark, LabeledSequences, ProbeError, encode_labels, read_table, stratified_split
from seqdiff.probes.splice import load_splice

USER_TEST_FRACTION = 0.2
USER_TEST_SEED = 20_260_001


def _genomic(name: str) -> Callable[..., Benchmark]:
    return lambda data_dir=None, **_: gb.load_genomic_benchmark(name, data_dir)


def _nt(name: str) -> Callable[..., Benchmark]:
    return lambda data_dir=None, **_: nt.load_nt_task(name, data_dir)


BENCHMARKS: dict[str, Callable[..., Benchmark]] = {
    "splice": lambda data_dir=None, **_: load_splice(Path(data_dir) / "DNA.rda" if data_dir else None),
    **{name: _genomic(name) for name in gb.DATASETS},
    **{alias: _genomic(target) for alias, target in gb.ALIASES.items()},
    **{name: _nt(name) for name in nt.BENCHMARK_NAMES},
}
TABLE_SUFFIXES = (".csv", ".tsv", ".tab")


def load_user_table(path: str | Path, test_file: str | Path | None = None) -> Benchmark:
    """A user dataset: CSV / TSV of sequence, label; test rows from `test_file` or a seeded 20% hold-out."""
    path = Path(path)
    sequences, label_names = read_table(path)
    labels, classes = encode_labels(label_names)
    check_user_classes(path, labels, classes, held_out=test_file is None)
    data = LabeledSequences(sequences, labels)
    if test_file is not None:
        test_seqs, test_names = read_table(test_file)
        test = LabeledSequences(test_seqs, encode_labels(test_names, classes)[0])
        missing = sorted(set(classes) - set(test_names))
        if missing:
            raise ProbeError(f"{test_file}: no rows of class(es) {missing}; the test rows need every class of "
                             f"{path} ({classes})")
        train, split_note = data, f"official: {test_file}"
    else:
        kept, held = stratified_split(labels, USER_TEST_FRACTION, USER_TEST_SEED)
        train, test = data.subset(kept), data.subset(held)
        split_note = f"held out: {len(held)} rows ({USER_TEST_FRACTION:.0%} per class), numpy seed {USER_TEST_SEED}"
    return Benchmark(name=path.stem, classes=classes, train=train, test=test,
                     max_len=max(len(s) for s in train.sequences + test.sequences), source=str(path),
                     test_split=split_note)


def check_user_classes(path: Path, labels: np.ndarray, classes: list[str], held_out: bool) -> None:
    """Refuse a user table that the protocol cannot split into classes (before any model work), naming the file:
    one class only; with a held-out test split, a class of one row (it cannot be in both splits) or no class of
    three rows or more (the training rows left would hold one of each, and the validation split none)."""
    counts = np.bincount(labels, minlength=len(classes))
    if len(classes) < 2:
        raise ProbeError(f"{path}: all {len(labels)} rows have label {classes[0]!r}; a probe needs at least two "
                         "classes")
    if held_out and counts.min() < 2:
        rare = [c for c, n in zip(classes, counts, strict=True) if n < 2]
        raise ProbeError(f"{path}: class(es) {rare} have a single row; with a held-out test split every class needs "
                         "at least 2 rows (one for train, one for test), or give the test rows in --test-file")
    if counts.max() < (3 if held_out else 2):
        need = "3 rows of some class (2 stay in training after the held-out test split)" if held_out else \
            "2 rows of some class"
        raise ProbeError(f"{path}: {len(labels)} rows, at most {counts.max()} of any class; the protocol's 90/10 "
                         f"train/validation split needs at least {need}")


def load_benchmark(name: str, data_dir: str | Path | None = None, test_file: str | Path | None = None) -> Benchmark:
    """The benchmark called `name` (or the user table at that path), checked (classes, alphabet)."""
    if name in BENCHMARKS:
        bench = BENCHMARKS[name](data_dir=data_dir)
    elif nt.is_nt_name(name):
        bench = nt.load_nt_task(name, data_dir)  # an unknown task: the message lists the collection's tasks
    elif Path(name).suffix.lower() in TABLE_SUFFIXES:
        if not Path(name).is_file():
            raise ProbeError(f"dataset file {name} does not exist")
        bench = load_user_table(name, test_file)
    else:
        named = sorted(n for n in BENCHMARKS if not nt.is_nt_name(n))
        raise ProbeError(f"unknown benchmark {name!r}; choose one of {named}, nt/TASK or nt-revised/TASK "
                         "(Nucleotide Transformer tasks), or give a .csv / .tsv file of sequence,label")
    bench.check()
    return bench
