"""Writing files so that an operating-system failure is one line, and never leaves a partial file.

Every write goes to `<name>.tmp` beside the final name, then `os.replace` puts it in place: a crash or a
full disk leaves the previous file as it was. A failure (full disk, read-only file system, permission,
a path component that is a file, a file-size limit) removes the `.tmp` file and raises `WriteError`,
whose message names the path and the cause in the OS's own words ("no space left on device").

torch.save is given a Python file object rather than a path: its own C++ writer reports a full disk as
"unexpected pos 2068352 vs 2068244"; through a file object the OSError (errno included) is kept as the
exception's context, which `os_cause` finds.

This module is the project's one write-then-rename: text, bytes, torch checkpoints, figures
(`atomic_save_figure`) and whole folders (`atomic_directory`) all go through it. A report of several files
(JSON, Markdown, figures) is written inside `written_together`, so that Ctrl-C does not leave it half new.
A path that exists and is neither a regular file nor a folder (a character device such as /dev/null, a
named pipe) is written through, never renamed over: replacing /dev/null with a regular file breaks every
program on the machine.
A `SeqdiffError` raised by the writing callback (a user error found while streaming) is passed on as it is.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def check_output_file(path: str | Path, what: str = "output file") -> Path:
    """Refuse, before the work that would fill it, an output path that cannot become a file: a folder, a path
    under a file, or a folder this process may not write into. Creates nothing; an existing file is replaced
    when the output is written (as with any `-o FILE`)."""
    path = Path(path)
    if path.is_dir():
        raise WriteError(f"{what} {path} is a folder; name a file")
    if is_special(path):  # /dev/null, a named pipe: written through
        return path
    _check_writable_from(path.parent, f"{what} {path}", path)
    return path


def check_output_folder(path: str | Path, what: str = "output folder") -> Path:
    """Refuse, before the work that would fill it, a folder that cannot be made or written into: a file on its
    path, or no permission where it would be made. Creates nothing."""
    path = Path(path)
    _check_writable_from(path, f"{what} {path}", path)
    return path


def _check_writable_from(folder: Path, where: str, target: Path) -> None:
    """The nearest existing folder at or above `folder` must be a folder this process can write into; `where`
    names the output (`target`), and the folder at fault is named after it unless it is the target itself."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    named = where if existing == target else f"{where}: {existing}"
    if existing.exists() and not existing.is_dir():
        raise WriteError(f"{named} is a file, not a folder")
    if existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise WriteError(f"{named} is not writable (permission denied)")


def is_special(path: str | Path) -> bool:
    """True for a path that exists and is neither a regular file nor a folder (/dev/null, a named pipe)."""
    path = Path(path)
    return path.exists() and not path.is_file() and not path.is_dir()


def atomic_write(path: str | Path, write: Callable[[IO[bytes]], Any], what: str = "file") -> Path:
    """Call write(file object) on `<path>.tmp`, then rename it to `path`; on failure remove it, raise WriteError.

    `write` may close the file object itself (a compressing writer that closes its sink)."""
    path = Path(path)
    if is_special(path):  # /dev/null, a named pipe: write through
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
            if not f.closed:
                f.flush()
                if _has_fileno(f):  # a full network disk may report ENOSPC only here
                    os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if isinstance(e, SeqdiffError):  # already one line (e.g. a truncated input found while streaming)
            raise
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


def atomic_write_bytes(path: str | Path, data: bytes, what: str = "file") -> Path:
    return atomic_write(path, lambda f: f.write(data), what)


def atomic_save_figure(fig, path: str | Path, dpi: int = 110, what: str = "figure", **savefig: Any) -> Path:
    """fig.savefig to `path` (format from its suffix, PNG by default) by write-then-rename."""
    fmt = savefig.pop("format", None) or (Path(path).suffix.lstrip(".").lower() or "png")
    return atomic_write(path, lambda f: fig.savefig(f, dpi=dpi, format=fmt, **savefig), what)


@contextmanager
def atomic_directory(path: str | Path, what: str = "folder", prefix: str | None = None,
                     accept_existing: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """Yield a new temporary folder beside `path`; when the block ends without an exception, put it in place.

    An existing folder at `path` is moved aside, replaced, then removed (restored if the replace fails). If the
    replace fails and `accept_existing(path)` is true (another process put a sound copy there first), that copy
    is kept. The temporary folder never outlives the block. `prefix` names it (default `.<name>.`, suffix .tmp).
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise WriteError(f"{what} {path} exists and is not a directory")
    ensure_dir(path.parent, "folder")
    try:
        tmp = Path(tempfile.mkdtemp(prefix=prefix or f".{path.name}.", suffix=".tmp" if prefix is None else "",
                                    dir=path.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would make the placed folder private
    except OSError as e:
        raise WriteError(f"cannot create {what} {path}: {os_cause(e)}") from e
    try:
        yield tmp
        _move_into_place(tmp, path, accept_existing)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def written_together() -> Iterator[None]:
    """The files a block writes are written as one report: a Ctrl-C (SIGINT) or SIGTERM that arrives during the
    block takes effect when it ends, so a stop never leaves a report's JSON new and its Markdown old. A second
    signal within the block stops at once (as the first would have without the block). Outside the main thread
    (where Python runs no signal handler) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Any] = {}

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)

    def hold(signum: int, frame: Any) -> None:
        if held:  # a second stop: now (and not again when the block ends)
            held.clear()
            restore()
            signal.raise_signal(signum)
            return
        held.append(signum)

    for signum in HELD_SIGNALS:
        previous[signum] = signal.signal(signum, hold)
    try:
        yield
    finally:
        restore()
        if held:  # delivered now, to the handler that was in place (KeyboardInterrupt for Ctrl-C)
            signal.raise_signal(held[0])


def scratch_prefix(name: str) -> str:
    """`.<name>.tmp-<pid>-`: the name prefix of a scratch folder of this process (a cache build, a fetch's
    download), which `remove_stale_scratch` removes once this process is gone (killed outright: kill -9)."""
    return f".{name}.tmp-{os.getpid()}-"


def remove_stale_scratch(root: str | Path) -> None:
    """Remove the scratch folders in `root` (named by `scratch_prefix`) whose process no longer runs; those of
    running processes (this one, another build or fetch at work) are left alone."""
    for tmp in Path(root).glob(".*.tmp-*"):
        pid = tmp.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:  # another user's live process
            pass


def _move_into_place(tmp: Path, path: Path, accept_existing: Callable[[Path], bool] | None) -> None:
    old = path.with_name(f".{path.name}.old-{os.getpid()}")
    moved = False
    try:
        if path.exists():
            os.replace(path, old)  # a folder is replaced only when empty: swap, then remove the old one
            moved = True
        os.replace(tmp, path)
    except OSError as e:
        if moved and not path.exists():
            os.replace(old, path)
            moved = False
        if accept_existing is not None and path.is_dir() and accept_existing(path):
            return
        raise WriteError(f"cannot put folder {path} in place: {os_cause(e)}") from e
    finally:
        if moved:
            shutil.rmtree(old, ignore_errors=True)


def atomic_torch_save(obj: Any, path: str | Path, what: str = "checkpoint") -> Path:
    import torch

    return atomic_write(path, lambda f: torch.save(obj, f), what)


__all__ = ["WriteError", "atomic_directory", "atomic_save_figure", "atomic_torch_save", "atomic_write",
           "atomic_write_bytes", "atomic_write_text", "ensure_dir", "find_os_error", "is_special", "os_cause",
           "remove_stale_scratch", "scratch_prefix"]
