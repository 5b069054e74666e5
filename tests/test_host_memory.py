"""seqdiff.host_memory: inside reuse_freed_memory() a freed block is reused without new page faults."""

import ctypes
import resource
import sys

import pytest

from seqdiff.host_memory import reuse_freed_memory

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _cycle(libc, size: int) -> int:
    """Page faults of malloc(size), touching every page, then free."""
    before = _faults()
    block = libc.malloc(size)
    assert block, "malloc failed"
    libc.memset(block, 1, size)
    faults = _faults() - before
    libc.free(block)
    return faults


@linux_only
def test_a_freed_block_is_reused_without_faulting_its_pages_in_again():
    """glibc maps a 64 MiB block afresh at each malloc by default (above its largest mmap threshold, so every
    page faults in each time); inside the context the freed block stays in the heap and the next malloc of
    that size faults in nothing new. After it, a block that large is mapped afresh again."""
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, pages = 64 << 20, (64 << 20) // 4096
    assert _cycle(libc, size) >= pages // 2  # by default: faulted in (the measurement sees faults)
    with reuse_freed_memory() as applied:
        assert applied, "glibc refused the thresholds"
        faults = [_cycle(libc, size) for _ in range(3)]
    assert max(faults[1:]) < pages // 10, f"page faults per cycle {faults} ({pages} pages)"
    assert _cycle(libc, size) >= pages // 2  # after it: above 32 MiB, mapped and returned at free again
    with reuse_freed_memory() as outer:
        with reuse_freed_memory() as inner:  # an evaluation inside training
            assert outer and inner
        _cycle(libc, size)
        nested = [_cycle(libc, size) for _ in range(2)]
    assert max(nested) < pages // 10, f"the inner block undid the outer one's setting: {nested}"


def test_outside_linux_nothing_is_set(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    with reuse_freed_memory() as applied:
        assert applied is False


def test_cpu_training_and_evaluation_run_inside_it(tmp_path, monkeypatch):
    import contextlib

    import seqdiff.evaluation.likelihood as likelihood
    import seqdiff.training.run as run_module
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.config import load_run_config
    from seqdiff.data.text import tokenize_file

    fixture = "tests/fixtures/shakespeare_tiny.txt"
    entered = []

    @contextlib.contextmanager
    def spy():
        entered.append("in")
        yield True
        entered.append("out")

    monkeypatch.setattr(run_module, "reuse_freed_memory", spy)
    monkeypatch.setattr(likelihood, "reuse_freed_memory", spy)
    recipe = ["model.preset=test", "model.max_seq_len=32", "data.seq_len=32", "data.batch_size=4",
              f"data.train_file={fixture}", f"data.valid_file={fixture}", f"data.test_file={fixture}",
              "train.max_steps=2", "train.val_every=2", "train.val_batches=1", "train.progress_bar=false"]
    run_module.train(load_run_config(None, recipe), tmp_path / "run")
    assert entered == ["in", "out"]  # around trainer.fit (validation included)
    model = load_checkpoint(tmp_path / "run")
    report = likelihood.evaluate_tokens(model, tokenize_file(fixture, model.tokenizer)[:200], batch_size=4)
    assert entered == ["in", "out", "in", "out"] and report["bits_per_token"] > 0
