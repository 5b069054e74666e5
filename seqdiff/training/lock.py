"""One writer per run directory: `<run>/train.lock` while `seqdiff train` writes it.

The lock file holds the owner's pid, host name, start time and command (JSON). It is created complete and
atomically: written under a unique temporary name, then hard-linked to `train.lock`, which fails when the
lock exists, so two trainers starting at once cannot both win.

A lock whose owner is gone is stale: when its host is this host and no process has its pid, it is taken
over with a message naming the old owner. A lock held by a live process, or by another host (whose
processes cannot be seen from here), refuses the second trainer with one line that says how to remove it
if its owner is known to be gone. Only global rank 0 of a multi-process run takes the lock.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

from seqdiff.safe_io import WriteError, os_cause
from seqdiff.training.guards import RunError

LOCK_NAME = "train.lock"


class RunLockedError(RunError):
    """Another training process is writing this run directory."""


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (a zombie counts as alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def read_lock(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class RunLock:
    """Context manager: hold `<run_dir>/train.lock` for the duration of a training run."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.held = False
        self.owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                      "command": " ".join(sys.argv)}

    def acquire(self) -> RunLock:
        tmp = self.path.with_name(f".{LOCK_NAME}.{self.owner['host']}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(self.owner) + "\n")
        except OSError as e:
            raise WriteError(f"cannot write the lock file {self.path}: {os_cause(e)}") from e
        try:
            for _ in range(2):  # a second try after taking over a stale lock
                try:
                    os.link(tmp, self.path)
                    self.held = True
                    return self
                except FileExistsError:
                    self._take_over_or_refuse()
                except OSError as e:
                    raise WriteError(f"cannot write the lock file {self.path}: {os_cause(e)}") from e
            raise RunLockedError(f"{self.run_dir} is being locked by another trainer right now; try again")
        finally:
            tmp.unlink(missing_ok=True)

    def check_free(self) -> None:
        """Raise RunLockedError when another live trainer holds the lock; a stale or absent lock passes (it is
        taken over by `acquire`). Called before the run's checkpoints are looked at, so a second trainer
        learns that the run is busy rather than that it has no checkpoint yet."""
        if self.path.exists():
            refusal = self._refusal(read_lock(self.path))
            if refusal is not None:
                raise refusal

    def _refusal(self, owner: dict | None) -> RunLockedError | None:
        """Why the lock (with this content) may not be taken over; None when it is stale."""
        if owner is None:  # unreadable: written by something else, or emptied; stale unless brand new
            age = time.time() - self.path.stat().st_mtime if self.path.exists() else 0
            if age < 5:
                return RunLockedError(f"{self.path} exists (unreadable, {age:.0f} s old): another trainer may be "
                                      f"starting in {self.run_dir}; if none is, remove the file")
            return None
        pid, host = int(owner.get("pid", -1)), str(owner.get("host", "?"))
        if host != self.owner["host"]:
            return RunLockedError(f"{self.run_dir} is locked by process {pid} on host {host} (since "
                                  f"{owner.get('started', '?')}); if that trainer is gone, remove {self.path}")
        if pid_alive(pid) and pid != os.getpid():
            return RunLockedError(f"{self.run_dir} is being written by another trainer (pid {pid} on {host}, "
                                  f"since {owner.get('started', '?')}); wait for it or choose another --run-dir")
        return None

    def _take_over_or_refuse(self) -> None:
        owner = read_lock(self.path)
        refusal = self._refusal(owner)
        if refusal is not None:
            raise refusal
        if owner is None:
            print(f"seqdiff: taking over the unreadable lock {self.path}", file=sys.stderr)
        else:
            print(f"seqdiff: taking over the stale lock {self.path} of process {owner.get('pid', -1)} on "
                  f"{owner.get('host', '?')} (no longer running)", file=sys.stderr)
        self.path.unlink(missing_ok=True)

    def release(self) -> None:
        if self.held:
            owner = read_lock(self.path)
            if owner is not None and owner.get("pid") == self.owner["pid"] and owner.get("host") == self.owner["host"]:
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
