"""The Nucleotide Transformer downstream tasks (Dalla-Torre et al., "The Nucleotide Transformer", bioRxiv 2023;
Nature Methods 2024): 18 classification tasks on human sequences, each with an official train / test split,
as `--benchmark nt/TASK` (the preprint's set, `InstaDeepAI/nucleotide_transformer_downstream_tasks`) or
`nt-revised/TASK` (the set revised after peer review, `..._revised`).

Two ways in, tried in this order (nothing is ever downloaded here):
1. `--data-dir ROOT`, a copy of the dataset repository: `ROOT/TASK/{train,test}.parquet` (columns
   `sequence`, `label`, other columns ignored; a `task` column, which the repository's Parquet conversion
   added, selects this task's rows), else `ROOT/TASK/{train,test}.fna` (FASTA, one header `>NAME|LABEL`
   per sequence: the repository's original files, as third-party readers parse them), else
   `ROOT/TASK/{train,test}.csv` (columns sequence, label; as some mirrors ship it). ROOT may also be the
   task folder itself.
2. `datasets.load_dataset(DATASET_ID, TASK)` from the local Hugging Face cache only: the libraries' offline
   switches are on during the call, so a dataset that is not cached fails with a message instead of a fetch.
Labels are the integer class indices of the files; class names are their decimal strings ("0", "1", "2").
A label outside the task's documented class count is refused, naming the file.

What was checked, and against what (from this offline machine, through stored copies of public pages and
repositories; the NT preprint's own text and the full dataset card table could not be read):
- Task names: the 18 configuration names passed to `load_dataset(..., name=TASK)` by the Caduceus
  repository's NT scripts (kuleshov-group/caduceus, slurm_scripts/wrapper_run_nucleotide_transformer.sh);
  the per-task folders `TASK/{train,test}.fna` (and later `.parquet`) in the dataset repository's file tree.
- Lengths and class counts: HyenaDNA's `configs/dataset/nucleotide_transformer.yaml` (HazyResearch/hyena-dna;
  17 tasks, splice_sites_all absent) and a Caduceus-derived copy of it that adds splice_sites_all (400 bp,
  3 classes; ZJ4433MR/caduceus-genomic-benchmark);
  the dataset card: enhancers_types is the 3-class (strong / weak / none) version of enhancers, and
  splice_sites_all holds donor, acceptor and non-site sequences (3 classes).
- Headline metrics (the preprint set): MCC for the enhancer and histone tasks, F1 for the promoter and
  splice acceptor / donor tasks (HyenaDNA's configs, and its paper's account of the NT protocol), accuracy
  for splice_sites_all (the Caduceus-derived config only: NOT checked against the NT preprint). Which F1:
  HyenaDNA's config averages over classes (macro), the Caduceus-derived one scores the positive class
  (binary); we report macro F1. Either way accuracy is recorded in every row.
- The revised set: MCC for every task (the published paper's Fig. 2 reports MCC across tasks); histone
  sequences of 1 kb and enhancers of 400 bp (the revised card); promoters 300 bp, splice tasks 600 bp and
  the class counts come from a third-party config only (unchecked). Its repository uses a loading script;
  that it also keeps the `TASK/{split}.fna` layout is assumed, not checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqdiff.probes.data import (
    Benchmark,
    LabeledSequences,
    ProbeError,
    check_alphabet,
    hf_split_columns,
    read_table,
)

SPLITS = ("train", "test")
FILE_LAYOUT = "TASK/{train,test}.parquet (or .fna / .csv)"


@dataclass(frozen=True)
class NTTask:
    name: str
    """Folder and configuration name in the dataset repository."""
    seq_len: int
    """Documented sequence length (bp)."""
    num_classes: int
    metric: str
    """Headline test metric (`metrics.METRICS`)."""


@dataclass(frozen=True)
class NTCollection:
    prefix: str
    """`--benchmark PREFIX/TASK`."""
    dataset_id: str
    """Hugging Face dataset id."""
    tasks: dict[str, NTTask]
    metric_note: str
    """Where the headline metrics come from (written into the report's notes)."""


def _tasks(*specs: tuple[str, int, int, str]) -> dict[str, NTTask]:
    return {name: NTTask(name, length, classes, metric) for name, length, classes, metric in specs}


_HISTONE = ("H3", "H3K14ac", "H3K36me3", "H3K4me1", "H3K4me2", "H3K4me3", "H3K79me3", "H3K9ac", "H4", "H4ac")
ORIGINAL = NTCollection(
    "nt", "InstaDeepAI/nucleotide_transformer_downstream_tasks",
    _tasks(*((h, 500, 2, "mcc") for h in _HISTONE),
           ("enhancers", 200, 2, "mcc"), ("enhancers_types", 200, 3, "mcc"),
           ("promoter_all", 300, 2, "f1_macro"), ("promoter_no_tata", 300, 2, "f1_macro"),
           ("promoter_tata", 300, 2, "f1_macro"),
           ("splice_sites_acceptors", 600, 2, "f1_macro"), ("splice_sites_donors", 600, 2, "f1_macro"),
           ("splice_sites_all", 400, 3, "accuracy")),
    "headline metric as in HyenaDNA's NT configs (MCC: enhancers, histone marks; F1: promoters, splice "
    "acceptors / donors, reported as macro F1); accuracy for splice_sites_all from a Caduceus-derived config, "
    "not checked against the NT preprint",
)
_HISTONE_REVISED = ("H2AFZ", "H3K27ac", "H3K27me3", "H3K36me3", "H3K4me1", "H3K4me2", "H3K4me3", "H3K9ac",
                    "H3K9me3", "H4K20me1")
REVISED = NTCollection(
    "nt-revised", "InstaDeepAI/nucleotide_transformer_downstream_tasks_revised",
    _tasks(*((h, 1000, 2, "mcc") for h in _HISTONE_REVISED),
           ("enhancers", 400, 2, "mcc"), ("enhancers_types", 400, 3, "mcc"),
           ("promoter_all", 300, 2, "mcc"), ("promoter_no_tata", 300, 2, "mcc"), ("promoter_tata", 300, 2, "mcc"),
           ("splice_sites_acceptors", 600, 2, "mcc"), ("splice_sites_donors", 600, 2, "mcc"),
           ("splice_sites_all", 600, 3, "mcc")),
    "headline metric MCC on every task, as the published paper (Nature Methods 2024, Fig. 2) reports them",
)
COLLECTIONS: dict[str, NTCollection] = {c.prefix: c for c in (ORIGINAL, REVISED)}
BENCHMARK_NAMES = [f"{c.prefix}/{t}" for c in COLLECTIONS.values() for t in c.tasks]
"""Every `--benchmark` name this module serves."""


def is_nt_name(name: str) -> bool:
    """Whether `name` asks for a Nucleotide Transformer task (known or not): PREFIX/anything."""
    prefix, sep, _ = name.partition("/")
    return bool(sep) and prefix in COLLECTIONS


def resolve(name: str) -> tuple[NTCollection, NTTask]:
    """(collection, task) of `nt/TASK` or `nt-revised/TASK`; an unknown task lists the known ones."""
    prefix, sep, task = name.partition("/")
    if not sep or prefix not in COLLECTIONS:
        raise ProbeError(f"{name!r} is not a Nucleotide Transformer task; use one of "
                         f"{', '.join(p + '/TASK' for p in COLLECTIONS)}")
    collection = COLLECTIONS[prefix]
    if task not in collection.tasks:
        close = difflib.get_close_matches(task, list(collection.tasks), n=1)
        hint = f" (did you mean {prefix}/{close[0]}?)" if close else ""
        raise ProbeError(f"{name!r}: {task!r} is not one of the {len(collection.tasks)} tasks of "
                         f"{collection.dataset_id}{hint}; choose one of {sorted(collection.tasks)}")
    return collection, collection.tasks[task]


# ------------------------------------------------------------------------------------------ file readers
def _int_labels(values: Sequence[Any], where: str) -> list[int]:
    labels = []
    for i, value in enumerate(values):
        try:
            label = int(value)
            if label != float(value):
                raise ValueError
        except (TypeError, ValueError):
            raise ProbeError(f"{where}: label {value!r} of sequence {i + 1} is not an integer class index") from None
        labels.append(label)
    return labels


def _keep_task(columns: dict[str, list], task: str, where: str) -> dict[str, list]:
    """Rows of `task` when the data carries a task column (the repository's Parquet files do)."""
    if "task" not in columns:
        return columns
    keep = [t == task for t in columns["task"]]
    if not any(keep):
        found = sorted({str(t) for t in columns["task"]})
        raise ProbeError(f"{where}: the task column holds {found[:5]}, not {task!r}")
    return {k: [v for v, kept in zip(values, keep) if kept] for k, values in columns.items()}


def read_parquet(path: Path, task: str) -> tuple[list[str], list[int]]:
    """(sequences, labels) from a Parquet file with columns sequence, label (and optionally task)."""
    try:
        import pyarrow.parquet as pq

        columns = pq.read_table(path).to_pydict()
    except ImportError as e:
        raise ProbeError(f"reading {path} needs the pyarrow package (pip install pyarrow)") from e
    except Exception as e:  # pyarrow raises several types for a foreign or truncated file
        raise ProbeError(f"cannot read {path} as Parquet: {e}") from e
    missing = [c for c in ("sequence", "label") if c not in columns]
    if missing:
        raise ProbeError(f"{path}: no column {', '.join(missing)}; found {sorted(columns)} (the dataset's files "
                         f"hold sequence, label)")
    columns = _keep_task(columns, task, str(path))
    return _sequence_strings(columns["sequence"], str(path)), _int_labels(columns["label"], str(path))


def _sequence_strings(values: Sequence[Any], where: str) -> list[str]:
    """The sequence cells as strings; a missing (null) or non-text cell is refused, not read as "None" / "7"."""
    for i, value in enumerate(values):
        if not isinstance(value, str):
            what = "missing (null)" if value is None else f"not text ({type(value).__name__} {value!r})"
            raise ProbeError(f"{where}: sequence {i + 1} is {what}; every row needs a DNA sequence")
    return list(values)


def read_fna(path: Path, task: str) -> tuple[list[str], list[int]]:
    """(sequences, labels) from the repository's FASTA files: `>NAME|LABEL`, then the sequence (any lines)."""
    sequences, labels, pieces, label = [], [], [], None
    try:
        with open(path) as f:
            for line_no, line in enumerate(f, start=1):
                line = line.strip()
                if not line:
                    continue
                if line.startswith(">"):
                    if label is not None:
                        sequences.append("".join(pieces))
                        labels.append(label)
                    _, sep, tail = line[1:].rpartition("|")
                    if not sep:
                        raise ProbeError(f"{path} line {line_no}: header {line[:60]!r} does not end in |LABEL "
                                         "(the dataset's FASTA headers are >NAME|LABEL)")
                    label, pieces = _int_labels([tail], f"{path} line {line_no}")[0], []
                elif label is None:
                    raise ProbeError(f"{path} line {line_no}: sequence before the first >NAME|LABEL header")
                else:
                    pieces.append(line)
    except (OSError, UnicodeDecodeError) as e:
        raise ProbeError(f"cannot read {path}: {e}") from e
    if label is not None:
        sequences.append("".join(pieces))
        labels.append(label)
    if not sequences:
        raise ProbeError(f"{path} holds no >NAME|LABEL records")
    return sequences, labels


def read_csv(path: Path, task: str) -> tuple[list[str], list[int]]:
    """(sequences, labels) from a CSV with a sequence and a label column (`data.read_table`)."""
    sequences, labels = read_table(path)
    return sequences, _int_labels(labels, str(path))


READERS: dict[str, Callable[[Path, str], tuple[list[str], list[int]]]] = {
    ".parquet": read_parquet,
    ".fna": read_fna,
    ".csv": read_csv,
}
"""File suffix -> reader, in the order they are looked for."""


def read_split(folder: Path, split: str, task: str) -> tuple[list[str], list[int], Path]:
    """(sequences, labels, file) of one split: the first of split.parquet, split.fna, split.csv in `folder`."""
    for suffix, reader in READERS.items():
        path = folder / f"{split}{suffix}"
        if path.is_file():
            return (*reader(path, task), path)
    raise ProbeError(f"{folder} has no {split} split: expected {' or '.join(split + s for s in READERS)}")


# ------------------------------------------------------------------------------------------------ sources
def load_layout(root: str | Path, collection: NTCollection, task: NTTask) -> Benchmark:
    """The task from a copy of the dataset repository: ROOT/TASK/{train,test}.{parquet,fna,csv}."""
    root = Path(root)
    folder = root / task.name
    if not folder.is_dir() and root.name == task.name and root.is_dir():
        folder = root  # --data-dir pointed at the task folder itself
    if not folder.is_dir():
        raise ProbeError(f"{folder} does not exist; --data-dir must be a copy of {collection.dataset_id} "
                         f"holding {FILE_LAYOUT}")
    splits = {}
    for split in SPLITS:
        sequences, labels, path = read_split(folder, split, task.name)
        splits[split] = _checked(sequences, labels, task, str(path))
    return _benchmark(collection, task, splits, str(folder))


def load_from_hf_cache(collection: NTCollection, task: NTTask, load_dataset: Callable[..., Any] | None = None
                       ) -> Benchmark:
    """`load_dataset(DATASET_ID, TASK)` with the libraries offline: only a dataset already in the local cache."""
    where = f"{collection.dataset_id} ({task.name})"
    if load_dataset is None:
        try:
            from datasets import load_dataset
        except ImportError as e:
            raise ProbeError("reading the Hugging Face cache needs the `datasets` package") from e
    try:
        from seqdiff.data.hub import hub_offline

        with hub_offline():
            data = load_dataset(collection.dataset_id, task.name)
    except Exception as e:  # not cached: ConnectionError, FileNotFoundError, OfflineModeIsEnabled, ...
        raise ProbeError(f"{where} is not in the local Hugging Face cache: {e}") from e
    splits = {}
    for split, columns in hf_split_columns(data, where, ("sequence", "label"), SPLITS).items():
        columns = _keep_task(columns, task.name, f"{where} {split}")
        labels = _int_labels(columns["label"], f"{where} {split}")
        sequences = _sequence_strings(columns["sequence"], f"{where} {split}")
        splits[split] = _checked(sequences, labels, task, f"{where} {split}")
    return _benchmark(collection, task, splits, f"{collection.dataset_id} (config {task.name}, local cache)")


def _checked(sequences: list[str], labels: list[int], task: NTTask, where: str) -> LabeledSequences:
    """The split, refused (naming `where`, its file) when empty, with a label outside the task's classes, or a
    sequence with characters outside the nucleotide alphabet."""
    if not sequences:
        raise ProbeError(f"{where} holds no sequences")
    check_alphabet(sequences, where)
    bad = sorted({y for y in labels if not 0 <= y < task.num_classes})
    if bad:
        raise ProbeError(f"{where}: labels {bad[:5]} outside 0..{task.num_classes - 1} ({task.name} has "
                         f"{task.num_classes} classes)")
    return LabeledSequences(sequences, np.array(labels, dtype=np.int64))


def _benchmark(collection: NTCollection, task: NTTask, splits: dict[str, LabeledSequences], source: str
               ) -> Benchmark:
    longest = max(len(s) for split in splits.values() for s in split.sequences)
    return Benchmark(name=f"{collection.prefix}/{task.name}", classes=[str(i) for i in range(task.num_classes)],
                     train=splits["train"], test=splits["test"], max_len=max(task.seq_len, longest),
                     source=source, test_split="official: the dataset's test split", metric=task.metric,
                     notes=[collection.metric_note])


def load_nt_task(name: str, data_dir: str | Path | None = None, load_dataset: Callable[..., Any] | None = None
                 ) -> Benchmark:
    """`nt/TASK` or `nt-revised/TASK`: from `data_dir` (a copy of the dataset repository), else from the local
    Hugging Face cache; offline with neither, one message says how to provide a copy."""
    collection, task = resolve(name)
    if data_dir is not None:
        return load_layout(data_dir, collection, task)
    try:
        return load_from_hf_cache(collection, task, load_dataset)
    except ProbeError as e:
        raise ProbeError(f"{name}: no local copy ({e}). Pass --data-dir ROOT with a copy of the dataset "
                         f"repository {collection.dataset_id} (ROOT/{task.name}/{{train,test}}.parquet, "
                         ".fna or .csv), or load it once with datasets.load_dataset where the hub is reachable") from e
