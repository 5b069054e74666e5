"""Reference genomes for DNA language models: FASTA access, interval splits, training and evaluation windows.

Design choices
- Every FASTA a command reads (train, score, eval, sample) first passes `check_fasta`, one streamed pass that
  refuses a malformed file in one line naming the file and the problem (empty header, duplicate names, a
  character that is no nucleotide, every base N, ...) before pyfaidx indexes it or anything is written.
- pyfaidx reads plain and bgzip-compressed FASTA by random access (.fai, plus .gzi for bgzip). Missing
  indexes are built beside the file; present ones are checked against it (modification time, and the
  record boundaries the .fai claims) and rebuilt when stale. In a folder this user cannot write, a right
  index beside the file is used, else one is built under the data directory (`fasta-index/`). A truncated
  bgzip file is refused. A plain gzip file or a file whose sequence lines vary in length (neither of which
  pyfaidx can index) is read through a copy re-wrapped at 60 bases per line (BGZF when the file was
  compressed) under the data directory (`indexable_copy`).
- One pyfaidx handle per process: `FastaHandle` keeps the pid that opened it and reopens in a forked
  DataLoader worker (a handle shared across forks reads empty or garbled sequence).
- Splits are lists of `Interval(chrom, start, end, split)`, 0-based and half-open: from a BED file in the
  Basenji / Enformer layout `chrom start end split` (the one HyenaDNA and Caduceus train on), from whole
  held-out chromosomes, or from held-out blocks of one chromosome, with a gap of at least one window
  between blocks of different splits so that no window crosses or touches another split.
- Chromosome names are matched up to a `chr` prefix and chrM / MT (`chr20` finds `20`).
- Training windows (`RandomGenomeWindows`) are step-indexed like `blocks.RandomWindowBatches`: batch k
  depends only on (seed, k), so a resumed run and a run with workers see the same batches. A window start
  is uniform over all valid starts of all intervals (intervals are drawn in proportion to their length);
  windows with more than `max_n_fraction` N are redrawn; each window is reverse-complemented with
  probability 1/2. Evaluation tiles (`TiledGenomeWindows`) cover each interval once, in order; tiles with
  too many N are skipped.
- N is never scored (`loss_mask` False). Lowercase (soft-masked) bases are read as uppercase, and can be
  kept as a per-base "soft_mask" flag. IUPAC ambiguity codes are read as N and reported once per file.
- Tokenization is one table lookup over the raw bytes (`NucleotideTokenizer.encode_bytes`).
"""

from __future__ import annotations

import bisect
import gzip
import heapq
import json
import logging
import math
import os
import re
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from seqdiff.data.blocks import StepIndexedBatches, step_generator
from seqdiff.errors import SeqdiffError
from seqdiff.safe_io import atomic_write
from seqdiff.sources import expand_data_path, fetch_hint
from seqdiff.tokenizers.nucleotide import IUPAC_AMBIGUOUS, NucleotideTokenizer

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
SPLIT_NAMES = {"train": "train", "training": "train", "valid": "valid", "validation": "valid", "val": "valid",
               "dev": "valid", "test": "test", "testing": "test"}
"""Spellings accepted in a BED file's split column."""
HUMAN_PRIMARY = {str(i) for i in range(1, 23)} | {"X", "Y"}
"""Canonical names of the nuclear human chromosomes (the default training set in chromosomes mode)."""
BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")
"""The empty block that ends every complete BGZF file."""

_IUPAC = np.zeros(256, dtype=bool)
_IUPAC[[ord(c) for c in IUPAC_AMBIGUOUS + IUPAC_AMBIGUOUS.lower()]] = True
_LOWER = np.zeros(256, dtype=bool)
_LOWER[ord("a"): ord("z") + 1] = True
_IUPAC_REPORTED: set[str] = set()  # files whose IUPAC codes this process has already reported


class GenomeError(SeqdiffError):
    """A FASTA / BED / index that cannot be used; the message names the file, record and position."""


# ---------------------------------------------------------------------------------------------- names
def canonical_chrom(name: str) -> str:
    """`chr20` -> `20`, `chrM` / `M` / `MT` -> `MT`, `chrX` -> `X` (case-insensitive)."""
    core = name[3:] if name.lower().startswith("chr") and len(name) > 3 else name
    core = core.upper()
    return "MT" if core in ("M", "MT") else core


def _name_list(names: Sequence[str], limit: int = 40) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def resolve_chrom(name: str, available: Sequence[str], where: str = "") -> str:
    """The FASTA's spelling of chromosome `name` (exact match first, then up to chr prefix and chrM/MT)."""
    if name in available:
        return name
    matches = [a for a in available if canonical_chrom(a) == canonical_chrom(name)]
    prefix = f"{where}: " if where else ""
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise GenomeError(f"{prefix}chromosome {name!r} is ambiguous in the FASTA: {matches}")
    raise GenomeError(f"{prefix}chromosome {name!r} is not in the FASTA; available: {_name_list(list(available))}")


# ---------------------------------------------------------------------------------------------- files
def compression(path: str | Path) -> str:
    """'plain', 'bgzf' (block gzip, random access) or 'gzip' (plain gzip: no random access)."""
    with open(path, "rb") as f:
        head = f.read(18)
    if head[:2] != b"\x1f\x8b":
        return "plain"
    # BGZF: FEXTRA flag set and a 'BC' subfield first (SAM/BAM specification, section 4.1).
    if len(head) >= 14 and head[3] & 4 and head[12:14] == b"BC":
        return "bgzf"
    return "gzip"


def bgzip_file(src: str | Path, dst: str | Path) -> Path:
    """Recompress a plain or gzip FASTA as BGZF (what `bgzip` does), so that pyfaidx can read it."""
    from Bio import bgzf

    src, dst = Path(src), Path(dst)
    opener = gzip.open if compression(src) != "plain" else open

    def recompress(sink) -> None:
        try:
            with opener(src, "rb") as fin, bgzf.BgzfWriter(fileobj=sink) as fout:
                while chunk := fin.read(1 << 20):
                    fout.write(chunk)
        except (EOFError, OSError, zlib.error) as e:
            raise GenomeError(f"{src}: cannot be read to the end ({e}); is it truncated?") from e

    return atomic_write(dst, recompress, "FASTA")


def _gzip_hint(path: Path) -> str:
    return (f"recompress it with `gunzip -c {path} | bgzip > OUT.fa.gz` (bgzip is in htslib / tabix) or, in "
            f"Python, seqdiff.data.genome.bgzip_file('{path}', 'OUT.fa.gz'); or gunzip it to a plain FASTA")


class _RawReader:
    """Bytes of the uncompressed FASTA at any offset (plain seek, or BGZF virtual offsets from the .gzi)."""

    def __init__(self, path: Path, bgzf: bool, index_base: Path | None = None):
        self.bgzf = bgzf
        if bgzf:
            from Bio import bgzf as biobgzf

            data = Path(str(index_base or path) + ".gzi").read_bytes()
            (n,) = struct.unpack_from("<Q", data, 0)
            pairs = np.frombuffer(data, dtype="<u8", count=2 * n, offset=8).reshape(n, 2)
            self.cstarts = [0] + pairs[:, 0].tolist()
            self.ustarts = [0] + pairs[:, 1].tolist()
            self._make_voffset = biobgzf.make_virtual_offset
            self.file = biobgzf.BgzfReader(str(path), "rb")
        else:
            self.file = open(path, "rb")

    def read(self, offset: int, n: int) -> bytes:
        if offset < 0:
            return b""
        if self.bgzf:
            i = bisect.bisect_right(self.ustarts, offset) - 1
            self.file.seek(self._make_voffset(self.cstarts[i], offset - self.ustarts[i]))
        else:
            self.file.seek(offset)
        return self.file.read(n)

    def close(self) -> None:
        self.file.close()


def _index_problem(path: Path, faidx, bgzf: bool, index_base: Path, max_checked: int = 2000) -> str | None:
    """Why the .fai (and .gzi) disagree with the FASTA, or None: each record must start right after its
    header line and end exactly where the index says (checked on up to `max_checked` records)."""
    records = list(faidx.index.items())
    if not records:
        return "the index lists no sequences"
    if len(records) > max_checked:
        records = records[: max_checked // 2] + records[-max_checked // 2:]
    try:
        reader = _RawReader(path, bgzf, index_base)
    except (OSError, ValueError, struct.error) as e:
        return f"the index cannot be read ({e})"
    try:
        for name, rec in records:
            if rec.rlen == 0:
                continue
            if rec.lenc <= 0 or rec.lenb < rec.lenc:
                return f"record {name}: line lengths {rec.lenc} / {rec.lenb} are invalid"
            if reader.read(rec.offset - 1, 1) != b"\n":
                return f"record {name} does not start at byte {rec.offset:,} after its header line"
            full, rem = divmod(rec.rlen, rec.lenc)
            end = rec.offset + (full - 1) * rec.lenb + rec.lenc if rem == 0 else rec.offset + full * rec.lenb + rem
            newline = rec.lenb - rec.lenc  # 1 (\n) or 2 (\r\n)
            tail = reader.read(end - 1, 2 + newline)  # last base, its line break, what follows
            if not tail or tail[:1] in (b"\n", b"\r", b">"):
                return f"record {name} is shorter than the {rec.rlen:,} bases the index lists"
            after = tail[1 + newline:]
            if tail[1:1 + newline].strip(b"\r\n") or after not in (b"", b">", b"\n", b"\r"):
                return f"record {name} is longer than the {rec.rlen:,} bases the index lists"
    except (OSError, ValueError, EOFError, zlib.error) as e:
        return f"reading the file at the indexed offsets failed ({e})"
    finally:
        reader.close()
    return None


class UnevenLines(GenomeError):
    """pyfaidx needs every sequence line of a record to have one length (random access computes offsets)."""


def _open_faidx(path: Path, index_base: Path, rebuild: bool = True):
    """pyfaidx's handle of `path`, its index at `index_base`.fai (and .gzi): beside the file, or under the data
    directory for a file in a read-only folder (`_private_index_base`)."""
    import pyfaidx

    try:
        return pyfaidx.Faidx(str(path), as_raw=True, rebuild=rebuild, build_index=rebuild,
                             sequence_always_upper=False, indexname=f"{index_base}.fai",
                             gzi_indexname=f"{index_base}.gzi")
    except pyfaidx.FastaIndexingError as e:
        kind = UnevenLines if "not consistent" in str(e) else GenomeError
        raise kind(f"{path}: not a FASTA file pyfaidx can index: {e}") from e
    except UnicodeDecodeError as e:
        raise GenomeError(f"{path}: {_first_non_ascii(path) or e}; a FASTA file holds ASCII text") from e
    except pyfaidx.UnsupportedCompressionFormat as e:
        raise GenomeError(f"{path} is gzip- but not bgzip-compressed: {_gzip_hint(path)}") from e
    except (EOFError, zlib.error) as e:
        raise GenomeError(f"{path}: the compressed file ends early or is damaged ({e}); is it truncated?") from e
    except ValueError as e:  # duplicate names, bad .fai lines
        raise GenomeError(f"{path}: {e}") from e
    except OSError as e:
        raise GenomeError(f"{path}: cannot open or index it ({e})") from e


def _index_files(index_base: Path, bgzf: bool) -> list[Path]:
    return [Path(f"{index_base}.fai")] + ([Path(f"{index_base}.gzi")] if bgzf else [])


def _index_state(path: Path, bgzf: bool, index_base: Path) -> tuple[list[Path], list[Path]]:
    """(missing, stale) index files: stale = older than the FASTA."""
    indexes = _index_files(index_base, bgzf)
    missing = [p for p in indexes if not p.exists()]
    mtime = path.stat().st_mtime
    stale = [p for p in indexes if p.exists() and p.stat().st_mtime < mtime]
    return missing, stale


def _file_key(path: Path) -> str:
    """A name for what `path` holds now: its resolved path, size and modification time, hashed."""
    import hashlib

    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def _private_index_base(path: Path) -> Path:
    """Where the index of a FASTA in a read-only folder goes: under the data directory (`fasta-index/`), named by
    the file's path, size and modification time, so that an edited file is indexed afresh."""
    from seqdiff.sources import data_dir

    folder = data_dir() / "fasta-index" / f"{path.name}-{_file_key(path)}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / path.name


def _fasta_lines(path: Path) -> Iterable[bytes]:
    """The lines of a plain, gzip or bgzip FASTA, streamed."""
    opener = open if compression(path) == "plain" else gzip.open
    with opener(path, "rb") as f:
        yield from f


def _first_non_ascii(path: Path) -> str | None:
    """Where the first byte that is not ASCII sits ("line 22, column 31: byte 0xe9"), for a decoding error."""
    try:
        for number, line in enumerate(_fasta_lines(path), 1):
            bad = next((i for i, b in enumerate(line) if b > 127), None)
            if bad is not None:
                return f"line {number:,}, column {bad + 1}: byte {line[bad]:#04x} is not ASCII"
    except (OSError, EOFError, zlib.error):
        pass
    return None


REWRAP_WIDTH = 60
"""Bases per line of a re-wrapped copy (the width of the UCSC and Ensembl FASTA files)."""


class PlainGzip(GenomeError):
    """A gzip (not BGZF) file: its bytes cannot be reached by offset, so pyfaidx cannot read it."""


def _rewrapped_chunks(path: Path, chunk_bytes: int = 1 << 20) -> Iterable[bytes]:
    """The FASTA at `path` (plain / gzip / bgzip) with headers kept, comment lines dropped and each record's
    bases (spaces and tabs removed) in lines of REWRAP_WIDTH, as chunks of about `chunk_bytes`."""
    out, size, buffer = [], 0, bytearray()
    for line in _fasta_lines(path):
        line = line.rstrip(b"\r\n")
        if line.startswith(b">"):
            if buffer:
                out.append(bytes(buffer) + b"\n")
                buffer.clear()
            out.append(line + b"\n")
        elif not line.startswith(b";"):
            buffer += line.replace(b" ", b"").replace(b"\t", b"")
            full = len(buffer) - len(buffer) % REWRAP_WIDTH
            out += [bytes(buffer[i:i + REWRAP_WIDTH]) + b"\n" for i in range(0, full, REWRAP_WIDTH)]
            size += full
            del buffer[:full]
        if size >= chunk_bytes:
            yield b"".join(out)
            out, size = [], 0
    if buffer:
        out.append(bytes(buffer) + b"\n")
    yield b"".join(out)


def indexable_copy(path: Path, reason: str) -> Path:
    """A copy of `path` that pyfaidx can index: every record's bases in lines of REWRAP_WIDTH, BGZF-compressed
    when the file was compressed (plain otherwise). For a FASTA whose lines vary in length, or a plain gzip
    file (as UCSC ships hg19.fa.gz). Written once, streamed, under the data directory (`fasta-indexable/`),
    named by the file's path, size and modification time, so that an edited file gets a fresh copy and the
    user's folder receives nothing."""
    from seqdiff.sources import data_dir

    compressed = compression(path) != "plain"
    stem = Path(re.sub(r"\.(gz|bgz)$", "", path.name)).stem
    out = data_dir() / "fasta-indexable" / f"{stem}-{_file_key(path)}.fa{'.gz' if compressed else ''}"
    if out.is_file():
        return out
    log.warning("%s: %s; writing a copy that can be indexed (%d bases per line%s) to %s, once", path, reason,
                REWRAP_WIDTH, ", bgzip" if compressed else "", out)

    def write(sink) -> None:
        if compressed:
            from Bio import bgzf

            with bgzf.BgzfWriter(fileobj=sink, compresslevel=1) as f:  # 7.6x faster than 6, 12% larger
                for chunk in _rewrapped_chunks(path):
                    f.write(chunk)
        else:
            for chunk in _rewrapped_chunks(path):
                sink.write(chunk)

    try:
        atomic_write(out, write, "indexable FASTA copy")
    except (EOFError, zlib.error) as e:
        raise GenomeError(f"{path}: the compressed file ends early or is damaged ({e}); is it truncated?") from e
    return out


def open_fasta(path: str | Path) -> FastaHandle:
    """Open (and index when needed) a plain or bgzip FASTA that passes `check_fasta`; refuses truncated files and
    bad indexes. A plain gzip file, or a FASTA whose lines vary in length, is read through an indexable copy
    (`indexable_copy`)."""
    path = expand_data_path(path)  # recipes may say ~/... or $SEQDIFF_DATA/... (set or not)
    check_fasta(path)  # before pyfaidx writes an index or a copy is made
    try:
        return _open_indexed(path)
    except PlainGzip:
        return _open_indexed(indexable_copy(path, "it is gzip- but not bgzip-compressed, so it has no random "
                                                  "access"))
    except UnevenLines:
        return _open_indexed(indexable_copy(path, "its sequence lines vary in length, which indexed (random) "
                                                  "access cannot read"))


def _checked_index_beside(path: Path, bgzf: bool):
    """pyfaidx's handle of a FASTA in a read-only folder when the index beside it is complete and agrees with the
    file (it may be older than the file: a copy can reset times), else None: the index is then built under the
    data directory."""
    missing, stale = _index_state(path, bgzf, path)
    if missing:
        return None
    try:
        faidx = _open_faidx(path, path, rebuild=False)
    except GenomeError:
        return None
    problem = _index_problem(path, faidx, bgzf, path)
    if problem is None:
        return faidx
    faidx.close()
    log.warning("%s: the index beside it does not match it (%s) and the folder is read-only: indexing it under "
                "the data directory", path, problem)
    return None


def _open_built_index(path: Path, bgzf: bool, base: Path):
    """pyfaidx's handle with the index at `base` (a writable place): built when missing, rebuilt when older than
    the file or when it disagrees with the file."""
    missing, stale = _index_state(path, bgzf, base)
    if stale:
        log.warning("%s: %s older than the FASTA: rebuilding", path, " and ".join(p.name for p in stale))
        for p in stale:
            p.unlink()
    faidx = _open_faidx(path, base)
    problem = _index_problem(path, faidx, bgzf, base)
    if problem is not None:
        faidx.close()
        log.warning("%s.fai does not match %s (%s): rebuilding the index", base, path, problem)
        for p in _index_files(base, bgzf):
            p.unlink(missing_ok=True)
        faidx = _open_faidx(path, base)
        problem = _index_problem(path, faidx, bgzf, base)
        if problem is not None:
            faidx.close()
            raise GenomeError(f"{path}: an index rebuilt from the file still disagrees with it ({problem}); the "
                              f"file is damaged")
    return faidx


def _not_a_file(path: Path) -> str:
    """Why a FASTA path cannot be read: a folder, or missing (with the `seqdiff data fetch` that puts it there)."""
    return f"FASTA file {path} " + ("is a directory" if path.is_dir() else "does not exist" + fetch_hint(path))


def _open_indexed(path: Path) -> FastaHandle:
    if not path.is_file():
        raise GenomeError(_not_a_file(path))
    kind = compression(path)
    if kind == "gzip":
        raise PlainGzip(f"{path} is gzip- but not bgzip-compressed, so it has no random access: {_gzip_hint(path)}")
    bgzf = kind == "bgzf"
    if bgzf:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - len(BGZF_EOF)))
            if f.read() != BGZF_EOF:
                raise GenomeError(f"{path} is truncated: the BGZF end-of-file block is missing (download or "
                                  f"compress it again)")
    base, faidx = path, None
    if not os.access(path.parent, os.W_OK):  # the index beside the file if it is there and right, else a private one
        faidx = _checked_index_beside(path, bgzf)
        base = path if faidx is not None else _private_index_base(path)
    if faidx is None:
        faidx = _open_built_index(path, bgzf, base)
    lengths = {name: int(rec.rlen) for name, rec in faidx.index.items()}
    handle = FastaHandle(path, lengths, bgzf, base)
    handle._faidx, handle._pid = faidx, os.getpid()
    return handle


class FastaHandle:
    """Random access to an indexed FASTA, with one pyfaidx handle per process (reopened after a fork)."""

    def __init__(self, path: str | Path, lengths: dict[str, int], bgzf: bool, index_base: Path | None = None):
        self.path = Path(path)
        self.index_base = Path(index_base) if index_base is not None else self.path
        self.lengths = dict(lengths)
        self.bgzf = bgzf
        self._faidx = None
        self._pid: int | None = None

    @property
    def names(self) -> list[str]:
        return list(self.lengths)

    def resolve(self, name: str, where: str = "") -> str:
        return resolve_chrom(name, self.names, where or str(self.path))

    def length(self, chrom: str) -> int:
        return self.lengths[self.resolve(chrom)]

    def _handle(self):
        if self._pid != os.getpid() or self._faidx is None:
            self._faidx = _open_faidx(self.path, self.index_base, rebuild=False)  # built by open_fasta
            self._pid = os.getpid()
        return self._faidx

    def fetch(self, chrom: str, start: int, end: int) -> np.ndarray:
        """Raw bytes (uint8, case kept) of chrom[start:end], 0-based half-open."""
        length = self.lengths.get(chrom)
        if length is None:
            chrom = self.resolve(chrom)
            length = self.lengths[chrom]
        if not 0 <= start <= end <= length:
            raise GenomeError(f"{self.path}: {chrom}:{start}-{end} is outside the chromosome (length {length:,})")
        if start == end:
            return np.zeros(0, dtype=np.uint8)
        try:
            seq = self._handle().fetch(chrom, start + 1, end)
        except (UnicodeDecodeError, EOFError, OSError, zlib.error) as e:
            raise GenomeError(f"{self.path}: reading {chrom}:{start}-{end} failed ({e})") from e
        raw = np.frombuffer(str(seq).encode("latin-1"), dtype=np.uint8)
        if len(raw) != end - start:
            raise GenomeError(f"{self.path}: read {len(raw)} bases of {chrom}:{start}-{end}, expected "
                              f"{end - start}; the file changed after it was indexed")
        return raw

    def sequence(self, chrom: str, start: int, end: int) -> str:
        return self.fetch(chrom, start, end).tobytes().decode("ascii")

    def close(self) -> None:
        if self._faidx is not None and self._pid == os.getpid():
            self._faidx.close()
        self._faidx, self._pid = None, None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_faidx"], state["_pid"] = None, None  # each process opens its own
        return state

    def __repr__(self) -> str:
        return f"FastaHandle({str(self.path)!r}, {len(self.lengths)} sequences)"


# ---------------------------------------------------------------------------------------------- tokens
@dataclass
class EncodedBases:
    ids: np.ndarray  # (n,) int64 token ids
    n_mask: np.ndarray  # (n,) bool, True where the base is N (or an IUPAC code read as N)
    soft_mask: np.ndarray  # (n,) bool, True where the FASTA had lowercase
    iupac: int  # IUPAC ambiguity codes among the n bases


def encode_bases(raw: np.ndarray, tokenizer: NucleotideTokenizer, path: str | Path, chrom: str,
                 start: int = 0) -> EncodedBases:
    """Vectorized FASTA bytes -> ids; a byte that is no nucleotide fails naming file, record and position."""
    ids = tokenizer.encode_bytes(raw)
    bad = np.flatnonzero(ids < 0)
    if bad.size:
        i = int(bad[0])
        raise GenomeError(f"{path}: record {chrom}, position {start + i + 1:,}: character {chr(raw[i])!r} is "
                          f"not a nucleotide or IUPAC code ({bad.size} such characters in this stretch)")
    return EncodedBases(ids=ids, n_mask=ids == tokenizer.n_id, soft_mask=_LOWER[raw],
                        iupac=int(_IUPAC[raw].sum()))


def report_iupac(path: str | Path, count: int, first: str, exact: bool) -> None:
    """One log line per file and process: IUPAC codes are read as N."""
    key = str(Path(path).resolve())
    if count == 0 or key in _IUPAC_REPORTED:
        return
    _IUPAC_REPORTED.add(key)
    if exact:
        log.warning("%s: %d IUPAC ambiguity codes (first at %s) are read as N and not scored", path, count, first)
    else:
        log.warning("%s: IUPAC ambiguity codes (first at %s) are read as N and not scored; further ones are "
                    "counted, not reported", path, first)


def _first_iupac(raw: np.ndarray) -> int:
    return int(np.flatnonzero(_IUPAC[raw])[0])


# ---------------------------------------------------------------------------------------------- checking
_TOKENS = NucleotideTokenizer()
_BASE_BYTES = bytes(np.flatnonzero(_TOKENS.lookup_table >= 0).tolist())  # A C G T N, IUPAC codes, either case
_N_BYTES = bytes(np.flatnonzero(_TOKENS.lookup_table == _TOKENS.n_id).tolist())  # N and IUPAC codes: not scored
_LINE_SPACE = b" \t\r\n"  # dropped from sequence lines (CRLF, trailing spaces)
_FASTA_BLOCK = 1 << 22
_CHECKED: dict[str, FastaSummary] = {}  # _file_key -> summary: a file this process has checked


@dataclass(frozen=True)
class FastaSummary:
    """What `check_fasta` found: bases per record (file order) and how many of all bases are not N."""

    path: Path
    lengths: dict[str, int]
    scored: int  # bases that are neither N nor an IUPAC code (read as N)

    @property
    def names(self) -> list[str]:
        return list(self.lengths)


def _fasta_blocks(path: Path) -> Iterable[bytes]:
    """The decompressed bytes of a plain / gzip / bgzip file in blocks of about 4 MB, each ending at a line end."""
    opener = open if compression(path) == "plain" else gzip.open
    pending: list[bytes] = []  # a line longer than a block (a chromosome on one line)
    try:
        with opener(path, "rb") as f:
            while chunk := f.read(_FASTA_BLOCK):
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:
                    pending.append(chunk)
                    continue
                yield b"".join([*pending, chunk[:cut]])
                pending = [chunk[cut:]]
    except EOFError as e:
        raise GenomeError(f"{path} is truncated: the compressed file ends early ({e})") from e
    except (OSError, zlib.error) as e:
        raise GenomeError(f"{path}: the compressed file is damaged ({e})") from e
    if any(pending):
        yield b"".join(pending)


def _marked_lines(data: bytes) -> Iterator[int]:
    """Where each header ('>') or comment (';') line of `data` (a block of whole lines) starts, in order. A '>' or
    ';' inside a line is not one: the sequence check refuses it by position. (Two memchr scans: a regex over every
    line start is 100x slower.)"""

    def starts(mark: bytes) -> Iterator[int]:
        i = data.find(mark)
        while i >= 0:
            if i == 0 or data[i - 1] == ord("\n"):
                yield i
            i = data.find(mark, i + 1)

    return heapq.merge(starts(b">"), starts(b";"))


class _FastaScan:
    """One pass over a FASTA file's lines: the checks of `check_fasta`, and each record's bases when `keep`."""

    def __init__(self, path: Path, keep: bool):
        self.path, self.keep = path, keep
        self.lengths: dict[str, int] = {}
        self.number: dict[str, int] = {}  # record name -> its number (1-based)
        self.records: list[tuple[str, bytes]] = []
        self.name: str | None = None  # the current record
        self.parts: list[bytes] = []
        self.bases = self.scored = self.n_bad = 0
        self.first_bad: tuple[int, int] | None = None  # (1-based position in the record, byte)

    def block(self, data: bytes, line: int) -> int:
        """Scan a block that starts at line `line` (1-based); returns the line number after it."""
        if not data.isascii():
            where = _first_non_ascii(self.path) or "a byte is not ASCII"
            raise GenomeError(f"{self.path}: {where}; a FASTA file holds ASCII text")
        pos = 0
        for start in _marked_lines(data):
            self.sequence(data[pos:start])
            line += data.count(b"\n", pos, start)
            end = data.find(b"\n", start)
            end = len(data) if end < 0 else end
            if data[start] == ord(">"):
                self.header(data[start:end], line)
            pos = end
        self.sequence(data[pos:])
        return line + data.count(b"\n", pos)

    def header(self, text: bytes, line: int) -> None:
        self.end_record()
        fields = text[1:].decode("ascii").split()
        count = len(self.number) + 1
        if not fields:
            raise GenomeError(f"{self.path}: record {count} has an empty header line (line {line:,}); a record starts "
                              f"with '>NAME'")
        name = fields[0]
        if name in self.number:
            raise GenomeError(f"{self.path}: record names are not unique: {name!r} names records "
                              f"{self.number[name]} and {count}")
        self.number[name], self.name, self.bases = count, name, 0

    def sequence(self, text: bytes) -> None:
        seq = text.translate(None, _LINE_SPACE)
        if not seq:
            return
        if self.name is None:
            raise GenomeError(f"{self.path}: not a FASTA file (it must start with a '>' header line)")
        bad = seq.translate(None, _BASE_BYTES)
        if bad:
            self.n_bad += len(bad)
            if self.first_bad is None:
                self.first_bad = (self.bases + seq.index(bad[:1]) + 1, bad[0])
        self.scored += len(seq.translate(None, _N_BYTES))
        self.bases += len(seq)
        if self.keep:
            self.parts.append(seq)

    def end_record(self) -> None:
        if self.name is None:
            return
        if self.first_bad is not None:
            position, byte = self.first_bad
            raise GenomeError(f"{self.path}: record {self.name}, position {position:,}: character {chr(byte)!r} is not "
                              f"a nucleotide or IUPAC code ({self.n_bad:,} such characters in this record)")
        self.lengths[self.name] = self.bases
        if self.keep:
            self.records.append((self.name, b"".join(self.parts)))
            self.parts = []
        self.name = None

    def finish(self) -> FastaSummary:
        self.end_record()
        if not self.number:
            raise GenomeError(f"{self.path}: not a FASTA file (it must start with a '>' header line)")
        if not any(self.lengths.values()):
            raise GenomeError(f"{self.path} holds no sequence: its records are empty")
        return FastaSummary(self.path, self.lengths, self.scored)


def _scan_fasta(path: str | Path, keep: bool) -> tuple[FastaSummary, list[tuple[str, bytes]]]:
    path = Path(path)
    if not path.is_file():
        raise GenomeError(_not_a_file(path))
    scan, line = _FastaScan(path, keep), 1
    for data in _fasta_blocks(path):
        line = scan.block(data, line)
    summary = scan.finish()
    _CHECKED[_file_key(path)] = summary
    return summary, scan.records


def _require_scored(summary: FastaSummary, all_n_ok: bool) -> None:
    if not all_n_ok and summary.scored == 0:
        raise GenomeError(f"{summary.path}: every base is N (IUPAC codes are read as N); the file holds no sequence "
                          f"to train on or score")


def check_fasta(path: str | Path, all_n_ok: bool = False) -> FastaSummary:
    """The one check of a user's FASTA (plain / gzip / bgzip), shared by every command that reads one (train's
    data.fasta.path and score --fasta through `open_fasta`; eval --data, sample --reference and --infill-file
    through `read_fasta_records`), run before any index, copy or run directory is written. Refused, in one line
    naming the file: a missing file, a truncated or damaged compressed one, a byte that is not ASCII (line and
    column), text before the first '>' header, an empty header line, a record name used twice, a character that
    is not a nucleotide or IUPAC code (record and position; a gap '-' too), no bases at all, and (unless
    `all_n_ok`) every base N. Accepted: lowercase (soft-masked) bases, N and IUPAC codes, CRLF line ends, lines
    of any length, blank lines, spaces at line ends, ';' comment lines and descriptions after the name.

    One streamed pass (blocks of 4 MB, ~100 MB/s); the result is remembered per file version (path, size,
    modification time) for the rest of the process, and for a large file (a genome) under the data directory
    (`fasta-checked/`), so that the next command skips the pass."""
    path = Path(path)
    summary = (_CHECKED.get(_file_key(path)) or _read_check_stamp(path)) if path.is_file() else None
    if summary is None:
        summary = _scan_fasta(path, keep=False)[0]
        _write_check_stamp(summary)
    _require_scored(summary, all_n_ok)
    return summary


_STAMP_MIN_BYTES = 1 << 26
"""A FASTA file of at least this many bytes on disk keeps the summary of its check under the data directory."""


def _check_stamp(path: Path) -> Path:
    from seqdiff.sources import data_dir

    return data_dir() / "fasta-checked" / f"{path.name}-{_file_key(path)}.json"


def _read_check_stamp(path: Path) -> FastaSummary | None:
    if path.stat().st_size < _STAMP_MIN_BYTES:
        return None
    try:
        saved = json.loads(_check_stamp(path).read_text())
        summary = FastaSummary(path, {str(k): int(v) for k, v in saved["lengths"].items()}, int(saved["scored"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    _CHECKED[_file_key(path)] = summary
    return summary


def _write_check_stamp(summary: FastaSummary) -> None:
    if summary.path.stat().st_size < _STAMP_MIN_BYTES:
        return
    text = json.dumps({"path": str(summary.path.resolve()), "lengths": summary.lengths, "scored": summary.scored})
    try:
        atomic_write(_check_stamp(summary.path), lambda f: f.write(text.encode()), "FASTA check summary")
    except (OSError, SeqdiffError) as e:  # a read-only data directory: the next command checks the file again
        log.info("%s: the summary of its check is not kept (%s)", summary.path, e)


def read_fasta_records(path: str | Path, all_n_ok: bool = False) -> list[tuple[str, bytes]]:
    """(name, sequence bytes without line breaks or spaces) for every record of a plain / gzip / bgzip FASTA,
    read and checked in the same pass as `check_fasta` checks it."""
    summary, records = _scan_fasta(path, keep=True)
    _require_scored(summary, all_n_ok)
    return records


def read_sequence_file(path: str | Path) -> str:
    """The bases of a DNA sequence file a user gives on the command line (`sample --infill-file`): a FASTA
    (anything with a '>' or ';' line, or compressed), checked by `check_fasta` with N allowed everywhere (N
    marks a position to fill), its records joined in file order; or plain lines of bases, joined."""
    path = Path(path)
    if not path.is_file():
        raise GenomeError(_not_a_file(path))
    with open(path, "rb") as f:
        data = f.read()
    if compression(path) != "plain" or next(_marked_lines(data), -1) >= 0:
        return "".join(seq.decode("ascii") for _, seq in read_fasta_records(path, all_n_ok=True))
    if not data.isascii():
        raise GenomeError(f"{path}: {_first_non_ascii(path)}; a sequence file holds ASCII text")
    return "".join(line.strip() for line in data.decode("ascii").splitlines())


def fasta_tokens(path: str | Path, tokenizer: NucleotideTokenizer,
                 records: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every base of a FASTA file (plain, gzip or bgzip; no index needed) as one token stream.

    Returns (ids int64 (n,), loss_mask bool (n,)): records are concatenated in file order (or in the order
    of `records`, names matched up to chr / chrM-MT), lowercase is uppercased, IUPAC codes become N and
    N is excluded from the loss. For zero-shot bits per base of any FASTA: score `ids` in blocks, counting
    only positions where `loss_mask` is True.
    """
    path = Path(path)
    found = read_fasta_records(path)  # checked as every FASTA is (check_fasta)
    by_name = dict(found)
    names = [n for n, _ in found] if records is None else [resolve_chrom(r, list(by_name), str(path))
                                                             for r in records]
    ids_parts, iupac, first = [], 0, ""
    for name in names:
        raw = np.frombuffer(by_name[name], dtype=np.uint8)
        enc = encode_bases(raw, tokenizer, path, name)
        if enc.iupac and not first:
            first = f"{name}:{_first_iupac(raw) + 1}"
        iupac += enc.iupac
        ids_parts.append(enc.ids)
    ids = np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int64)
    report_iupac(path, iupac, first, exact=True)
    loss_mask = ids != tokenizer.n_id
    if not loss_mask.any():  # the file has other bases (checked), these records have none
        raise GenomeError(f"{path}: every base of records {names} is N; nothing to score")
    return ids.astype(np.int64, copy=False), loss_mask


# ---------------------------------------------------------------------------------------------- intervals
@dataclass(frozen=True)
class Interval:
    """chrom[start:end] (0-based, half-open) assigned to one split."""

    chrom: str
    start: int
    end: int
    split: str = "train"

    def __len__(self) -> int:
        return self.end - self.start


def read_bed(path: str | Path, fasta: FastaHandle | None = None, default_split: str | None = None) -> list[Interval]:
    """Intervals of a BED file `chrom start end split` (tab or space separated; extra columns ignored).

    Each line is checked (errors name file and line): integer coordinates, 0 <= start < end, a known split
    (train / valid / test; validation, val, dev, training, testing are accepted). With `fasta`, names are
    matched to the FASTA (chr20 = 20), intervals starting past the chromosome end are refused and those
    ending past it are clipped (one warning for the file).
    """
    path = Path(path)
    if not path.is_file():
        raise GenomeError(f"BED file {path} does not exist")
    opener = gzip.open if compression(path) != "plain" else open
    try:
        with opener(path, "rt") as f:
            lines = f.read().splitlines()
    except (EOFError, OSError, zlib.error, UnicodeDecodeError) as e:
        raise GenomeError(f"{path}: cannot be read ({e})") from e
    if default_split is not None and default_split not in SPLITS:
        raise GenomeError(f"default_split={default_split!r}; choose one of {list(SPLITS)}")
    out: list[Interval] = []
    clipped: list[str] = []
    for number, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith(("#", "track", "browser")):
            continue
        where = f"{path}, line {number}"
        cols = text.split()
        if len(cols) < 3 or (len(cols) < 4 and default_split is None):
            raise GenomeError(f"{where}: expected `chrom start end split`, got {text!r}")
        chrom, start_s, end_s = cols[:3]
        try:
            start, end = int(start_s), int(end_s)
        except ValueError:
            raise GenomeError(f"{where}: start and end must be integers, got {start_s!r} and {end_s!r}") from None
        if len(cols) >= 4:
            split = SPLIT_NAMES.get(cols[3].lower())
            if split is None:
                raise GenomeError(f"{where}: split {cols[3]!r} is unknown; use one of {list(SPLIT_NAMES)}")
        else:
            split = default_split
        if start < 0:
            raise GenomeError(f"{where}: start {start} is negative")
        if end <= start:
            kind = "empty" if end == start else "reversed"
            raise GenomeError(f"{where}: {kind} interval {chrom}:{start}-{end} (BED is 0-based, end exclusive)")
        if fasta is not None:
            chrom = fasta.resolve(chrom, where)
            length = fasta.lengths[chrom]
            if start >= length:
                raise GenomeError(f"{where}: {chrom}:{start}-{end} starts beyond the end of {chrom} "
                                  f"(length {length:,})")
            if end > length:
                clipped.append(f"line {number} ({chrom}:{start}-{end})")
                end = length
        out.append(Interval(chrom, start, end, split))
    if not out:
        raise GenomeError(f"BED file {path} holds no intervals")
    if clipped:
        log.warning("%s: %d interval(s) ran past the chromosome end and were clipped to it: %s", path,
                    len(clipped), ", ".join(clipped[:5]) + (" ..." if len(clipped) > 5 else ""))
    overlaps = _cross_split_overlaps(out)
    if overlaps:
        log.warning("%s: %d pair(s) of intervals of different splits overlap (first: %s)", path, len(overlaps),
                    overlaps[0])
    return out


def _cross_split_overlaps(intervals: Iterable[Interval]) -> list[str]:
    found = []
    by_chrom: dict[str, list[Interval]] = {}
    for iv in intervals:
        by_chrom.setdefault(iv.chrom, []).append(iv)
    for ivs in by_chrom.values():
        ivs.sort(key=lambda iv: iv.start)
        reach: Interval | None = None
        for iv in ivs:
            if reach is not None and iv.start < reach.end and iv.split != reach.split:
                found.append(f"{reach.chrom}:{reach.start}-{reach.end} {reach.split} / {iv.start}-{iv.end} {iv.split}")
            if reach is None or iv.end > reach.end:
                reach = iv
    return found


def split_by_chromosome(fasta: FastaHandle, valid: Sequence[str], test: Sequence[str],
                        train: Sequence[str] | None = None) -> list[Interval]:
    """Whole chromosomes per split. `train=None`: every nuclear human chromosome (1-22, X, Y) not held out,
    or every record not held out when the FASTA has none of those names (no chrM, _random, chrUn ...)."""
    valid_c = [fasta.resolve(c, "valid chromosomes") for c in valid]
    test_c = [fasta.resolve(c, "test chromosomes") for c in test]
    held = set(valid_c) | set(test_c)
    if set(valid_c) & set(test_c):
        raise GenomeError(f"chromosomes {sorted(set(valid_c) & set(test_c))} are both valid and test")
    if train is None:
        primary = [n for n in fasta.names if canonical_chrom(n) in HUMAN_PRIMARY]
        train_c = [n for n in (primary or fasta.names) if n not in held]
    else:
        train_c = [fasta.resolve(c, "train chromosomes") for c in train]
        both = sorted(set(train_c) & held)
        if both:
            raise GenomeError(f"chromosomes {both} are both in training and held out")
    if not train_c:
        raise GenomeError(f"{fasta.path}: no chromosome is left for training")
    return [Interval(c, 0, fasta.lengths[c], split)
            for split, chroms in (("train", train_c), ("valid", valid_c), ("test", test_c)) for c in chroms]


def block_n_fractions(fasta: FastaHandle, chrom: str, block_size: int,
                      tokenizer: NucleotideTokenizer | None = None) -> np.ndarray:
    """Fraction of N (IUPAC codes included) in each block of `block_size` bases of `chrom` (last may be short)."""
    tokenizer = tokenizer or NucleotideTokenizer()
    length = fasta.lengths[chrom]
    fractions = np.zeros(math.ceil(length / block_size))
    iupac, first = 0, ""
    chunk = max(block_size, (1 << 22) // block_size * block_size)  # whole blocks per read, ~4 Mb
    for start in range(0, length, chunk):
        raw = fasta.fetch(chrom, start, min(length, start + chunk))
        enc = encode_bases(raw, tokenizer, fasta.path, chrom, start)
        if enc.iupac and not first:
            first = f"{chrom}:{start + _first_iupac(raw) + 1}"
        iupac += enc.iupac
        b0 = start // block_size
        n = np.add.reduceat(enc.n_mask, np.arange(0, len(raw), block_size))
        sizes = np.diff(np.append(np.arange(0, len(raw), block_size), len(raw)))
        fractions[b0: b0 + len(n)] = n / sizes
    report_iupac(fasta.path, iupac, first, exact=False)
    return fractions


def enforce_gap(intervals: Sequence[Interval], gap: int) -> list[Interval]:
    """Trim intervals so that two of different splits on a chromosome are >= `gap` bases apart (the
    training side is trimmed when there is one); intervals trimmed to nothing are dropped."""
    out = sorted(intervals, key=lambda iv: (iv.chrom, iv.start))
    changed = True
    while changed:
        changed = False
        for i in range(len(out) - 1):
            a, b = out[i], out[i + 1]
            if a.chrom != b.chrom or a.split == b.split or b.start - a.end >= gap:
                continue
            need = gap - (b.start - a.end)
            if a.split == "train" or b.split != "train":
                out[i] = Interval(a.chrom, a.start, a.end - need, a.split)
            else:
                out[i + 1] = Interval(b.chrom, b.start + need, b.end, b.split)
            out = [iv for iv in out if len(iv) > 0]
            changed = True
            break
    return out


def split_by_blocks(fasta: FastaHandle, chrom: str, block_size: int, valid_fraction: float, test_fraction: float,
                    gap: int, seed: int = 0, max_block_n_fraction: float = 0.5) -> list[Interval]:
    """Held-out blocks of one chromosome: blocks of `block_size` bases with more than
    `max_block_n_fraction` N (telomeres, centromere, gaps) are dropped, the rest are assigned to valid /
    test / train at random (seeded), neighbours of one split are merged, and splits are kept `gap` apart."""
    chrom = fasta.resolve(chrom)
    if gap < 0:
        raise GenomeError(f"gap must be >= 0, got {gap}")
    fractions = block_n_fractions(fasta, chrom, block_size)
    kept = np.flatnonzero(fractions <= max_block_n_fraction)
    n_valid = max(1, round(valid_fraction * len(kept))) if valid_fraction > 0 else 0
    n_test = max(1, round(test_fraction * len(kept))) if test_fraction > 0 else 0
    if n_valid + n_test >= len(kept):
        raise GenomeError(f"{fasta.path}: {chrom} has {len(kept)} usable blocks of {block_size:,} bases, too few "
                          f"for {n_valid} valid + {n_test} test blocks and training; use a smaller block_size")
    order = np.random.default_rng(seed).permutation(kept)
    split_of = {int(b): "train" for b in kept}
    split_of.update({int(b): "valid" for b in order[:n_valid]})
    split_of.update({int(b): "test" for b in order[n_valid: n_valid + n_test]})
    length = fasta.lengths[chrom]
    merged: list[Interval] = []
    for b in sorted(split_of):
        start, end, split = b * block_size, min(length, (b + 1) * block_size), split_of[b]
        last = merged[-1] if merged else None
        if last is not None and last.split == split and last.end == start:
            merged[-1] = Interval(chrom, last.start, end, split)
        else:
            merged.append(Interval(chrom, start, end, split))
    out = enforce_gap(merged, gap)
    wanted = {"train": True, "valid": valid_fraction > 0, "test": test_fraction > 0}
    for split in SPLITS:
        if wanted[split] and not any(iv.split == split for iv in out):
            raise GenomeError(f"{chrom}: no {split} block is left after keeping a gap of {gap} bases between "
                              f"splits; use a larger block_size")
    return out


def summarize(intervals: Iterable[Interval]) -> dict[str, dict[str, int]]:
    """{split: {"intervals": n, "bases": total}} for logs and reports."""
    out = {s: {"intervals": 0, "bases": 0} for s in SPLITS}
    for iv in intervals:
        out[iv.split]["intervals"] += 1
        out[iv.split]["bases"] += len(iv)
    return out


# ---------------------------------------------------------------------------------------------- windows
class RandomGenomeWindows(StepIndexedBatches):
    """Endless step-indexed batches of random windows inside intervals: batch k depends only on (seed, k).

    Yields {"input_ids": (B, L) long, "loss_mask": (B, L) bool [, "soft_mask": (B, L) bool]}.
    """

    def __init__(self, fasta: FastaHandle, intervals: Sequence[Interval], seq_len: int, batch_size: int,
                 tokenizer: NucleotideTokenizer, seed: int, start_step: int = 0, max_n_fraction: float = 0.1,
                 rc_augment: bool = True, keep_soft_mask: bool = False, max_draws: int = 1000):
        usable = [iv for iv in intervals if len(iv) >= seq_len]
        if not usable:
            raise GenomeError(f"{fasta.path}: no training interval is at least data.seq_len={seq_len} bases long")
        self.fasta, self.tokenizer = fasta, tokenizer
        self.seq_len, self.batch_size, self.seed, self.start_step = seq_len, batch_size, seed, start_step
        self.max_n, self.rc_augment, self.keep_soft_mask = max_n_fraction, rc_augment, keep_soft_mask
        self.max_draws = max_draws
        self.chroms = [iv.chrom for iv in usable]
        self.starts = np.array([iv.start for iv in usable], dtype=np.int64)
        counts = np.array([len(iv) - seq_len + 1 for iv in usable], dtype=np.int64)  # valid starts per interval
        self.cum = np.cumsum(counts)  # window p lies in interval searchsorted(cum, p, "right")
        self.total = int(self.cum[-1])
        self.iupac_count = 0
        self.complement = tokenizer.complement_ids.numpy()

    def window(self, p: int) -> tuple[str, int]:
        """The p-th of all valid windows, p in [0, total): (chrom, start)."""
        i = int(np.searchsorted(self.cum, p, side="right"))
        before = int(self.cum[i - 1]) if i else 0
        return self.chroms[i], int(self.starts[i]) + p - before

    def draw(self, g: torch.Generator) -> tuple[str, int, np.ndarray, EncodedBases]:
        limit = self.max_n * self.seq_len
        for _ in range(self.max_draws):
            u = torch.rand((), dtype=torch.float64, generator=g).item()
            chrom, start = self.window(min(int(u * self.total), self.total - 1))
            raw = self.fasta.fetch(chrom, start, start + self.seq_len)
            enc = encode_bases(raw, self.tokenizer, self.fasta.path, chrom, start)
            if enc.n_mask.sum() <= limit:
                return chrom, start, raw, enc
        raise GenomeError(f"{self.fasta.path}: {self.max_draws} random windows in a row had more than "
                          f"{self.max_n:.0%} N; the intervals are mostly N (raise data.fasta.max_n_fraction or fix "
                          "them)")

    def batch_at(self, step: int) -> dict[str, torch.Tensor]:
        g = step_generator(self.seed, step)
        flip = (torch.rand(self.batch_size, generator=g) < 0.5).tolist()  # drawn even without augmentation
        complement = self.complement
        ids, loss_mask, soft = [], [], []
        for b in range(self.batch_size):
            chrom, start, raw, enc = self.draw(g)
            if enc.iupac:
                report_iupac(self.fasta.path, enc.iupac, f"{chrom}:{start + _first_iupac(raw) + 1}", exact=False)
                self.iupac_count += enc.iupac
            row_ids, row_scored, row_soft = enc.ids, ~enc.n_mask, enc.soft_mask
            if self.rc_augment and flip[b]:  # reverse complement (numpy: torch indexing is slow on CPU)
                row_ids, row_scored, row_soft = complement[row_ids][::-1], row_scored[::-1], row_soft[::-1]
            ids.append(row_ids)
            loss_mask.append(row_scored)
            soft.append(row_soft)
        batch = {"input_ids": torch.from_numpy(np.stack(ids)),  # (B, L) long
                 "loss_mask": torch.from_numpy(np.stack(loss_mask))}  # (B, L) bool, False at N
        if self.keep_soft_mask:
            batch["soft_mask"] = torch.from_numpy(np.stack(soft))  # (B, L) bool, True where lowercase
        return batch



class TiledGenomeWindows(Dataset):
    """Consecutive windows of `seq_len` covering each interval once (the last one of an interval padded);
    windows with more than `max_n_fraction` N are skipped. Items: input_ids, attention_mask, loss_mask
    [, soft_mask], each (L,)."""

    def __init__(self, fasta: FastaHandle, intervals: Sequence[Interval], seq_len: int,
                 tokenizer: NucleotideTokenizer, max_n_fraction: float = 0.1, keep_soft_mask: bool = False):
        self.fasta, self.tokenizer, self.seq_len = fasta, tokenizer, seq_len
        self.keep_soft_mask = keep_soft_mask
        tiles, skipped, scored = [], 0, 0
        chunk = max(1, (1 << 22) // seq_len) * seq_len
        for iv in intervals:
            for c0 in range(iv.start, iv.end, chunk):
                c1 = min(iv.end, c0 + chunk)
                raw = fasta.fetch(iv.chrom, c0, c1)
                enc = encode_bases(raw, tokenizer, fasta.path, iv.chrom, c0)
                if enc.iupac:
                    report_iupac(fasta.path, enc.iupac, f"{iv.chrom}:{c0 + _first_iupac(raw) + 1}", exact=False)
                offsets = np.arange(0, c1 - c0, seq_len)
                n = np.add.reduceat(enc.n_mask, offsets)
                sizes = np.minimum(seq_len, (c1 - c0) - offsets)
                keep = n <= max_n_fraction * sizes
                skipped += int((~keep).sum())
                scored += int((sizes - n)[keep].sum())
                tiles += [(iv.chrom, c0 + int(o), int(s)) for o, s in zip(offsets[keep], sizes[keep])]
        self.tiles = tiles
        self.skipped, self.scored_bases = skipped, scored
        if skipped:
            log.info("%s: %d of %d evaluation windows skipped (more than %.0f%% N)", fasta.path, skipped,
                     skipped + len(tiles), 100 * max_n_fraction)

    def __len__(self) -> int:
        return len(self.tiles)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chrom, start, size = self.tiles[i]
        raw = self.fasta.fetch(chrom, start, start + size)
        enc = encode_bases(raw, self.tokenizer, self.fasta.path, chrom, start)
        pad = self.seq_len - size
        ids = torch.from_numpy(np.pad(enc.ids, (0, pad), constant_values=self.tokenizer.pad_id))
        attention_mask = torch.arange(self.seq_len) < size
        item = {"input_ids": ids, "attention_mask": attention_mask,
                "loss_mask": torch.from_numpy(np.pad(~enc.n_mask, (0, pad)))}
        if self.keep_soft_mask:
            item["soft_mask"] = torch.from_numpy(np.pad(enc.soft_mask, (0, pad)))
        return item
