"""Download the GRCh37 (hg19) human reference for users with the internet, verify it, and index it.

    python -m experiments.fetch_grch37 [--out-dir DIR] [--format bgzip|plain] [--chromosomes chr20 chr21 ...]
                                     [--url URL --md5 HEX] [--keep-download]

Source: UCSC's hg19.fa.gz (GRCh37 with UCSC names: chr1..chr22, chrX, chrY, chrM and the unplaced /
random / haplotype contigs; about 0.9 GB gzip, 3.1 Gb). UCSC publishes the md5 of every file of the
folder in md5sum.txt; it is read from the same folder unless `--md5` pins a value. Offline machines can't
run this; the chromosome 20 that tests and CPU recipes use comes from a Debian package instead
(`seqdiff data fetch grch37-chr20`).

Steps, each idempotent:
1. download to `<out>/hg19.fa.gz.part` with the md5 computed on the fly, renamed once it verifies;
2. recompress as BGZF (`--format bgzip`, the default: random access through pyfaidx with .fai + .gzi, the
   UCSC file being plain gzip, which has none) or decompress (`--format plain`), optionally keeping only
   `--chromosomes`; written to a temporary file and renamed;
3. index (.fai, and .gzi for bgzip) and check the index against the file (seqdiff.data.genome.open_fasta).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import sys
import urllib.request
import zlib
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path

from seqdiff.data.genome import GenomeError, canonical_chrom, compression, open_fasta
from seqdiff.safe_io import atomic_write

UCSC_HG19_URL = "https://hgdownload.soe.ucsc.edu/goldenPath/hg19/bigZips/hg19.fa.gz"
"""The GRCh37 / hg19 reference, gzip-compressed FASTA with UCSC chromosome names."""
UCSC_HG19_MD5_URL = "https://hgdownload.soe.ucsc.edu/goldenPath/hg19/bigZips/md5sum.txt"
"""md5 of every file in the hg19 bigZips folder (`<md5>  <file name>` lines)."""
DATA_DIR_ENV = "SEQDIFF_DATA"
CHUNK = 1 << 20


class ChecksumError(ValueError):
    """A file whose checksum differs from the published one."""


def default_out_dir() -> Path:
    root = os.environ.get(DATA_DIR_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "seqdiff" / "data") / "grch37"


# ---------------------------------------------------------------------------------------------- checksums
def file_digest(path: str | Path, algorithm: str = "md5") -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def parse_md5sums(text: str, filename: str) -> str:
    """The md5 of `filename` in an `md5sum` listing (`<hex>  <name>` or `<hex> *<name>` lines)."""
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[1].lstrip("*").strip() == filename:
            value = parts[0].lower()
            if len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
                raise ChecksumError(f"md5 listing: {value!r} for {filename} is not an md5")
            return value
    raise ChecksumError(f"the md5 listing has no line for {filename}")


def verify_checksum(path: str | Path, expected: str, algorithm: str = "md5") -> None:
    got = file_digest(path, algorithm)
    if got != expected.lower():
        raise ChecksumError(f"{path}: {algorithm} is {got}, expected {expected.lower()}; the file is damaged or "
                            f"not the published one (delete it and download again)")


# ---------------------------------------------------------------------------------------------- download
def download(url: str, dest: Path, expected_md5: str, log=print) -> Path:
    """Stream `url` to `dest` (via dest.part), checking the md5; a verified `dest` is kept as is."""
    if dest.is_file():
        verify_checksum(dest, expected_md5)
        log(f"{dest}: already downloaded and verified")
        return dest
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.md5()
    with urllib.request.urlopen(url, timeout=60) as response, open(part, "wb") as out:
        total = int(response.headers.get("Content-Length") or 0)
        done, shown = 0, -1
        while chunk := response.read(CHUNK):
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if total and (pct := 100 * done // total) != shown and pct % 5 == 0:
                log(f"{dest.name}: {pct}% of {total / 1e9:.2f} GB")
                shown = pct
    if digest.hexdigest() != expected_md5.lower():
        raise ChecksumError(f"{url}: md5 of the download is {digest.hexdigest()}, expected {expected_md5}; "
                            f"left it in {part} for inspection")
    os.replace(part, dest)
    return dest


def fetch_md5(url: str, filename: str) -> str:
    with urllib.request.urlopen(url, timeout=60) as response:
        return parse_md5sums(response.read().decode("utf-8", "replace"), filename)


# ---------------------------------------------------------------------------------------------- conversion
def _records(lines: Iterable[bytes], keep: set[str] | None) -> Iterable[bytes]:
    """Lines of the FASTA records whose (canonical) name is in `keep` (all when None)."""
    writing = keep is None
    for line in lines:
        if line.startswith(b">"):
            name = line[1:].split(None, 1)[0].decode("latin-1") if line[1:].strip() else ""
            writing = keep is None or canonical_chrom(name) in keep
        if writing:
            yield line


def prepare_reference(src: str | Path, out: str | Path, fmt: str = "bgzip",
                      chromosomes: Iterable[str] | None = None):
    """Plain / gzip FASTA `src` -> indexed `out` (BGZF or plain), optionally only some chromosomes.

    Returns the opened `FastaHandle` (its .fai / .gzi are written beside `out`)."""
    from Bio import bgzf

    src, out = Path(src), Path(out)
    if fmt not in ("bgzip", "plain"):
        raise ValueError(f"format {fmt!r}: choose bgzip or plain")
    keep = {canonical_chrom(c) for c in chromosomes} if chromosomes else None
    opener = open if compression(src) == "plain" else gzip.open
    written: set[str] = set()

    def convert(f) -> None:
        try:
            with opener(src, "rb") as fin:
                sink = bgzf.BgzfWriter(fileobj=f) if fmt == "bgzip" else nullcontext(f)
                with sink as out_file:
                    for line in _records(fin, keep):
                        if line.startswith(b">"):
                            written.add(canonical_chrom(line[1:].split(None, 1)[0].decode("latin-1")))
                        out_file.write(line)
        except (EOFError, OSError, zlib.error) as e:
            raise GenomeError(f"{src}: cannot be read to the end ({e}); is it truncated?") from e
        absent = [c for c in chromosomes or [] if canonical_chrom(c) not in written]
        if absent:
            raise GenomeError(f"{src}: chromosomes {absent} are not in the file")
        for index in (Path(str(out) + ".fai"), Path(str(out) + ".gzi")):
            index.unlink(missing_ok=True)

    atomic_write(out, convert, "FASTA")
    return open_fasta(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.fetch_grch37", description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", type=Path, default=None, help=f"default: ${DATA_DIR_ENV}/grch37 or "
                   "~/.cache/seqdiff/data/grch37")
    p.add_argument("--format", choices=["bgzip", "plain"], default="bgzip")
    p.add_argument("--chromosomes", nargs="*", default=None, help="keep only these (chr20 and 20 both work)")
    p.add_argument("--url", default=UCSC_HG19_URL, help="a mirror of hg19.fa.gz")
    p.add_argument("--md5", default=None, help="expected md5 (default: read from UCSC's md5sum.txt)")
    p.add_argument("--keep-download", action="store_true", help="keep hg19.fa.gz after conversion")
    args = p.parse_args(argv)
    out_dir = args.out_dir or default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    name = args.url.rstrip("/").rsplit("/", 1)[-1]
    suffix = "_".join(args.chromosomes) if args.chromosomes else ""
    stem = name.removesuffix(".gz").removesuffix(".fa") + (f".{suffix}" if suffix else "")
    out = out_dir / (f"{stem}.fa.gz" if args.format == "bgzip" else f"{stem}.fa")
    if out.is_file():  # finished earlier (prepare_reference renames only a complete file)
        fasta = open_fasta(out)
        print(f"{out}: already prepared ({len(fasta.lengths)} sequences); use data.fasta.path={out}")
        return 0
    md5 = args.md5 or fetch_md5(UCSC_HG19_MD5_URL, name)
    raw = download(args.url, out_dir / name, md5)
    fasta = prepare_reference(raw, out, args.format, args.chromosomes)
    if not args.keep_download and raw != out:
        raw.unlink()
    total = sum(fasta.lengths.values())
    print(f"{out}: {len(fasta.lengths)} sequences, {total:,} bases, indexed; use data.fasta.path={out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ChecksumError, GenomeError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
