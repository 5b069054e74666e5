"""Audit of `seqdiff data`, `seqdiff train` interruption / resume and the samplers a recipe names: each case
either works or is refused in one line naming the option or file, before anything is downloaded or written."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
import torch

from seqdiff.cli import main
from seqdiff.config import load_run_config
from seqdiff.data import fetch as fetch_mod
from seqdiff.data.fetch import SOURCES, FetchError, Source, SourceFile, failure_reason, fetch
from seqdiff.training.guards import RunError
from seqdiff.training.run import train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=32", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=1", "train.val_every=100"]

# ---------------------------------------------------------------------------------------------- data fetch
NPM_OFFLINE = """npm error code ECONNREFUSED
npm error syscall connect
npm error FetchError: request to http://registry.invalid/fake-data failed, reason: connect ECONNREFUSED
npm error     at ClientRequest.<anonymous> (/usr/lib/node_modules/npm/node_modules/minipass-fetch/lib/index.js:130:14)
npm error   type: 'system'
npm error }
npm error If you are behind a proxy, please make sure that the 'proxy' config is set properly.
npm error A complete log of this run can be found in: /root/.npm/_logs/debug-0.log
"""


def _source() -> Source:
    data = b"alpha\n"
    return Source(name="fake", description="a fake source", client="npm", package="fake-data@1.0.0",
                  files=(SourceFile("package/a.txt", hashlib.sha256(data).hexdigest()),), target="fake")


@pytest.fixture
def fake_npm(tmp_path, monkeypatch):
    """A registered source `fake`, an npm on PATH that logs its calls and serves its tarball, or fails as npm does
    offline when $FAKE_FAIL is set; returns the call log."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    (tmp_path / "npm.err").write_text(NPM_OFFLINE)
    archive = tmp_path / "fake-data-1.0.0.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("package/a.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"alpha\n"))
    script = bin_dir / "npm"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n'
                      f'[ -z "$FAKE_FAIL" ] || {{ cat {tmp_path / "npm.err"} >&2; exit 1; }}\ncp {archive} .\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    monkeypatch.setitem(SOURCES, "fake", _source())
    return log


def test_a_failed_download_is_one_line_with_the_clients_reason(fake_npm, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_FAIL", "1")
    assert main(["data", "fetch", "fake"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err  # not the client's stack trace, line after line
    assert "failed (exit 1): npm error FetchError: request to http://registry.invalid/fake-data failed" in err
    assert not (tmp_path / "data" / "fake").exists() and os.listdir(tmp_path / "data") == []


@pytest.mark.parametrize("output, reason", [
    ("WARNING: Location 'file:///opt/x/' is ignored\nERROR: Could not find a version that satisfies the requirement "
     "x==1 (from versions: none)\nERROR: No matching distribution found for x==1\n",
     "ERROR: No matching distribution found for x==1"),
    ("W: Download is performed unsandboxed as root\nE: Failed to fetch http://mirror.invalid/x.deb  Could not "
     "connect to 127.0.0.1:9\n", "E: Failed to fetch http://mirror.invalid/x.deb  Could not connect to 127.0.0.1:9"),
    ("E: Unable to locate package no-such-package\n", "E: Unable to locate package no-such-package"),
    ("something odd\nand its last word\n", "and its last word"),
    ("", "no output"),
])
def test_the_reason_of_a_failed_client_is_its_telling_line(output, reason):
    assert failure_reason(output) == reason


def test_a_file_where_the_source_folder_goes_is_refused_before_downloading(fake_npm, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "fake").write_text("not a folder\n")
    with pytest.raises(FetchError, match=r"data/fake is a file, where source 'fake' keeps its folder"):
        fetch("fake", log=lambda m: None)
    assert not fake_npm.exists()  # nothing was downloaded
    assert (tmp_path / "data" / "fake").read_text() == "not a folder\n"


def test_an_unusable_data_directory_names_it_and_seqdiff_data(fake_npm, tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("x\n")
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "a-file"))
    assert main(["data", "fetch", "fake"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"seqdiff data fetch: error: data directory {tmp_path / 'a-file'} exists and is not a directory; "
                   f"set $SEQDIFF_DATA to use another data directory")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", kwargs.get("dir"))

    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "ro"))
    monkeypatch.setattr(fetch_mod.tempfile, "mkdtemp", read_only)
    assert main(["data", "fetch", "fake"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"seqdiff data fetch: error: cannot write into data directory {tmp_path / 'ro'}: read-only file "
                   f"system; set $SEQDIFF_DATA to use another data directory")
    assert not fake_npm.exists()


def test_an_unwritable_token_cache_names_the_option(tmp_path, monkeypatch, capsys):
    (tmp_path / "a-file").write_text("x\n")
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "a-file" / "data"))  # the cache cannot be made there
    run = tmp_path / "r"
    assert main(["train", "--run-dir", str(run), *RECIPE, "data.text.cache=true", "train.max_steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "tokenized cache folder" in err and "not a directory" in err, err
    assert "set data.text.cache=false" in err
    assert not run.exists()


# ---------------------------------------------------------------------------------------------- train / resume
def _train(run: Path, *extra: str, resume: bool = False):
    return train(load_run_config(None, [*RECIPE, *extra]), run, resume=resume)


def test_resume_without_config_yaml_asks_for_the_recipe(tmp_path, capsys):
    run = tmp_path / "r"
    _train(run, "train.max_steps=2")
    before = (run / "checkpoints" / "last.ckpt").read_bytes()
    (run / "config.yaml").unlink()
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run), "--resume", "train.max_steps=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"seqdiff train: error: --resume: {run / 'config.yaml'} is missing; it holds the recipe the run was "
                   f"started with: give that recipe with --config")  # not a list of the defaults' differences
    (run / "config.yaml").mkdir()
    assert main(["train", "--run-dir", str(run), "--resume", "train.max_steps=4"]) == 2
    assert "config.yaml is not a file" in capsys.readouterr().err
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == before


def test_a_folder_named_last_ckpt_is_refused_before_training(tmp_path):
    run = tmp_path / "r"
    _train(run, "train.max_steps=2")
    (run / "checkpoints" / "last.ckpt").unlink()
    (run / "checkpoints" / "last.ckpt").mkdir()
    with pytest.raises(RunError, match=r"last.ckpt is not a file; move it away"):
        _train(run, "train.max_steps=4", resume=True)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["last.ckpt", "step2.ckpt"]


def test_a_longer_cosine_run_on_resume_says_the_learning_rate_rises(tmp_path, capsys):
    run = tmp_path / "r"
    _train(run, "train.max_steps=3", "train.lr_schedule=cosine")  # the rate has decayed to 0 at step 3
    capsys.readouterr()
    result = _train(run, "train.max_steps=5", "train.lr_schedule=cosine", resume=True)
    err = capsys.readouterr().err
    assert "train.max_steps 3 -> 5 stretches train.lr_schedule=cosine: the learning rate at step 3 becomes" in err
    assert "(it was 0)" in err
    assert torch.load(result.checkpoint, weights_only=False, map_location="cpu")["global_step"] == 5


# ---------------------------------------------------------------------------------------------- samplers
def test_a_recipe_sampler_that_cannot_drive_the_method_is_refused_by_train(tmp_path, capsys):
    run = tmp_path / "r"
    assert main(["train", "--run-dir", str(run), *RECIPE, "method.name=ar", "sample.sampler=remdm",
                 "train.max_steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("seqdiff train: error: sample.sampler=remdm cannot drive models of method.name=ar; choose one of "
                   "['ar'], or sample.sampler=null for its default")
    assert not run.exists()  # refused before anything is written, not at the run's first `seqdiff sample`
