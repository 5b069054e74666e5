"""Small user-facing problems left by earlier audits: `--config FOLDER`, the ReMDM loop band's message, an
invalid `--overlap`, an invalid value saved in a run's config.yaml, an EDLM energy shorter than the samples,
and the scratch folders of a fetch killed outright."""

import os
import stat
from pathlib import Path

import pytest
import yaml

import seqdiff.evaluation.frontier as frontier
import seqdiff.evaluation.generate as generate_mod
from seqdiff.cli import main
from seqdiff.data.fetch import SOURCES, fetch
from tests.test_fetch import FILES, fake_source, make_tarball

FIXTURE = Path("tests/fixtures/shakespeare_tiny.txt").resolve()
RECIPE = ["model.preset=test", "data.batch_size=4", f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}",
          f"data.test_file={FIXTURE}", "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=1",
          "train.val_every=100", "train.max_steps=1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A one-step MDLM of 32-token blocks (context 64) and an AR model that reads only 16 tokens."""
    root = tmp_path_factory.mktemp("leftovers")
    for name, method, seq_len, context in (("mdlm", "mdlm", 32, 64), ("short_ar", "ar", 16, 16)):
        assert main(["train", "--run-dir", str(root / name), *RECIPE, f"method.name={method}",
                     f"data.seq_len={seq_len}", f"model.max_seq_len={context}"]) == 0
    return root


@pytest.fixture
def no_sampling(monkeypatch):
    """Sampling that starts fails the test: the refusal must come first."""
    def never(*args, **kwargs):
        raise AssertionError("sampling started before the mistake was said")

    monkeypatch.setattr(generate_mod, "generate", never)
    monkeypatch.setattr(frontier, "_generate", never)


# ------------------------------------------------------------------ 1. --config FOLDER
def test_a_config_that_is_a_folder_is_said_to_be_one(runs, tmp_path, capsys, refused):
    line = refused(["config", "--config", str(tmp_path)])
    assert line == f"seqdiff config: error: config file {tmp_path} is a directory, not a YAML recipe"
    for command in ("config", "train"):  # a run directory: its recipe is named
        line = refused([command, "--config", str(runs / "mdlm")])
        assert "is a directory, not a YAML recipe" in line and str(runs / "mdlm" / "config.yaml") in line


# ------------------------------------------------------------------ 2. the ReMDM loop band
@pytest.mark.parametrize("given", [["--remdm-t-on", "0.2", "--remdm-t-off", "0.5"],
                                   ["sample.remdm_t_on=0.2", "sample.remdm_t_off=0.5"]])
def test_a_wrong_loop_band_is_one_clean_sentence(tmp_path, capsys, given, refused):
    line = refused(["sample", str(tmp_path / "run"), "--sampler", "remdm", "--remdm-schedule", "loop", *given])
    assert line == ("seqdiff sample: error: sample.remdm_t_off (--remdm-t-off) and sample.remdm_t_on (--remdm-t-on) "
                    "need 0 < t_off < t_on < 1, got 0.5 and 0.2")


# ------------------------------------------------------------------ 3. --overlap
def test_an_overlap_of_a_block_or_more_names_the_flag(runs, capsys, refused):
    line = refused(["sample", str(runs / "mdlm"), "--length", "100", "--overlap", "40", "--steps", "2",
                           "--num-samples", "1"])
    assert line == "seqdiff sample: error: --overlap (sample.overlap)=40 must lie in [0, block length 32)"


# ------------------------------------------------------------------ 4. an invalid value in RUN/config.yaml
def test_an_invalid_saved_value_names_the_run_config_file(runs, tmp_path, capsys, refused):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.ckpt").symlink_to(runs / "mdlm" / "checkpoints" / "last.ckpt")
    config = yaml.safe_load((runs / "mdlm" / "config.yaml").read_text())
    config["sample"]["steps"] = 0
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    line = refused(["sample", str(run), "--num-samples", "1"])
    assert line == f"seqdiff sample: error: {run / 'config.yaml'}: sample.steps must be >= 1, got 0"
    # a value the user gives instead is taken; a mistake of the user's own is still named as typed
    assert "--temperature must be >= 0" in refused(["sample", str(run), "--steps", "2", "--temperature", "-1"])
    config["sample"]["steps"], config["train"]["lr"] = 2, -1
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    line = refused(["train", "--resume", "--run-dir", str(run)])
    assert line.startswith(f"seqdiff train: error: {run / 'config.yaml'}: train.lr ")


# ------------------------------------------------------------------ 5. an energy shorter than the samples
def test_sample_refuses_an_energy_that_reads_fewer_tokens_than_a_sample(runs, capsys, no_sampling, refused):
    energy = f"ar:{runs / 'short_ar'}"
    line = refused(["sample", str(runs / "mdlm"), "--sampler", "edlm", "--energy", energy, "--steps", "2"])
    assert line == (f"seqdiff sample: error: --energy {energy}: it reads at most 16 tokens (its model.max_seq_len), "
                    f"fewer than the 32-token samples to draw")
    line = refused(["sample", str(runs / "mdlm"), "--sampler", "edlm", "--energy", energy, "--steps", "2",
                           "--length", "100"])  # semi-autoregressive: each 32-token block is read whole
    assert "reads at most 16 tokens" in line and "32-token blocks each sample is drawn in" in line


def test_frontier_refuses_an_energy_that_reads_fewer_tokens_than_a_sample(runs, tmp_path, capsys, no_sampling, refused):
    energy = f"ar:{runs / 'short_ar'}"
    line = refused(["frontier", "--checkpoint", str(runs / "mdlm"), "--oracle", str(runs / "short_ar"),
                           "--edlm-energy", energy, "--steps", "2", "--num-samples", "2", "--batch-size", "2",
                           "--out", str(tmp_path / "frontier")])
    assert f"--edlm-energy {energy}: it reads at most 16 tokens" in line and "32-token samples" in line


# ------------------------------------------------------------------ 6. scratch folders of a killed fetch
def test_fetch_removes_the_scratch_folders_of_killed_fetches_only(tmp_path, monkeypatch):
    data, bin_dir, log = tmp_path / "data", tmp_path / "bin", tmp_path / "cwd.log"
    bin_dir.mkdir()
    npm = bin_dir / "npm"  # a fake client that says where it downloads, and serves a tarball of FILES
    npm.write_text('#!/bin/sh\npwd >> "$FAKE_LOG"\ncp "$FAKE_ARCHIVE" .\n')
    npm.chmod(npm.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SEQDIFF_DATA", str(data))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_ARCHIVE", str(make_tarball(tmp_path / "fake-data-1.0.0.tgz", FILES)))
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setitem(SOURCES, "fake", fake_source())
    dead = [data / ".fetch-fake.tmp-999999999-x1", data / ".fake.tmp-999999999-x2"]  # kill -9 left these
    live = data / f".fetch-other.tmp-{os.getppid()}-x3"  # another fetch, still running
    for folder in [*dead, live]:
        (folder / "download").mkdir(parents=True)
    fetch("fake", log=lambda message: None)
    assert not any(folder.exists() for folder in dead) and (live / "download").is_dir()
    scratch = Path(log.read_text().strip()).parent  # this fetch's own scratch: named with its pid, and gone
    assert scratch.parent == data and scratch.name.startswith(f".fetch-fake.tmp-{os.getpid()}-")
    assert sorted(os.listdir(data)) == sorted(["fake", live.name])
