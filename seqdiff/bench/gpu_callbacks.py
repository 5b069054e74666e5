"""The callbacks `python -m seqdiff.bench.gpu_check` trains with: each step's wall time, and one profiled step.

Kept apart from gpu_check so that the script imports Lightning (about 10 s on a slow CPU) only once a run
starts: on a machine without CUDA it refuses in the time it takes to import torch.
"""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch

from seqdiff.bench.profile import profiler_lines_dropped


class StepTimer(L.Callback):
    """Wall time of each training batch (start to end, device synchronized)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._t0 = 0.0

    @staticmethod
    def _sync(module) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._sync(pl_module)
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._sync(pl_module)
        self.times.append(time.perf_counter() - self._t0)


class StepProfiler(L.Callback):
    """torch.profiler over one training batch (global step `step`): is the step bound by the host or the device?

    `summary` holds the step's wall time, the device's busy time (the sum of its kernels' times; None on the
    CPU), the host operators' self time binned as `seqdiff bench` bins them, and the top operators by self time
    on each side. The profiler slows the host down, so the busy share it reports is a lower bound."""

    def __init__(self, step: int, top: int = 12) -> None:
        self.step, self.top = step, top
        self.summary: dict[str, Any] | None = None
        self._prof = None
        self._t0 = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step != self.step or self._prof is not None:
            return
        from torch.profiler import ProfilerActivity, profile

        cuda = pl_module.device.type == "cuda"
        StepTimer._sync(pl_module)
        try:  # a profiler that cannot start (no CUPTI, say) costs the profile, never the measured run
            self._prof = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []))
            with profiler_lines_dropped():
                self._prof.__enter__()
        except Exception as e:
            self._prof, self.summary = False, {"error": f"{type(e).__name__}: {e}"[:300]}
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._prof or self.summary is not None:
            return
        StepTimer._sync(pl_module)
        wall = time.perf_counter() - self._t0
        try:
            with profiler_lines_dropped():
                self._prof.__exit__(None, None, None)
            self.summary = summarize_profile(self._prof, wall, pl_module.device.type == "cuda", self.top)
        except Exception as e:
            self.summary = {"error": f"{type(e).__name__}: {e}"[:300]}


def summarize_profile(prof, wall_s: float, cuda: bool, top: int) -> dict[str, Any]:
    """The numbers of StepProfiler.summary from a finished torch.profiler run (times in milliseconds)."""
    from seqdiff.bench.profile import CATEGORIES, _category

    host = dict.fromkeys(CATEGORIES, 0.0)
    device_busy = 0.0
    for evt in prof.events():
        if str(getattr(evt, "device_type", "")).endswith("CUDA"):
            device_busy += getattr(evt, "self_device_time_total", 0.0) / 1e3
        else:
            # by operator name only: Lightning runs forward and backward inside optimizer.step(closure), so
            # "everything under the optimizer" (seqdiff bench's rule for its own loop) would be the whole step.
            # For the same reason the self time of the `Optimizer.step#...` annotation is the closure's Python
            # (Lightning's training_step between operators), not AdamW's work: it counts as unattributed.
            cat = "unattributed" if evt.name.startswith("Optimizer.step") else _category(evt.name)
            host[cat] += evt.self_cpu_time_total / 1e3
    averages = prof.key_averages()

    def ranked(attr: str) -> list[list[Any]]:
        rows = [(e.key, getattr(e, attr, 0.0) / 1e3, e.count) for e in averages]
        rows = [r for r in rows if r[1] > 0]
        return [[k, round(ms, 3), n] for k, ms, n in sorted(rows, key=lambda r: -r[1])[:top]]

    wall_ms = wall_s * 1e3
    return {
        "wall_ms": round(wall_ms, 3),
        "device_busy_ms": round(device_busy, 3) if cuda else None,
        "device_busy_share": round(device_busy / wall_ms, 4) if cuda and wall_ms > 0 else None,
        "host_ms_by_category": {k: round(v, 3) for k, v in host.items()},
        "top_host_ops": ranked("self_cpu_time_total"),
        "top_device_ops": ranked("self_device_time_total") if cuda else [],
    }
