"""The one matplotlib set-up of seqdiff and its reports: the Agg backend, one style, atomic PNG saves.

Design choices:
- `pyplot()` selects the non-interactive Agg backend before pyplot is first imported (reports are written
  on machines without a display; a figure is never shown) and returns the module, so callers write
  `plt = pyplot()` where they wrote `import matplotlib.pyplot as plt`.
- One style: matplotlib's defaults, with figure sizes, colours and dpi given by each figure as before
  (the figures' content is unchanged); `STYLE` is the one place to change the look of every report.
- `save_figure` writes through `seqdiff.safe_io.atomic_save_figure` (write-then-rename, never over a device;
  via `seqdiff.atomic.save_figure_atomically`) and closes the figure, so a report never holds half a plot
  and a long sweep does not leak figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seqdiff.atomic import save_figure_atomically

BACKEND = "Agg"
"""The matplotlib backend of every figure: files only, no display needed."""

DPI = 110
"""The resolution every report figure is saved at unless it says otherwise."""

STYLE: dict[str, Any] = {}
"""rcParams applied to every figure (empty: matplotlib's defaults, which today's figures were drawn with)."""


def pyplot():
    """matplotlib.pyplot with the Agg backend and the project style set (idempotent)."""
    import matplotlib

    matplotlib.use(BACKEND)  # cheap when already selected; switches an interactive default off
    matplotlib.rcParams.update(STYLE)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = DPI) -> Path:
    """Save `fig` by write-then-rename (format from the suffix) and close it."""
    pyplot()
    return save_figure_atomically(fig, path, dpi=dpi)


__all__ = ["BACKEND", "DPI", "STYLE", "pyplot", "save_figure"]
