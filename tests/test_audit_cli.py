"""CLI robustness found by a user audit: the plain `train --resume`, a relative data file seen from another
directory, an empty --run-dir, a truncated checkpoint's message, `export RUN/checkpoints`, a prompt outside a
character model's alphabet, and a warm-up longer than the training."""

import shutil
from pathlib import Path

import pytest
import torch

from seqdiff.cli import main

FIXTURE = Path("tests/fixtures/shakespeare_tiny.txt").resolve()  # absolute: several tests change directory
RECIPE = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=2", "train.lr=1e-3",
          "train.val_every=100"]


def _step(path):
    return torch.load(path, weights_only=False, map_location="cpu")["global_step"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A finished two-step run of the default character (text8) tokenizer: last.ckpt and step2.ckpt."""
    path = tmp_path_factory.mktemp("audit") / "run"
    assert main(["train", "--run-dir", str(path), *RECIPE, "train.max_steps=2"]) == 0
    return path


# ------------------------------------------------------------------ 1. `train --resume` without --run-dir
def test_plain_resume_reads_the_recipe_saved_in_the_default_run_dir(tmp_path, monkeypatch, capsys, refused):
    """`seqdiff train --resume` (no --config, no --run-dir) continues runs/<name> with its saved config.yaml, as
    `--run-dir runs/<name> --resume` does, instead of comparing the built-in defaults with it."""
    monkeypatch.chdir(tmp_path)
    assert main(["train", *RECIPE, "train.max_steps=2"]) == 0
    capsys.readouterr()
    assert main(["train", "--resume", "train.max_steps=3"]) == 0, capsys.readouterr().err
    assert "another recipe" not in capsys.readouterr().err
    assert _step(tmp_path / "runs" / "run" / "checkpoints" / "last.ckpt") == 3
    # the recipe's name picks the folder; a changed recipe is still refused
    err = refused(["train", "--resume", "name=other", "train.max_steps=3"])
    assert "no checkpoint at runs/other/checkpoints/last.ckpt" in err
    assert "model.n_layers: 2 -> 3" in refused(["train", "--resume", "model.n_layers=3", "train.max_steps=4"])


# ------------------------------------------------------------------ 2. a relative data file, resumed elsewhere
def test_a_relative_data_file_missing_on_resume_says_where_it_is_read_and_how_to_give_it(tmp_path, monkeypatch,
                                                                                          capsys, refused):
    monkeypatch.chdir(tmp_path)
    shutil.copy(FIXTURE, tmp_path / "my_text.txt")
    assert main(["train", "--run-dir", "runs/own", *RECIPE, "data.train_file=my_text.txt", "train.max_steps=2"]) == 0
    monkeypatch.chdir(tmp_path / "runs")
    capsys.readouterr()
    err = refused(["train", "--run-dir", "own", "--resume", "train.max_steps=3"])
    assert "data.train_file=my_text.txt: no such file" in err
    assert f"a relative path is read from the current directory ({tmp_path / 'runs'})" in err
    assert err.endswith("give the file again on resume: data.train_file=../my_text.txt"), err
    # given again, it is accepted (a resumable key), announced as a moved copy
    assert main(["train", "--run-dir", "own", "--resume", "train.max_steps=3", "data.train_file=../my_text.txt"]) == 0
    assert "resuming with data.train_file='../my_text.txt' (was 'my_text.txt')" in capsys.readouterr().err
    assert _step(tmp_path / "runs" / "own" / "checkpoints" / "last.ckpt") == 3
    # another spelling of the same file is accepted without a word about moved data
    assert main(["train", "--run-dir", "own", "--resume", "train.max_steps=4", "data.train_file=./../my_text.txt"]) == 0
    assert "resuming with" not in capsys.readouterr().err
    assert _step(tmp_path / "runs" / "own" / "checkpoints" / "last.ckpt") == 4
    # a fresh run: where the path is read from, no resume advice
    err = refused(["train", "--run-dir", "fresh", *RECIPE, "data.valid_file=nope.txt"])
    assert err.endswith(f"data.valid_file=nope.txt: no such file; a relative path is read from the current "
                        f"directory ({tmp_path / 'runs'})"), err
    assert not (tmp_path / "runs" / "fresh").exists()


# ------------------------------------------------------------------ 3. --run-dir ""
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_run_dir_is_refused(value, tmp_path, monkeypatch, capsys, refused):
    monkeypatch.chdir(tmp_path)
    err = refused(["train", "--run-dir", value, *RECIPE, "train.max_steps=1"])
    assert err.startswith("seqdiff train: error: --run-dir is empty"), err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ 4. a truncated checkpoint
def test_a_truncated_checkpoint_is_named_in_a_whole_message(run, tmp_path, capsys, refused):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    last = copy / "checkpoints" / "last.ckpt"
    with open(last, "r+b") as f:
        f.truncate(1000)
    capsys.readouterr()
    # a readable step checkpoint beside it: the fallback, whose line names the file and torch's whole reason
    assert main(["export", str(copy), str(tmp_path / "hf")]) == 0
    err = capsys.readouterr().err
    assert (f"seqdiff: checkpoint {last} cannot be read: it is truncated or not a torch file (1,000 bytes; torch: "
            f"PytorchStreamReader failed reading zip archive: failed finding central directory); falling back to "
            f"{copy / 'checkpoints' / 'step2.ckpt'} (step 2)") in err, err
    (copy / "checkpoints" / "step2.ckpt").unlink()
    for argv in (["eval", str(copy)], ["sample", str(copy)], ["train", "--run-dir", str(copy), "--resume"]):
        err = refused(argv)
        assert f"checkpoint {last} cannot be read: it is truncated or not a torch file (1,000 bytes; " in err, err
        assert "corru" not in err and "miniz" not in err
        assert err.endswith("failed finding central directory); no step*.ckpt beside it to fall back to"), err


# ------------------------------------------------------------------ 5. export RUN/checkpoints
def test_export_of_a_checkpoints_folder_names_it_and_what_was_expected(run, tmp_path, capsys, refused):
    folder = run / "checkpoints"
    err = refused(["export", str(folder), str(tmp_path / "out")])
    assert (f"{folder} is a folder of checkpoints, not a run directory: give the run directory {run} or one "
            f"checkpoint file in it, e.g. {folder / 'last.ckpt'}") in err, err
    empty = tmp_path / "empty"
    empty.mkdir()
    err = refused(["export", str(empty), str(tmp_path / "out")])
    assert (f"{empty} is a directory, but not a seqdiff run directory (no {empty / 'checkpoints' / 'last.ckpt'}) "
            f"nor a model exported by `seqdiff export` (no {empty / 'config.json'} + model.safetensors)") in err, err
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------ 6. a prompt outside the alphabet
def test_a_prompt_outside_a_text8_alphabet_names_the_option_the_characters_and_the_rule(run, capsys, refused):
    err = refused(["sample", str(run), "--prompt", "Romeo, ", "--num-samples", "1"])
    assert "error: --prompt: characters outside the tokenizer's alphabet: ','" in err, err
    assert "training and eval normalize text" in err and "sampling takes --prompt as written" in err
    assert err.endswith("e.g. 'romeo ' as the model saw such text in training"), err
    err = refused(["sample", str(run), "sample.prompt=Romeo!", "--num-samples", "1"])
    assert "error: sample.prompt: characters outside the tokenizer's alphabet: '!'" in err, err
    err = refused(["sample", str(run), "--infill", "Romeo, ___", "--num-samples", "1"])
    assert "error: --infill: characters outside the tokenizer's alphabet: ','" in err, err


# ------------------------------------------------------------------ 7. warm-up longer than the training
def test_a_warmup_longer_than_max_steps_is_one_warning_line(tmp_path, capsys):
    assert main(["train", "--run-dir", str(tmp_path / "r"), *RECIPE, "train.warmup_steps=8",
                 "train.max_steps=2"]) == 0
    # (Python warnings raised inside the test quote its source lines on stderr too: count seqdiff's own lines)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("seqdiff: warning: train.warmup")]
    assert lines == ["seqdiff: warning: train.warmup_steps=8 exceeds train.max_steps=2: the learning rate warms up "
                     "linearly over 8 steps and reaches only 25% of train.lr=0.001 by the last step; lower "
                     "train.warmup_steps, or raise train.max_steps (now or on --resume)"], lines
    # a resume past the warm-up trains at the full rate: no warning
    assert main(["train", "--run-dir", str(tmp_path / "r"), "--resume", "train.max_steps=8"]) == 0
    assert "seqdiff: warning: train.warmup" not in capsys.readouterr().err


# ------------------------------------------------------------------ 8. the user's text validated on the corpus
def test_a_train_file_without_a_valid_file_says_validation_reads_the_corpus(tmp_path, capsys):
    without = [a for a in RECIPE if not a.startswith("data.valid_file=")]
    assert main(["train", "--run-dir", str(tmp_path / "a"), *without, "train.max_steps=1"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "without data.valid_file" in line]
    assert lines == [f"seqdiff: data.train_file={FIXTURE} is given without data.valid_file: validation reads the "
                     "'shakespeare' corpus' valid split; give data.valid_file=PATH to validate on your own text"]
    assert main(["train", "--run-dir", str(tmp_path / "b"), *RECIPE, "train.max_steps=1"]) == 0  # both given
    assert "without data.valid_file" not in capsys.readouterr().err


# ------------------------------------------------------------------ 9. a length beyond the context says what it costs
def test_a_length_beyond_the_context_says_how_many_blocks_each_sample_takes(tmp_path, capsys):
    from seqdiff.samplers.mdlm_semi_ar import block_starts
    from tests.test_variants import TOK, save_checkpoint  # DNA MDLM: context 64, trained at 32

    ckpt = save_checkpoint(tmp_path / "dna.ckpt", TOK)
    blocks = len(block_starts(100, 32, 16))
    assert main(["sample", str(ckpt), "--length", "100", "--steps", "2", "--num-samples", "1"]) == 0
    err = capsys.readouterr().err
    assert (f"seqdiff: 100 tokens exceed the model's context of 64: each sample is made in {blocks} "
            f"semi-autoregressive blocks of 32 tokens (overlap 16), each a full") in err, err
    assert main(["sample", str(ckpt), "--length", "60", "--steps", "2", "--num-samples", "1"]) == 0  # fits: silent
    assert "semi-autoregressive blocks" not in capsys.readouterr().err


# ------------------------------------------------------------------ 10. eval of a run whose own file is gone
def test_eval_of_a_run_whose_split_file_is_gone_points_to_data_and_dataset(tmp_path, capsys):
    import shutil

    mine = tmp_path / "mine.txt"
    shutil.copy(FIXTURE, mine)
    recipe = [a for a in RECIPE if not a.startswith("data.test_file=")] + [f"data.test_file={mine}"]
    assert main(["train", "--run-dir", str(tmp_path / "r"), *recipe, "train.max_steps=1"]) == 0
    mine.unlink()
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "r"), "--split", "test"]) == 2
    err = capsys.readouterr().err
    assert err == (f"seqdiff eval: error: {mine}: no such file (the run's data.test_file, read from the current "
                   "directory when relative); score a file with --data PATH, or a corpus with --dataset NAME\n"), err
    assert main(["eval", str(tmp_path / "r"), "--split", "test", "--data", str(FIXTURE)]) == 0  # the way out
