"""The quickstart's training step with and without DiT.last_block_at_outputs, alternating step by step.

    python -m experiments.last_block_time [--out reports/bench/quickstart_step/last_block] [--pairs 150]
        [--threads 1]

Why alternate: on a shared host the speed drifts by 10-30% within minutes, more than the effect measured here, and
two variants in separate processes (experiments.quickstart_step_time) see different stretches of that drift. The
switch is a runtime attribute of the backbone, so one process can time step A, step B, step A, ... on the same
weights, batch and memory, and the ratio of the two steps of a pair sees the same host. The order within a pair
alternates too (AB, BA, ...), so a drift across one pair falls on each side equally often.

For each method of the quickstart (MDLM, AR), one process (the quickstart recipe: exact GELU, local convolutions
before attention and MLP, k-mers; one torch thread, as each model gets when the quickstart trains both side by
side on 2 cores): `--pairs` pairs of training steps after 5 warm-up steps. AR never asks for selected positions,
so its switch does nothing: its ratios show how far this measurement strays when nothing changes (the control).
Writes results.json and README.md under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from experiments.quickstart_step_time import cpu_name, recipe_step
from experiments.report import command_line

METHODS = ("mdlm", "ar")


def time_pairs(method: str, pairs: int, threads: int) -> dict:
    """Per-pair step seconds with the switch off and on, alternating, in this process."""
    from seqdiff.host_memory import reuse_freed_memory

    step, module, _, _ = recipe_step(method, [], threads)
    backbone = module.backbone
    off, on = [], []
    with reuse_freed_memory():  # as the quickstart trains on CPU
        for switch in (False, True, False, True, False):  # warm-up, both paths
            backbone.last_block_at_outputs = switch
            step()
        for i in range(pairs):
            for switch in ((False, True) if i % 2 == 0 else (True, False)):
                backbone.last_block_at_outputs = switch
                start = time.perf_counter()
                step()
                (on if switch else off).append(time.perf_counter() - start)
    ratios = [a / b for a, b in zip(off, on, strict=True)]
    return {"method": method, "off_s": off, "on_s": on, "median_off_ms": 1000 * statistics.median(off),
            "median_on_ms": 1000 * statistics.median(on), "median_ratio": statistics.median(ratios),
            "ratio_of_sums": sum(off) / sum(on), "quartiles_ratio": statistics.quantiles(ratios, n=4)}


def render(results: dict) -> str:
    lines = [
        "# The quickstart's training step with and without `DiT.last_block_at_outputs`, alternating",
        "",
        f"Made by `{results['command']}` on {results['date']} ({results['cpu']}, {results['threads']} torch "
        f"thread(s), load average {results['load_average_at_start']:.2f} at the start, "
        f"{results['load_average_at_end']:.2f} at the end; {results['seconds']:.0f} s). Numbers from `results.json`.",
        "",
        f"One process per method times {results['pairs']} pairs of training steps of the quickstart recipe (loss, "
        "backward, clipping, AdamW, EMA), the switch off and on in turn (order alternating from pair to pair), after "
        "5 warm-up steps. Speed-up: step time with the switch off over step time with it on. AR never selects "
        "positions: its row is the control (what the measurement reads when nothing changes).",
        "",
        "| model | step, switch off (ms, median) | step, switch on (ms, median) | speed-up, median of pairs "
        "[quartiles] | speed-up, total time |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results["methods"]:
        q = r["quartiles_ratio"]
        lines.append(f"| {r['method']} | {r['median_off_ms']:.1f} | {r['median_on_ms']:.1f} | "
                     f"**{r['median_ratio']:.3f}** [{q[0]:.3f}, {q[2]:.3f}] | {r['ratio_of_sums']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m experiments.last_block_time", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="reports/bench/quickstart_step/last_block")
    p.add_argument("--pairs", type=int, default=150)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--methods", default="mdlm,ar", help="comma-separated, of " + ", ".join(METHODS))
    args = p.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if not methods or any(m not in METHODS for m in methods) or args.pairs < 2 or args.threads < 1:
        p.error(f"--methods takes {', '.join(METHODS)}; --pairs >= 2; --threads >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, load = time.perf_counter(), os.getloadavg()[0]
    rows = []
    for method in methods:
        rows.append(time_pairs(method, args.pairs, args.threads))
        print(f"[last_block_time] {method}: speed-up {rows[-1]['median_ratio']:.3f} (median of pairs)",
              file=sys.stderr)
    results = {"command": command_line("last_block_time", argv),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu_name(), "threads": args.threads,
               "pairs": args.pairs, "load_average_at_start": load, "load_average_at_end": os.getloadavg()[0],
               "seconds": time.perf_counter() - start, "methods": rows}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "README.md").write_text(render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
