"""seqdiff.safe_io, the one write-then-rename: a device or named pipe is written through, never renamed over;
folders are put in place whole; a failure leaves nothing partial."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from seqdiff.safe_io import (
    WriteError,
    atomic_directory,
    atomic_save_figure,
    atomic_torch_save,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
)


def _fifo_with_reader(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    return fifo, got, reader


@pytest.mark.parametrize("write", [
    lambda p: atomic_write_text(p, "hello\n"),
    lambda p: atomic_write_bytes(p, b"hello\n"),
    lambda p: __import__("seqdiff.atomic").atomic.write_atomically(p, "hello\n"),  # the old names, both homes
    lambda p: __import__("seqdiff.evaluation.generate").evaluation.generate.write_atomically(p, "hello\n"),
])
def test_a_named_pipe_is_written_through_and_stays_a_pipe(tmp_path, write):
    fifo, got, reader = _fifo_with_reader(tmp_path)
    write(fifo)
    reader.join(timeout=10)
    assert got == [b"hello\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # not replaced by a regular file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]  # no .tmp left beside it


def test_a_checkpoint_and_a_figure_to_a_named_pipe_are_written_through(tmp_path):
    import io

    import torch

    fifo, got, reader = _fifo_with_reader(tmp_path)
    atomic_torch_save({"x": torch.arange(3)}, fifo)
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert torch.equal(torch.load(io.BytesIO(got[0]))["x"], torch.arange(3))

    from seqdiff.figures import pyplot

    fig = pyplot().figure()
    (tmp_path / "sub").mkdir()
    fifo2, got2, reader2 = _fifo_with_reader(tmp_path / "sub")
    atomic_save_figure(fig, fifo2)
    reader2.join(timeout=10)
    assert got2[0][:8] == b"\x89PNG\r\n\x1a\n" and stat.S_ISFIFO(os.stat(fifo2).st_mode)


def test_only_devices_and_pipes_are_special(tmp_path):
    from seqdiff.safe_io import is_special

    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("x")
    assert is_special(tmp_path / "pipe")
    assert not is_special(tmp_path / "file") and not is_special(tmp_path) and not is_special(tmp_path / "absent")


def test_a_regular_file_is_replaced_whole_and_a_failure_keeps_the_old_one(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write_text(path, "one")
    assert path.read_text() == "one"

    def half_then_fail(f):
        f.write(b"tw")
        raise OSError(28, "No space left on device")

    with pytest.raises(WriteError, match="no space left on device"):
        atomic_write(path, half_then_fail)
    assert path.read_text() == "one" and sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_user_error_raised_while_streaming_passes_unchanged_and_leaves_nothing(tmp_path):
    from seqdiff.errors import SeqdiffError

    class Truncated(SeqdiffError):
        pass

    def fail(f):
        f.write(b"x")
        raise Truncated("input.fa: cannot be read to the end") from OSError(5, "Input/output error")

    with pytest.raises(Truncated):
        atomic_write(tmp_path / "out.fa", fail)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_is_put_in_place_whole_replacing_an_old_one(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with atomic_directory(out) as tmp:
        assert tmp.parent == tmp_path and not out.joinpath("new.txt").exists()
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # no temporary or old folder left
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o777 & ~umask


def test_a_failed_folder_leaves_the_old_one_and_no_temporary(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    (out / "old.txt").write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_directory(out) as tmp:
            (tmp / "new.txt").write_text("new")
            raise RuntimeError("boom")
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_a_folder_over_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(WriteError, match="exists and is not a directory"):
        with atomic_directory(tmp_path / "f"):
            pass
