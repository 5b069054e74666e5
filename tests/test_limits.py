"""Degenerate or unbounded requests are refused before anything is allocated or written (issue 23, item 6),
and operating-system failures are one line with no partial file left (item 7)."""

import errno
import os
import subprocess
import sys

import pytest
import torch

import seqdiff.safe_io as safe_io
from seqdiff.cli import main
from seqdiff.config import load_run_config
from seqdiff.evaluation.limits import check_sample_memory, sample_memory
from seqdiff.probes.data import ProbeError, read_table
from seqdiff.safe_io import WriteError, atomic_torch_save
from seqdiff.samplers import SamplerError
from seqdiff.training.run import train

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
RECIPE = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
          f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
          "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=2", "train.max_steps=2",
          "train.val_every=2", "train.checkpoint_every=2", "train.ema_decay=0.9"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r"
    train(load_run_config(None, RECIPE), path)
    return path


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    return err


# ------------------------------------------------------------------ 6. limits
@pytest.mark.parametrize("flag", ["--length", "--seq-len", "--num-samples", "--steps", "--batch-size"])
@pytest.mark.parametrize("value", ["0", "-3"])
def test_sample_refuses_zero_and_negative_counts(run, capsys, flag, value):
    assert f"{flag} must be >= 1, got {value}" in _error(capsys, ["sample", str(run), flag, value])


def test_sample_refuses_lengths_beyond_the_model_or_the_memory(run, capsys):
    assert "--seq-len 65 exceeds the model's max_seq_len=64" in _error(capsys, ["sample", str(run), "--seq-len", "65"])
    err = _error(capsys, ["sample", str(run), "--length", "1000000000"])  # refused at once, nothing allocated
    assert "need about" in err and "GiB" in err and "lower --length" in err


def test_the_memory_estimate_counts_samples_and_one_batch():
    kept, working = sample_memory(num_samples=10, batch_size=4, length=100, context=64, vocab=50)
    assert kept == 10 * 100 * 12
    assert working == 4 * 100 * 8 * 4 + 4 * 64 * 50 * 8 * 3
    check_sample_memory(10, 4, 100, 64, 50)  # a few kB fit anywhere
    with pytest.raises(SamplerError, match="need about"):
        check_sample_memory(1000, 1000, 10**9, 1024, 50_000)


def test_eval_refuses_zero_time_samples(run, capsys):
    assert "--num-t-samples must be >= 1, got 0" in _error(capsys, ["eval", str(run), "--num-t-samples", "0"])
    assert "--batch-size must be >= 1, got 0" in _error(capsys, ["eval", str(run), "--batch-size", "0"])


def test_a_probe_table_with_an_empty_label_is_refused_naming_the_row(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("sequence,label\nACGT,a\nACGA,\nACGG,b\n")
    with pytest.raises(ProbeError, match=r"t.csv line 3: the 'label' cell is empty"):
        read_table(table)
    table.write_text("sequence,label\nACGT,a\n ,b\n")
    with pytest.raises(ProbeError, match=r"line 3: the 'sequence' cell is empty"):
        read_table(table)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_one_line(run, tmp_path, capsys):
    for command in ("eval", "sample"):
        assert "torch sees no CUDA GPU here" in _error(capsys, [command, str(run), "--device", "cuda"])
    err = _error(capsys, ["train", "--run-dir", str(tmp_path / "g"), *RECIPE, "train.accelerator=gpu"])
    assert "train.accelerator=gpu, but torch sees no CUDA GPU here" in err
    assert not (tmp_path / "g").exists()
    assert "not a device name" in _error(capsys, ["eval", str(run), "--device", "gpu0"])


# ------------------------------------------------------------------ 7. operating-system errors
class FullDisk:
    """A file object whose writes fail with ENOSPC after `room` bytes, as a full disk does."""

    def __init__(self, path, room):
        self.file, self.room = open(path, "wb"), room

    def write(self, data):
        if self.file.tell() + len(data) > self.room:
            self.file.write(bytes(data)[: max(0, self.room - self.file.tell())])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_a_full_disk_during_a_checkpoint_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(safe_io, "_open_binary", lambda path: FullDisk(path, room=20_000))
    with pytest.raises(WriteError, match=r"cannot write checkpoint .*x.ckpt: no space left on device"):
        atomic_torch_save({"w": torch.zeros(100_000)}, tmp_path / "x.ckpt")
    assert list(tmp_path.iterdir()) == []  # no x.ckpt.tmp keeps the disk full
    run = tmp_path / "r"
    err = _error(capsys, ["train", "--run-dir", str(run), *RECIPE])
    assert "no space left on device" in err and "nothing partial was left" in err
    assert not list(run.rglob("*.tmp")) and not list(run.rglob("*.ckpt"))
    assert not (run / "train.lock").exists()


def test_a_file_size_limit_in_a_real_subprocess_is_one_line(tmp_path):
    # the operating system itself refuses the write (EFBIG): torch's own writer path, no mock
    run = tmp_path / "r"
    script = ("import resource, signal, sys; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
              "resource.setrlimit(resource.RLIMIT_FSIZE, (60000, 60000)); "
              "from seqdiff.cli import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", script, "train", "--run-dir", str(run), *RECIPE],
                          capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "file too large" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(run.rglob("*.tmp")) and not list(run.rglob("*.ckpt"))


def test_a_run_dir_that_is_a_file_or_read_only_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert f"{a_file} is a file, not a directory" in _error(capsys, ["train", "--run-dir", str(a_file), *RECIPE])
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        err = _error(capsys, ["train", "--run-dir", str(locked / "r"), *RECIPE])
        assert "permission denied" in err or "read-only file system" in err
    finally:
        locked.chmod(0o700)


def test_a_read_only_file_system_is_named(tmp_path, monkeypatch, capsys):
    def read_only(path):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(safe_io, "_open_binary", read_only)
    err = _error(capsys, ["train", "--run-dir", str(tmp_path / "r"), *RECIPE])
    assert f"cannot write file {tmp_path / 'r' / 'config.yaml'}: read-only file system" in err
    assert not (tmp_path / "r" / "train.lock").exists()


def test_frontier_float_flags_refuse_nan(capsys):
    import pytest

    from seqdiff.cli import main as seqdiff_main

    for flag in ("--edlm-window", "--remdm-eta", "--threshold"):
        with pytest.raises(SystemExit) as e:
            seqdiff_main(["frontier", "--checkpoint", "x", "--oracle", "y", flag, "nan"])
        assert e.value.code == 2 and "finite number" in capsys.readouterr().err


def test_bench_float_flag_refuses_nan(capsys):
    import pytest

    from seqdiff.cli import main as seqdiff_main

    with pytest.raises(SystemExit) as e:
        seqdiff_main(["bench", "--sample-budget-s", "nan"])
    assert e.value.code == 2 and "finite number" in capsys.readouterr().err
