"""The probes' user-error class, in a module of its own so that every probes module (data, metrics, models)
can raise it without importing another; seqdiff.probes.data re-exports it."""

from __future__ import annotations

from seqdiff.errors import SeqdiffError


class ProbeError(SeqdiffError):
    """A benchmark, dataset file or checkpoint that the probes cannot use; the message names it and why."""


__all__ = ["ProbeError"]
