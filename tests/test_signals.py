"""SIGTERM / SIGINT during `seqdiff train`: a checkpoint of the current step, the --resume command, 143 / 130."""

import os
import shlex
import signal
import subprocess
import sys
import time

import lightning as L
import pytest
import torch

from seqdiff.cli import main
from seqdiff.config import load_run_config
from seqdiff.training.guards import TrainingInterrupted
from seqdiff.training.lock import LOCK_NAME
from seqdiff.training.run import train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=2", "train.lr=1e-3",
          "model.dropout=0.1", "train.ema_decay=0.9", "train.deterministic=true"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")


@pytest.fixture
def one_thread():
    """Single-threaded CPU kernels, as in the subprocesses (same float summation order)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)


def _state(path):
    ckpt = torch.load(path, weights_only=False, map_location="cpu")
    return ckpt["global_step"], ckpt["state_dict"], ckpt["ema_state_dict"]


def _assert_same(path, reference):
    step, weights, ema = _state(path)
    ref_step, ref_weights, ref_ema = _state(reference)
    assert step == ref_step
    for name in ref_weights:
        torch.testing.assert_close(weights[name], ref_weights[name], rtol=1e-6, atol=1e-7, msg=name)
    for name in ref_ema:
        torch.testing.assert_close(ema[name], ref_ema[name], rtol=1e-6, atol=1e-7, msg=name)


class SignalAt(L.Callback):
    """Send a signal to this process after optimizer step `step` (as a scheduler or Ctrl-C would)."""

    def __init__(self, step, signum):
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_the_current_step_and_resume_matches_an_uninterrupted_run(tmp_path, one_thread, signum):
    recipe = [*RECIPE, "train.max_steps=12", "train.val_every=6", "train.checkpoint_every=5"]
    run = tmp_path / "interrupted"
    # the handlers this process had (SIG_IGN for SIGINT where a shell started it in the background)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(TrainingInterrupted) as info:
        train(load_run_config(None, recipe), run, extra_callbacks=[SignalAt(7, signum)])
    assert info.value.step == 7 and info.value.exit_status == 128 + signum
    assert _state(run / "checkpoints" / "last.ckpt")[0] == 7  # not step 5, the last periodic one
    assert (run / "checkpoints" / "step7.ckpt").is_file()
    assert not (run / LOCK_NAME).exists()
    assert {s: signal.getsignal(s) for s in before} == before  # handlers restored after training
    train(load_run_config(None, recipe), run, resume=True)
    reference = train(load_run_config(None, recipe), tmp_path / "uninterrupted")
    _assert_same(run / "checkpoints" / "last.ckpt", reference.checkpoint)


def _cli(run_dir, *extra):
    return [sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(run_dir), *RECIPE, *extra]


def _interrupt_subprocess(run, recipe, signum):
    proc = subprocess.Popen(_cli(run, *recipe), env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "last.ckpt").exists():  # training has started
        assert proc.poll() is None, f"training exited early: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.01)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=240)
    return proc.returncode, err


def test_sigterm_to_seqdiff_train_exits_143_with_the_step_and_the_resume_command(tmp_path, one_thread):
    recipe = ["train.max_steps=40", "train.val_every=20", "train.checkpoint_every=4"]
    run = tmp_path / "run"
    code, err = _interrupt_subprocess(run, recipe, signal.SIGTERM)
    assert code == 143, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("seqdiff train: stopped by SIGTERM at step")]
    assert len(line) == 1, err[-3000:]
    step = int(line[0].split(" at step ")[1].split(";")[0])
    assert 0 < step < 40
    assert _state(run / "checkpoints" / "last.ckpt")[0] == step
    assert "Traceback" not in err
    command = shlex.split(line[0].split("continue with: ")[1])
    assert command[:2] == ["seqdiff", "train"] and "--resume" in command
    assert main(command[1:]) == 0  # the printed command, run in this process (one subprocess import less)
    reference = train(load_run_config(None, [*RECIPE, *recipe]), tmp_path / "uninterrupted")
    _assert_same(run / "checkpoints" / "last.ckpt", reference.checkpoint)


def test_ctrl_c_in_seqdiff_train_exits_130_and_names_the_step(tmp_path, monkeypatch, capsys):
    import functools

    import seqdiff.training.run as run_module

    monkeypatch.setattr(run_module, "train", functools.partial(train, extra_callbacks=[SignalAt(3, signal.SIGINT)]))
    run = tmp_path / "run"
    code = main(["train", "--run-dir", str(run), *RECIPE, "train.max_steps=20", "train.checkpoint_every=10"])
    err = capsys.readouterr().err
    assert code == 130, err[-3000:]
    line = [x for x in err.splitlines() if x.startswith("seqdiff train: stopped by SIGINT at step 3;")]
    assert len(line) == 1, err[-3000:]
    assert f"continue with: seqdiff train --run-dir {run} --resume " in line[0]
    assert _state(run / "checkpoints" / "last.ckpt")[0] == 3


def test_a_second_signal_exits_at_once_leaving_no_lock_and_no_partial_file(tmp_path, monkeypatch):
    """Ctrl-C twice: exit 130 at once, without saving, but the run's lock is released and a half-written
    checkpoint removed first (the next trainer found both and had to take them over)."""
    import seqdiff.training.guards as guards

    class HardExit(BaseException):
        pass

    run, seen = tmp_path / "run", {}

    def exit_now(code):  # os._exit, observed: what the directory holds when the process would be gone
        seen.update(code=code, lock=(run / LOCK_NAME).exists(), tmp=sorted(run.rglob("*.tmp")))
        raise HardExit

    class Twice(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                (run / "checkpoints").mkdir(parents=True, exist_ok=True)
                (run / "checkpoints" / "step2.ckpt.tmp").write_bytes(b"half a checkpoint")
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(guards.os, "_exit", exit_now)
    with pytest.raises(HardExit):
        train(load_run_config(None, [*RECIPE, "train.max_steps=10"]), run, extra_callbacks=[Twice()])
    assert seen == {"code": 130, "lock": False, "tmp": []}
