"""Train a second run in a child process at the same time as one in this process, the CPU threads split.

Why: the models a CPU trains in minutes are small (the quickstart's: 128 wide, 2 layers, 4,096 tokens a
step), and their operators use a second thread poorly, so two runs on one thread each finish sooner than the same
runs one after the other on two threads: 1.21x for the quickstart's two runs of 120 steps on a 2-core host,
start-up included (reports/quickstart_side_by_side/timing); the whole quickstart took 287 s there
(reports/quickstart_side_by_side), against 439 s one after the other before the faster local convolution.

The child is `python -m seqdiff.training.side_by_side` in a session of its own, so a terminal's Ctrl-C reaches
this process only, and this process passes it on once: both runs then stop at a step boundary with a
checkpoint, as a lone `seqdiff train` does. A child that finds its parent gone (killed without a chance to pass
anything on) stops itself the same way, so no run is left training with nobody waiting for it. What the child
prints (Lightning's lines, a traceback) goes to a log file whose last lines are shown if it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback

from seqdiff.config import RunConfig, from_dict, to_dict
from seqdiff.training.guards import RunError

INTERRUPTED = 3
"""The child's exit status when a signal stopped it after its checkpoint was written."""
WAIT_AFTER_SIGNAL_S = 120
"""How long a stopped child may take to finish its step and write its checkpoint before it is killed."""


def split_threads(threads: int) -> tuple[int, int] | None:
    """(this process, the child) torch threads for two runs at once; None where there is one thread only."""
    if threads < 2:
        return None
    return threads - threads // 2, threads // 2


class ChildRun:
    """A `train(config, run_dir, resume)` running in a child process with `threads` torch threads."""

    def __init__(self, config: RunConfig, run_dir: Path, resume: bool, threads: int, log: Path) -> None:
        self.run_dir, self.log = Path(run_dir), Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        args = [sys.executable, "-m", "seqdiff.training.side_by_side", json.dumps(to_dict(config)),
                str(run_dir), str(int(resume)), str(threads)]
        with open(self.log, "a") as out:  # appended: an earlier, interrupted try keeps its lines; the child holds
            # its own descriptor, ours closes here
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        self.signalled = False

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask the child to stop at its next step boundary (a second call stops it at once, unsaved)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
            self.signalled = True

    def wait(self) -> int:
        """The child's exit status once it has ended. Ctrl-C while waiting is passed on (the child writes its
        checkpoint and stops; a second Ctrl-C stops it at once), then raised here."""
        try:
            return self._wait()
        except KeyboardInterrupt:
            self.stop(signal.SIGINT)
            try:
                self._wait()
            except KeyboardInterrupt:
                self.stop(signal.SIGINT)
                self.process.wait()
            raise

    def _wait(self) -> int:
        try:
            return self.process.wait(timeout=WAIT_AFTER_SIGNAL_S if self.signalled else None)
        except subprocess.TimeoutExpired:  # a stop it did not act on: no checkpoint will come
            self.process.kill()
            return self.process.wait()

    def check(self, status: int) -> None:
        """Raise for a child that did not finish its run: naming the run, its log and the log's last lines."""
        if status == 0:
            return
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:] if self.log.is_file() else []
        what = ("stopped after writing a checkpoint" if status == INTERRUPTED
                else f"failed (exit status {status})")
        raise RunError(f"training {self.run_dir} in a second process {what}; its output is in {self.log}"
                       + "".join(f"\n  {line}" for line in tail))


class OrphanWatch(Callback):
    """In the child: stop as on SIGTERM (checkpoint, then exit) when the parent process is gone."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if os.getppid() != self.parent:
            os.kill(os.getpid(), signal.SIGTERM)


class EarlySignals(Callback):
    """In the child: a stop asked for before training started (while importing, building the data) is kept and
    handed to the run's own signal guard once it is in place, so that it still ends with a checkpoint."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._record)

    def _record(self, signum, frame) -> None:
        self.signum = signum

    def on_train_start(self, trainer, pl_module) -> None:  # train()'s guard is installed by now
        if self.signum is not None:
            os.kill(os.getpid(), self.signum)


def main(argv: list[str]) -> int:
    """The child: train one run; 0 when finished, INTERRUPTED after a signal's checkpoint, 1 on an error."""
    from seqdiff.errors import SeqdiffError
    from seqdiff.training.guards import TrainingInterrupted
    from seqdiff.training.run import train

    early = EarlySignals()
    config_json, run_dir, resume, threads = argv
    torch.set_num_threads(int(threads))
    torch.set_float32_matmul_precision("high")
    try:
        config = from_dict(RunConfig, json.loads(config_json))
        train(config, run_dir, resume=bool(int(resume)), extra_callbacks=[OrphanWatch(), early])
    except TrainingInterrupted as stop:
        print(f"seqdiff train: {stop}", file=sys.stderr)
        return INTERRUPTED
    except SeqdiffError as e:
        print(f"seqdiff train: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
