"""The quickstart's training step, timed under variants of its recipe and of the process, side by side.

    python -m experiments.quickstart_step_time --out reports/bench/quickstart_step [--rounds 4] [--steps 30]
        [--threads 1] [--variant NAME ...] [--task step|eval]

A variant (VARIANTS below) is a list of `section.key=value` overrides of the quickstart recipe (seqdiff.quickstart)
and whether the step runs inside `seqdiff.host_memory.reuse_freed_memory()`. Each round runs every
variant once, each in a fresh process (a mmap threshold set by hand cannot be unset), in an order that rotates
from round to round; each process times the recipe's training step (loss, backward, gradient clipping, AdamW,
EMA update, as the trainer runs them) for MDLM and AR, `--steps` steps after 5 warm-up steps, at `--threads`
torch threads (1: what each model gets when the quickstart trains both side by side on 2 cores). Reports the
median step time, minor page faults per step and peak RSS of each variant, and the median of the per-round ratios
of the first variant's step time to each one's (> 1: faster than the first). `--task eval` times instead one
evaluation of the test play per process, as the quickstart scores it (evaluate_batches' loop). Writes results.json
and README.md (the command in its header).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from seqdiff.quickstart import NUM_T_SAMPLES

METHODS = ("mdlm", "ar")
VARIANTS: dict[str, dict] = {
    "tanh_gelu": {"overrides": ["model.activation=gelu_tanh"], "reuse_memory": False},  # the recipe to session 33
    "tanh_gelu_reuse": {"overrides": ["model.activation=gelu_tanh"], "reuse_memory": True},
    "exact_gelu": {"overrides": ["model.activation=gelu"], "reuse_memory": False},
    "exact_gelu_reuse": {"overrides": ["model.activation=gelu"], "reuse_memory": True},
    # session 42: bigger models for a compute-matched comparison at long budgets (reports/text/ladder)
    "deep4": {"overrides": ["model.n_layers=4"], "reuse_memory": False},
    "wide256": {"overrides": ["model.hidden_size=256", "model.n_heads=4"], "reuse_memory": False},
    # session 43: blocks of 256 characters at the same characters a step (reports/quickstart_sweep/block_length)
    "block256": {"overrides": ["data.seq_len=256", "model.max_seq_len=256", "data.batch_size=16"],
                 "reuse_memory": False},
}


def recipe_step(method: str, overrides: list[str], threads: int):
    """(step, module, cfg, tokenizer): one training step of the quickstart recipe with `overrides` (loss, backward,
    clipping, AdamW, EMA) on a fixed random batch, as a closure; the module, its config and its tokenizer."""
    import torch

    from seqdiff.config import RunConfig, apply_overrides, from_dict, to_dict
    from seqdiff.methods.base import Batch
    from seqdiff.optim import adamw_with_warmup, decay_groups, lr_multiplier
    from seqdiff.quickstart import QUICKSTART
    from seqdiff.tokenizers import build_tokenizer
    from seqdiff.training.module import SeqDiffModule

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = from_dict(RunConfig, apply_overrides(to_dict(QUICKSTART), [*overrides, f"method.name={method}"]))
    tokenizer = build_tokenizer(cfg.data.tokenizer)
    module = SeqDiffModule(model=to_dict(cfg.model), method=to_dict(cfg.method), train=to_dict(cfg.train),
                           tokenizer=tokenizer.to_dict(), seq_len=cfg.data.seq_len)
    backbone, loss_method = module.backbone, module.method
    params = [p for p in backbone.parameters() if p.requires_grad]
    optimizer, _ = adamw_with_warmup(decay_groups(params, cfg.train.weight_decay), lr_multiplier(1), lr=cfg.train.lr)
    shadow = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, tokenizer.vocab_size - 2, (cfg.data.batch_size, cfg.data.seq_len), generator=generator)

    def step() -> None:
        out = loss_method.loss(backbone, Batch(input_ids=ids), generator)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.train.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        torch._foreach_lerp_(shadow, [p.detach() for p in params], 1 - cfg.train.ema_decay)

    return step, module, cfg, tokenizer


def worker(variant: dict, method: str, steps: int, threads: int, task: str = "step") -> dict:
    """One process: `steps` timed training steps of the quickstart recipe (with the variant's overrides), or
    (task "eval") one timed evaluation of the test play as the quickstart scores it (untrained weights: the
    work does not depend on them)."""
    import contextlib
    import resource

    from seqdiff.host_memory import reuse_freed_memory

    step, module, cfg, tokenizer = recipe_step(method, variant["overrides"], threads)
    context = reuse_freed_memory() if variant["reuse_memory"] else contextlib.nullcontext(False)
    if task == "eval":
        return _eval_worker(module, cfg, tokenizer, context, method)
    with context as applied:
        for _ in range(5):
            step()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"method": method, "reuse_applied": bool(applied), "step_s": statistics.median(times),
            "faults_per_step": faults / steps,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _eval_worker(module, cfg, tokenizer, context, method: str) -> dict:
    """The quickstart's evaluation of the test play (blocks of seq_len, eval_batch_size, MDLM's NELBO with
    NUM_T_SAMPLES time samples), timed once: evaluate_batches' loop, with or without the context (evaluate_batches
    itself now always enters reuse_freed_memory on CPU, so the loop is run here)."""
    import resource
    from pathlib import Path

    from torch.utils.data import DataLoader

    from seqdiff.checkpoint import LoadedModel
    from seqdiff.data.blocks import TiledBlocks
    from seqdiff.data.text import split_path, tokenize_file
    from seqdiff.evaluation.likelihood import batch_nlls

    model = LoadedModel(backbone=module.backbone.eval(), method=module.method, tokenizer=tokenizer,
                        model_config=module.model_config, method_config=module.method_config, data_config=cfg.data,
                        seq_len=cfg.data.seq_len, step=0, path=Path("."), ema=False)
    tokens = tokenize_file(split_path(cfg.data, "test"), tokenizer)
    loader = DataLoader(TiledBlocks(tokens, cfg.data.seq_len, tokenizer.pad_id, None),
                        batch_size=cfg.data.eval_batch_size)
    samples = 1 if model.method.exact_likelihood else NUM_T_SAMPLES
    with context as applied:
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        batches = sum(1 for _ in batch_nlls(model, loader, samples, 0))
        seconds = time.perf_counter() - start
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return {"method": method, "reuse_applied": bool(applied), "step_s": seconds, "faults_per_step": faults,
            "batches": batches, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def cpu_name() -> str:
    """The CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_worker(name: str, method: str, steps: int, threads: int, task: str = "step") -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    done = subprocess.run([sys.executable, "-m", "experiments.quickstart_step_time", "--worker", name,
                           "--method", method, "--steps", str(steps), "--threads", str(threads), "--task", task],
                          env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"worker {name} {method} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summarize(runs: list[dict], names: list[str]) -> dict:
    """Per method and variant: medians over rounds, and the median of the per-round ratios first / variant."""
    summary: dict = {}
    for method in METHODS:
        rounds = [r for r in runs if r["method"] == method]
        summary[method] = {}
        for name in names:
            ratios = [r[names[0]]["step_s"] / r[name]["step_s"] for r in rounds]
            summary[method][name] = {
                "step_s": statistics.median(r[name]["step_s"] for r in rounds),
                "faults_per_step": statistics.median(r[name]["faults_per_step"] for r in rounds),
                "peak_rss_mb": statistics.median(r[name]["peak_rss_mb"] for r in rounds),
                "speedup_median": statistics.median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios)}
    return summary


def render(results: dict) -> str:
    names = results["variants"]
    evaluating = results.get("task") == "eval"
    what = ("one evaluation of the test play as the quickstart scores it (MDLM's NELBO with "
            f"{NUM_T_SAMPLES} time samples; untrained weights)" if evaluating else
            "the quickstart recipe's training step (loss, backward, clipping, AdamW, EMA) over "
            f"{results['steps']} steps after 5 warm-up steps")
    unit = "evaluation" if evaluating else "step"
    lines = [
        f"# The quickstart's {'evaluation' if evaluating else 'training step'} under variants, side by side",
        "",
        f"Made by `{results['command']}` on {results['date']} ({results['cpu']}, {results['threads']} torch "
        f"thread(s) per process, load average {results['load_average_at_start']:.2f} at the start, "
        f"{results['load_average_at_end']:.2f} at the end; {results['seconds']:.0f} s). Numbers from `results.json`.",
        "",
        f"Each of {results['rounds']} rounds runs every variant once, each in a fresh process, in an order rotating "
        f"from round to round; a process times {what}. Speed-up: the first variant's time over the variant's, "
        "median of the per-round ratios [min, max].",
        "",
        "Variants: " + "; ".join(f"`{n}` = {' '.join(VARIANTS[n]['overrides']) or '(recipe)'}"
                                 + (", inside reuse_freed_memory()" if VARIANTS[n]["reuse_memory"] else "")
                                 for n in names) + ".",
        "",
        f"| model | variant | {unit} (ms) | speed-up | page faults / {unit} | peak RSS (MB) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for method, per in results["summary"].items():
        for name in names:
            s = per[name]
            lines.append(f"| {method} | {name} | {1000 * s['step_s']:.1f} | **{s['speedup_median']:.3f}** "
                         f"[{s['speedup_min']:.3f}, {s['speedup_max']:.3f}] | {s['faults_per_step']:,.0f} | "
                         f"{s['peak_rss_mb']:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m experiments.quickstart_step_time", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="reports/bench/quickstart_step")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--task", choices=("step", "eval"), default="step",
                   help="step: training steps (default); eval: one evaluation of the test play per process")
    p.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                   help="variants to run, the first is the reference (default: all, in VARIANTS' order)")
    p.add_argument("--worker", choices=sorted(VARIANTS), help=argparse.SUPPRESS)
    p.add_argument("--method", default="mdlm", choices=METHODS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(VARIANTS[args.worker], args.method, args.steps, args.threads, args.task)))
        return 0
    names = args.variant or list(VARIANTS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start, load = time.perf_counter(), os.getloadavg()[0]
    runs = []
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for method in METHODS:
            row = {"round": r, "method": method, "order": order}
            row.update({name: run_worker(name, method, args.steps, args.threads, args.task) for name in order})
            runs.append(row)
            print(f"[step_time] round {r} {method}: " + ", ".join(
                f"{n} {1000 * row[n]['step_s']:.1f} ms" for n in names), file=sys.stderr)
    results = {"command": "python -m experiments.quickstart_step_time " + shlex.join(argv),
               "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpu": cpu_name(), "threads": args.threads,
               "steps": args.steps, "rounds": args.rounds, "variants": names, "task": args.task,
               "load_average_at_start": load, "load_average_at_end": os.getloadavg()[0],
               "seconds": time.perf_counter() - start, "summary": summarize(runs, names), "runs": runs}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "README.md").write_text(render(results))
    print(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
