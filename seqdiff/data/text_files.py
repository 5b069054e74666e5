"""Plain-text corpora on disk: reading one file, and finding the file of a split.

A corpus is a folder with one file per split, `{split}.txt`, `{split}.txt.gz`, `{split}.jsonl` (one JSON
object with a `text` field per line) or `{split}.parquet` (a string column `text`, one document per row).
Corpora shipped inside the package are named in `BUILTIN_CORPORA`
and described by a `manifest.json` beside their files (see `experiments/make_shakespeare_slice.py`).

Every problem with a file raises `DataFileError`, whose message names the file and what is wrong with it.
"""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from seqdiff.errors import SeqdiffError

_CORPORA_DIR = Path(__file__).resolve().parent / "corpora"

BUILTIN_CORPORA: dict[str, Path] = {
    "shakespeare": _CORPORA_DIR / "shakespeare",
}
"""Corpora shipped with seqdiff, by name: the folder holding `{split}.txt.gz` and `manifest.json`."""

# File names a user corpus folder may hold for a split, in the order they are looked for.
SPLIT_FILE_PATTERNS = ("{split}.txt", "{split}.txt.gz", "{split}.jsonl", "{split}.parquet")
MANIFEST_NAME = "manifest.json"


class DataFileError(SeqdiffError):
    """A data file is missing, unreadable or malformed; the message names the file and the problem."""


def read_text_file(path: str | Path) -> str:
    """The text of a `.txt`, `.txt.gz` or `.jsonl` file, as one string.

    Text is decoded as strict UTF-8 (a leading byte-order mark is dropped) and line endings are turned
    into "\\n". In a `.jsonl` file each non-blank line is a JSON object with a string `text` field; the
    documents are joined with a blank line ("\\n\\n"), and documents that are empty or only whitespace are
    left out. A file with no text but whitespace is an error.
    """
    path = Path(path)
    kind = _file_kind(path)
    if kind == "parquet":
        return _joined(path, _parquet_documents(path))
    raw = _read_bytes(path)
    if kind == "txt.gz":
        raw = _gunzip(path, raw)
    text = _decode_utf8(path, raw, decompressed=kind == "txt.gz")
    if kind == "jsonl":
        text = "\n\n".join(_jsonl_documents(path, text))
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        what = "is empty" if not raw else "holds no text (only whitespace)"
        if kind == "jsonl" and raw.strip():
            what = "holds no text (every document is empty)"
        raise DataFileError(f"{path}: {what}")
    return text


def read_documents(path: str | Path, documents: str = "paragraphs") -> list[str]:
    """The documents of a file, in order; empty (whitespace-only) documents are left out.

    Document boundaries: a `.jsonl` line / `.parquet` row is one document; in `.txt` / `.txt.gz` files a
    document is a paragraph (text between blank lines, `documents="paragraphs"`) or a single non-blank
    line (`documents="lines"`, e.g. LM1B's one sentence per line). Line breaks inside a paragraph are kept.
    """
    path = Path(path)
    kind = _file_kind(path)
    if kind == "parquet":
        docs = _parquet_documents(path)
    elif kind == "jsonl":
        docs = _jsonl_documents(path, _decode_utf8(path, _read_bytes(path), decompressed=False))
        docs = [d.replace("\r\n", "\n").replace("\r", "\n") for d in docs]
    else:
        text = read_text_file(path)
        docs = list(split_documents(text.split("\n"), documents))
    if not docs:
        raise DataFileError(f"{path}: holds no documents (every document is empty)")
    return docs


_BLANK = re.compile(r"[ \t]*")


def split_documents(lines: Iterable[str], documents: str = "paragraphs") -> Iterator[str]:
    """Documents from the lines of a text (no "\\n"), lazily: each non-blank line (`"lines"`), or each run of
    lines between blank lines (only spaces / tabs), joined by "\\n" (`"paragraphs"`). Lazy, so that the
    streaming tokenizer (seqdiff.data.streaming) and `read_documents` share one definition."""
    if documents not in ("paragraphs", "lines"):
        raise DataFileError(f"data.text.documents={documents!r} is unknown; choose 'paragraphs' or 'lines'")
    if documents == "lines":
        yield from (line for line in lines if line.strip())
        return
    paragraph: list[str] = []
    for line in lines:
        if _BLANK.fullmatch(line):
            if paragraph and any(p.strip() for p in paragraph):
                yield "\n".join(paragraph)
            paragraph = []
        else:
            paragraph.append(line)
    if paragraph and any(p.strip() for p in paragraph):
        yield "\n".join(paragraph)


def _joined(path: Path, documents: list[str]) -> str:
    text = "\n\n".join(documents).replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise DataFileError(f"{path}: holds no text (every document is empty)")
    return text


def _parquet_documents(path: Path) -> list[str]:
    return list(iter_parquet_documents(path))


def iter_parquet_documents(path: Path, batch_rows: int = 4096) -> Iterator[str]:
    """The non-empty `text` values of a .parquet file, read `batch_rows` rows at a time."""
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise DataFileError(f"{path}: reading .parquet files needs pyarrow (pip install pyarrow)") from e
    try:
        file = pq.ParquetFile(path)
        schema = file.schema_arrow
    except Exception as e:  # pyarrow raises several types for a malformed file
        raise DataFileError(f"{path}: not a readable parquet file ({e})") from e
    if "text" not in schema.names:
        raise DataFileError(f"{path}: has no 'text' column (columns: {', '.join(schema.names)})")
    kind = schema.field("text").type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise DataFileError(f"{path}: column 'text' holds {kind}, not strings")
    try:
        for batch in file.iter_batches(batch_size=batch_rows, columns=["text"]):
            yield from (d for d in batch.column(0).to_pylist() if d is not None and d.strip())
    except OSError as e:
        raise DataFileError(f"{path}: not a readable parquet file ({e})") from e


def corpus_split_path(name_or_path: str | Path, split: str) -> Path:
    """The file of `split` in a builtin corpus (by name) or in a user's corpus folder (by path).

    A builtin name gives `{folder}/{split}.txt.gz`. A folder must hold exactly one of `{split}.txt`,
    `{split}.txt.gz`, `{split}.jsonl`, `{split}.parquet`.
    """
    if not isinstance(split, str) or not split or "/" in split or "\\" in split or split.startswith("."):
        raise DataFileError(f"split {split!r} is not a valid split name (e.g. 'train', 'valid', 'test')")
    expected = [p.format(split=split) for p in SPLIT_FILE_PATTERNS]
    builtin_names = ", ".join(sorted(BUILTIN_CORPORA))
    key = str(name_or_path)
    if key in BUILTIN_CORPORA:
        folder = BUILTIN_CORPORA[key]
        path = folder / f"{split}.txt.gz"
        if not path.is_file():
            present = sorted(p.name for p in folder.glob("*.txt.gz")) if folder.is_dir() else []
            raise DataFileError(
                f"builtin corpus {key!r} has no split {split!r}: {path} does not exist "
                f"(files present: {', '.join(present) or 'none'})"
            )
        return path
    folder = Path(name_or_path).expanduser()
    if not folder.is_dir():
        problem = "is a file, not a folder" if folder.exists() else "is neither a builtin corpus nor a folder"
        raise DataFileError(
            f"corpus {key!r} {problem}; use a builtin corpus name ({builtin_names}) or a folder holding "
            f"one of {', '.join(expected)}"
        )
    found = [folder / name for name in expected if (folder / name).exists()]
    if not found:
        raise DataFileError(
            f"corpus folder {folder} has no file for split {split!r}: expected one of {', '.join(expected)} "
            f"(builtin corpora: {builtin_names})"
        )
    if len(found) > 1:
        raise DataFileError(
            f"corpus folder {folder} has several files for split {split!r} "
            f"({', '.join(p.name for p in found)}); keep only one"
        )
    return found[0]


def load_manifest(name: str) -> dict:
    """The `manifest.json` of a builtin corpus: its source, the works in each split, sizes and sha256s."""
    if name not in BUILTIN_CORPORA:
        raise DataFileError(
            f"{name!r} is not a builtin corpus; builtin corpora: {', '.join(sorted(BUILTIN_CORPORA))}"
        )
    path = BUILTIN_CORPORA[name] / MANIFEST_NAME
    text = _decode_utf8(path, _read_bytes(path), decompressed=False)
    try:
        manifest = json.loads(text)
    except json.JSONDecodeError as e:
        raise DataFileError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(manifest, dict):
        raise DataFileError(f"{path}: expected a JSON object, found {type(manifest).__name__}")
    return manifest


def _file_kind(path: Path) -> str:
    if path.is_dir():  # before its name: a folder called "corpus" is not an "unsupported file type"
        raise DataFileError(f"{path}: is a directory, not a file")
    name = path.name.lower()
    for kind in ("txt.gz", "txt", "jsonl", "parquet"):
        if name.endswith("." + kind):
            return kind
    if path.suffix.lower() in PLAIN_TEXT_SUFFIXES:  # notes.md, README: plain text (a binary file fails its NUL check)
        return "txt"
    raise DataFileError(f"{path}: unsupported file type; expected a .txt, .txt.gz, .jsonl or .parquet file (plain "
                        f"text may also be named .md, .rst, .text or have no extension)")


PLAIN_TEXT_SUFFIXES = ("", ".md", ".rst", ".text")
"""Name endings besides .txt read as plain UTF-8 text."""


def require_file(path: Path) -> None:
    """One line naming `path` when it is missing or a directory (what reading it would fail on first)."""
    if not path.exists():
        raise DataFileError(f"{path}: no such file")
    if path.is_dir():
        raise DataFileError(f"{path}: is a directory, not a file")


def _read_bytes(path: Path) -> bytes:
    require_file(path)
    try:
        return path.read_bytes()
    except OSError as e:
        raise DataFileError(f"{path}: cannot be read ({e.strerror or e})") from e


def _gunzip(path: Path, raw: bytes) -> bytes:
    if not raw:
        raise DataFileError(f"{path}: is empty (not even a gzip header)")
    try:
        return gzip.decompress(raw)
    except EOFError as e:
        raise DataFileError(f"{path}: truncated gzip data ({e})") from e
    except (gzip.BadGzipFile, zlib.error, OSError) as e:
        raise DataFileError(f"{path}: corrupt gzip data ({e})") from e


_WIDE_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"), (codecs.BOM_UTF16_LE, "UTF-16"),
              (codecs.BOM_UTF16_BE, "UTF-16"))


def wide_text_encoding(head: bytes) -> str | None:
    """'UTF-16' or 'UTF-32' when the first bytes of a file are text in that encoding with its byte-order mark,
    'UTF-16LE' / 'UTF-16BE' for ASCII with every other byte NUL and no mark (as some Windows tools write "Unicode"
    text); else None. The name is one iconv understands."""
    for bom, name in _WIDE_BOMS:
        if head.startswith(bom):
            return name
    head = head[:min(200, len(head) - len(head) % 2)]  # whole 2-byte units
    for nul, text, name in ((head[0::2], head[1::2], "UTF-16BE"), (head[1::2], head[0::2], "UTF-16LE")):
        if len(head) >= 4 and not nul.strip(b"\x00") and all(9 <= b < 127 for b in text):
            return name  # without a byte-order mark, iconv must be told the byte order
    return None


def refuse_nul(path: Path, raw: bytes, offset: int, decompressed: bool) -> None:
    """A NUL byte (never part of a UTF-8 character other than NUL itself) marks a binary file: refused, naming
    its offset, instead of being read as text that normalization would turn into a few spaces. Text saved as
    UTF-16 / UTF-32 (NUL bytes too) is named as such, with how to convert it."""
    at = raw.find(b"\x00")
    if at >= 0:
        where = "of the decompressed text" if decompressed else "of the file"
        if offset == 0 and (wide := wide_text_encoding(raw)) is not None:
            raise DataFileError(f"{path}: {wide} text, not UTF-8: save it as UTF-8 (`iconv -f {wide} -t UTF-8` "
                                f"converts it)")
        raise DataFileError(f"{path}: a NUL byte at byte offset {offset + at} {where}: a binary file, not text")


def _decode_utf8(path: Path, raw: bytes, *, decompressed: bool) -> str:
    refuse_nul(path, raw, 0, decompressed)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        where = "of the decompressed text" if decompressed else "of the file"
        bad = raw[e.start : e.end].hex(" ")
        raise DataFileError(
            f"{path}: invalid UTF-8 at byte offset {e.start} {where} (bytes {bad}: {e.reason})"
        ) from e
    return text.removeprefix("\ufeff")


def _jsonl_documents(path: Path, text: str) -> list[str]:
    # Split on "\n" only: JSON strings may hold characters that str.splitlines() treats as line breaks.
    documents = [jsonl_document(path, number, line) for number, line in enumerate(text.split("\n"), start=1)]
    return [d for d in documents if d is not None]


def jsonl_document(path: Path, number: int, line: str) -> str | None:
    """The `text` of line `number` of a .jsonl file; None for a blank line or an empty / whitespace document."""
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DataFileError(
            f"{path}: line {number} is not valid JSON ({e.msg}, column {e.colno})"
        ) from e
    if not isinstance(record, dict) or "text" not in record:
        found = (
            f"keys {sorted(record)}" if isinstance(record, dict) else f"a JSON {type(record).__name__}"
        )
        raise DataFileError(f"{path}: line {number} has no 'text' field ({found})")
    document = record["text"]
    if not isinstance(document, str):
        raise DataFileError(f"{path}: line {number}: 'text' is a {type(document).__name__}, not a string")
    return document if document.strip() else None
