"""A second Python process started before this one's heavy imports, that imports torch and Lightning meanwhile and
then waits to be handed a run to train (seqdiff.training.side_by_side.ChildRun).

Why: the quickstart trains AR in a second process, and whichever run ends last sets the quickstart's time. Started
from scratch once this process had imported Lightning and checked its runs, that process began importing ~6 s after
the command started and spent ~6 s more importing the same modules (both single-threaded, on a 2-core machine with
a core to spare meanwhile), so AR ended last. Started first thing, its imports overlap this process's, and the two
trainings start together. Measured (reports/quickstart_side_by_side/session35_runs): 3-5 s less outside training,
but the totals level on that host (the trainings took 1.6-3% longer, perhaps for overlapping for their whole length);
with a cold file cache the imports it overlaps take longer.

This module imports only the standard library: the CLI imports it before anything heavy. The spare reads one line
of JSON from its standard input ({"argv": side_by_side.main's arguments, "log": file}); an end of input instead
(dismissed, or this process gone, however it ended) makes it exit without a word, so it never outlives its parent.
Until it is handed a run its output goes nowhere; from then on, to the run's log, import errors included, so a
spare that cannot import fails the run with the same message a fresh process would give.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
PROGRAM = ("import sys; sys.path[0] = {root!r}\n"
           "try:\n"
           "    from seqdiff.training.side_by_side import main\n"
           "except BaseException:\n"
           "    import traceback; main = traceback.format_exc()\n"
           "from seqdiff.training.spare import serve\n"
           "sys.exit(serve(main))\n")
"""The spare's program; as side_by_side.CHILD, it imports the seqdiff this process imported. The import's error,
if any, is kept for the run's log."""


def block_signals(signums) -> set | None:
    """Block `signums` in this thread, returning the previous mask (None where the OS has no signal masks:
    there a stop during a child's start-up ends it before it has written anything)."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, signums)


def package_root() -> str:
    """The folder holding the seqdiff package this process imported (first on a child's sys.path)."""
    return str(Path(__file__).resolve().parents[2])


class SpareProcess:
    """A process importing what training needs, waiting for `hand` (then it trains) or `dismiss` (then it exits)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.handed = False

    @classmethod
    def start(cls) -> SpareProcess:
        """Start one, in a session of its own (a terminal's Ctrl-C reaches this process only, which passes stops
        on), with SIGINT and SIGTERM blocked, as side_by_side.ChildRun starts its child: a stop sent before its
        run's guard is in place stays pending until then (side_by_side.EarlySignals)."""
        blocked = block_signals(STOP_SIGNALS)
        try:
            process = subprocess.Popen([sys.executable, "-c", PROGRAM.format(root=package_root())],
                                       stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True)
        finally:
            if blocked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return cls(process)

    def hand(self, argv: list[str], log: Path) -> subprocess.Popen | None:
        """Give it a run: side_by_side.main(argv), its output appended to `log`. None where it can no longer take
        one (it has ended, or was handed or dismissed before): the caller starts a fresh process then."""
        if self.handed or self.process.poll() is not None or self.process.stdin is None:
            return None
        try:
            self.process.stdin.write((json.dumps({"argv": argv, "log": str(log)}) + "\n").encode())
            self.process.stdin.close()
        except (BrokenPipeError, OSError):  # it ended between the check and the write
            self.dismiss()
            return None
        self.handed = True
        return self.process

    def dismiss(self) -> None:
        """End it if it was not handed a run (it has written nothing); safe to call more than once."""
        if self.handed:
            return
        self.handed = True  # taken: no run can be handed to it any more
        if self.process.stdin is not None:
            try:
                self.process.stdin.close()
            except OSError:
                pass
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def serve(main: Callable[[list[str]], int] | str) -> int:
    """The spare's side, once it has imported: wait for a run and train it with `main` (side_by_side.main), or
    exit at an end of input. A str `main` is the traceback of that import, written to the run's log instead."""
    line = sys.stdin.readline()
    if not line:
        return 0
    job = json.loads(line)
    log = os.open(job["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    if isinstance(main, str):
        sys.stderr.write(main)
        return 1
    return main(job["argv"])
