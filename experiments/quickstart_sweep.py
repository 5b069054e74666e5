"""Choose the quickstart recipe by a measured sweep: each candidate trains MDLM and AR on the quickstart's data
and is scored on the *validation* play (never the test play), with its training seconds.

    python -m experiments.quickstart_sweep --out reports/quickstart_sweep --run-root runs/quickstart_sweep \
        [--candidate NAME] [--threads 2]

A candidate is a list of `section.key=value` overrides of the quickstart recipe (CANDIDATES below, or
`--extra NAME:key=value,key=value`). Finished runs are reused, so an interrupted sweep resumes where it
stopped. Writes results.json (every run: validation bits per character, training seconds, steps, tokens) and
table.md (the table and the command); the report's README.md is written by hand. The choice of the quickstart
recipe is made by a person from it, under the quickstart's time budget; this command only measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from experiments.quickstart_ladder import score_validation, training_log
from seqdiff.checkpoint import load_checkpoint, read_checkpoint
from seqdiff.config import ConfigError, RunConfig, from_dict, to_dict
from seqdiff.config import apply_overrides as apply_config_overrides
from seqdiff.evaluation.generate import write_atomically
from seqdiff.quickstart import METHODS, NUM_T_SAMPLES, QUICKSTART, finished_run_changes, method_recipe
from seqdiff.training.run import LAST_CHECKPOINT, train

CANDIDATES: dict[str, list[str]] = {
    "baseline": [],
    "lr4e-3": ["train.lr=4e-3"],
    "batch64-500": ["data.batch_size=64", "train.max_steps=500", "train.lr=3e-3"],
    "w192-l3-500": ["model.hidden_size=192", "model.n_layers=3", "model.n_heads=3", "train.max_steps=500"],
    "w256-l2-500": ["model.hidden_size=256", "model.n_layers=2", "model.n_heads=4", "train.max_steps=500"],
    "mask_count": ["method.time_sampling=mask_count"],
    "lr1e-3": ["train.lr=1e-3"],
    "batch16-2000": ["data.batch_size=16", "train.max_steps=2000"],
    # equal cost to the recipe: 16 windows, each scored with a mask and its complement (32 rows per forward)
    "complementary-16": ["method.complementary_masks=true", "data.batch_size=16"],
    "mask_count-complementary-16": ["method.time_sampling=mask_count", "method.complementary_masks=true",
                                    "data.batch_size=16"],
    # session 14, against the 2,000-step bf16 recipe: a depthwise convolution over neighbours (model.local_conv)
    "local_conv5": ["model.local_conv=5"],
    "local_conv9": ["model.local_conv=9"],
    # session 15, against the recipe with local_conv=9: wider kernels
    "local_conv15": ["model.local_conv=15"],
    "local_conv25": ["model.local_conv=25"],
    "conv_mlp": ["model.local_conv_mlp=true"],
    "heads4": ["model.n_heads=4"],
    # session 17, against the 1,100-step recipe with local_conv=9 and local_conv_mlp and no k-mers (the "baseline"
    # row of reports/quickstart_sweep/kmer; `model.kmer_sizes=[]` reproduces it now): k-mer input embeddings
    "kmer3": ["model.kmer_sizes=[3]"],
    "kmer3_5": ["model.kmer_sizes=[3,5]", "model.kmer_buckets=65536"],
    "kmer2_3_4": ["model.kmer_sizes=[2,3,4]", "model.kmer_buckets=65536"],
    "kmer2_3_4_5": ["model.kmer_sizes=[2,3,4,5]", "model.kmer_buckets=65536"],
    # session 28, against the 1,100-step recipe with k-mers (MDLM only, `--methods mdlm`): the library's default
    # estimator (auto: mask_count with mask_count_law=inverse_sqrt) in place of the recipe's antithetic times
    "time_auto": ["method.time_sampling=auto"],
    # session 34, against the recipe with the library's default estimator: the exact (erf) GELU in place of the
    # tanh approximation, whose CPU kernel is the slower one (reports/bench/bench.md's profile; same quality expected)
    "gelu_exact": ["model.activation=gelu"],
}
"""Recipes tried, as overrides of seqdiff.quickstart.QUICKSTART (the preset's width is overridden too). The
recipe changed in session 13 (2,000 steps, train.precision=bf16-if-native): the rows of
reports/quickstart_sweep/results.json were measured against the 1,000-step float32 recipe, which
`train.max_steps=1000 train.precision=auto` reproduces. Since session 36 each method starts from its own learning rate
(seqdiff.quickstart.LEARNING_RATES); the rows before were measured with 2e-3 for both, which `train.lr=2e-3`
reproduces. Since session 44 AR starts from its own step count and rate (MAX_STEPS, LEARNING_RATES: 550 steps at
2e-3); AR's rows from session 36 to 43 were measured at 1,100 steps and 1e-3 (`train.max_steps=1100 train.lr=1e-3`).
Since session 45 MDLM trains 1,000 steps (MAX_STEPS); its rows before were measured at 1,100 (`train.max_steps=1100`).
`method.*` overrides are MDLM's: AR trains without them, and reuses the run of an earlier candidate whose
AR overrides are the same (mask_count's AR run is the baseline's; both complementary candidates' AR run is
complementary-16's, AR at 16 windows per step)."""


def method_overrides(overrides: list[str], method: str) -> list[str]:
    """The overrides that apply to `method`: AR takes no method.* key (they tune the diffusion objective) and no
    model.time_conditioning (it has no noise level to condition on, and refuses one)."""
    diffusion_only = ("method.", "model.time_conditioning=")
    return overrides if method == "mdlm" else [o for o in overrides if not o.startswith(diffusion_only)]


def run_name(name: str, overrides: list[str], method: str, candidates: dict[str, list[str]]) -> str:
    """The folder of this candidate's run of `method`: the first candidate with the same effective overrides."""
    mine = method_overrides(overrides, method)
    return next((other for other, o in candidates.items() if method_overrides(o, method) == mine), name)


def candidate_config(name: str, overrides: list[str], method: str):
    """The candidate's run of `method`: the quickstart's run of it (its own learning rate since session 36) with
    the candidate's overrides."""
    data = apply_config_overrides(to_dict(method_recipe(QUICKSTART, method)),
                                  [*overrides, f"method.name={method}", "model.preset=null"])
    config = from_dict(RunConfig, data)
    t = config.train
    steps = t.max_steps
    config = dataclasses.replace(config, name=f"sweep-{name}-{method}", train=dataclasses.replace(
        t, val_every=min(t.val_every, steps), checkpoint_every=min(t.checkpoint_every, steps),
        warmup_steps=min(t.warmup_steps, steps)))
    return config


def run_candidate(name: str, overrides: list[str], run_root: Path,
                  candidates: dict[str, list[str]] | None = None, methods: tuple[str, ...] = METHODS) -> dict:
    out = {"overrides": overrides, "methods": {}}
    for method in methods:
        folder = run_name(name, overrides, method, candidates or {name: overrides})
        config = candidate_config(folder, method_overrides(overrides, method), method)
        run_dir = run_root / folder / method
        last = run_dir / LAST_CHECKPOINT
        done = last.is_file() and read_checkpoint(last).get("global_step", 0) >= config.train.max_steps
        stale = finished_run_changes(config, run_dir) if done else ""
        if stale:  # e.g. a run root of an earlier session, before the recipe changed: not this candidate's run
            raise ConfigError(f"{run_dir} holds a finished run of another recipe ({stale}); remove it or pass "
                              "another --run-root")
        if not done:
            train(config, run_dir, resume=last.is_file())
        timing = run_dir / "timing.json"
        seconds = json.loads(timing.read_text())["train_seconds"] if timing.is_file() else float("nan")
        model = load_checkpoint(run_dir)
        report = score_validation(model, config.data)
        out["methods"][method] = {
            "valid_bits_per_character": report["bits_per_character"], "bound": report["bound"],
            "train_seconds": seconds, "steps": model.step,
            "parameters": sum(p.numel() for p in model.backbone.parameters()),
            "tokens_seen": model.step * config.data.batch_size * config.data.seq_len,
            "run": f"{folder}/{method}",
            "training_log": training_log(run_dir),  # the validation curve: where a long run starts to overfit
        }
    if {"mdlm", "ar"} <= set(out["methods"]):
        m, a = out["methods"]["mdlm"], out["methods"]["ar"]
        out["relative_gap_bits"] = m["valid_bits_per_character"] / a["valid_bits_per_character"] - 1
    return out


def _cells(run: dict | None) -> tuple[str, str]:
    """(validation bits, training seconds) of one method's run, or dashes where the candidate did not train it."""
    if run is None:
        return "-", "-"
    return f"{run['valid_bits_per_character']:.4f}", f"{run['train_seconds']:.0f}"


def table(results: dict) -> str:
    lines = [f"Made by `{results['command']}` ({results['torch_threads']} torch threads, load average "
             f"{results['load_average_at_start']:.1f} at the start; seconds depend on the machine's load). "
             "Numbers from `results.json`. Bits per character on the validation play (MDLM: NELBO bound with "
             f"{NUM_T_SAMPLES} time samples per block; AR: exact).", "",
             "| candidate | overrides | MDLM valid bits | AR valid bits | gap | MDLM train s | AR train s | params |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results["candidates"].items():
        (m_bits, m_s), (a_bits, a_s) = _cells(r["methods"].get("mdlm")), _cells(r["methods"].get("ar"))
        gap = f"{100 * r['relative_gap_bits']:+.1f}%" if "relative_gap_bits" in r else "-"
        params = next(iter(r["methods"].values()))["parameters"]
        lines.append(f"| {name} | {' '.join(r['overrides']) or '(quickstart recipe)'} | {m_bits} | {a_bits} | "
                     f"{gap} | {m_s} | {a_s} | {params:,} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m experiments.quickstart_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="reports/quickstart_sweep")
    p.add_argument("--run-root", default="runs/quickstart_sweep")
    p.add_argument("--candidate", action="append", help="run only these (names of CANDIDATES or --extra)")
    p.add_argument("--extra", action="append", default=[], help="NAME:key=value,key=value (another candidate)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated methods to train and score (default: both; mdlm for method.* candidates)")
    args = p.parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m)
    if not methods or any(m not in METHODS for m in methods):
        p.error(f"--methods {args.methods!r}: choose from {list(METHODS)}")
    candidates = dict(CANDIDATES)
    for spec in args.extra:
        name, _, body = spec.partition(":")
        if not name or not body:
            p.error(f"--extra {spec!r}: expected NAME:key=value,key=value")
        candidates[name] = body.split(",")
    chosen = args.candidate or list(candidates)
    unknown = [c for c in chosen if c not in candidates]
    if unknown:
        p.error(f"--candidate {unknown}: unknown; choose from {sorted(candidates)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    path = out / "results.json"
    results = json.loads(path.read_text()) if path.is_file() else {"candidates": {}}
    results.update(command="python -m experiments.quickstart_sweep " + shlex.join(argv),
                   torch_threads=torch.get_num_threads(), load_average_at_start=os.getloadavg()[0])
    start = time.perf_counter()
    try:
        for name in chosen:
            print(f"[sweep] {name}: {' '.join(candidates[name]) or '(quickstart recipe)'}", file=sys.stderr)
            results["candidates"][name] = run_candidate(name, candidates[name], Path(args.run_root), candidates,
                                                       methods)
            out.mkdir(parents=True, exist_ok=True)
            write_atomically(path, json.dumps(results, indent=2) + "\n")
            write_atomically(out / "table.md", table(results))
    except ConfigError as e:
        print(f"quickstart_sweep: error: {e}", file=sys.stderr)
        return 2
    print(table(results))
    print(f"[sweep] {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
