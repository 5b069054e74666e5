"""Probe reports: a printed table, `NAME.json` (every number) and `NAME.md` (the table for people),
with published numbers next to ours where we have them. Tables, plots and goals show the benchmark's headline
metric (`row["metric"]`, accuracy unless the benchmark declares another); the JSON keeps accuracy as well.
A benchmark name with a slash (`nt/H3`) is written as `nt_H3.json`.

Published numbers (`seqdiff/probes/published.py`, each row with its source) are printed for the Genomic
Benchmarks datasets.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqdiff.atomic import write_atomically
from seqdiff.figures import pyplot, save_figure
from seqdiff.probes.genomic_benchmarks import ALIASES, DATASETS
from seqdiff.probes.metrics import DEFAULT_METRIC, get_metric
from seqdiff.probes.published import PUBLISHED, PublishedRow  # noqa: F401  (PublishedRow: re-exported)
from seqdiff.safe_io import check_output_file, written_together


def metric_of(rows_or_row: list[dict[str, Any]] | dict[str, Any]) -> str:
    """The headline metric of a row (or of the first of a list of rows); rows written before metrics existed
    are accuracy rows."""
    row = rows_or_row[0] if isinstance(rows_or_row, list) else rows_or_row
    return row.get("metric", DEFAULT_METRIC)


def headline(row: dict[str, Any], stat: str = "mean") -> float:
    """The row's headline test score: `stat` is mean, min or max over seeds."""
    return row[f"test_{metric_of(row)}_{stat}"]


def metric_label(rows: list[dict[str, Any]]) -> str:
    return get_metric(metric_of(rows)).label if rows else get_metric(DEFAULT_METRIC).label


def format_row(row: dict[str, Any]) -> str:
    mean, lo, hi = headline(row, "mean"), headline(row, "min"), headline(row, "max")
    return f"{100 * mean:6.2f}  [{100 * lo:6.2f}, {100 * hi:6.2f}]"


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown table: model, probe, seeds, headline test metric mean [min, max]."""
    lines = [f"| model | probe | seeds | {metric_label(rows)} (mean [min, max]) | selected on validation |",
             "| --- | --- | --- | --- | --- |"]
    for row in rows:
        choices = "; ".join(", ".join(f"{k}={v}" for k, v in c.items()) for c in row["selected"])
        lines.append(f"| {row['model']} | {row['probe']} | {row['seeds']} | {format_row(row)} | {choices} |")
    return lines


def published_lines(benchmark: str) -> list[str]:
    benchmark = ALIASES.get(benchmark, benchmark)
    if benchmark not in DATASETS:
        return ["Published rows are kept for the Genomic Benchmarks datasets only; none for this benchmark."]
    rows = PUBLISHED.get(benchmark, [])
    if not rows:
        return ["No published numbers are listed for this benchmark (see `seqdiff/probes/report.py`: numbers "
                "are added only when checked against the paper's table)."]
    lines = ["| model (published) | test accuracy % | spread | source |", "| --- | --- | --- | --- |"]
    for r in rows:
        spread = f"±{100 * r.spread:.1f}" if r.spread is not None else ""
        lines.append(f"| {r.model} | {100 * r.accuracy:.1f} | {spread} | {r.citation} |")
    return lines


def goal_lines(rows: list[dict[str, Any]], finetune_target: float = 0.96) -> list[str]:
    """The issue's goals, checked on the rows: each pretrained frozen probe against the random-init frozen probe,
    the k-mer and the one-hot baseline (mean headline test metric); the best fine-tuned mean accuracy against
    `finetune_target` (an accuracy target, so only checked when the headline is accuracy)."""
    def mean(r):
        return headline(r)

    what_metric = "" if not rows or metric_of(rows) == DEFAULT_METRIC else f" {metric_of(rows)}"
    unit = get_metric(metric_of(rows)).unit if rows else "%"

    random = next((r for r in rows if r["probe"] == "frozen" and r["pretrained"] is False), None)
    kmer = next((r for r in rows if r["probe"] == "kmer"), None)
    onehot = next((r for r in rows if r["probe"] == "onehot"), None)
    lines = []
    for r in rows:
        if r["probe"] != "frozen" or not r["pretrained"]:
            continue
        for other, what in ((random, "random-init frozen probe"), (kmer, "k-mer baseline"),
                            (onehot, "one-hot baseline")):
            if other is None:
                continue
            verdict = "met" if mean(r) > mean(other) else "NOT met"
            lines.append(f"{r['model']} frozen probe{what_metric} {100 * mean(r):.2f}{unit} vs {what} "
                         f"{100 * mean(other):.2f}{unit}: beats it — {verdict}")
    tuned = [r for r in rows if r["probe"] == "finetune" and r["pretrained"]]
    if tuned and not what_metric:
        best = max(tuned, key=mean)
        verdict = "met" if mean(best) >= finetune_target else "NOT met"
        lines.append(f"best fine-tuned pretrained model {best['model']}: {100 * mean(best):.2f}% vs the "
                     f"{100 * finetune_target:.0f}% target — {verdict}")
    return lines


def plot_rows(path: Path, rows: list[dict[str, Any]], title: str) -> None:
    """Horizontal bars: mean headline test metric per row, whiskers from the min to the max over seeds."""
    plt = pyplot()

    labels = [f"{r['model'][:48]} / {r['probe']}" for r in rows]
    means = [100 * headline(r) for r in rows]
    lo = [100 * (headline(r) - headline(r, "min")) for r in rows]
    hi = [100 * (headline(r, "max") - headline(r)) for r in rows]
    metric = get_metric(metric_of(rows))
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.2))
    ax.barh(range(len(rows)), means, xerr=[lo, hi], color="#4c72b0", capsize=3)
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(max(100 * metric.lowest, min(means) - 10), 100)
    label = "test top-1 accuracy %" if metric_of(rows) == DEFAULT_METRIC else metric.label
    ax.set_xlabel(f"{label} (mean; whiskers: min, max over seeds)")
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def protocol_text(metric: str) -> str:
    """The protocol in one line, for the JSON and the Markdown (unchanged for accuracy benchmarks)."""
    if metric == DEFAULT_METRIC:
        return ("per seed: stratified 90/10 train/validation split of the training set; hyperparameters chosen on "
                "validation; top-1 accuracy on the test set; mean and [min, max] over seeds")
    return ("per seed: stratified 90/10 train/validation split of the training set; hyperparameters chosen on "
            f"validation accuracy; {metric} on the test set (top-1 accuracy recorded too); mean and [min, max] "
            "over seeds")


def report_paths(out_dir: str | Path, name: str) -> tuple[Path, Path, Path]:
    """The JSON, Markdown and PNG files of benchmark `name`'s report in `out_dir` (nt/H3 -> nt_H3.*)."""
    stem = name.replace("/", "_")
    out_dir = Path(out_dir)
    return out_dir / f"{stem}.json", out_dir / f"{stem}.md", out_dir / f"{stem}.png"


def check_report_dir(out_dir: str | Path, name: str) -> None:
    """Refuse, before any probe runs, an --out where the report cannot be written (a file, under a file, a folder
    without write permission, a report name taken by a folder). Creates nothing."""
    for path in report_paths(out_dir, name):
        check_output_file(path, "probe report")


def write_report(out_dir: str | Path, bench, rows: list[dict[str, Any]], command: str,
                 settings: dict[str, Any], notes: list[str] | None = None) -> tuple[Path, Path]:
    """Write out_dir/NAME.json, NAME.md and NAME.png; returns the JSON and Markdown paths."""
    name = bench.name
    counts = {split: [int((data.labels == i).sum()) for i in range(len(bench.classes))]
              for split, data in (("train", bench.train), ("test", bench.test))}
    payload = {
        "benchmark": name, "source": bench.source, "classes": bench.classes, "class_counts": counts,
        "max_len": bench.max_len, "truncation": bench.truncation, "test_split": bench.test_split,
        "metric": bench.metric, "protocol": protocol_text(bench.metric),
        "command": command, "settings": settings, "rows": rows,
        "published": [vars(r) for r in PUBLISHED.get(name, [])], "notes": [*(notes or []), *bench.notes],
    }
    json_path, md_path, png_path = report_paths(out_dir, name)
    goals = goal_lines(rows)
    payload["goals"] = goals
    md = [
        f"# Probes on {name}", "",
        f"Produced by `{command}`", "",
        f"- data: {bench.source}; classes {bench.classes}; train {sum(counts['train'])} "
        f"({counts['train']}), test {sum(counts['test'])} ({counts['test']})",
        f"- test split: {bench.test_split}",
        f"- sequences longer than a model's context: cut to it by rule `{bench.truncation}` "
        f"(counted per row in the JSON, `truncated_sequences`)",
        f"- protocol: {payload['protocol']}",
        *([f"- small-data check: each seed draws {settings['train_size']} training sequences (stratified) before "
           "its 90/10 split; the test set is the full one"] if settings.get("train_size") else []),
        *([f"- the frozen, k-mer and one-hot rows chose C, the layer and k by {settings['cv_folds']}-fold "
           "cross-validation over each seed's train and validation rows pooled, then refit on all of them (their "
           "'val' is the mean fold accuracy); the fine-tuned and CNN rows chose on the 90/10 split"]
          if (settings.get("cv_folds") or 0) > 1 else []),
        *([f"- masked reading: each base's features come from one of {settings['mask_stride']} passes, the one "
           f"that masked it (one base in {settings['mask_stride']} masked per pass)"]
          if (settings.get("mask_stride") or 0) > 1 else []), "",
        *table_lines(rows), "",
        f"![{'test accuracy' if bench.metric == DEFAULT_METRIC else metric_label(rows)} per row]({png_path.name})",
        "",
        *(["## Goals", "", *[f"- {g}" for g in goals], ""] if goals else []),
        "## Published numbers", "", *published_lines(name), "",
    ]
    notes = [*(notes or []), *bench.notes]
    if notes:
        md += ["## Notes", "", *[f"- {n}" for n in notes], ""]
    with written_together():  # a Ctrl-C here takes effect after the three files
        write_atomically(json_path, json.dumps(payload, indent=2) + "\n")
        plot_rows(png_path, rows, f"{name}: probes and baselines")
        write_atomically(md_path, "\n".join(md))
    return json_path, md_path
