"""What keeps a run directory trustworthy while `seqdiff train` writes it: non-finite values, signals, and
checkpoint paths that survive a moved directory.

Design choices
- Non-finite loss: checked after every optimizer step, before any checkpoint of that step is written (the
  checks run in `StepCheckpoint.on_train_batch_end`, and Lightning runs checkpoint callbacks after every
  other callback, EMA included). The run stops at once with `NonFiniteLossError` naming the step and the
  likely cause; the checkpoints on disk are the last finite ones. As a second line, `check_finite_weights`
  refuses to write any checkpoint whose weights (raw or EMA) hold NaN or inf, so no path writes one.
- Signals (SIGTERM from a job scheduler, SIGINT from Ctrl-C): the handler only records the signal; the
  next step boundary (a safe point: the optimizer step and the EMA update are done) writes a checkpoint of
  that step, atomically like every other, and stops the loop; `train` then raises `TrainingInterrupted`,
  which the CLI turns into a message naming the step and the `--resume` command, and exit status 128 +
  signal (143 for SIGTERM, 130 for SIGINT). A second signal stops at once without saving. Lightning's own
  SIGTERM handler (which ends the fit with exit status 0 and saves nothing) is replaced for the training
  loop. With several processes the decision is reduced over all of them, so all stop at the same step.
- A moved or copied run directory: Lightning's ModelCheckpoint stores absolute paths and, when the folder
  changed, forgets `last_model_path` and then versions the file (`last-v1.ckpt`). The saved paths are
  mapped to the folder the run now lives in (`relocate_checkpoint_state`), and versioning is off: every
  name we write is unique by step, and writes are atomic.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch

from seqdiff.errors import SeqdiffError


class RunError(SeqdiffError):
    """A run directory that cannot be started or resumed as asked."""


class NonFiniteLossError(RunError):
    """The training loss became NaN or infinite: the run stopped before writing a checkpoint of that step."""


class NonFiniteWeightsError(RunError):
    """A checkpoint about to be written holds NaN or infinite weights; it is not written."""


class TrainingInterrupted(Exception):  # noqa: N818 (not an error of the user: a request to stop)
    """SIGTERM / SIGINT stopped training after a checkpoint of the current step was written."""

    def __init__(self, signum: int, step: int, checkpoint, run_dir):
        self.signum, self.step, self.checkpoint, self.run_dir = signum, step, checkpoint, run_dir
        super().__init__(f"{signal.Signals(signum).name} at step {step}: checkpoint {checkpoint}")

    @property
    def exit_status(self) -> int:
        """128 + signal number, the shell's convention (143 for SIGTERM, 130 for SIGINT)."""
        return 128 + self.signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SignalGuard:
    """Record SIGTERM / SIGINT instead of dying mid-step; a second one exits at once (without saving)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self.step_saved: str = "the last checkpoint"
        self.at_hard_exit: list[Callable[[], None]] = []
        """Run before the second signal's immediate exit (the run's lock released, half-written files removed),
        so that exiting without saving leaves nothing for the next trainer to clean up."""

    def install(self) -> None:
        """(Re)install the handlers: in the main thread only (signal handlers cannot be set elsewhere)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            current = signal.getsignal(signum)
            if current is not self._handle:
                self._previous.setdefault(signum, current)
                signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:  # the second request: stop now
            print(f"seqdiff train: {name} again: stopping now without saving; {self.step_saved} is where a "
                  f"resumed run continues from", file=sys.stderr, flush=True)
            for cleanup in self.at_hard_exit:
                try:
                    cleanup()
                except Exception:  # noqa: BLE001  (exiting anyway: a failed cleanup must not keep the process)
                    pass
            os._exit(128 + signum)
        self.signum = signum
        print(f"seqdiff train: {name} received: a checkpoint of the current step is written when it ends, then "
              f"training stops ({name} again stops at once without saving)", file=sys.stderr, flush=True)


def loss_value(outputs) -> torch.Tensor | None:
    """The loss tensor of a training step's outputs (a tensor or Lightning's {"loss": ...} dict)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(outputs, dict) and isinstance(outputs.get("loss"), torch.Tensor):
        return outputs["loss"]
    return None


def step_flags(trainer, pl_module, outputs, guard: SignalGuard | None) -> tuple[bool, bool]:
    """(loss not finite, stop requested) on any process: one small reduction, one host sync per step."""
    loss = loss_value(outputs)
    bad = (~torch.isfinite(loss.detach())).any().float() if loss is not None else torch.zeros(())
    stop = float(guard is not None and guard.signum is not None)
    flags = torch.stack([bad.to(pl_module.device), torch.tensor(stop, device=pl_module.device)])
    if trainer.world_size > 1:
        flags = trainer.strategy.reduce(flags, reduce_op="sum")
    bad_any, stop_any = flags.tolist()
    return bad_any > 0, stop_any > 0


def non_finite_message(step: int, what: str, lr: float, grad_clip: float, last: str | None) -> str:
    """One line: what is not finite at which step, the likely cause and what is on disk."""
    if lr >= 1e-2:
        cause = f"train.lr={lr:g} is far above the usual 1e-4 to 1e-3: lower it"
    else:
        cause = (f"the learning rate (train.lr={lr:g}) may still be too high, or a batch of the data is degenerate "
                 f"(check the data files)")
    if grad_clip <= 0:
        cause += "; train.grad_clip=0 lets one bad batch blow the weights up"
    kept = (f"the last finite checkpoint, {last}, is kept and is what eval, sample and --resume use" if last
            else "no checkpoint had been written yet (nothing to resume)")
    return f"{what} at step {step}: {cause}; training stopped, nothing of this step was saved; {kept}"


def non_finite_tensors(tensors: dict[str, Any]) -> list[str]:
    """Names of the floating-point tensors of a state dict holding NaN or inf."""
    bad = []
    for name, value in tensors.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point() and not bool(torch.isfinite(value).all()):
            bad.append(name)
    return bad


def check_finite_weights(checkpoint: dict[str, Any], path) -> None:
    """Refuse to write a checkpoint whose raw or EMA weights hold NaN or inf (raises NonFiniteWeightsError)."""
    bad = non_finite_tensors(checkpoint.get("state_dict", {}))
    bad += [f"ema:{n}" for n in non_finite_tensors(checkpoint.get("ema_state_dict", {}) or {})]
    if bad:
        step = checkpoint.get("global_step", "?")
        raise NonFiniteWeightsError(f"the weights are not finite ({len(bad)} tensors hold NaN or inf, e.g. "
                                    f"{bad[0]}) at step {step}: {path} was not written; the training diverged "
                                    f"(lower train.lr); the checkpoints already on disk are the last finite ones")


RELOCATED_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


def relocate_checkpoint_state(state: dict[str, Any], new_dir: str) -> dict[str, Any]:
    """ModelCheckpoint's saved state with every path under its old folder mapped into `new_dir`.

    A run directory moved (or copied) since the checkpoint was written keeps its files' names; only the
    folder changed. Paths outside the old folder are dropped (they are not this run's files).
    """
    old = state.get("dirpath")
    if not old or old == new_dir:
        return state

    def move(path):
        if not path:
            return path
        rel = os.path.relpath(path, old)
        return os.path.join(new_dir, rel) if not rel.startswith(os.pardir) else ""

    state = dict(state, dirpath=new_dir)
    for key in RELOCATED_KEYS:
        if key in state:
            state[key] = move(state[key])
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {move(k): v for k, v in state["best_k_models"].items() if move(k)}
    return state

