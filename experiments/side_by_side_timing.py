"""The quickstart's two trainings one after the other on every thread, against side by side in two processes.

    python -m experiments.side_by_side_timing --out reports/quickstart_side_by_side/timing

Each contender trains the quickstart recipe's MDLM and AR runs for --steps steps from scratch through
`seqdiff.training.run.train` (data, Lightning, EMA and the final checkpoint included; no validation), timed on
the wall clock from the first call to both runs' end:

- `one after the other`: MDLM, then AR, in this process on all torch threads (the quickstart's --sequential);
- `side by side`: AR in a second process (seqdiff.training.side_by_side, its start-up included) while MDLM trains
  here, the threads split (the quickstart's default on a CPU with two threads or more).

The two are timed in rounds, the order alternating, and the speed-up is the median of per-round ratios (the
machine is shared). Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from experiments.report import command_line, write_results
from seqdiff.bench.measure import load_average, rotated, spread
from seqdiff.quickstart import QUICKSTART
from seqdiff.training.run import train
from seqdiff.training.side_by_side import ChildRun, split_threads

CONTENDERS = ("one after the other", "side by side")


def configs(steps: int) -> dict:
    """The quickstart's two recipes for `steps` steps, without validation or progress bar."""
    train_cfg = dataclasses.replace(QUICKSTART.train, max_steps=steps, val_every=10 * steps,
                                    checkpoint_every=steps, progress_bar=False)
    return {m: dataclasses.replace(QUICKSTART, name=f"timing-{m}", train=train_cfg,
                                   method=dataclasses.replace(QUICKSTART.method, name=m)) for m in ("mdlm", "ar")}


def one_after_the_other(cfgs: dict, root: Path, threads: int) -> float:
    torch.set_num_threads(threads)
    start = time.perf_counter()
    for method, cfg in cfgs.items():
        train(cfg, root / method)
    return time.perf_counter() - start


def side_by_side(cfgs: dict, root: Path, threads: int) -> float:
    here, there = split_threads(threads)
    start = time.perf_counter()
    child = ChildRun(cfgs["ar"], root / "ar", resume=False, threads=there, log=root / "ar.log")
    torch.set_num_threads(here)
    try:
        train(cfgs["mdlm"], root / "mdlm")
    finally:
        status = child.wait()
        torch.set_num_threads(threads)
    child.check(status)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/quickstart_side_by_side/timing")
    parser.add_argument("--steps", type=int, default=120, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    if split_threads(threads) is None:
        print("side_by_side_timing: needs two torch threads or more", file=sys.stderr)
        return 2
    torch.set_float32_matmul_precision("high")
    cfgs = configs(args.steps)
    timers = {"one after the other": one_after_the_other, "side by side": side_by_side}
    seconds: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    loads = []
    for r in range(args.rounds):
        for contender in rotated(list(CONTENDERS), r):
            root = Path(tempfile.mkdtemp(prefix="side_by_side_"))
            try:
                loads.append(load_average())
                seconds[contender].append(timers[contender](cfgs, root, threads))
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print(f"round {r}: {contender}: {seconds[contender][-1]:.1f} s", file=sys.stderr)
    ratios = [a / b for a, b in zip(seconds["one after the other"], seconds["side by side"])]
    results = {"command": command_line("side_by_side_timing", argv), "steps": args.steps, "rounds": args.rounds,
               "torch_threads": threads, "split": list(split_threads(threads)), "cpu_count": os.cpu_count(),
               "processor": platform.processor() or platform.machine(), "load_averages": loads,
               "seconds": {c: spread(v) for c, v in seconds.items()}, "speedup": spread(ratios)}
    med = {c: results["seconds"][c]["median"] for c in CONTENDERS}
    table = "\n".join([
        f"Made by `{results['command']}` ({threads} torch threads on {os.cpu_count()} cores, split "
        f"{results['split'][0]} + {results['split'][1]} side by side; load averages at each start: {loads}).",
        "",
        f"The quickstart recipe's MDLM and AR, {args.steps} training steps each from scratch, wall-clock seconds for "
        f"both (median of {args.rounds} rounds, order alternating):",
        "",
        "| contender | seconds (median) | min | max |",
        "|---|---|---|---|",
        *(f"| {c} | {med[c]:.1f} | {results['seconds'][c]['min']:.1f} | {results['seconds'][c]['max']:.1f} |"
          for c in CONTENDERS),
        "",
        f"Speed-up of side by side (median of per-round ratios): **{results['speedup']['median']:.2f}x** "
        f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)}).",
        "",
    ])
    write_results(args.out, results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
