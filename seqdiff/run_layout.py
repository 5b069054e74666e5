"""Which files of a run directory belong to the run (seqdiff.training.run lists the layout).

Commands that write a file or a folder the user names (`sample --out`, `eval --out`, `score --out`,
`export DIR`) ask here before any work, so that a mistyped path never replaces a checkpoint, the saved
recipe or the training log. No torch import: the CLI checks this while it parses.
"""

from __future__ import annotations

from pathlib import Path

RUN_OWN_FOLDERS = ("checkpoints", "logs", "eval", "wandb")
"""Folders `seqdiff train` / `eval` write into: an export never goes into or over them."""
RUN_OWN_FILES = ("config.yaml", "tokenizer_config.json", "train.lock", "timing.json")
"""Files at the top of a run directory that `seqdiff train` writes."""


def run_root(path: str | Path) -> Path | None:
    """The run directory `path` lies in (or is): a folder with checkpoints/ and config.yaml or a last.ckpt."""
    path = Path(path).expanduser().resolve()
    for folder in (path, *path.parents):
        if (folder / "checkpoints").is_dir() and ((folder / "config.yaml").is_file()
                                                  or (folder / "checkpoints" / "last.ckpt").is_file()):
            return folder
    return None


def run_file_written_over(path: str | Path) -> str | None:
    """Why writing the file `path` would replace part of a run (None when it would not): the run's checkpoints,
    logs, saved recipe, tokenizer or lock. Its eval/ folder (where `seqdiff eval` writes by default) and any
    other file beside them (samples.txt) are the user's to write."""
    resolved = Path(path).expanduser().resolve()
    run = run_root(resolved.parent)
    if run is None:
        return None
    inside = resolved.relative_to(run).parts
    if not inside:
        return f"it is the run directory {run}"
    if inside[0] in ("checkpoints", "logs", "wandb"):
        return f"it lies in the {inside[0]}/ folder of the run {run}"
    if len(inside) == 1 and inside[0] in RUN_OWN_FILES:
        return f"it is the {inside[0]} of the run {run}"
    return None


__all__ = ["RUN_OWN_FILES", "RUN_OWN_FOLDERS", "run_file_written_over", "run_root"]
