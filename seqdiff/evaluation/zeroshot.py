"""Zero-shot likelihood: one checkpoint scored on several datasets in one run, as a table.

    seqdiff eval RUN --dataset shakespeare:test --dataset austen --dataset wikitext103 --data my.jsonl

A source is either
- `--data PATH`: a .txt / .txt.gz / .jsonl / .parquet file, or a corpus folder holding {split}.<ext>;
- `--dataset NAME[:SPLIT]`: a builtin corpus (shakespeare), a fetched local corpus (austen) or a hub
  dataset of the registry in `seqdiff.data.datasets` (wikitext103, lambada, ptb, lm1b, ...). A hub dataset
  fails offline with the registry's message, which says how to point at local files instead.

Each source goes through the same path as training data (`seqdiff.data.text`): documents are read, the
dataset's registered detokenizer is applied (or `detokenizer`, which overrides it; "none" turns it off),
and the text is tokenized into the checkpoint's own block mode (stream, wrapped or padded) at its block
length, so that a zero-shot number is measured the way the model was validated. Every source is resolved
(names checked, files found) before any scoring starts, so a typo fails fast.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqdiff.checkpoint import LoadedModel
from seqdiff.config import ConfigError, DataConfig, TextDataConfig
from seqdiff.data.text_files import DataFileError

FASTA_SUFFIXES = (".fa", ".fasta", ".fna", ".fa.gz", ".fasta.gz", ".fna.gz")


@dataclass(frozen=True)
class EvalSource:
    """One row of the zero-shot table: where its text comes from and which split."""

    label: str
    """Short name printed in the table (file name, or dataset/split)."""
    split: str
    corpus: str | None = None
    """Dataset name, builtin corpus or corpus folder (None for a single file)."""
    file: Path | None = None
    """A single file scored as the split (None for a corpus)."""

    @property
    def is_fasta(self) -> bool:
        return self.file is not None and self.file.name.lower().endswith(FASTA_SUFFIXES)


def parse_sources(options: list[tuple[str, str]] | None, split: str) -> list[EvalSource]:
    """EvalSources from ("data", PATH) and ("dataset", NAME[:SPLIT]) options, in order, checked before anything
    is scored."""
    return [_data_source(value, split) if kind == "data" else _dataset_source(value, split)
            for kind, value in options or []]


def _data_source(value: str, split: str) -> EvalSource:
    from seqdiff.data.text_files import corpus_split_path

    path = Path(value).expanduser()
    if path.is_dir():
        corpus_split_path(path, split)  # raises, naming the folder and the files it expects
        return EvalSource(f"{path.name}/{split}", split, corpus=str(path))
    if path.is_file():
        return EvalSource(path.name, split, file=path)
    raise DataFileError(f"--data {value}: no such file or folder (use --dataset NAME for a named dataset)")


def _dataset_source(value: str, split: str) -> EvalSource:
    from seqdiff.data.datasets import DATASETS, SPLITS, DatasetError
    from seqdiff.data.text_files import BUILTIN_CORPORA, corpus_split_path

    name, _, chosen = value.partition(":")
    chosen = chosen or split
    if chosen not in SPLITS:
        raise DatasetError(f"--dataset {value}: split {chosen!r} is unknown; choose one of {list(SPLITS)}")
    if name in BUILTIN_CORPORA:
        corpus_split_path(name, chosen)
    elif name in DATASETS and hasattr(DATASETS[name], "files"):
        DATASETS[name].files(chosen)  # a corpus `seqdiff data fetch` provides: not fetched is said before any work
    elif name not in DATASETS:
        raise DatasetError(f"--dataset {value}: unknown dataset {name!r}; known datasets: "
                           f"{', '.join(sorted(DATASETS))}; builtin corpora: {', '.join(sorted(BUILTIN_CORPORA))} "
                           "(files and folders go in --data)")
    return EvalSource(f"{name}/{chosen}", chosen, corpus=name)


def file_tokens(path: Path, tokenizer):
    """Tokens and a loss mask (False at N bases; None for text) of one text file, or of a FASTA file for a
    nucleotide tokenizer: the whole file as one stream, for scorers that tile it themselves (EDLM bounds)."""
    if tokenizer.kind == "nucleotide" and path.name.lower().endswith(FASTA_SUFFIXES):
        from seqdiff.data.genome import fasta_tokens

        return fasta_tokens(path, tokenizer)
    from seqdiff.data.text import tokenize_file

    return tokenize_file(path, tokenizer, warn_alphabet=True), None


def source_config(model: LoadedModel, source: EvalSource, batch_size: int,
                  detokenizer: str | None = None) -> DataConfig:
    """The data config that reads `source` like the checkpoint's own evaluation data (block mode, length,
    document boundaries), with the source's detokenizer rather than the training corpus'."""
    base = model.data_config if model.data_config is not None and model.data_config.kind == "text" else None
    text = dataclasses.replace(base.text if base else TextDataConfig(), detokenizer=detokenizer)
    files = {f"{s}_file": None for s in ("train", "valid", "test")}
    if source.file is not None:
        files[f"{source.split}_file"] = str(source.file)
    return DataConfig(kind="text", corpus=source.corpus or "shakespeare", **files, seq_len=model.seq_len,
                      eval_batch_size=batch_size, text=text)


def evaluate_source(model: LoadedModel, source: EvalSource, batch_size: int = 32, num_t_samples: int = 1,
                    seed: int = 0, detokenizer: str | None = None, progress: bool = False,
                    order: str | None = None) -> dict[str, Any]:
    """The likelihood report of one source (see `seqdiff.evaluation.likelihood.nll_report`), labelled."""
    from seqdiff.evaluation.likelihood import evaluate_batches, evaluate_tokens

    if source.is_fasta and model.tokenizer.kind == "nucleotide":  # a genome slice: N bases are not scored
        from seqdiff.data.genome import fasta_tokens

        tokens, loss_mask = fasta_tokens(source.file, model.tokenizer)
        report = evaluate_tokens(model, tokens, batch_size=batch_size, loss_mask=loss_mask,
                                 num_t_samples=num_t_samples, seed=seed, progress=progress, order=order)
        detok = None
    else:
        from seqdiff.data.text import SplitSource, TextData

        config = source_config(model, source, batch_size, detokenizer)
        detok = SplitSource(config, source.split).detokenizer_name
        loader = TextData(config, model.tokenizer).eval_dataloader(source.split)
        report = evaluate_batches(model, loader, num_t_samples=num_t_samples, seed=seed, progress=progress,
                                  order=order)
    report.update({"dataset": source.label, "split": source.split, "detokenizer": detok,
                   "data": str(source.file) if source.file is not None else source.corpus})
    return report


def _short_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def source_key(source: EvalSource) -> str:
    """A result file's name for one source: its label, plus a short hash of the resolved path for files and
    folders, so that two sources with the same base name (a/test.txt, b/test.txt) never share a file."""
    stem = source.label.replace("/", "-")
    path = source.file if source.file is not None else Path(source.corpus) if source.corpus else None
    if path is not None and (source.file is not None or path.is_dir()):
        stem += "-" + _short_hash(str(path.expanduser().resolve()))
    return stem


def eval_results_path(checkpoint: str | Path, sources: list[EvalSource], own_split: str = "own",
                      order: str | None = None) -> Path:
    """Default `seqdiff eval` output: `<run>/eval/` for a run (or a checkpoint in its checkpoints/ folder),
    `<export>/eval/` for an exported directory, `<folder>/eval/` beside a loose .ckpt; named by the source
    (`source_key`), `zeroshot-<hash of the sources>` for several, the run's own split by its corpus and split.
    A checkpoint other than a run's last.ckpt prefixes its own name (step100-...); an exact order (`--order`)
    suffixes its name, so the bound and each order's likelihood keep their own files."""
    from seqdiff.checkpoint import LAST_CHECKPOINT, is_exported_dir

    given = Path(checkpoint)
    prefix = ""
    if is_exported_dir(given):
        folder = given / "eval"
    elif given.is_dir():
        folder = given / "eval"
    elif given.parent.name == LAST_CHECKPOINT.parent.name:
        folder = given.parent.parent / "eval"
        prefix = "" if given.name == LAST_CHECKPOINT.name else given.stem + "-"
    else:
        folder = given.parent / "eval"
        prefix = given.stem + "-"
    if len(sources) == 1:
        stem = source_key(sources[0])
    elif sources:
        stem = "zeroshot-" + _short_hash("\n".join(source_key(s) for s in sources))
    else:  # the run's own corpus split (its config names it), e.g. shakespeare-test
        stem = own_split.replace("/", "-")
    suffix = "" if order is None else "-order-" + re.sub(r"[^A-Za-z0-9_]+", "_", order)
    return folder / f"{prefix}{stem}{suffix}.json"


def read_eval_results(path: str | Path) -> list[dict[str, Any]]:
    """The reports of a `seqdiff eval` file: {"results": [...]} now, or the flat report older versions wrote
    for a single source (returned as a one-element list)."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and isinstance(data.get("results"), list):
        common = {k: v for k, v in data.items() if k != "results"}
        return [{**common, **r} for r in data["results"]]
    if isinstance(data, dict) and "nll_nats_per_token" in data:
        return [data]
    raise ConfigError(f"{path} is not a `seqdiff eval` results file (no 'results' list)")


UNIT_COLUMNS = {"character": "BPC", "base": "bits/base"}


def format_table(reports: list[dict[str, Any]]) -> str:
    """The zero-shot table: dataset, tokens, nats/token, perplexity, bits per character / base where the
    tokens are characters / bases, and whether the number is a bound (diffusion) or exact (AR)."""
    unit_keys = [(f"bits_per_{u}", name) for u, name in UNIT_COLUMNS.items()
                 if any(f"bits_per_{u}" in r for r in reports)]
    header = ["dataset", "tokens", "nats/token", "PPL", *[name for _, name in unit_keys], "kind"]
    rows = []
    for r in reports:
        kind = "bound" if r["bound"] else "exact"
        rows.append([r["dataset"], f"{r['num_tokens']:,}", f"{r['nll_nats_per_token']:.4f}",
                     _ppl(r["perplexity"]), *[f"{r[k]:.4f}" if k in r else "" for k, _ in unit_keys], kind])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths)))]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
    return "\n".join(lines)


def _ppl(value: float) -> str:
    return f"{value:.3f}" if value < 1e6 and not math.isinf(value) else f"{value:.3e}"

