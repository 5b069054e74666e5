"""The old names of the write-then-rename helpers, as a leaf module: thin wrappers of `seqdiff.safe_io`.

`seqdiff.safe_io` is the one writer (a device or named pipe is written through, never renamed over; a
failure is one line and leaves nothing partial). These names stay because reports and experiments import
them (also through their older home, `seqdiff.evaluation.generate`). Figures: prefer
`seqdiff.figures.save_figure`, which also selects the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

from seqdiff.safe_io import atomic_save_figure, atomic_write_text


def write_atomically(path: str | Path, text: str) -> Path:
    """Write then rename (`safe_io.atomic_write_text`): an interrupted run never leaves a partial file."""
    return atomic_write_text(path, text)


def save_figure_atomically(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure by write-then-rename (`safe_io.atomic_save_figure`) and close it."""
    import matplotlib.pyplot as plt  # late: matplotlib is slow to import and only figures need it

    try:
        return atomic_save_figure(fig, path, dpi=dpi)
    finally:
        plt.close(fig)


__all__ = ["save_figure_atomically", "write_atomically"]
