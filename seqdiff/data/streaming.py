"""Streaming tokenization: a text source of any size into the on-disk token cache, in bounded memory.

    meta = build_streaming(source, tokenizer, config, folder)   # writes tokens.npy, or blocks.npy + lengths.npy

The in-memory path (`seqdiff.data.text.build_split_arrays`) reads a whole split, tokenizes it and packs it;
for OpenWebText-size corpora (tens of GB) neither the text nor its tokens fit in memory. This path reads the
source in blocks of bytes, cuts the text into chunks of about `chunk_chars` characters, tokenizes the
chunks (in worker processes, at most two chunks per worker in flight, results taken in order), and appends
the tokens (stream mode) or the packed rows (wrapped / padded / packed) to raw files on disk, which become the
cache's .npy shards at the end. The arrays are identical to the in-memory path's (tests compare them with
chunks of a few characters):

- wrapped / padded / packed: both paths tokenize the documents one by one, so chunks of whole documents change
  nothing; packing keeps less than one row of tokens between documents (`WrappedPacker`, `PaddedPacker`,
  `seqdiff.data.blocks.DocumentPacker`).
- stream: the in-memory path tokenizes the split's whole text at once, and a BPE merge or a text8 run of
  non-letters may cross an arbitrary cut. A chunk is therefore cut only where the tokenizer provably
  starts a new token (`SAFE_CUTS`, by tokenizer kind): between two ASCII letters for character and
  nucleotide tokenizers (each letter is its own token and a run of non-letters stays whole), and after a
  line break that has non-space characters on both sides for GPT-2 byte-level BPE and BERT WordPiece (both
  pre-tokenizers always split there, so no merge crosses it). Other tokenizer kinds get no cut: the
  stream is then tokenized as one chunk.

Interruption: the shards are written inside the cache's temporary folder, which is renamed into place only
when complete (`seqdiff.data.cache.load_or_build_into`); a killed build leaves nothing under the final name.
"""

from __future__ import annotations

import codecs
import gzip
import itertools
import multiprocessing
import os
import re
import shutil
import sys
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from seqdiff.config import DataConfig
from seqdiff.data.blocks import DocumentPacker, segment_dtype
from seqdiff.data.text_files import (
    DataFileError,
    _file_kind,
    iter_parquet_documents,
    jsonl_document,
    refuse_nul,
    require_file,
    split_documents,
)
from seqdiff.tokenizers import tokenizer_from_dict
from seqdiff.tokenizers.base import Tokenizer, TokenizerError

READ_BYTES = 1 << 20
"""Bytes read from a file at a time."""
CHUNK_CHARS = 2_000_000
"""Characters per tokenization task."""
PARALLEL_MIN_BYTES = 16_000_000
"""Sources smaller than this are tokenized in this process."""

SAFE_CUTS: dict[str, str] = {
    "char": r"(?<=[A-Za-z])(?=[A-Za-z])",
    "nucleotide": r"(?<=[A-Za-z])(?=[A-Za-z])",
    "gpt2": r"(?<=\S\n)(?=\S)",
    "bert": r"(?<=\S\n)(?=\S)",
}
"""Registry: tokenizer kind -> regex of positions where cutting the text leaves its tokens unchanged."""


# ---------------------------------------------------------------------------------------------- reading
def _byte_blocks(path: Path, read_bytes: int) -> Iterator[bytes]:
    require_file(path)
    opener = gzip.open if _file_kind(path) == "txt.gz" else open
    try:
        with opener(path, "rb") as f:
            while block := f.read(read_bytes):
                yield block
    except EOFError as e:
        raise DataFileError(f"{path}: truncated gzip data ({e})") from e
    except (gzip.BadGzipFile, zlib.error) as e:
        raise DataFileError(f"{path}: corrupt gzip data ({e})") from e
    except OSError as e:
        raise DataFileError(f"{path}: cannot be read ({e.strerror or e})") from e


def iter_text(path: str | Path, newlines: bool = True, read_bytes: int = READ_BYTES) -> Iterator[str]:
    """The text of a .txt / .txt.gz / .jsonl file in pieces, as `read_text_file` decodes it: strict UTF-8
    (the error names the byte offset), a leading byte-order mark dropped, line endings turned into "\\n"
    (unless `newlines` is False)."""
    path = Path(path)
    pieces = _decoded(path, read_bytes)
    if newlines:
        pieces = normalize_newlines(pieces)
    first = True
    for text in pieces:
        if first and text:
            text, first = text.removeprefix("\ufeff"), False
        if text:
            yield text


def _decoded(path: Path, read_bytes: int) -> Iterator[str]:
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0
    for block in itertools.chain(_byte_blocks(path, read_bytes), [None]):
        pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous block
        if block:
            refuse_nul(path, block, offset, _file_kind(path) == "txt.gz")
        try:
            text = decoder.decode(block or b"", final=block is None)
        except UnicodeDecodeError as e:
            where = "of the decompressed text" if _file_kind(path) == "txt.gz" else "of the file"
            bad = e.object[e.start : e.end].hex(" ")
            raise DataFileError(f"{path}: invalid UTF-8 at byte offset {offset - pending + e.start} {where} "
                                f"(bytes {bad}: {e.reason})") from e
        offset += len(block or b"")
        yield text


def normalize_newlines(pieces: Iterable[str]) -> Iterator[str]:
    """"\\r\\n" and lone "\\r" -> "\\n" across pieces (a "\\r" at the end of a piece waits for the next one)."""
    held = ""
    for piece in pieces:
        text = held + piece
        held = "\r" if text.endswith("\r") else ""
        text = text[: len(text) - len(held)]
        yield text.replace("\r\n", "\n").replace("\r", "\n")
    if held:
        yield "\n"


def iter_lines(pieces: Iterable[str]) -> Iterator[str]:
    """`"".join(pieces).split("\\n")`, lazily."""
    parts: list[str] = []
    for piece in pieces:
        if "\n" not in piece:
            parts.append(piece)
            continue
        lines = piece.split("\n")
        parts.append(lines[0])
        yield "".join(parts)
        yield from lines[1:-1]
        parts = [lines[-1]]
    yield "".join(parts)


def iter_documents(path: str | Path, documents: str = "paragraphs", read_bytes: int = READ_BYTES) -> Iterator[str]:
    """`read_documents(path, documents)`, lazily (no check that there is at least one)."""
    path = Path(path)
    kind = _file_kind(path)
    if kind == "parquet":
        yield from iter_parquet_documents(path)
    elif kind == "jsonl":
        for number, line in enumerate(iter_lines(iter_text(path, newlines=False, read_bytes=read_bytes)), start=1):
            doc = jsonl_document(path, number, line)
            if doc is not None:
                yield doc.replace("\r\n", "\n").replace("\r", "\n")
    else:
        yield from split_documents(iter_lines(iter_text(path, read_bytes=read_bytes)), documents)


def _raw_documents(path: Path, read_bytes: int) -> Iterator[str]:
    """Documents of a .jsonl / .parquet file before newline normalization (what `read_text_file` joins)."""
    if _file_kind(path) == "parquet":
        yield from iter_parquet_documents(path)
        return
    for number, line in enumerate(iter_lines(iter_text(path, newlines=False, read_bytes=read_bytes)), start=1):
        doc = jsonl_document(path, number, line)
        if doc is not None:
            yield doc


def joined(documents: Iterable[str], separator: str = "\n\n") -> Iterator[str]:
    """`separator.join(documents)` in pieces."""
    for i, doc in enumerate(documents):
        if i:
            yield separator
        yield doc


def stream_text(source, read_bytes: int = READ_BYTES) -> Iterator[str]:
    """The text that the in-memory stream path tokenizes for `source` (a `SplitSource`), in pieces."""
    if source.path is not None and source.detokenize is None:
        if _file_kind(source.path) in ("txt", "txt.gz"):
            return iter_text(source.path, read_bytes=read_bytes)  # read_text_file's text
        return normalize_newlines(joined(_raw_documents(source.path, read_bytes)))  # .jsonl / .parquet
    return joined(source_documents(source, read_bytes))


def source_documents(source, read_bytes: int = READ_BYTES) -> Iterator[str]:
    """`source.documents()` (detokenized), lazily for files and fetched corpora."""
    if source.path is not None:
        docs: Iterable[str] = iter_documents(source.path, source.documents_mode, read_bytes)
    elif hasattr(source.dataset, "files"):
        docs = (d for p in source.dataset.files(source.split) for d in iter_documents(p, source.documents_mode))
    else:
        docs = source.documents()  # a hub dataset: `datasets` holds it already (memory-mapped arrow)
        return iter(docs)
    return (source.detokenize(d) for d in docs) if source.detokenize is not None else docs


# ---------------------------------------------------------------------------------------------- chunking
def cut_chunks(pieces: Iterable[str], cut_pattern: str | None, chunk_chars: int = CHUNK_CHARS) -> Iterator[str]:
    """Re-cut a text given in pieces into chunks that end at a match of `cut_pattern` (None: one chunk): once
    `chunk_chars` characters are held, the text up to the last match is a chunk. Joined, they are the text."""
    regex = re.compile(cut_pattern) if cut_pattern else None
    parts: list[str] = []
    size, scanned = 0, 0  # characters held; characters of them already searched for a cut
    for piece in pieces:
        parts.append(piece)
        size += len(piece)
        if regex is None or size < chunk_chars:
            continue
        text = "".join(parts)
        cut = _last_cut(regex, text, scanned)
        if cut is None:
            parts, scanned = [text], len(text)
            continue
        yield text[:cut]
        parts, size, scanned = [text[cut:]], len(text) - cut, 0
    text = "".join(parts)
    if text:
        yield text


def _last_cut(regex: re.Pattern, text: str, scanned: int) -> int | None:
    """The last cut position in text[scanned - 2:] (> 0), searching windows that grow from the end."""
    window = 4096
    while True:
        start = max(max(scanned - 2, 0), len(text) - window)
        last = None
        for m in regex.finditer(text, start):
            last = m.start()
        if last:
            return last
        if start <= max(scanned - 2, 0):
            return None
        window *= 8


def document_chunks(documents: Iterable[str], chunk_chars: int = CHUNK_CHARS) -> Iterator[tuple[int, list[str]]]:
    """(index of the first document, documents) groups of about `chunk_chars` characters."""
    group: list[str] = []
    first, size, index = 0, 0, 0
    for index, doc in enumerate(documents):
        group.append(doc)
        size += len(doc)
        if size >= chunk_chars:
            yield first, group
            group, first, size = [], index + 1, 0
    if group:
        yield first, group


# ---------------------------------------------------------------------------------------------- tokenizing
# The workers of a process pool (also used by seqdiff.data.text.tokenize_documents): each holds its own
# tokenizer, rebuilt from its description.
_WORKER_TOKENIZER: Tokenizer | None = None


def _init_worker(description: dict) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = tokenizer_from_dict(description)


def _encode_chunk(chunk: tuple[int, list[str]]) -> list[np.ndarray]:
    first, docs = chunk
    return [_encode(_WORKER_TOKENIZER, d, first + i) for i, d in enumerate(docs)]


def _encode(tokenizer: Tokenizer, document: str, index: int) -> np.ndarray:
    try:
        return np.asarray(tokenizer.encode(document), dtype=np.int32)
    except TokenizerError as e:
        raise TokenizerError(f"document {index}: {e}") from e


def encode_in_order(tasks: Iterable[tuple[int, list[str]]], tokenizer: Tokenizer, workers: int
                    ) -> Iterator[list[np.ndarray]]:
    """The ids of each task's texts, task by task in order; with workers > 1 in a process pool holding at
    most 2 * workers tasks in flight (so memory stays bounded however large the source)."""
    if workers <= 1:
        for first, texts in tasks:
            yield [_encode(tokenizer, t, first + i) for i, t in enumerate(texts)]
        return
    with multiprocessing.get_context().Pool(workers, _init_worker, (tokenizer.to_dict(),)) as pool:
        pending: deque = deque()
        for task in tasks:
            pending.append(pool.apply_async(_encode_chunk, (task,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


# ---------------------------------------------------------------------------------------------- writing
class ShardWriter:
    """Rows appended to a raw file beside the shard; `finish()` writes `<name>.npy` (an .npy header, then the
    raw bytes copied file to file, so the rows never sit in memory together) and removes the raw file."""

    def __init__(self, folder: Path, name: str, dtype, row_shape: tuple[int, ...] = ()):
        self.path = folder / f"{name}.npy"
        self.raw_path = folder / f".{name}.raw"
        self.dtype, self.row_shape, self.rows = np.dtype(dtype), row_shape, 0
        self._file = open(self.raw_path, "wb")

    def append(self, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype)
        self._file.write(rows.tobytes())
        self.rows += len(rows)

    def finish(self) -> int:
        self._file.close()
        header = {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
                  "shape": (self.rows, *self.row_shape)}
        with open(self.path, "wb") as out, open(self.raw_path, "rb") as raw:  # file to file: no pages mapped
            np.lib.format.write_array_header_1_0(out, header)
            shutil.copyfileobj(raw, out, 16 << 20)
        self.raw_path.unlink()
        return self.rows


class WrappedPacker:
    """`pack_wrapped` one document at a time: documents joined by EOS, cut into rows BOS piece EOS; keeps
    fewer than seq_len - 2 tokens between calls."""

    def __init__(self, seq_len: int, bos_id: int, eos_id: int, pad_id: int):
        self.seq_len, self.bos, self.eos, self.pad = seq_len, bos_id, eos_id, pad_id
        self.carry = np.zeros(0, dtype=np.int32)

    def add(self, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        stream = np.concatenate([self.carry, np.asarray(doc, dtype=np.int32), np.array([self.eos], np.int32)])
        piece = self.seq_len - 2
        full = len(stream) // piece
        self.carry = stream[full * piece :]
        blocks = np.empty((full, self.seq_len), dtype=np.int32)
        blocks[:, 0], blocks[:, -1] = self.bos, self.eos
        blocks[:, 1:-1] = stream[: full * piece].reshape(full, piece)
        return blocks, np.full(full, self.seq_len, dtype=np.int32)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        rest = len(self.carry)
        if not rest:
            return np.zeros((0, self.seq_len), np.int32), np.zeros(0, np.int32)
        row = np.full((1, self.seq_len), self.pad, dtype=np.int32)
        row[0, 0], row[0, 1 : 1 + rest], row[0, 1 + rest] = self.bos, self.carry, self.eos
        return row, np.array([rest + 2], dtype=np.int32)


class PaddedPacker:
    """`pack_padded` one document at a time: BOS doc EOS, truncated to seq_len - 2 tokens, then PAD."""

    def __init__(self, seq_len: int, bos_id: int, eos_id: int, pad_id: int):
        self.seq_len, self.bos, self.eos, self.pad = seq_len, bos_id, eos_id, pad_id
        self.truncated = 0
        self.tokens = self.dropped = 0  # document tokens seen / cut off: what the truncation message reports

    def add(self, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.tokens += len(doc)
        if len(doc) > self.seq_len - 2:
            self.truncated += 1
            self.dropped += len(doc) - (self.seq_len - 2)
            doc = doc[: self.seq_len - 2]
        row = np.full((1, self.seq_len), self.pad, dtype=np.int32)
        row[0, 0], row[0, 1 : 1 + len(doc)], row[0, 1 + len(doc)] = self.bos, doc, self.eos
        return row, np.array([len(doc) + 2], dtype=np.int32)

    def finish(self) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((0, self.seq_len), np.int32), np.zeros(0, np.int32)


PACKERS: dict[str, Callable[..., WrappedPacker | PaddedPacker | DocumentPacker]] = {
    "wrapped": WrappedPacker, "padded": PaddedPacker, "packed": DocumentPacker}
"""Registry: data.text.block_mode -> streaming packer (stream mode keeps the tokens as they come)."""


# ---------------------------------------------------------------------------------------------- building
def build_streaming(source, tokenizer: Tokenizer, config: DataConfig, folder: Path,
                    chunk_chars: int = CHUNK_CHARS, read_bytes: int = READ_BYTES,
                    workers: int | None = None) -> dict[str, Any]:
    """Write a split's shards into `folder` (the same arrays as `build_split_arrays`) and return its meta."""
    from tqdm.auto import tqdm

    size = source.size_bytes()
    if workers is None:
        workers = 1 if size < PARALLEL_MIN_BYTES else (config.text.tokenize_workers or min(8, os.cpu_count() or 1))
    what = source.what()
    progress = tqdm(total=None if size == float("inf") else int(size), unit="char", unit_scale=True,
                    desc=f"tokenizing {what}", file=sys.stderr, disable=size < PARALLEL_MIN_BYTES // 4,
                    delay=1.0)  # shown after a second: a source that fails at once (hub offline) prints no bar
    try:
        if config.text.block_mode == "stream":
            return _build_stream(source, tokenizer, folder, chunk_chars, read_bytes, workers, progress)
        return _build_blocks(source, tokenizer, config, folder, chunk_chars, read_bytes, workers, progress)
    except TokenizerError as e:
        raise DataFileError(f"{what}: {e}") from e
    finally:
        progress.close()


def _build_stream(source, tokenizer, folder, chunk_chars, read_bytes, workers, progress) -> dict[str, Any]:
    chunks = cut_chunks(stream_text(source, read_bytes), SAFE_CUTS.get(tokenizer.kind), chunk_chars)
    starts: list[int] = []
    text_seen = False

    def tasks() -> Iterator[tuple[int, list[str]]]:
        nonlocal text_seen
        start = 0
        for i, chunk in enumerate(chunks):
            text_seen = text_seen or bool(chunk.strip())
            starts.append(start)
            start += len(chunk)
            progress.update(len(chunk))
            yield i, [chunk]

    writer = ShardWriter(folder, "tokens", np.int64)
    try:
        for (ids,) in encode_in_order(tasks(), tokenizer, workers):
            writer.append(ids)
    except TokenizerError as e:  # "document i" is chunk i here: name where it starts
        index = int(m.group(1)) if (m := re.match(r"document (\d+)", str(e))) else None
        where = f"in the chunk starting at character {starts[index]}" if index is not None else ""
        raise TokenizerError(f"{where}: {e}" if where else str(e)) from e
    if writer.finish() == 0 or not text_seen:
        raise DataFileError(f"{source.what()}: holds no text (empty, or only whitespace), no tokens to cache")
    return {}


def _build_blocks(source, tokenizer, config, folder, chunk_chars, read_bytes, workers, progress) -> dict[str, Any]:
    packer = PACKERS[config.text.block_mode](config.seq_len, tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    shapes = {"blocks": (dtype, (config.seq_len,)), "lengths": (np.int32, ()),
              "segments": (segment_dtype(config.seq_len), (config.seq_len,))}
    names = getattr(packer, "arrays", ("blocks", "lengths"))  # the packed mode adds a table of segment ids
    writers = [ShardWriter(folder, name, *shapes[name]) for name in names]
    documents = 0

    def counted() -> Iterator[str]:
        for doc in source_documents(source, read_bytes):
            progress.update(len(doc))
            yield doc

    def write(*tables: np.ndarray) -> None:
        for writer, table in zip(writers, tables, strict=True):
            writer.append(table)

    for ids in encode_in_order(document_chunks(counted(), chunk_chars), tokenizer, workers):
        documents += len(ids)
        out = [packer.add(doc) for doc in ids]
        write(*(np.concatenate([o[i] for o in out]) for i in range(len(names))))
    if documents == 0:
        raise DataFileError(f"{source.what()}: holds no documents (every document is empty)")
    write(*packer.finish())
    for writer in writers:
        writer.finish()
    meta = {"documents": documents, "truncated": getattr(packer, "truncated", 0)}
    if isinstance(packer, PaddedPacker):
        meta.update(tokens=packer.tokens, dropped_tokens=packer.dropped)
    return meta
