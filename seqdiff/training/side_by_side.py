"""Train a second run in a child process at the same time as one in this process, the CPU threads split.

Why: the models a CPU trains in minutes are small (the quickstart's: 128 wide, 2 layers, 4,096 tokens a
step), and their operators use a second thread poorly, so two runs on one thread each finish sooner than the same
runs one after the other on two threads: 1.20-1.21x in two measurements of the quickstart's two runs of 120 steps
on a 2-core host, start-up included (reports/quickstart_side_by_side/timing); the whole quickstart took 287 s and
315 s there (reports/quickstart_side_by_side; the host ran ~12% slower for the second), against 439 s one after the
other before the faster local convolution.

The child runs this module's `main` (`python -c`, see CHILD) in a session of its own, so a terminal's Ctrl-C reaches
this process only, and this process passes it on once: both runs then stop at a step boundary with a
checkpoint, as a lone `seqdiff train` does. A child that finds its parent gone (killed without a chance to pass
anything on) stops itself the same way, so no run is left training with nobody waiting for it. What the child
prints (Lightning's lines, a traceback) goes to a log file whose last lines are shown if it fails.

A stop reaches the child whenever it comes: SIGINT and SIGTERM are blocked while the child is started, so they
wait (pending) until it has installed its handlers, and a SIGTERM to this process outside a run's own guard (set-up,
waiting for the child) raises `Stopped`, handled like Ctrl-C's KeyboardInterrupt. The child imports the same
seqdiff as this process, not a `seqdiff/` folder that happens to be in the working directory.

The two runs rarely end together. Whichever is left takes the other's threads: this process once the child has
ended (ChildWatch), the child once this process has nothing left to do but wait for it (`ChildRun.offer_threads`
writes a small file next to the child's log; the child's ThreadOffer reads it at its next step boundary).

`seqdiff quickstart` starts the child before its own heavy imports, as a spare process that imports meanwhile
(seqdiff.training.spare; ChildRun hands it the run); where there is none, or it has ended, a fresh one is started.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from lightning.pytorch import Callback

from seqdiff.config import RunConfig, from_dict, to_dict
from seqdiff.errors import SeqdiffError
from seqdiff.safe_io import atomic_write_text
from seqdiff.training.guards import RunError
from seqdiff.training.quiet import quiet_third_party_noise
from seqdiff.training.spare import STOP_SIGNALS, SpareProcess, block_signals, package_root

INTERRUPTED = 3
"""The child's exit status when a signal stopped it after its checkpoint was written."""
WAIT_AFTER_SIGNAL_S = 120
"""How long a stopped child may take to finish its step and write its checkpoint before it is killed."""
CHILD = ("import sys; sys.path[0] = {root!r}; from seqdiff.training.side_by_side import main; "
         "sys.exit(main(sys.argv[1:]))")
"""The child's program: `-m` would put the working directory first on sys.path, where a checkout of another
seqdiff version may sit; this puts the folder this process imported seqdiff from there instead."""


class Stopped(KeyboardInterrupt):
    """SIGTERM where no run's guard records it (set-up, waiting for the child): handled wherever Ctrl-C's
    KeyboardInterrupt is, with the signal kept so that the child is stopped by the same one."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def sigterm_raises():
    """SIGTERM raises Stopped here (a run's guard still takes it over while that run trains): without this, a
    job scheduler's SIGTERM would end this process alone, silently, and leave the child to find out later."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def describe(status: int) -> str:
    """How a child ended, in words."""
    if status == 0:
        return "finished"
    if status == INTERRUPTED:
        return "stopped after writing a checkpoint"
    if status < 0:
        return f"was killed by {signal.Signals(-status).name}"
    return f"failed (exit status {status})"


def split_threads(threads: int) -> tuple[int, int] | None:
    """(this process, the child) torch threads for two runs at once; None where there is one thread only."""
    if threads < 2:
        return None
    return threads - threads // 2, threads // 2


class ChildRun:
    """A `train(config, run_dir, resume)` running in a child process with `threads` torch threads."""

    def __init__(self, config: RunConfig, run_dir: Path, resume: bool, threads: int, log: Path,
                 spare: SpareProcess | None = None) -> None:
        """`spare`: a process started earlier that has (partly) imported already (seqdiff.training.spare); it
        trains the run where it can still take one, else a fresh process does."""
        self.run_dir, self.log = Path(run_dir), Path(log)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.signalled = False
        self.offer = offer_file(self.log)
        self.clear_offer()  # an earlier try's: not this child's
        argv = self.arguments(config, run_dir, resume, threads, self.offer)
        with open(self.log, "a") as out:  # appended: an earlier, interrupted try keeps its lines; the child holds
            # its own descriptor, ours closes here
            out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')}: {'resuming' if resume else 'training'} "
                      f"{run_dir} ---\n")
            out.flush()
            self.process = spare.hand(argv, self.log) if spare is not None else None
            if self.process is not None:
                return
            blocked = block_signals(STOP_SIGNALS)  # inherited by the child: EarlySignals unblocks them
            try:
                self.process = subprocess.Popen(self.command(config, run_dir, resume, threads, self.offer),
                                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                start_new_session=True)
            finally:
                if blocked is not None:
                    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    @staticmethod
    def arguments(config: RunConfig, run_dir: Path, resume: bool, threads: int, offer: Path) -> list[str]:
        """main()'s arguments for this run."""
        return [json.dumps(to_dict(config)), str(run_dir), str(int(resume)), str(threads), str(offer)]

    @classmethod
    def command(cls, config: RunConfig, run_dir: Path, resume: bool, threads: int, offer: Path) -> list[str]:
        """A fresh process's command for this run."""
        return [sys.executable, "-c", CHILD.format(root=package_root()), *cls.arguments(config, run_dir, resume,
                                                                                        threads, offer)]

    def offer_threads(self, threads: int) -> None:
        """Tell the child that it may train on `threads` torch threads from its next step on (this process only
        waits for it now). Best effort: a file that cannot be written leaves the child on its share."""
        try:
            atomic_write_text(self.offer, f"{threads}\n")
        except (OSError, SeqdiffError):
            pass

    def clear_offer(self) -> None:
        """Remove the offer, the child's answer and its step time (once recorded elsewhere): nothing stale is left
        next to the log."""
        for path in (self.offer, taken_file(self.offer), pace_file(self.offer)):
            path.unlink(missing_ok=True)

    def step_seconds(self) -> float | None:
        """The seconds a training step takes in the child (its StepPace), once it has timed them; None before."""
        try:
            return float(json.loads(pace_file(self.offer).read_text())["seconds_per_step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def took_threads(self) -> tuple[int, int] | None:
        """(threads, from step) where the child took the threads offered to it; None where it did not."""
        try:
            taken = json.loads(taken_file(self.offer).read_text())
            return int(taken["threads"]), int(taken["from_step"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Ask the child to stop at its next step boundary (a second call stops it at once, unsaved)."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
            self.signalled = True

    def wait(self) -> int:
        """The child's exit status once it has ended. Ctrl-C (or Stopped) while waiting is passed on (the child
        writes its checkpoint and stops; a second one stops it at once), then raised here."""
        try:
            return self._wait()
        except KeyboardInterrupt as first:
            self.stop(getattr(first, "signum", signal.SIGINT))
            try:
                self._wait()
            except KeyboardInterrupt as second:
                self.stop(getattr(second, "signum", signal.SIGINT))
                self.process.wait()
            raise

    def _wait(self) -> int:
        try:
            return self.process.wait(timeout=WAIT_AFTER_SIGNAL_S if self.signalled else None)
        except subprocess.TimeoutExpired:  # a stop it did not act on: no checkpoint will come
            self.process.kill()
            return self.process.wait()

    def problem(self, status: int) -> str | None:
        """One line for a child that did not finish its run (None when it did): the run, how it ended, its log."""
        if status == 0:
            return None
        after = ("; the same command resumes it" if status == INTERRUPTED else
                 "; the same command trains it again, from its last checkpoint if it has one" if status < 0 else "")
        return f"training {self.run_dir} in a second process {describe(status)}{after}; its output is in {self.log}"

    def check(self, status: int) -> None:
        """Raise for a child that did not finish its run: naming the run, its log and the log's last lines (not
        for a child killed by a signal: its last lines are whatever it printed before, not why)."""
        problem = self.problem(status)
        if problem is None:
            return
        tail = self.log.read_text(errors="replace").strip().splitlines()[-5:] if self.log.is_file() else []
        raise RunError(problem + "".join(f"\n  {line}" for line in tail if status > 0))


class ChildWatch(Callback):
    """In this process: a child whose run ended early (killed, failed) is reported at the next step, not only
    when this process's own run has finished, minutes later; this run goes on. A second signal, which ends this
    process at once, says what becomes of the child (it stops at its next step, with a checkpoint).

    `threads`: this run's torch threads once the child has ended, however it ended (its share of the cores is free
    then); `took_threads_at` records the step it took them at. Two runs of the same length rarely end together, and
    the one left trains its last steps on every thread instead of leaving a core idle."""

    def __init__(self, child: ChildRun, here: str, threads: int | None = None) -> None:
        self.child, self.here, self.told = child, here, False
        self.threads, self.took_threads_at = threads, None

    def on_train_start(self, trainer, pl_module) -> None:
        guard = getattr(trainer.checkpoint_callback, "guard", None)  # the run's SignalGuard (StepCheckpoint)
        if guard is not None:
            guard.at_hard_exit.append(self._exiting)

    def _exiting(self) -> None:
        if self.child.process.poll() is None:
            self.child.stop(signal.SIGTERM)
            print(f"[quickstart] {self.child.run_dir} (the second process) stops at its next step, with a "
                  f"checkpoint; its output: {self.child.log}", file=sys.stderr, flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        status = self.child.process.poll()
        if status is None:
            return
        if self.threads is not None and self.took_threads_at is None and self.threads > torch.get_num_threads():
            torch.set_num_threads(self.threads)
            self.took_threads_at = trainer.global_step
        if self.told or status == 0:
            return
        self.told = True
        line = (f"[quickstart] {self.child.problem(status)}; {self.here} goes on training, then this error stops "
                "the quickstart")
        bar = getattr(trainer, "progress_bar_callback", None)
        (bar.print if bar is not None else print)(line, file=sys.stderr)


def offer_file(log: Path) -> Path:
    """Where this process offers the child its threads: next to the child's log (`ar.log` -> `ar.threads`)."""
    return log.with_suffix(".threads")


def taken_file(offer: Path) -> Path:
    """Where the child says that it took them, and from which step (JSON)."""
    return offer.with_suffix(".threads_taken")


def pace_file(offer: Path) -> Path:
    """Where the child writes the seconds its training steps take (JSON), for the parent's projection."""
    return offer.with_suffix(".pace")


class StepTimer:
    """The seconds a training step takes, timed over steps `skip`..`skip + probe` of this training (counted from
    where it began, a resumed run's checkpoint included: the first steps pay one-off allocation; validation comes
    later, at train.val_every). `tick(step)` after each step: None until then."""

    def __init__(self, skip: int = 5, probe: int = 20, clock=time.perf_counter) -> None:
        self.skip, self.probe, self.clock = skip, probe, clock
        self.began: int | None = None  # the step count before the first step ticked
        self.started: tuple[int, float] | None = None

    def tick(self, step: int) -> float | None:
        if self.began is None:
            self.began = step - 1
        if self.started is None:
            if step - self.began >= self.skip:
                self.started = (step, self.clock())
            return None
        first, t0 = self.started
        if step - first < self.probe:
            return None
        return (self.clock() - t0) / (step - first)


class StepPace(Callback):
    """In the child: its seconds a step, written once to `path` (ChildRun.step_seconds reads them), so that the
    parent's projection of the training time can go by the slower of the two runs, not by its own alone."""

    def __init__(self, path: Path, timer: StepTimer | None = None) -> None:
        self.path, self.timer, self.written = path, timer or StepTimer(), False

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.written:
            return
        per_step = self.timer.tick(trainer.global_step)
        if per_step is None:
            return
        self.written = True
        try:
            atomic_write_text(self.path, json.dumps({"seconds_per_step": per_step, "step": trainer.global_step}))
        except (OSError, SeqdiffError):
            pass  # the parent then projects from its own steps, as before


class ThreadOffer(Callback):
    """In the child: once the parent offers its threads (`ChildRun.offer_threads`; it has only the waiting left),
    train on them from the next step on, and say so for the parent's report. One stat of a small file a step."""

    def __init__(self, offer: Path | None) -> None:
        self.offer, self.took_threads_at = offer, None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.offer is None or self.took_threads_at is not None or not self.offer.is_file():
            return
        try:
            threads = int(self.offer.read_text())
        except (OSError, ValueError):  # half-written cannot happen (renamed into place); unreadable: ignore it
            return
        self.took_threads_at = trainer.global_step
        if threads <= torch.get_num_threads():
            return
        torch.set_num_threads(threads)
        try:
            atomic_write_text(taken_file(self.offer), json.dumps({"threads": threads,
                                                                  "from_step": trainer.global_step}))
        except (OSError, SeqdiffError):
            pass


class OrphanWatch(Callback):
    """In the child: stop as on SIGTERM (checkpoint, then exit) when the parent process is gone."""

    def __init__(self) -> None:
        self.parent = os.getppid()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if os.getppid() != self.parent:
            os.kill(os.getpid(), signal.SIGTERM)


class EarlySignals(Callback):
    """In the child: a stop asked for before training started (while importing, building the data) is kept and
    handed to the run's own signal guard once it is in place, so that it still ends with a checkpoint. The
    child starts with SIGINT and SIGTERM blocked (ChildRun): one sent while it imported is delivered here."""

    def __init__(self) -> None:
        self.signum: int | None = None
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._record)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)

    def _record(self, signum, frame) -> None:
        self.signum = signum

    def on_train_start(self, trainer, pl_module) -> None:  # train()'s guard is installed by now
        if self.signum is not None:
            os.kill(os.getpid(), self.signum)


def main(argv: list[str]) -> int:
    """The child: train one run; 0 when finished, INTERRUPTED after a signal's checkpoint, 1 on an error."""
    from seqdiff.training.guards import TrainingInterrupted
    from seqdiff.training.run import train

    early = EarlySignals()
    config_json, run_dir, resume, threads, *offer = argv  # offer: where the parent offers its threads (ChildRun)
    quiet_third_party_noise()  # as `seqdiff` does, or they fill the log tail shown on a failure
    torch.set_num_threads(int(threads))
    torch.set_float32_matmul_precision("high")
    try:
        config = from_dict(RunConfig, json.loads(config_json))
        pace = [StepPace(pace_file(Path(offer[0])))] if offer else []
        train(config, run_dir, resume=bool(int(resume)),
              extra_callbacks=[OrphanWatch(), early, ThreadOffer(Path(offer[0]) if offer else None), *pace])
    except TrainingInterrupted as stop:
        print(f"seqdiff train: {stop}", file=sys.stderr)
        return INTERRUPTED
    except SeqdiffError as e:
        print(f"seqdiff train: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
