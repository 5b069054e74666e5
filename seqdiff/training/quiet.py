"""Third-party lines that say nothing about the run, dropped by every seqdiff process that trains.

Lightning prints its cloud-logger tip at every Trainer, and the installed torch warns about a deprecation inside
Lightning's own code (not ours to fix). `seqdiff` drops both for every command; the quickstart's second process
(seqdiff.training.side_by_side) does too, or they would fill the log tail it shows when training fails.
"""

from __future__ import annotations

import logging
import warnings


class DropLightningTips(logging.Filter):
    """Lightning's advertisement for its cloud logger, printed at every Trainer: nothing a user can act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)


def quiet_third_party_noise() -> None:
    """Drop Lightning's cloud-logger tip and the treespec deprecation warning (idempotent)."""
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, DropLightningTips) for f in logger.filters):
        logger.addFilter(DropLightningTips())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


__all__ = ["DropLightningTips", "quiet_third_party_noise"]
