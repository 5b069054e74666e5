"""How `seqdiff bench` measures: timed calls, spreads over rounds, the load of other processes, the reference
matmul and peak memory.

Rounds are interleaved and summarized by median [min, max] (`spread`); a round counts as quiet when other
processes used under QUIET_OTHERS of the CPUs meanwhile (`OtherLoad`, from Linux /proc).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch


# ---------------------------------------------------------------------------------------------- helpers
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of fn(), with the device synchronized on both sides."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def spread(values: list[float]) -> dict[str, Any]:
    """Median and spread of a list of measurements (quartiles only when there are enough of them)."""
    out: dict[str, Any] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "n": len(values)}
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
        out["q1"], out["q3"] = q1, q3
    out["values"] = [round(v, 6) for v in values]
    return out


def ratio_ceiling(matmul_flops_per_s: float, flops_per_token: float, other_tokens_per_s: float) -> float:
    """The most a model could gain over a contender on this device: its tokens/s if all of its `flops_per_token`
    ran at the reference matmul rate and nothing else took time, over the contender's measured tokens/s.

    An upper bound (small matmuls run below the large reference one, and norms, activations and the optimizer take
    time too). It equals the measured ratio over the model's matmul fraction, so a ratio target above it cannot be
    met without fewer FLOPs per token, however the rest of the step is written.
    """
    return matmul_flops_per_s / (flops_per_token * other_tokens_per_s)


def load_average() -> float | None:
    """1-minute load average of the machine (None where the OS has none): how busy it was with other work."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


class OtherLoad:
    """CPU time that other processes used over an interval, as a fraction of all the machine's CPUs.

    Linux only (/proc/stat minus this process' own utime + stime from /proc/self/stat, clock ticks); None
    elsewhere. A measurement is called quiet when others used less than QUIET_OTHERS of the CPUs meanwhile.
    """

    @staticmethod
    def snapshot() -> tuple[int, int, int] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime of all threads
        except (OSError, ValueError, IndexError):
            return None
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks), own

    @staticmethod
    def between(a: tuple[int, int, int] | None, b: tuple[int, int, int] | None) -> float | None:
        if a is None or b is None or b[1] <= a[1]:
            return None
        return max(0.0, (b[0] - a[0]) - (b[2] - a[2])) / (b[1] - a[1])


QUIET_OTHERS = 0.1


def quiet_rounds(others: list[float | None]) -> list[bool]:
    return [o is None or o < QUIET_OTHERS for o in others]


def rotated(items: list, r: int) -> list:
    k = r % len(items)
    return items[k:] + items[:k]



# ---------------------------------------------------------------------------------------------- matmul
def make_matmul(n: int, device: torch.device, seed: int,
                dtype: torch.dtype = torch.float32) -> tuple[Callable[[], None], int]:
    """An n x n @ n x n matmul in `dtype` (the reference rate of the precision the models train in) and its FLOPs."""
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, generator=gen, device=device).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).to(dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    return (lambda: torch.mm(a, b, out=out)), 2 * n**3




# ---------------------------------------------------------------------------------------------- memory
class PeakMemory:
    """Peak memory of a block of work above the level at its start, in bytes.

    CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`, reset first). CPU: the process's
    peak resident set (VmHWM in /proc/self/status), reset by writing "5" to /proc/self/clear_refs after
    freeing what glibc holds (malloc_trim), so the baseline is the memory really in use. Where the reset is
    not permitted, the increase of `ru_maxrss` (a lower bound: it only moves above the previous peak).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._libc = None
        with contextlib.suppress(OSError):
            self._libc = ctypes.CDLL("libc.so.6")
        if device.type == "cuda":
            self.method = "torch.cuda.max_memory_allocated (reset before each model)"
        elif self._can_reset_hwm():
            self.method = "peak RSS: /proc/self/status VmHWM, reset via /proc/self/clear_refs '5', after malloc_trim"
        else:
            self.method = "ru_maxrss increase (lower bound: it cannot be reset)"

    @staticmethod
    def _can_reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return PeakMemory._status_kb("VmHWM") is not None
        except OSError:
            return False

    @staticmethod
    def _status_kb(key: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def _release(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        elif self._libc is not None:
            with contextlib.suppress(AttributeError):
                self._libc.malloc_trim(0)

    def measure(self, fn: Callable[[], Any]) -> int:
        """Bytes of peak memory while fn() runs, above what was in use when it started."""
        self._release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - base
        if self.method.startswith("peak RSS"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = self._status_kb("VmRSS") or 0
            fn()
            return max(0, ((self._status_kb("VmHWM") or 0) - base) * 1024)
        import resource

        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn()
        return max(0, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
