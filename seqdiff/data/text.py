"""Text data module: a corpus (builtin, named dataset, or a user's folder / files) turned into blocks.

Four block modes (data.text.block_mode):
- stream (default): each split tokenized into one stream; training takes random windows
  (`RandomWindowBatches`), evaluation tiles the stream (`TiledBlocks`).
- wrapped: documents joined with EOS and cut into BOS ... EOS rows (`pack_wrapped`, MDLM's wrap);
- padded: one document per row, BOS doc EOS, truncated and padded (`pack_padded`; padding is masked out
  of attention and of the loss). Both train on whole rows (`RandomBlockBatches`) and evaluate every row
  (`PackedBlocks`).
- packed: documents BOS doc EOS one after the other in full rows of data.seq_len (`pack_documents`; a document
  that reaches the end of a row goes on in the next row as a document of its own), with per-token segment
  ids and positions restarting at 0 in each document; the backbone keeps attention inside each document
  and every row but the split's last is full (no padding). Train, valid and test are packed separately;
  training visits whole rows (`RandomBlockBatches`, the last, padded row included: no token is dropped) and
  evaluation scores every row, packed as in training (`PackedBlocks`), which equals scoring each document
  on its own (document-aware attention).

Document boundaries: a .jsonl line or .parquet row; in .txt files a paragraph or a line (data.text.documents).
Tokenized blocks of large sources (data.text.cache_min_bytes, or data.text.cache=true) are cached on disk under
the data directory (`seqdiff.data.cache`), tokenized as a stream in bounded memory, in parallel with a
progress bar (`seqdiff.data.streaming`: the same arrays as the in-memory path, built chunk by chunk).
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from seqdiff.config import DataConfig
from seqdiff.data import cache
from seqdiff.data.blocks import (
    PackedBlocks,
    RandomBlockBatches,
    RandomWindowBatches,
    TiledBlocks,
    pack_documents,
    pack_padded,
    pack_wrapped,
    segment_dtype,
)
from seqdiff.data.cache import file_identity
from seqdiff.data.datasets import DATASETS, get_dataset, get_detokenizer, load_documents
from seqdiff.data.streaming import _encode, _encode_chunk, _init_worker, build_streaming
from seqdiff.data.text_files import DataFileError, corpus_split_path, read_documents, read_text_file
from seqdiff.safe_io import WriteError
from seqdiff.sources import DATA_DIR_ENV
from seqdiff.tokenizers.base import Tokenizer, TokenizerError

SPLITS = ("train", "valid", "test")
PARALLEL_MIN_CHARS = 16_000_000
"""Sources with fewer characters are tokenized in this process."""
CHUNK_CHARS = 2_000_000
"""Characters of documents per parallel tokenization task."""


def split_path(config: DataConfig, split: str) -> Path:
    explicit = getattr(config, f"{split}_file")
    return Path(explicit) if explicit else corpus_split_path(config.corpus, split)


ALPHABET_SAMPLE_CHARS = 1_000_000
"""Characters of a source read to tell how much of it lies outside a normalizing tokenizer's alphabet."""


def warn_outside_alphabet(text: str, tokenizer: Tokenizer, what: str) -> None:
    """Say on stderr when most of `text` (its first 1M characters) is outside a normalizing tokenizer's alphabet
    (a text8 model fed Chinese or a table of numbers): the model would be trained or scored on the spaces that
    remain, and a bits-per-character figure of that would mislead."""
    if not tokenizer.normalizes_away:
        return
    share = tokenizer.outside_share(text[:ALPHABET_SAMPLE_CHARS])
    if share > 0.5:
        alphabet = "".join(s for s in tokenizer.symbols if not s.isspace())
        print(f"seqdiff: {what}: {share:.0%} of its non-space characters are outside the model's alphabet "
              f"({alphabet}) and become spaces under its normalization: the model sees little of this text",
              file=sys.stderr)


def tokenize_file(path: str | Path, tokenizer: Tokenizer, warn_alphabet: bool = False) -> np.ndarray:
    """Read and tokenize one file; errors name the file. warn_alphabet: say when most of it is outside a
    normalizing tokenizer's alphabet (callers outside the data module, which checks its splits itself)."""
    text = read_text_file(path)
    if warn_alphabet:
        warn_outside_alphabet(text, tokenizer, str(path))
    try:
        ids = tokenizer.encode(text)
    except TokenizerError as e:
        raise DataFileError(f"{path}: {e}") from e
    if len(ids) == 0:
        raise DataFileError(f"{path}: no tokens after tokenization")
    return ids


# ---------------------------------------------------------------------------------------------- sources
class SplitSource:
    """Where a split's documents come from: its cache identity, size, and how to read them."""

    def __init__(self, config: DataConfig, split: str):
        self.split, self.path, self.dataset = split, None, None
        explicit = getattr(config, f"{split}_file")
        if explicit is None and config.corpus in DATASETS:
            self.dataset = get_dataset(config.corpus)
        else:
            self.path = split_path(config, split)
        default = self.dataset.detokenizer if self.dataset is not None else None
        name = config.text.detokenizer if config.text.detokenizer is not None else default
        self.detokenizer_name = None if name == "none" else name
        self.detokenize = get_detokenizer(self.detokenizer_name)
        self.documents_mode = config.text.documents

    def identity(self) -> dict[str, Any]:
        source = file_identity(self.path) if self.path is not None else self.dataset.identity(self.split)
        return {"source": source, "detokenizer": self.detokenizer_name, "documents": self.documents_mode}

    def size_bytes(self) -> float:
        if self.path is not None:
            return self.path.stat().st_size if self.path.is_file() else 0
        files = getattr(self.dataset, "files", None)
        return sum(p.stat().st_size for p in files(self.split)) if files else float("inf")

    def documents(self) -> list[str]:
        if self.path is not None:
            docs = read_documents(self.path, self.documents_mode)
        else:
            docs = load_documents(self.dataset.name, self.split, self.documents_mode)
        if self.detokenize is not None:
            docs = [self.detokenize(d) for d in docs]
        return docs

    def what(self) -> str:
        return str(self.path) if self.path is not None else f"dataset {self.dataset.name!r} split {self.split!r}"


# ---------------------------------------------------------------------------------------------- tokenization
def tokenize_documents(documents: list[str], tokenizer: Tokenizer, workers: int = 0,
                       what: str = "documents") -> list[np.ndarray]:
    """Each document's ids (int32), in order; large inputs in `workers` processes with a progress bar."""
    from tqdm.auto import tqdm

    total = sum(len(d) for d in documents)
    workers = workers or min(8, os.cpu_count() or 1)
    try:
        if total < PARALLEL_MIN_CHARS or workers == 1:
            progress = total >= PARALLEL_MIN_CHARS // 4
            items = tqdm(documents, desc=f"tokenizing {what}", unit="doc", disable=not progress, file=sys.stderr)
            return [_encode(tokenizer, d, i) for i, d in enumerate(items)]
        chunks, start, size = [], 0, 0
        for i, d in enumerate(documents):
            size += len(d)
            if size >= CHUNK_CHARS or i == len(documents) - 1:
                chunks.append((start, documents[start : i + 1]))
                start, size = i + 1, 0
        out: list[np.ndarray] = []
        with multiprocessing.get_context().Pool(workers, _init_worker, (tokenizer.to_dict(),)) as pool:
            for ids in tqdm(pool.imap(_encode_chunk, chunks), total=len(chunks), desc=f"tokenizing {what}",
                            unit="chunk", file=sys.stderr):
                out.extend(ids)
        return out
    except TokenizerError as e:
        raise DataFileError(f"{what}: {e}") from e


def build_split_arrays(source: SplitSource, tokenizer: Tokenizer, config: DataConfig
                       ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays of one split in the configured block mode (what the cache stores), and meta data."""
    if config.text.block_mode == "stream":
        if source.path is not None and source.detokenize is None:
            return {"tokens": tokenize_file(source.path, tokenizer)}, {}  # the file read and tokenized whole
        ids = tokenize_documents(["\n\n".join(source.documents())], tokenizer, 1, source.what())[0]
        if len(ids) == 0:
            raise DataFileError(f"{source.what()}: no tokens after tokenization")
        return {"tokens": ids}, {}
    docs = source.documents()
    ids = tokenize_documents(docs, tokenizer, config.text.tokenize_workers, source.what())
    special = (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
    truncated = 0
    extra: dict[str, np.ndarray] = {}
    if config.text.block_mode == "wrapped":
        blocks, lengths = pack_wrapped(ids, config.seq_len, *special)
    elif config.text.block_mode == "packed":
        blocks, lengths, segments = pack_documents(ids, config.seq_len, *special)
        extra["segments"] = segments.astype(segment_dtype(config.seq_len))  # as the streaming path stores them
    else:
        blocks, lengths, truncated = pack_padded(ids, config.seq_len, *special)
    if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1:  # GPT-2, BERT, characters: half the disk and memory
        blocks = blocks.astype(np.uint16)
    meta = {"documents": len(docs), "truncated": truncated}
    if config.text.block_mode == "padded":  # what truncation cut off, as the streaming PaddedPacker counts it
        meta.update(tokens=sum(len(d) for d in ids),
                    dropped_tokens=sum(max(0, len(d) - (config.seq_len - 2)) for d in ids))
    return {"blocks": blocks, "lengths": lengths, **extra}, meta


def load_split_arrays(config: DataConfig, tokenizer: Tokenizer, split: str,
                      log: Callable[[str], None] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """A split's arrays, from the on-disk cache when it is enabled for this source (built on a miss)."""
    source = SplitSource(config, split)
    text = config.text
    use_cache = text.cache if text.cache is not None else source.size_bytes() >= text.cache_min_bytes
    if not use_cache:
        return build_split_arrays(source, tokenizer, config)
    fields = {**source.identity(), "tokenizer": cache.tokenizer_fingerprint(tokenizer),
              "seq_len": config.seq_len if text.block_mode != "stream" else None, "mode": text.block_mode}
    # built by the streaming path: bounded memory, the same arrays
    try:
        return cache.load_or_build_into(fields, lambda folder: build_streaming(source, tokenizer, config, folder),
                                        log=log)
    except WriteError as e:  # a read-only or full data directory: say which option writes there
        setting = ("data.text.cache=true caches" if text.cache else f"data.text.cache=null caches sources of "
                   f"data.text.cache_min_bytes={text.cache_min_bytes} or more, as the {split} split,")
        raise WriteError(f"{e} ({setting} tokenized blocks there; set data.text.cache=false, or ${DATA_DIR_ENV} "
                         f"to a writable data directory)") from e


def truncation_message(meta: dict[str, Any], config: DataConfig, split: str) -> str:
    """What data.text.block_mode=padded cut off a split: documents and the share of its tokens. When most tokens
    are lost to paragraph documents (a blank line ends one), the file likely holds one document per line."""
    message = f"{meta['truncated']} of {meta['documents']} {split} documents truncated to data.seq_len={config.seq_len}"
    tokens = meta.get("tokens") or 0  # caches written before this count have none: the count alone
    if not tokens:
        return message
    share = meta.get("dropped_tokens", 0) / tokens
    message += f": {share:.1%} of the split's tokens are not used"
    if share > 0.5:
        hint = (" (data.text.documents=paragraphs ends a document at a blank line; for one document per line use "
                "data.text.documents=lines)" if config.text.documents == "paragraphs" else "")
        message += f"; a longer data.seq_len or data.text.block_mode=packed keeps them{hint}"
    return message


class TextData:
    """Training batches (step-indexed, resumable, rank-sliced) and evaluation blocks, in data.block_mode.

    Without Lightning, for evaluation; training uses TextDataModule (seqdiff.data.modules: this class with
    LightningDataModule's hooks, whose trainer gives train_dataloader its step and rank)."""

    def __init__(self, config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
        super().__init__()  # LightningDataModule's, in TextDataModule
        self.config, self.tokenizer, self.seed = config, tokenizer, seed
        self.arrays: dict[str, dict[str, np.ndarray]] = {}
        self.meta: dict[str, dict[str, Any]] = {}

    def check_files(self, splits=SPLITS) -> None:
        """Fail early (before any training) on a missing, empty or malformed file."""
        for split in splits:
            self.split_arrays(split)

    def check_windows(self, splits=("train", "valid")) -> None:
        """Fail before training writes anything when the training split cannot fill one row: a stream shorter
        than data.seq_len, or a block table with no rows. Evaluation splits tile with padding, so any
        non-empty one serves."""
        if "train" not in splits:
            return
        if self.config.text.block_mode == "stream":
            size = len(self.split_tokens("train"))
            if size < self.config.seq_len:
                raise DataFileError(f"{SplitSource(self.config, 'train').what()}: the training split has {size} "
                                    f"tokens, fewer than data.seq_len={self.config.seq_len}; use a longer file "
                                    f"or a smaller data.seq_len")
        elif len(self.split_arrays("train")["blocks"]) == 0:
            raise DataFileError(f"{SplitSource(self.config, 'train').what()}: the training split has no "
                                f"non-empty documents (data.text.documents={self.config.text.documents})")

    def split_arrays(self, split: str) -> dict[str, np.ndarray]:
        """{"tokens"} (stream), {"blocks", "lengths"} (wrapped / padded; packed: + "segments") of a split, loaded
        once."""
        if split not in self.arrays:
            self.arrays[split], self.meta[split] = load_split_arrays(self.config, self.tokenizer, split)
            if self.meta[split].get("truncated"):
                print(f"seqdiff: {truncation_message(self.meta[split], self.config, split)}", file=sys.stderr)
            self._check_alphabet(split)
        return self.arrays[split]

    def _check_alphabet(self, split: str) -> None:
        """Warn when most of a split's text is outside a normalizing tokenizer's alphabet (first 1M chars;
        files and fetched corpora, read lazily: a hub dataset is not loaded for this)."""
        from seqdiff.data.streaming import source_documents

        source, parts, size = SplitSource(self.config, split), [], 0
        lazy = source.path is not None or hasattr(source.dataset, "files")
        if not self.tokenizer.normalizes_away or not lazy:
            return
        for doc in source_documents(source):
            parts.append(doc)
            size += len(doc)
            if size >= ALPHABET_SAMPLE_CHARS:
                break
        warn_outside_alphabet("\n".join(parts), self.tokenizer, source.what())

    def split_tokens(self, split: str) -> np.ndarray:
        if self.config.text.block_mode != "stream":
            raise ValueError(f"data.text.block_mode={self.config.text.block_mode}: splits are block tables, not "
                             "streams")
        return self.split_arrays(split)["tokens"]

    def train_dataloader(self) -> DataLoader:
        trainer = getattr(self, "trainer", None)  # TextDataModule's, while a Trainer fits it
        start = trainer.global_step if trainer is not None else 0  # resume mid-run exactly
        rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
        if self.config.text.block_mode == "stream":
            data = RandomWindowBatches(self.split_tokens("train"), self.config.seq_len, self.config.batch_size,
                                       self.seed, start_step=start, rank=rank, world_size=world)
        else:
            arrays = self.split_arrays("train")
            blocks, lengths = arrays["blocks"], arrays["lengths"]
            if self.config.text.block_mode == "wrapped" and len(blocks) > 1 and lengths[-1] < self.config.seq_len:
                blocks, lengths = blocks[:-1], lengths[:-1]  # train on full rows only (as MDLM drops the rest)
            data = RandomBlockBatches(blocks, lengths, self.config.batch_size, self.seed, start_step=start,
                                      rank=rank, world_size=world, segments=arrays.get("segments"))
        return DataLoader(data, batch_size=None, num_workers=self.config.num_workers,
                          persistent_workers=self.config.num_workers > 0)

    def eval_dataloader(self, split: str) -> DataLoader:
        if self.config.text.block_mode == "stream":
            data = TiledBlocks(self.split_tokens(split), self.config.seq_len, self.tokenizer.pad_id)
        else:
            arrays = self.split_arrays(split)
            data = PackedBlocks(arrays["blocks"], arrays["lengths"], arrays.get("segments"))
        return DataLoader(data, batch_size=self.config.eval_batch_size, shuffle=False,
                          num_workers=self.config.num_workers)

    def val_dataloader(self) -> DataLoader:
        return self.eval_dataloader("valid")

    def test_dataloader(self) -> DataLoader:
        return self.eval_dataloader("test")
