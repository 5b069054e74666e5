"""Write-then-rename: a file appears under its final name only once it is complete.

A leaf module (it imports nothing of seqdiff), so that every layer that writes a report, a JSON result or a
figure can use the same writer: an interrupted run never leaves a partial file under the final name.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: str | Path, text: str) -> Path:
    """Write then rename, so an interrupted run never leaves a partial file under the final name."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def save_figure_atomically(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure (PNG) by write-then-rename and close it: reports never hold half a plot."""
    import matplotlib.pyplot as plt  # late: matplotlib is slow to import and only figures need it

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=dpi)
    plt.close(fig)
    os.replace(tmp, path)
    return path


__all__ = ["save_figure_atomically", "write_atomically"]
