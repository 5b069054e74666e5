"""Where the time of one training step goes: a torch.profiler run, its operators binned into CATEGORIES."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from seqdiff.bench.measure import timed

# ---------------------------------------------------------------------------------------------- profile
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot",
              "aten::_addmm_activation"}
CATEGORIES = ("matmul", "attention", "gelu", "layernorm", "elementwise", "copies", "loss", "embedding",
              "optimizer", "autograd", "unattributed")
COPY_OPS = {"aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack",
            "aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like", "aten::empty", "aten::empty_like",
            "aten::empty_strided"}


def _category(key: str) -> str:
    """Kind of a profiler event by operator name (each event's self time counts once)."""
    k = key.lower()
    if key in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in k or "flash_attention" in k or "efficient_attention" in k or "cudnn_attention" in k:
        return "attention"
    if "layer_norm" in k:
        return "layernorm"
    if "gelu" in k:
        return "gelu"
    if "softmax" in k or "nll_loss" in k or "cross_entropy" in k:
        return "loss"
    if "embedding" in k or k == "aten::index_select":
        return "embedding"
    if k.startswith("optimizer.") or k.startswith("aten::_foreach") or "adam" in k:
        return "optimizer"
    if key in COPY_OPS:
        return "copies"
    if k.startswith("autograd::") or "backward" in k:  # autograd Node wrappers: bookkeeping between kernels
        return "autograd"
    if k.startswith("aten::"):
        return "elementwise"  # adds, muls (the rotary complex multiply), reductions (bias gradients), views
    return "unattributed"


def _under_optimizer(evt: Any) -> bool:
    while evt is not None:
        if evt.name.startswith("Optimizer."):
            return True
        evt = evt.cpu_parent
    return False


@contextlib.contextmanager
def profiler_lines_dropped() -> Iterator[None]:
    """Standard error (file descriptor 2) to /dev/null for the duration: torch's native profiler prints a
    'USDT: ... profiler_start' / 'profiler_stop' line at every start and stop, which says nothing to a user.
    Only wrap the start and the stop, never the measured work, so no real message is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_step(step: Callable[[], None], device: torch.device) -> dict[str, Any]:
    """One profiled training step: milliseconds per kind of operator, and the rate of the matmul kernels.

    Every operator's self time (CPU; device time on CUDA) goes to one category; all work inside
    `optimizer.step()` / `zero_grad()` counts as `optimizer`. `unattributed` is wall time outside any operator
    (Python, dispatch between operators, plus the profiler's own overhead), so it overstates eager overhead.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    prof = profile(activities=activities, with_flops=True)
    with profiler_lines_dropped():
        prof.__enter__()
    try:
        wall = timed(step, device)
    finally:
        with profiler_lines_dropped():
            prof.__exit__(None, None, None)
    ms = dict.fromkeys(CATEGORIES, 0.0)
    matmul_flops = 0.0
    for evt in prof.events():
        if cuda and str(getattr(evt, "device_type", "")).endswith("CUDA"):
            continue  # kernels are counted through the CPU operators that launched them
        us = getattr(evt, "self_device_time_total", 0.0) if cuda else evt.self_cpu_time_total
        cat = "optimizer" if _under_optimizer(evt) else _category(evt.name)
        ms[cat] += us / 1e3
        if cat == "matmul":
            matmul_flops += float(evt.flops or 0)
    wall_ms = wall * 1e3
    if not cuda:
        ms["unattributed"] += max(0.0, wall_ms - sum(ms.values()))
    matmul_s = ms["matmul"] / 1e3
    total = max(sum(ms.values()), 1e-9)
    return {
        "wall_ms": round(wall_ms, 3),
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "share": {k: round(v / total, 4) for k, v in ms.items()},
        "matmul_gflop": matmul_flops / 1e9,
        "matmul_kernel_flops_per_s": matmul_flops / matmul_s if matmul_s > 0 else None,
    }
