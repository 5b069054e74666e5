"""Genomic Benchmarks (Grešová et al., BMC Genomic Data 2023): the eight classification sets that
HyenaDNA, Caduceus and MDLM report.

Three ways in, tried in this order:
1. the package's on-disk layout, `ROOT/NAME/{train,test}/{class}/*.txt` (one sequence per file; classes
   are the sorted folder names, identical in both splits) — from `--data-dir ROOT`, or the package's own
   cache `~/.genomic_benchmarks/NAME` when present;
2. the `genomic-benchmarks` package (`download_dataset`), which fetches that layout when online;
3. the Hugging Face mirror `katarinagresova/Genomic_Benchmarks_NAME` (columns `seq`, `label`) through
   `datasets`, when online.
Offline with none of them, the loader says so and names all three.

Every dataset records its longest sequence (`max_len`); a model with a shorter context sees the central
`context` bases of longer sequences (rule "center"), and the number cut is reported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from seqdiff.probes.data import Benchmark, LabeledSequences, ProbeError, hf_split_columns


@dataclass(frozen=True)
class GBDataset:
    name: str
    """Name in the genomic-benchmarks package (and the folder name of its layout)."""
    max_len: int
    """Longest sequence in the set (Grešová et al. 2023, Table 1)."""
    num_classes: int


DATASETS: dict[str, GBDataset] = {d.name: d for d in (
    GBDataset("dummy_mouse_enhancers_ensembl", 4707, 2),
    GBDataset("demo_coding_vs_intergenomic_seqs", 200, 2),
    GBDataset("demo_human_or_worm", 200, 2),
    GBDataset("human_enhancers_cohn", 500, 2),
    GBDataset("human_enhancers_ensembl", 573, 2),
    GBDataset("human_ensembl_regulatory", 802, 3),
    GBDataset("human_nontata_promoters", 251, 2),
    GBDataset("human_ocr_ensembl", 593, 2),
)}
ALIASES = {"dummy_mouse_enhancers": "dummy_mouse_enhancers_ensembl",
           "demo_coding_vs_intergenomic": "demo_coding_vs_intergenomic_seqs"}
"""Short names the issue (and some papers) use."""
HF_PREFIX = "katarinagresova/Genomic_Benchmarks_"
PACKAGE_CACHE = Path.home() / ".genomic_benchmarks"
SPLITS = ("train", "test")


def canonical_name(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in DATASETS:
        raise ProbeError(f"{name!r} is not a Genomic Benchmarks dataset; choose one of {sorted(DATASETS)}")
    return name


# ------------------------------------------------------------------------------------------ on-disk layout
def read_layout(folder: str | Path, name: str | None = None) -> Benchmark:
    """A dataset in the package layout `folder/{train,test}/{class}/*.txt`."""
    folder = Path(folder)
    name = name or folder.name
    class_sets = {}
    for split in SPLITS:
        split_dir = folder / split
        if not split_dir.is_dir():
            raise ProbeError(f"{folder} lacks the {split}/ folder of the Genomic Benchmarks layout "
                             f"(NAME/{{train,test}}/{{class}}/*.txt)")
        class_sets[split] = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    classes = class_sets["train"]
    if not classes:
        raise ProbeError(f"{folder / 'train'} holds no class folders")
    if class_sets["test"] != classes:
        raise ProbeError(f"{folder}: the class folders differ between train {classes} and test {class_sets['test']}; "
                         "both splits need the same classes")
    splits = {}
    for split in SPLITS:
        sequences, labels = [], []
        for label, cls in enumerate(classes):
            files = sorted((folder / split / cls).glob("*.txt"))
            if not files:
                raise ProbeError(f"{folder / split / cls} holds no .txt files: class {cls!r} has no {split} examples")
            for f in files:
                sequences.append("".join(f.read_text().split()))
                labels.append(label)
        splits[split] = LabeledSequences(sequences, np.array(labels))
    spec = DATASETS.get(ALIASES.get(name, name))
    longest = max(len(s) for split in splits.values() for s in split.sequences)
    return Benchmark(name=name, classes=classes, train=splits["train"], test=splits["test"],
                     max_len=spec.max_len if spec else longest, source=str(folder))


# --------------------------------------------------------------------------------- package and HF mirror
def load_with_package(name: str, download: Callable[..., Any] | None = None) -> Benchmark:
    """Fetch the layout with the genomic-benchmarks package (online), then read it."""
    if download is None:
        try:
            from genomic_benchmarks.loc2seq import download_dataset as download
        except ImportError as e:
            raise ProbeError("the genomic-benchmarks package is not installed (pip install genomic-benchmarks)") from e
    try:
        folder = download(name, version=0)
    except Exception as e:  # network errors come in many types
        raise ProbeError(f"genomic-benchmarks could not download {name} (offline?): {e}") from e
    return read_layout(folder, name)


def load_from_hf(name: str, load_dataset: Callable[..., Any] | None = None) -> Benchmark:
    """The Hugging Face mirror (columns seq, label; splits train, test) through `datasets`: its local cache, else
    the hub when it answers (seqdiff.data.hub)."""
    dataset_id = HF_PREFIX + name
    if load_dataset is None:  # the local cache first; not cached and the hub unreachable: at once, no retries
        from seqdiff.data.hub import load_hub_dataset as load_dataset
    try:
        data = load_dataset(dataset_id)
    except Exception as e:  # offline: ConnectionError, OfflineModeIsEnabled, FileNotFoundError, ...
        raise ProbeError(f"cannot load {dataset_id} with datasets (offline?): {e}") from e
    splits = {split: LabeledSequences(list(columns["seq"]), np.array(columns["label"]))
              for split, columns in hf_split_columns(data, dataset_id, ("seq", "label"), SPLITS).items()}
    n_classes = int(max(splits["train"].labels.max(), splits["test"].labels.max())) + 1
    return Benchmark(name=name, classes=[str(i) for i in range(n_classes)], train=splits["train"],
                     test=splits["test"], max_len=DATASETS[name].max_len, source=dataset_id)


def load_genomic_benchmark(name: str, data_dir: str | Path | None = None) -> Benchmark:
    """One of the eight datasets, from `data_dir/NAME`, the package cache, the package, or the HF mirror."""
    name = canonical_name(name)
    if data_dir is not None:
        folder = Path(data_dir) / name
        if not folder.is_dir():
            raise ProbeError(f"{folder} does not exist; --data-dir must hold NAME/{{train,test}}/{{class}}/*.txt")
        return read_layout(folder, name)
    if (PACKAGE_CACHE / name).is_dir():
        return read_layout(PACKAGE_CACHE / name, name)
    errors = []
    for loader in (load_with_package, load_from_hf):
        try:
            return loader(name)
        except ProbeError as e:
            errors.append(str(e))
    raise ProbeError(f"{name}: no local copy and no way to fetch one ({'; '.join(errors)}). Offline, put the "
                     f"dataset in the package layout and pass --data-dir ROOT "
                     f"(ROOT/{name}/{{train,test}}/{{class}}/*.txt)")
