"""Tokenized blocks cached on disk as memory-mapped numpy shards, keyed by what they were built from.

    arrays = load_or_build(key_fields, build)     # build() -> ({name: array}, meta) on a miss

Layout: `<data dir>/cache/<key>/` holds one `<name>.npy` shard per array and `manifest.json` (the key
fields, and per shard its shape, dtype, size in bytes and sha256). The key is a hash of the key fields:
the source's identity (path + size + mtime, or a dataset id and split), the tokenizer's fingerprint
(a hash of its `to_dict()`), seq_len, the block mode and anything else that changes the result.

Design choices
- Written atomically: shards and manifest go into a temporary folder beside the final one, which is then
  renamed into place; a crash leaves no half-written cache under the final name.
- Verified on every load: a missing shard, a size or sha256 that differs from the manifest (a flipped
  byte, a truncated file) makes the cache be rebuilt, with a message on stderr. It is never used silently.
- Shards are opened with `np.load(mmap_mode="r")`, so a corpus larger than memory is paged in on demand.
- Built in bounded memory: `load_or_build_into` lets the builder write the shards itself (the text data
  module uses `seqdiff.data.streaming`); temporary folders of killed builds are removed by later builds.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from seqdiff.safe_io import atomic_directory, ensure_dir, remove_stale_scratch, scratch_prefix
from seqdiff.sources import data_dir
from seqdiff.tokenizers.base import Tokenizer

CACHE_VERSION = 1
"""Bumped whenever the layout or the block construction changes, so old caches are not reused."""
MANIFEST = "manifest.json"


def cache_root() -> Path:
    return data_dir() / "cache"


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
    """sha256 of the tokenizer's serialized description (two tokenizers that encode alike share it)."""
    return hashlib.sha256(json.dumps(tokenizer.to_dict(), sort_keys=True).encode()).hexdigest()


def file_identity(path: str | Path) -> dict[str, Any]:
    """A file's identity for cache keys: resolved path, size and modification time (ns)."""
    path = Path(path).resolve()
    stat = path.stat()
    return {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def cache_key(fields: dict[str, Any]) -> str:
    payload = json.dumps({"version": CACHE_VERSION, **fields}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _problems(folder: Path) -> list[str]:
    """What is wrong with a cache folder (empty list: it is sound)."""
    manifest_path = folder / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        shards = manifest["shards"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [f"{manifest_path}: unreadable manifest ({e})"]
    problems = []
    for name, info in shards.items():
        path = folder / f"{name}.npy"
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != info["bytes"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, manifest says {info['bytes']}")
        elif _sha256(path) != info["sha256"]:
            problems.append(f"{path}: sha256 does not match the manifest")
    return problems


def _open(folder: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    manifest = json.loads((folder / MANIFEST).read_text())
    arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r") for name in manifest["shards"]}
    return arrays, manifest.get("meta", {})


def _write(folder: Path, fields: dict[str, Any], arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
    def save(tmp: Path) -> dict[str, Any]:
        for name, array in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(array))
        return meta

    _write_with(folder, fields, save)


def _write_with(folder: Path, fields: dict[str, Any], fill: Callable[[Path], dict[str, Any]]) -> None:
    """`fill(tmp)` writes the shards (<name>.npy) into a temporary folder and returns the meta; the manifest
    is added and the folder renamed into place only after it returns (an interrupted build leaves nothing
    under the final name; its temporary folder is removed by the next build of any key)."""
    ensure_dir(folder.parent, "tokenized cache folder")
    remove_stale_scratch(folder.parent)
    sound = lambda f: not _problems(f)  # noqa: E731  (another process' sound copy, put in place first, is kept)
    with atomic_directory(folder, "cache folder", prefix=scratch_prefix(folder.name),
                          accept_existing=sound) as tmp:
        meta = fill(tmp)
        shards = {}
        for path in sorted(tmp.glob("*.npy")):
            array = np.load(path, mmap_mode="r")
            shards[path.stem] = {"shape": list(array.shape), "dtype": str(array.dtype),
                                 "bytes": path.stat().st_size, "sha256": _sha256(path)}
            del array
        manifest = {"version": CACHE_VERSION, "key": fields, "meta": meta, "shards": shards}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")


def _intact(folder: Path, log: Callable[[str], None] | None) -> bool:
    """Whether a cache folder exists and passes its checks; a corrupt one is reported (and then rebuilt)."""
    if not folder.exists():
        return False
    problems = _problems(folder)
    if problems:
        (log or (lambda message: print(message, file=sys.stderr)))(
            f"seqdiff: tokenized cache {folder} is corrupt ({'; '.join(problems)}); rebuilding it")
    return not problems


def load_or_build(fields: dict[str, Any],
                  build: Callable[[], tuple[dict[str, np.ndarray], dict[str, Any]]],
                  root: str | Path | None = None,
                  log: Callable[[str], None] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The cached arrays (memory-mapped) and meta for `fields`; built, written and reopened on a miss."""
    folder = Path(root or cache_root()) / cache_key(fields)
    if _intact(folder, log):
        return _open(folder)
    arrays, meta = build()
    _write(folder, fields, arrays, meta)
    return _open(folder)


def load_or_build_into(fields: dict[str, Any], build_into: Callable[[Path], dict[str, Any]],
                       root: str | Path | None = None,
                       log: Callable[[str], None] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Like `load_or_build`, for builds larger than memory: on a miss `build_into(folder)` writes the .npy
    shards itself (e.g. `seqdiff.data.streaming.build_streaming`) and returns the meta."""
    folder = Path(root or cache_root()) / cache_key(fields)
    if _intact(folder, log):
        return _open(folder)
    _write_with(folder, fields, build_into)
    return _open(folder)
