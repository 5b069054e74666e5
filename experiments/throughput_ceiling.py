"""How far issue #18's throughput target (seqdiff >= 1.3x the same-shape Hugging Face model) is from what each
checked-in `seqdiff bench` run allows at all, read from the bench.json files those runs wrote.

    python -m experiments.throughput_ceiling --out reports/bench/ceiling [--target 1.3] [BENCH_JSON ...]

Both sides of a pair do the same matmuls per token (same width, depth and vocabulary), so seqdiff can only outrun
the Hugging Face model by spending less of its step outside the matmuls. Were all of seqdiff's model FLOPs run at the
bench's reference matmul rate with nothing else taking time, it would reach `seqdiff.bench.measure.ratio_ceiling`
times the Hugging Face model's measured tokens/s; the target then needs a matmul fraction of target / ceiling.
A fraction above what the step's matmul kernels reach (they run at up to ~95% of the 2048² rate on these hosts,
`bench.md` profiles) means the target cannot be met on that host without fewer FLOPs per token.

Nothing is timed here: the inputs are the medians each run recorded (its tokens/s, model FLOPs per token and matmul
rate). Writes ceiling.json and README.md (the command in the header). With no files named, every CPU bench.json under
reports/bench is read.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from seqdiff.bench.measure import ratio_ceiling
from seqdiff.bench.models import PAIRS
from seqdiff.safe_io import atomic_write_text

ISSUE_TARGET = 1.3


def ceiling_rows(bench: dict[str, Any], name: str, target: float) -> list[dict[str, Any]]:
    """One row per pair of one bench.json: its measured ratio and matmul fraction, the ceiling of the ratio on its
    host, and the matmul fraction `target` would need."""
    rows = []
    for pair, (ours, theirs) in PAIRS.items():
        ceiling = ratio_ceiling(bench["matmul_flops_per_s"], bench["flops_per_token"][ours],
                                bench["train_tokens_per_s"][theirs])
        kernels = (bench.get("profile") or {}).get(ours, {}).get("matmul_kernel_flops_per_s")
        rows.append({"run": name, "pair": pair, "contender": theirs, "vocab_size": bench["config"]["vocab_size"],
                     "precision": bench.get("precision", "float32"), "compile": bench["config"].get("compile", False),
                     "matmul_gflops": bench["matmul_flops_per_s"] / 1e9, "ratio": bench["ratio_vs_hf"][pair],
                     "matmul_fraction": bench["matmul_fraction"][ours], "ceiling": ceiling,
                     "fraction_needed": target / ceiling,
                     "kernel_rate_over_reference": kernels / bench["matmul_flops_per_s"] if kernels else None})
    return rows


def render(rows: list[dict[str, Any]], command: str, target: float) -> str:
    lines = ["# The ceiling of seqdiff / Hugging Face training throughput, per checked-in bench run\n",
             f"Made by `{command}` from the bench.json files named in the first column (their own headers say how and "
             "where each was measured). `ceiling`: the ratio seqdiff would reach were all of its model FLOPs run at "
             "that run's reference matmul rate with nothing else taking time (an upper bound); `needed`: the matmul "
             f"fraction seqdiff would need for {target:g}x, i.e. {target:g} / ceiling; `kernels`: the rate of the "
             "matmul kernels inside seqdiff's one profiled step over the reference rate (one step, so noisy; a "
             "needed fraction above it cannot be reached even with no time outside the matmuls).\n",
             "| run | pair | vocab | precision | matmul GFLOP/s | ratio | matmul fraction | ceiling | needed for "
             f"{target:g}x | kernels |", "|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['pair']} | {r['vocab_size']:,} | {r['precision']}"
                     f"{', compiled' if r['compile'] else ''} | {r['matmul_gflops']:.0f} | {r['ratio']:.3f} | "
                     f"{r['matmul_fraction']:.2f} | {r['ceiling']:.2f} | {r['fraction_needed']:.2f} | "
                     + (f"{r['kernel_rate_over_reference']:.2f} |" if r["kernel_rate_over_reference"] else "|"))
    return "\n".join(lines) + "\n"


def default_inputs(root: Path) -> list[Path]:
    found = sorted(root.rglob("bench.json"))
    return [p for p in found if json.loads(p.read_text()).get("device") == "cpu"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench", nargs="*", type=Path, help="bench.json files (default: every CPU one under reports/bench)")
    p.add_argument("--out", type=Path, default=Path("reports/bench/ceiling"))
    p.add_argument("--target", type=float, default=ISSUE_TARGET, help="the ratio asked for (issue #18: 1.3)")
    args = p.parse_args(argv)
    if not args.target > 0:
        p.error(f"--target must be > 0, got {args.target}")
    inputs = args.bench or default_inputs(Path("reports/bench"))
    if not inputs:
        p.error("no bench.json files to read: name some, or run from the repository root")
    rows = []
    for path in inputs:
        try:
            bench = json.loads(path.read_text())
            rows += ceiling_rows(bench, str(path.parent), args.target)
        except OSError as e:
            p.error(f"{path}: cannot be read ({e.strerror or e})")
        except (ValueError, KeyError, TypeError) as e:
            p.error(f"{path}: not a seqdiff bench.json with training figures ({type(e).__name__}: {e})")
    command = shlex.join(["python", "-m", "experiments.throughput_ceiling", *argv])
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "ceiling.json", json.dumps({"command": command, "target": args.target,
                                                            "rows": rows}, indent=2) + "\n")
    atomic_write_text(args.out / "README.md", render(rows, command, args.target))
    print(render(rows, command, args.target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
