"""Crash-safe training: kill -9 mid-run, `--resume`, same final weights; a corrupted last.ckpt falls back."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from seqdiff.checkpoint import CheckpointError, load_checkpoint
from seqdiff.cli import main
from seqdiff.config import load_run_config
from seqdiff.training.run import train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=2", "train.lr=1e-3",
          "model.dropout=0.1", "train.ema_decay=0.9", "train.deterministic=true"]
STEPS = 40  # killed at its first checkpoint, step 5


@pytest.fixture
def one_thread():
    """Single-threaded CPU kernels, as in the subprocesses (same float summation order, and fast on 2 cores)."""
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic)  # train.deterministic=true switches it on globally


def _cli(run_dir, *extra):
    return [sys.executable, "-m", "seqdiff.cli", "train", "--run-dir", str(run_dir), *RECIPE, *extra]


def _state(path):
    ckpt = torch.load(path, weights_only=False)
    return ckpt["global_step"], ckpt["state_dict"], ckpt["ema_state_dict"]


def test_kill_9_then_resume_reaches_the_uninterrupted_weights(tmp_path, one_thread):
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    recipe = [f"train.max_steps={STEPS}", f"train.val_every={STEPS // 2}", "train.checkpoint_every=5"]
    run = tmp_path / "crashed"
    proc = subprocess.Popen(_cli(run, *recipe), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (run / "checkpoints" / "last.ckpt").exists():  # kill as soon as a first checkpoint is complete
        assert proc.poll() is None, f"training exited before its first checkpoint: {proc.stderr.read()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint within the time limit"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    killed_at = _state(run / "checkpoints" / "last.ckpt")[0]
    assert 0 < killed_at < STEPS, "the run must be killed mid-way"
    # the seconds up to the checkpoint it resumes from are kept (timing.json was written at the end only)
    killed_timing = json.loads((run / "timing.json").read_text())
    assert killed_timing["step"] == killed_at and killed_timing["train_seconds"] > 0

    # resumed in this process (the same command line; one import of torch and Lightning less than a subprocess)
    assert main(_cli(run, *recipe, "--resume")[3:]) == 0
    timing = json.loads((run / "timing.json").read_text())
    assert timing["step"] == STEPS and timing["train_seconds"] > killed_timing["train_seconds"]

    reference = train(load_run_config(None, [*RECIPE, *recipe]), tmp_path / "uninterrupted")
    step, weights, ema = _state(run / "checkpoints" / "last.ckpt")
    ref_step, ref_weights, ref_ema = _state(reference.checkpoint)
    assert step == ref_step == STEPS
    for name in ref_weights:
        torch.testing.assert_close(weights[name], ref_weights[name], rtol=1e-6, atol=1e-7, msg=name)
    for name in ref_ema:
        torch.testing.assert_close(ema[name], ref_ema[name], rtol=1e-6, atol=1e-7, msg=name)


def test_corrupted_last_checkpoint_falls_back_to_the_previous_one(tmp_path, one_thread, capsys):
    recipe = ["train.val_every=100", "train.checkpoint_every=2"]
    run = tmp_path / "run"
    train(load_run_config(None, [*RECIPE, *recipe, "train.max_steps=4"]), run)
    last, step4 = run / "checkpoints" / "last.ckpt", run / "checkpoints" / "step4.ckpt"
    assert step4.is_file()
    last.write_bytes(last.read_bytes()[: 1000])  # truncated, as by a full disk
    capsys.readouterr()

    model = load_checkpoint(run)  # eval / sample / export
    err = capsys.readouterr().err
    assert model.step == 4 and model.path == step4
    assert "last.ckpt" in err and "falling back to" in err and "step4.ckpt" in err

    # --resume takes the same fallback and still repeats an uninterrupted run
    resumed = train(load_run_config(None, [*RECIPE, *recipe, "train.max_steps=6"]), run, resume=True)
    assert "falling back to" in capsys.readouterr().err
    assert resumed.trainer.global_step == 6
    reference = train(load_run_config(None, [*RECIPE, *recipe, "train.max_steps=6"]), tmp_path / "reference")
    for (name, p), (_, q) in zip(resumed.module.backbone.named_parameters(),
                                 reference.module.backbone.named_parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=name)

    # nothing readable left: one clear error
    for path in (run / "checkpoints").glob("*.ckpt"):
        path.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="step6.ckpt"):
        load_checkpoint(run)
    assert main(["sample", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "cannot be read" in err
    assert main(["train", "--run-dir", str(run), *RECIPE, *recipe, "--resume"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_a_run_without_a_checkpoint_yet_is_named_as_such(tmp_path, capsys):
    """A run directory whose training has not written its first checkpoint is a run, not 'not a run directory'."""
    from seqdiff.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("name: x\n")
    assert main(["sample", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{run} is a seqdiff run with no checkpoint yet" in err and err.count("\n") == 1
    (run / "config.yaml").unlink()
    assert main(["sample", str(run)]) == 2
    assert "not a seqdiff run directory" in capsys.readouterr().err
