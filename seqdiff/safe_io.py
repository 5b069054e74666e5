"""Writing files so that an operating-system failure is one line, and never leaves a partial file.

Every write goes to `<name>.tmp` beside the final name, then `os.replace` puts it in place: a crash or a
full disk leaves the previous file as it was. A failure (full disk, read-only file system, permission,
a path component that is a file, a file-size limit) removes the `.tmp` file and raises `WriteError`,
whose message names the path and the cause in the OS's own words ("no space left on device").

torch.save is given a Python file object rather than a path: its own C++ writer reports a full disk as
"unexpected pos 2068352 vs 2068244"; through a file object the OSError (errno included) is kept as the
exception's context, which `os_cause` finds.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from seqdiff.errors import SeqdiffError


class WriteError(SeqdiffError):
    """A file or folder that cannot be written (or read): the path and the operating system's cause."""


def find_os_error(exc: BaseException | None) -> OSError | None:
    """The OSError behind `exc` (itself, or in its __cause__ / __context__ chain), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def os_cause(exc: BaseException, path: str | Path | None = None) -> str:
    """The cause of a failed write in the OS's words, lower case ("no space left on device")."""
    err = find_os_error(exc)
    if err is not None and err.errno is not None:
        return os.strerror(err.errno).lower()
    if err is not None:
        return str(err)
    if path is not None:  # torch's own writer: no errno; a full disk is the usual reason
        try:
            import shutil

            if shutil.disk_usage(Path(path).parent).free < 1 << 20:
                return os.strerror(errno.ENOSPC).lower()
        except OSError:
            pass
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


def _open_binary(path: Path) -> IO[bytes]:
    """open(path, "wb"): one place, so that a test can make the writes fail the way a full disk does."""
    return open(path, "wb")


def ensure_dir(path: str | Path, what: str = "folder") -> Path:
    """mkdir -p, as one line when it fails (a component that is a file, read-only, permission)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise WriteError(f"{what} {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(f"cannot create {what} {path}: {os_cause(e)}") from e
    return path


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], what: str = "file") -> Path:
    """Call write(file object) on `<path>.tmp`, then rename it to `path`; on failure remove it, raise WriteError."""
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():  # /dev/null, a named pipe: write through
        try:
            with open(path, "wb") as f:
                write(f)
        except OSError as e:
            raise WriteError(f"cannot write {what} {path}: {os_cause(e)}") from e
        return path
    ensure_dir(path.parent, "folder")
    tmp = path.with_name(path.name + ".tmp")
    try:
        with _open_binary(tmp) as f:
            write(f)
            f.flush()
            if _has_fileno(f):  # a full network disk may report ENOSPC only here
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if find_os_error(e) is not None or (isinstance(e, RuntimeError) and _is_write_failure(e)):
            raise WriteError(f"cannot write {what} {path}: {os_cause(e, path)} (nothing partial was left)") from e
        raise
    return path


def _is_write_failure(e: RuntimeError) -> bool:
    """torch's zip writer reports a failed write as a RuntimeError without errno."""
    text = str(e)
    return "unexpected pos" in text or "file write failed" in text


def _has_fileno(f) -> bool:
    try:
        f.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    return True


def atomic_write_text(path: str | Path, text: str, what: str = "file") -> Path:
    return atomic_write(path, lambda f: f.write(text.encode("utf-8")), what)


def atomic_torch_save(obj: Any, path: str | Path, what: str = "checkpoint") -> Path:
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f), what)


__all__ = ["WriteError", "atomic_torch_save", "atomic_write", "atomic_write_text", "ensure_dir", "find_os_error",
           "os_cause"]
