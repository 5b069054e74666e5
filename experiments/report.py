"""What every study here does at its end: name the command that made the report, write results.json and
table.md under --out, print the table."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any


def command_line(module: str, argv: list[str] | None) -> str:
    """`python -m experiments.<module> ARGS` as it was run (argv None: this process's own arguments), quoted
    so that it can be pasted back into a shell."""
    args = argv if argv is not None else sys.argv[1:]
    return shlex.join(["python", "-m", f"experiments.{module}", *args])


def write_results(out: str | Path, results: dict[str, Any], table: str, indent: int = 2) -> Path:
    """<out>/results.json (the numbers) and <out>/table.md (`table`, for people); prints the table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=indent) + "\n")
    (out / "table.md").write_text(table)
    print(table)
    return out
