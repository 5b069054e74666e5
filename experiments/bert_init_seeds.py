"""One recipe of `experiments.bert_init`, several fine-tuning seeds: the probe test per seed and a rule over seeds.

    python -m experiments.bert_init_seeds REPORT_DIR... --counted-seeds 1,2,3 --min-met 2 --out DIR

Why: one seed's non-inferiority test does not cover the variation between fine-tuning seeds, which for this
recipe is as large as the margin. A rule declared before the seeds are trained ("the recipe is no worse when
the test is met for at least K of the counted seeds") turns several runs into one verdict. This command
computes that verdict from the reports' results.json files, so the figure is made by a command and not
copied by hand.

Checks before writing anything: every REPORT_DIR holds a results.json of `experiments.bert_init`; all share
one recipe (the resolved config without train.seed and sample.seed) and one margin; each counted seed
appears exactly once. Reports whose seed is not counted (e.g. a run whose setting was chosen after seeing
its result) are listed but do not enter the verdict.

Writes <out>/results.json, <out>/table.md (its numbers as tables) and <out>/intervals.png; the report's
README.md is written by hand.
"""

from __future__ import annotations

import argparse
import copy
import json
import shlex
import statistics
import sys
from pathlib import Path

from seqdiff.evaluation.generate import write_atomically
from seqdiff.evaluation.stats import noninferiority
from seqdiff.figures import pyplot, save_figure


class SeedReportError(ValueError):
    """Reports that cannot be combined under one rule."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.bert_init_seeds", description=__doc__.split("\n\n")[0])
    p.add_argument("reports", nargs="+", help="report directories of experiments.bert_init (each with results.json)")
    p.add_argument("--counted-seeds", required=True,
                   help="comma-separated train.seed values the rule counts, fixed before they were trained")
    p.add_argument("--min-met", type=int, required=True,
                   help="the recipe is 'no worse' when the test is met for at least this many counted seeds")
    p.add_argument("--declared-in", default=None,
                   help="where the rule was declared before the counted seeds were trained (e.g. a commit)")
    p.add_argument("--out", required=True, help="directory for results.json, table.md and intervals.png")
    return p


def load_report(directory: Path) -> dict:
    path = directory / "results.json"
    if not path.is_file():
        raise SeedReportError(f"{directory}: no results.json (a report directory of experiments.bert_init is needed)")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SeedReportError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(result, dict):
        raise SeedReportError(f"{path}: not a experiments.bert_init result (a JSON object is needed)")
    missing = [k for k in ("config", "probes", "after", "noninferiority_margin", "command") if k not in result]
    if missing:
        raise SeedReportError(f"{path}: not a experiments.bert_init result (missing {', '.join(missing)})")
    return result


def recipe_without_seed(result: dict) -> dict:
    """The resolved config without what `experiments.bert_init --seed` sets (train.seed and sample.seed), plus the
    WiSE-FT weight the models were scored with (`--encoder-alpha`)."""
    config = copy.deepcopy(result["config"])
    config["train"].pop("seed", None)
    config.get("sample", {}).pop("seed", None)
    config["encoder_alpha"] = result.get("encoder_alpha", 1.0)  # WiSE-FT after training is part of the recipe
    return config


def _first_difference(a, b, prefix: str = "") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
    return f"{prefix.rstrip('.')}: {a!r} vs {b!r}"


def seed_row(directory: Path, result: dict, counted: set[int]) -> dict:
    seed = int(result["config"]["train"]["seed"])
    margin = result["noninferiority_margin"]
    probes = {}
    for task, p in result["probes"].items():
        interval = p["difference_interval"]
        probes[task] = {"before": p["before"]["accuracy"], "after": p["after"]["accuracy"],
                        "difference": p["after"]["accuracy"] - p["before"]["accuracy"], "interval": interval,
                        "outcome": noninferiority(interval, margin)}
    return {"report": str(directory), "seed": seed, "counted": seed in counted,
            "test_bound": result["after"]["test"]["nll_nats_per_token"], "probes": probes,
            "met": all(p["outcome"] == "met" for p in probes.values()), "command": result["command"]}


def combine(directories: list[Path], counted: set[int], min_met: int) -> dict:
    """The rows and the verdict; raises SeedReportError when the reports do not form one recipe."""
    if not 1 <= min_met <= len(counted):
        raise SeedReportError(f"--min-met must lie in [1, {len(counted)}] (the number of counted seeds), got {min_met}")
    results = [load_report(d) for d in directories]
    reference = recipe_without_seed(results[0])
    for d, r in zip(directories[1:], results[1:]):
        if recipe_without_seed(r) != reference:
            raise SeedReportError(f"{d} and {directories[0]} are not the same recipe (besides the seed): "
                                  + _first_difference(reference, recipe_without_seed(r)))
        if r["noninferiority_margin"] != results[0]["noninferiority_margin"]:
            raise SeedReportError(f"{d}: margin {r['noninferiority_margin']} differs from {directories[0]}'s "
                                  f"{results[0]['noninferiority_margin']}")
    rows = sorted((seed_row(d, r, counted) for d, r in zip(directories, results)), key=lambda row: row["seed"])
    counted_rows = [row for row in rows if row["counted"]]
    seen = [row["seed"] for row in counted_rows]
    if sorted(seen) != sorted(counted):
        raise SeedReportError(f"--counted-seeds {sorted(counted)}: the reports hold counted seeds {seen} "
                              f"(each counted seed must appear exactly once)")
    met = sum(row["met"] for row in counted_rows)
    tasks = list(rows[0]["probes"])
    spread = {task: {"mean": statistics.fmean(row["probes"][task]["difference"] for row in counted_rows),
                     "min": min(row["probes"][task]["difference"] for row in counted_rows),
                     "max": max(row["probes"][task]["difference"] for row in counted_rows)} for task in tasks}
    bounds = [row["test_bound"] for row in counted_rows]
    return {"margin": results[0]["noninferiority_margin"], "counted_seeds": sorted(counted), "min_met": min_met,
            "met_count": met, "no_worse_shown": met >= min_met, "rows": rows, "difference_over_counted": spread,
            "test_bound_over_counted": {"mean": statistics.fmean(bounds), "min": min(bounds), "max": max(bounds)}}


def table(summary: dict, command: str) -> str:
    """table.md: the numbers of results.json as tables (the report's README.md is written by hand)."""
    tasks = list(summary["rows"][0]["probes"])
    declared = f" (declared in {summary['declared_in']})" if summary.get("declared_in") else ""
    lines = [f"Made by `{command}`; numbers from `results.json`. Rule{declared}: margin {summary['margin']:g}, "
             f"counted seeds {summary['counted_seeds']}, at least {summary['min_met']} met needed.", "",
             "| seed | counted | test bound (nats / token) | "
             + " | ".join(f"{t} after - before [95%] | outcome" for t in tasks) + " | test met |",
             "| ---: | --- | ---: | " + " | ".join("---: | ---" for _ in tasks) + " | --- |"]
    for row in summary["rows"]:
        cells = [f"{row['probes'][t]['difference']:+.3f} [{row['probes'][t]['interval'][0]:+.3f}, "
                 f"{row['probes'][t]['interval'][1]:+.3f}] | {row['probes'][t]['outcome']}" for t in tasks]
        lines.append(f"| {row['seed']} | {'yes' if row['counted'] else 'no'} | {row['test_bound']:.3f} | "
                     + " | ".join(cells) + f" | {'yes' if row['met'] else 'no'} |")
    lines += ["", f"Met for {summary['met_count']} of {len(summary['counted_seeds'])} counted seeds; "
              f"no_worse_shown: {summary['no_worse_shown']}.", "",
              "| over the counted seeds | mean | min | max |", "| --- | ---: | ---: | ---: |"]
    lines += [f"| {task} after - before | {s['mean']:+.3f} | {s['min']:+.3f} | {s['max']:+.3f} |"
              for task, s in summary["difference_over_counted"].items()]
    b = summary["test_bound_over_counted"]
    lines += [f"| test bound after (nats / token) | {b['mean']:.3f} | {b['min']:.3f} | {b['max']:.3f} |", ""]
    lines += [f"- seed {row['seed']}: `{row['report']}`, made by `{row['command']}`" for row in summary["rows"]]
    return "\n".join(lines) + "\n"


def interval_figure(summary: dict, out: Path) -> None:
    """One panel per probe: each seed's 95% interval of after - before, with 0 and -margin marked."""
    plt = pyplot()

    tasks = list(summary["rows"][0]["probes"])
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.5 * len(tasks), 0.5 * len(summary["rows"]) + 1.8),
                             sharey=True, squeeze=False)
    colors = {"met": "tab:green", "worse": "tab:red", "inconclusive": "tab:orange"}
    for ax, task in zip(axes[0], tasks):
        for y, row in enumerate(summary["rows"]):
            p = row["probes"][task]
            ax.plot(p["interval"], [y, y], color=colors[p["outcome"]], lw=3, alpha=0.9 if row["counted"] else 0.4)
            ax.plot([p["difference"]], [y], "o", color="black", mfc="black" if row["counted"] else "white")
        ax.axvline(0, color="gray", lw=1)
        ax.axvline(-summary["margin"], color="tab:red", ls="--", lw=1)
        ax.set(title=task, xlabel="accuracy after - before (95% interval)")
        ax.grid(alpha=0.3, axis="x")
    axes[0][0].set_yticks(range(len(summary["rows"])),
                          [f"seed {row['seed']}" + ("" if row["counted"] else " (not counted)")
                           for row in summary["rows"]])
    fig.suptitle("frozen-embedding probes: green met, red significantly worse, orange inconclusive;\n"
                 f"dashed line: -margin ({-summary['margin']:g}); open dot: seed not counted", fontsize=9)
    fig.tight_layout()
    save_figure(fig, out)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        counted = {int(s) for s in args.counted_seeds.split(",") if s.strip()}
    except ValueError:
        parser.error(f"--counted-seeds must be comma-separated integers, got {args.counted_seeds!r}")
    if not counted:
        parser.error("--counted-seeds names no seed")
    try:
        summary = combine([Path(d) for d in args.reports], counted, args.min_met)
    except SeedReportError as e:
        parser.error(str(e))
    command = shlex.join(["python", "-m", "experiments.bert_init_seeds", *argv])
    summary["command"] = command
    summary["declared_in"] = args.declared_in
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "results.json", json.dumps(summary, indent=2) + "\n")
    interval_figure(summary, out / "intervals.png")
    write_atomically(out / "table.md", table(summary, command))
    print(table(summary, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
