"""A run directory you can trust (issue 23): moved directories, non-finite values, changed recipes, locks."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seqdiff.checkpoint import CheckpointError, load_checkpoint
from seqdiff.cli import main
from seqdiff.config import ConfigError, load_run_config
from seqdiff.evaluation.zeroshot import read_eval_results
from seqdiff.training.guards import NonFiniteLossError, NonFiniteWeightsError, RunError
from seqdiff.training.lock import LOCK_NAME, RunLock, RunLockedError
from seqdiff.training.resume import RESUMABLE_KEYS
from seqdiff.training.run import TrainingClock, train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=2", "train.lr=1e-3",
          "train.ema_decay=0.9", "train.val_every=100"]


def _train(run, *extra, resume=False):
    return train(load_run_config(None, [*RECIPE, *extra]), run, resume=resume)


def _step(path):
    return torch.load(path, weights_only=False, map_location="cpu")["global_step"]


def _weights(path):
    return torch.load(path, weights_only=False, map_location="cpu")["state_dict"]


# ------------------------------------------------------------------ 1. moved or copied run directories
def test_a_moved_run_directory_resumes_into_its_own_last_checkpoint(tmp_path):
    _train(tmp_path / "r", "train.max_steps=4", "train.checkpoint_every=3")
    shutil.move(tmp_path / "r", tmp_path / "r2")
    _train(tmp_path / "r2", "train.max_steps=8", "train.checkpoint_every=3", resume=True)
    names = sorted(p.name for p in (tmp_path / "r2" / "checkpoints").iterdir())
    assert names == ["last.ckpt", "step8.ckpt"], names  # no last-v1.ckpt, and the old step file was replaced
    assert _step(tmp_path / "r2" / "checkpoints" / "last.ckpt") == 8
    assert load_checkpoint(tmp_path / "r2").step == 8  # what eval / sample / export read


def test_resuming_a_copy_leaves_the_original_untouched(tmp_path):
    _train(tmp_path / "a", "train.max_steps=4", "train.checkpoint_every=2")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    before = sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir())
    _train(tmp_path / "b", "train.max_steps=6", "train.checkpoint_every=2", resume=True)
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").iterdir()) == before == ["last.ckpt", "step4.ckpt"]
    assert _step(tmp_path / "a" / "checkpoints" / "last.ckpt") == 4
    assert sorted(p.name for p in (tmp_path / "b" / "checkpoints").iterdir()) == ["last.ckpt", "step6.ckpt"]
    assert _step(tmp_path / "b" / "checkpoints" / "last.ckpt") == 6


# ------------------------------------------------------------------ 2. non-finite values
def test_a_diverging_learning_rate_stops_before_writing_a_nan_checkpoint(tmp_path):
    # train.lr=1e4 (a typo for 1e-4): the weights blow up within a few steps; every checkpoint is checked
    run = tmp_path / "r"
    with pytest.raises((NonFiniteLossError, NonFiniteWeightsError)) as info:
        _train(run, "train.lr=1e4", "train.warmup_steps=1", "train.max_steps=40", "train.checkpoint_every=1")
    message = str(info.value)
    step = int(message.split(" at step ")[1].split(":")[0])
    assert 1 < step < 40
    assert "train.lr=10000" in message and "lower it" in message
    assert f"(step {step - 1})" in message  # the last finite checkpoint is named
    assert _step(run / "checkpoints" / "last.ckpt") == step - 1
    for name, tensor in _weights(run / "checkpoints" / "last.ckpt").items():
        assert torch.isfinite(tensor).all(), name
    assert not list((run / "checkpoints").glob("*.tmp"))
    assert not (run / LOCK_NAME).exists()


def test_a_nan_loss_stops_at_once_naming_the_step(tmp_path, capsys):
    # no checkpoint before the loss turns NaN: the message says so, and the CLI exits non-zero
    run = tmp_path / "r"
    code = main(["train", "--run-dir", str(run), *RECIPE, "train.lr=1e4", "train.warmup_steps=1",
                 "train.max_steps=200", "train.checkpoint_every=1000"])
    err = capsys.readouterr().err
    assert code == 2
    line = [x for x in err.splitlines() if x.startswith("seqdiff train: error:")]
    assert len(line) == 1 and "the training loss is nan at step" in line[0], err[-2000:]
    assert "no checkpoint had been written yet" in line[0]
    step = int(line[0].split(" at step ")[1].split(":")[0])
    assert step < 200
    assert not (run / "checkpoints").exists() or not list((run / "checkpoints").glob("*.ckpt"))


def test_eval_and_sample_refuse_a_checkpoint_with_nan_weights(tmp_path, capsys):
    run = tmp_path / "r"
    _train(run, "train.max_steps=2", "train.checkpoint_every=2")
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    name = next(iter(ckpt["ema_state_dict"]))
    ckpt["ema_state_dict"][name][0] = float("nan")
    bad = tmp_path / "bad.ckpt"
    torch.save(ckpt, bad)
    with pytest.raises(CheckpointError, match="NaN or inf"):
        load_checkpoint(bad)
    load_checkpoint(bad, use_ema=False)  # the raw weights are finite
    for command in (["eval", str(bad), "--data", FIXTURE], ["sample", str(bad), "--steps", "2"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "NaN or inf" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", ".nan", "inf", "-.inf"])
def test_float_config_values_refuse_nan_and_inf(value):
    with pytest.raises(ConfigError, match="train.lr must be a finite number"):
        load_run_config(None, [f"train.lr={value}"])
    with pytest.raises(ConfigError, match="sample.temperature must be a finite number"):
        load_run_config(None, [f"sample.temperature={value}"])


@pytest.mark.parametrize("override,message", [
    ("train.lr=-1", "train.lr must be a finite number >= 0"),
    ("train.weight_decay=-0.1", "train.weight_decay must be a finite number >= 0"),
    ("train.warmup_steps=-1", "train.warmup_steps must be >= 0"),
    ("train.grad_clip=-1", "train.grad_clip must be a finite number >= 0"),
    ("train.ema_decay=1.0", r"train.ema_decay must lie in \[0, 1\)"),
    ("name=", "name='' must be a non-empty folder name"),
    ("name=..", "name='..' must be a non-empty folder name"),
    ("name=../../x", "must be a non-empty folder name without '/'"),
])
def test_out_of_range_train_values_and_run_names_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [override])


def test_a_bad_override_is_blamed_on_the_command_line_and_a_bad_recipe_on_its_file(tmp_path):
    with pytest.raises(ConfigError, match=r"^command line: train.max_steps must be >= 1, got -5"):
        load_run_config("configs/shakespeare_char_mdlm.yaml", ["train.max_steps=-5"])
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("train:\n  max_steps: -5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: train.max_steps must be >= 1"):
        load_run_config(str(recipe), ["train.lr=1e-3"])


def test_fasta_blocks_shorter_than_the_window_are_refused():
    base = ["data.kind=fasta", "data.tokenizer=nucleotide", "data.seq_len=128"]
    with pytest.raises(ConfigError, match="data.fasta.block_size=64 is smaller than data.seq_len=128"):
        load_run_config(None, [*base, "data.fasta.block_size=64"])
    assert load_run_config(None, [*base, "data.fasta.block_size=128"]).data.fasta.block_size == 128


def test_train_refuses_an_unknown_default_sampler_before_writing(tmp_path, capsys):
    from tests.test_training import tiny_config

    with pytest.raises(RunError, match="sample.sampler='foo' is unknown"):
        train(tiny_config(**{"sample.sampler": "foo"}), tmp_path / "r")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flag", ["--temperature", "--top-p"])
def test_float_flags_refuse_nan(flag, tmp_path, capsys):
    assert main(["sample", str(tmp_path), flag, "nan"]) == 2  # before the run is read
    err = capsys.readouterr().err
    assert f"{flag} must be a finite number, got 'nan'" in err and "Traceback" not in err


# ------------------------------------------------------------------ 4. resume with a changed recipe
def test_resume_refuses_a_changed_method_and_data_shape_naming_each_key(tmp_path):
    run = tmp_path / "r"
    _train(run, "train.max_steps=2", "train.checkpoint_every=2")
    config_before = (run / "config.yaml").read_text()
    with pytest.raises(RunError) as info:
        _train(run, "train.max_steps=4", "method.name=ar", "data.seq_len=16", resume=True)
    message = str(info.value)
    assert "method.name: 'mdlm' -> 'ar'" in message
    assert "data.seq_len: 32 -> 16" in message
    assert "train.max_steps" in message  # the list of what may change
    assert (run / "config.yaml").read_text() == config_before  # refused before anything was written
    with pytest.raises(RunError, match=r"model.hidden_size: 32 -> 64"):
        _train(run, "train.max_steps=4", "model.hidden_size=64", resume=True)
    with pytest.raises(RunError, match=r"train.seed: 0 -> 1"):
        _train(run, "train.max_steps=4", "train.seed=1", resume=True)


def test_resume_allows_the_listed_keys_and_names_a_max_steps_below_the_checkpoint(tmp_path, capsys):
    run = tmp_path / "r"
    _train(run, "train.max_steps=4", "train.checkpoint_every=4")
    with pytest.raises(RunError, match=r"train.max_steps=3 is below the step of .* \(4\)"):
        _train(run, "train.max_steps=3", resume=True)
    _train(run, "train.max_steps=4", resume=True)
    assert "already at train.max_steps=4: nothing to train" in capsys.readouterr().err
    _train(run, "train.max_steps=6", "train.val_every=3", "train.checkpoint_every=3", "train.log_every=1",
           "data.eval_batch_size=8", resume=True)
    assert _step(run / "checkpoints" / "last.ckpt") == 6
    assert "train.max_steps" in RESUMABLE_KEYS and "method.name" not in RESUMABLE_KEYS


def test_resume_without_a_recipe_uses_the_runs_saved_config(tmp_path, capsys):
    """`seqdiff train --run-dir RUN --resume` (no --config) continues with RUN/config.yaml plus the overrides
    given now, rather than comparing the defaults against the run's recipe; Lightning's warning that the
    checkpoint folder is not empty (it is this run's) is not printed."""
    run = tmp_path / "r"
    assert main(["train", "--run-dir", str(run), *RECIPE, "train.max_steps=2", "train.checkpoint_every=2"]) == 0
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "train.max_steps=4"]) == 0
    assert "exists and is not empty" not in capsys.readouterr().err
    assert _step(run / "checkpoints" / "last.ckpt") == 4
    assert main(["train", "--run-dir", str(run), "--resume", "model.n_layers=3"]) == 2  # still a changed recipe
    assert "model.n_layers: 2 -> 3" in capsys.readouterr().err


def test_docs_list_every_key_that_may_change_on_resume():
    """docs/training.md is where users look up what --resume accepts: it names every RESUMABLE_KEYS entry."""
    text = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    assert [key for key in RESUMABLE_KEYS if f"`{key}`" not in text] == []


# ------------------------------------------------------------------ 5. one trainer per run directory
def _write_lock(run, pid, host):
    run.mkdir(parents=True, exist_ok=True)
    (run / LOCK_NAME).write_text(json.dumps({"pid": pid, "host": host, "started": "then"}))


def test_a_second_trainer_on_a_locked_directory_is_refused(tmp_path, capsys):
    run = tmp_path / "r"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(run, sleeper.pid, socket.gethostname())
        code = main(["train", "--run-dir", str(run), *RECIPE, "train.max_steps=2"])
        err = capsys.readouterr().err
        assert code == 2
        assert f"being written by another trainer (pid {sleeper.pid}" in err
        assert not (run / "config.yaml").exists() and not (run / "checkpoints").exists()
        # --resume while the first trainer has not written a checkpoint yet: busy, not "no checkpoint"
        assert main(["train", "--run-dir", str(run), *RECIPE, "train.max_steps=2", "--resume"]) == 2
        assert f"being written by another trainer (pid {sleeper.pid}" in capsys.readouterr().err
    finally:
        sleeper.kill()
        sleeper.wait()
    _write_lock(run, 12345678, "another-host")
    with pytest.raises(RunLockedError, match="locked by process 12345678 on host another-host"):
        RunLock(run).acquire()


def test_a_stale_lock_is_taken_over_with_a_message(tmp_path, capsys):
    run = tmp_path / "r"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _write_lock(run, dead.pid, socket.gethostname())
    _train(run, "train.max_steps=2", "train.checkpoint_every=2")
    assert f"taking over the stale lock {run / LOCK_NAME} of process {dead.pid}" in capsys.readouterr().err
    assert not (run / LOCK_NAME).exists()  # released at the end
    assert _step(run / "checkpoints" / "last.ckpt") == 2


def test_the_lock_holds_pid_and_host_while_training(tmp_path):
    import lightning as L

    seen = {}

    class Peek(L.Callback):
        def on_train_batch_end(self, trainer, *args):
            seen.update(json.loads((tmp_path / "r" / LOCK_NAME).read_text()))

    train(load_run_config(None, [*RECIPE, "train.max_steps=1"]), tmp_path / "r", extra_callbacks=[Peek()])
    assert seen["pid"] == os.getpid() and seen["host"] == socket.gethostname()


# ------------------------------------------------------------------ 5. results files never shared
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "r"
    train(load_run_config(None, [*RECIPE, "train.max_steps=2", "train.checkpoint_every=2"]), run)
    return run


def test_eval_of_a_run_on_its_own_files_names_the_file_not_the_default_corpus(tiny_run, capsys):
    """A run trained on data.*_file: its own split is labelled (and its results file named) by the file, not by
    data.corpus, which keeps its default (shakespeare) and would collide with `--dataset shakespeare:test`."""
    assert main(["eval", str(tiny_run), "--split", "valid"]) == 0
    out = tiny_run / "eval" / "shakespeare_tiny.txt-valid.json"
    report = read_eval_results(out)[0]
    assert report["dataset"] == "shakespeare_tiny.txt/valid" and report["data"] == FIXTURE
    assert not (tiny_run / "eval" / "shakespeare-valid.json").exists()
    capsys.readouterr()


def test_two_evals_of_files_with_the_same_name_keep_both_results(tiny_run, tmp_path, capsys):
    text = open(FIXTURE).read()
    a, b = tmp_path / "a" / "test.txt", tmp_path / "b" / "test.txt"
    for path, content in ((a, text[:3000]), (b, text[3000:9000])):
        path.parent.mkdir()
        path.write_text(content)
    assert main(["eval", str(tiny_run), "--data", str(a)]) == 0
    assert main(["eval", str(tiny_run), "--data", str(b)]) == 0
    files = sorted((tiny_run / "eval").glob("test.txt-*.json"))
    assert len(files) == 2, files
    reports = {r["data"]: r for f in files for r in read_eval_results(f)}
    assert set(reports) == {str(a), str(b)}
    assert reports[str(a)]["num_tokens"] != reports[str(b)]["num_tokens"]
    capsys.readouterr()


def test_eval_json_has_one_shape_and_old_flat_files_still_read(tiny_run, tmp_path, capsys):
    out = tmp_path / "one.json"
    assert main(["eval", str(tiny_run), "--data", FIXTURE, "--json", "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert isinstance(printed["results"], list) and len(printed["results"]) == 1
    assert printed["results"][0]["dataset"] == "shakespeare_tiny.txt" and printed["step"] == 2
    (report,) = read_eval_results(out)
    flat = tmp_path / "old.json"  # what a single-source eval wrote before
    flat.write_text(json.dumps(report))
    assert read_eval_results(flat) == [report]
    flat.write_text("{}")
    with pytest.raises(ValueError, match="not a `seqdiff eval` results file"):
        read_eval_results(flat)


def test_two_exports_in_one_folder_have_their_own_eval_folders(tiny_run, tmp_path, capsys):
    for name in ("m1", "m2"):
        assert main(["export", str(tiny_run), str(tmp_path / name)]) == 0
        assert main(["eval", str(tmp_path / name), "--data", FIXTURE]) == 0
    assert len(list((tmp_path / "m1" / "eval").glob("*.json"))) == 1
    assert len(list((tmp_path / "m2" / "eval").glob("*.json"))) == 1
    assert not (tmp_path / "eval").exists()
    capsys.readouterr()


@pytest.mark.parametrize("target", ["checkpoints", "logs", "eval/x", "."])
def test_export_refuses_to_write_into_or_over_a_run(tiny_run, target, capsys):
    before = sorted(p.name for p in (tiny_run / "checkpoints").iterdir())
    out = tiny_run / target
    assert main(["export", str(tiny_run), str(out), "--overwrite"]) == 2
    assert "never writes into or over a run's own files" in capsys.readouterr().err
    assert sorted(p.name for p in (tiny_run / "checkpoints").iterdir()) == before


def test_the_training_clock_sums_over_processes_and_rewrites_a_garbled_file(tmp_path):
    """timing.json: this process's seconds added to the earlier ones at each record; a file that is not the
    clock's own counts as 0 seconds and is rewritten; a clock never started (processes other than 0) writes
    nothing."""
    path = tmp_path / "timing.json"
    TrainingClock(tmp_path).record(7)
    assert not path.exists()
    path.write_text("{half a file")
    clock = TrainingClock(tmp_path)
    clock.start()
    clock.record(3)
    first = json.loads(path.read_text())
    assert first["step"] == 3 and 0 <= first["train_seconds"] < 60
    path.write_text(json.dumps({"train_seconds": 100.0, "step": 3}))
    later = TrainingClock(tmp_path)
    later.start()
    later.record(6)
    second = json.loads(path.read_text())
    assert second["step"] == 6 and 100.0 <= second["train_seconds"] < 160
