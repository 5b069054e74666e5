"""Probe reports: a printed table, `NAME.json` (every number) and `NAME.md` (the table for people),
with published numbers next to ours where we have them.

Published numbers: `PUBLISHED[benchmark]` lists rows (model, mean accuracy, range, citation). It is empty
on purpose: the Genomic Benchmarks tables of HyenaDNA (Nguyen et al. 2023), Caduceus (Schiff et al. 2024,
Table 1, CNN / HyenaDNA / Caduceus rows, 5-seed mean with max - min) and MDLM (Sahoo et al. 2024) could not
be checked digit by digit from this offline machine, and an unchecked number is worse than none. Add a row
only with the paper and table it comes from; the report prints whatever is listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqdiff.evaluation.generate import write_atomically


@dataclass(frozen=True)
class PublishedRow:
    model: str
    accuracy: float
    """Top-1 test accuracy (mean over seeds / folds), as a fraction."""
    spread: float | None
    """As the paper gives it (e.g. max - min over 5 seeds), or None."""
    citation: str
    """Paper and table."""


PUBLISHED: dict[str, list[PublishedRow]] = {}


def format_row(row: dict[str, Any]) -> str:
    mean, lo, hi = row["test_accuracy_mean"], row["test_accuracy_min"], row["test_accuracy_max"]
    return f"{100 * mean:6.2f}  [{100 * lo:6.2f}, {100 * hi:6.2f}]"


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown table: model, probe, seeds, test accuracy mean [min, max]."""
    lines = ["| model | probe | seeds | test accuracy % (mean [min, max]) | selected on validation |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        choices = "; ".join(", ".join(f"{k}={v}" for k, v in c.items()) for c in row["selected"])
        lines.append(f"| {row['model']} | {row['probe']} | {row['seeds']} | {format_row(row)} | {choices} |")
    return lines


def published_lines(benchmark: str) -> list[str]:
    rows = PUBLISHED.get(benchmark, [])
    if not rows:
        return ["No published numbers are listed for this benchmark (see `seqdiff/probes/report.py`: numbers "
                "are added only when checked against the paper's table)."]
    lines = ["| model (published) | test accuracy % | spread | source |", "| --- | --- | --- | --- |"]
    for r in rows:
        spread = f"±{100 * r.spread:.1f}" if r.spread is not None else ""
        lines.append(f"| {r.model} | {100 * r.accuracy:.1f} | {spread} | {r.citation} |")
    return lines


def write_report(out_dir: str | Path, bench, rows: list[dict[str, Any]], command: str,
                 settings: dict[str, Any], notes: list[str] | None = None) -> tuple[Path, Path]:
    """Write out_dir/NAME.json and out_dir/NAME.md; returns their paths."""
    out_dir = Path(out_dir)
    name = bench.name
    counts = {split: [int((data.labels == i).sum()) for i in range(len(bench.classes))]
              for split, data in (("train", bench.train), ("test", bench.test))}
    payload = {
        "benchmark": name, "source": bench.source, "classes": bench.classes, "class_counts": counts,
        "max_len": bench.max_len, "truncation": bench.truncation, "test_split": bench.test_split,
        "protocol": "per seed: stratified 90/10 train/validation split of the training set; hyperparameters "
                    "chosen on validation; top-1 accuracy on the test set; mean and [min, max] over seeds",
        "command": command, "settings": settings, "rows": rows,
        "published": [vars(r) for r in PUBLISHED.get(name, [])], "notes": notes or [],
    }
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    write_atomically(json_path, json.dumps(payload, indent=2) + "\n")
    md = [
        f"# Probes on {name}", "",
        f"Produced by `{command}`", "",
        f"- data: {bench.source}; classes {bench.classes}; train {sum(counts['train'])} "
        f"({counts['train']}), test {sum(counts['test'])} ({counts['test']})",
        f"- test split: {bench.test_split}",
        f"- sequences longer than a model's context: cut to it by rule `{bench.truncation}` "
        f"(counted per row in the JSON, `truncated_sequences`)",
        f"- protocol: {payload['protocol']}", "",
        *table_lines(rows), "",
        "## Published numbers", "", *published_lines(name), "",
    ]
    if notes:
        md += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    write_atomically(md_path, "\n".join(md))
    return json_path, md_path
