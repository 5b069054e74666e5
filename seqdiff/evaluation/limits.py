"""Refuse a request that cannot run before allocating it: devices that are not there, counts that are not
positive, and sample lengths whose memory exceeds what the machine has.

The memory estimate is rough on purpose (an upper bound within a small factor), counted in bytes:
- what is kept: every sample's tokens (int64) and its decoded text (up to 4 bytes per character in a
  Python string), num_samples x length x 12;
- what one batch needs while it is generated: the running sequence and its masks, batch x length x 8 x 4,
  and the denoiser's logits over one block of at most the model's context, batch x block x vocab x 8 x 3
  (float32 logits, float64 probabilities and Gumbel noise, as the samplers draw in float64).
It is compared with the memory available now (MemAvailable on Linux; the free memory of a CUDA device for
the per-batch part when sampling on one).
"""

from __future__ import annotations

import os

import torch

from seqdiff.config import ConfigError
from seqdiff.samplers import SamplerError


def check_device(device: str, option: str = "--device") -> torch.device:
    """A torch device that exists here; else one line naming the option and what is available."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ConfigError(f"{option} {device!r} is not a device name (cpu, cuda, cuda:1, mps): {e}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{option} {device}: torch sees no CUDA GPU here (torch.cuda.is_available() is False); "
                             f"use {option} cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{option} {device}: only {count} CUDA device(s) here (cuda:0 .. cuda:{count - 1})")
    elif dev.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(f"{option} {device}: the MPS backend is not available here; use {option} cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{option} {device}: seqdiff runs on cpu, cuda or mps")
    return dev


def check_positive(**values: int | None) -> None:
    """Each named count (e.g. num_samples=4) must be None (unset) or >= 1; the name is the option's."""
    for name, value in values.items():
        if value is not None and value < 1:
            flag = "--" + name.replace("_", "-")
            raise SamplerError(f"{flag} must be >= 1, got {value}")


def available_memory() -> int | None:
    """Bytes of memory available to a new allocation now (Linux MemAvailable), None when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def sample_memory(num_samples: int, batch_size: int, length: int, context: int, vocab: int) -> tuple[int, int]:
    """(bytes kept for every sample, bytes one batch needs while generated): see the module docstring."""
    kept = num_samples * length * 12
    batch = min(batch_size, num_samples)
    working = batch * length * 8 * 4 + batch * min(length, context) * vocab * 8 * 3
    return kept, working


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_sample_memory(num_samples: int, batch_size: int, length: int, context: int, vocab: int,
                        device: torch.device | str = "cpu") -> None:
    """Refuse a sampling request whose estimated memory exceeds what is available (before allocating it)."""
    kept, working = sample_memory(num_samples, batch_size, length, context, vocab)
    device = torch.device(device)
    host = available_memory()
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        needs = [(working, free, f"{device} memory")] + ([(kept, host, "host memory")] if host else [])
    else:
        needs = [(kept + working, host, "memory")] if host else []
    for need, have, what in needs:
        if need > 0.9 * have:
            raise SamplerError(f"{num_samples} samples of {length:,} tokens (--batch-size {batch_size}) need about "
                               f"{_gib(need)} of {what} by a rough estimate, more than the {_gib(have)} available; "
                               f"lower --length / --seq-len, --num-samples or --batch-size")
