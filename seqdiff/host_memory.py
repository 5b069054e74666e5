"""Keep the memory a CPU training step (or evaluation batch) frees for the next one, instead of handing it back to
the kernel.

Why: an eager training step allocates its activations and gradients afresh, tens of MB a step in blocks of
0.1-8 MB. glibc's malloc serves blocks above its mmap threshold with mmap and unmaps them at free (and trims
the top of its heap past a threshold), so the next step gets fresh pages, and the kernel faults in and
zero-fills every one of them on first touch: thousands of page faults a step at the quickstart's shape.
Raising both thresholds keeps the freed blocks in malloc's heap, where the next step's allocations of the
same sizes find them (measured by `python -m experiments.quickstart_step_time`, reports/bench/quickstart_step).
The memory goes back to the kernel when training ends (`malloc_trim`), so the process's peak is what it was.
Used around `trainer.fit` and around an evaluation's batches (seqdiff.evaluation.likelihood), on CPU.

glibc only (Linux); elsewhere, or if the C library refuses, nothing changes. The thresholds are the whole
process's: at the end the trim threshold goes back to glibc's default and the mmap threshold to 32 MiB, the
most glibc's own adjustment raises it to (a threshold set by hand turns that adjustment off for good), so
blocks larger than that are again mapped and returned at free, as glibc does by default.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import sys
from collections.abc import Iterator

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30
"""Bytes: blocks up to 1 GiB come from the heap, and up to 1 GiB of free heap top stays mapped."""
DEFAULT_TRIM_THRESHOLD = 128 * 1024  # glibc's M_TRIM_THRESHOLD default
MMAP_THRESHOLD_AFTER = 32 * 1024 * 1024  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_depth = 0  # nested blocks (an evaluation inside training): only the outermost sets and restores
_applied = False  # whether the outermost block set the thresholds


@contextlib.contextmanager
def reuse_freed_memory() -> Iterator[bool]:
    """Within the block, freed heap memory stays mapped for reuse; at its end, free memory goes back
    (malloc_trim). Yields whether the thresholds are set (False: not glibc, or refused). Re-entrant: a nested
    block leaves the outer one's setting alone."""
    global _depth, _applied
    if _depth > 0:
        _depth += 1
        try:
            yield _applied
        finally:
            _depth -= 1
        return
    libc = _libc()
    applied = _applied = bool(libc is not None and libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1
                              and libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD) == 1)
    _depth += 1
    try:
        yield applied
    finally:
        _depth, _applied = _depth - 1, False
        if applied:
            libc.mallopt(M_TRIM_THRESHOLD, DEFAULT_TRIM_THRESHOLD)  # later frees trim the heap top again
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_AFTER)
            libc.malloc_trim(0)


__all__ = ["reuse_freed_memory"]
