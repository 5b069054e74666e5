"""Compare methods (AR, MDLM, SEDD, D3PM) on one corpus and tokenizer, with the same backbone and token budget.

    python -m experiments.compare_methods --config configs/quickstart.yaml --methods ar,mdlm,sedd_absorbing \\
        --run-root /work/runs/x --out reports/baselines --name shakespeare_char train.max_steps=3000

Every method trains from the same recipe (`--config` + dotted overrides); only the `method.*` keys of its
variant (METHOD_VARIANTS) differ, so backbone width/depth, batch, block length, steps, optimizer and seed are
shared. Then, for each method: the test bound (AR exact NLL, diffusion NELBO upper bound; nats/token, PPL,
bits per character, also for BPE tokenizers by dividing the total by the test file's characters), and the
samples/s of its default sampler, timed in interleaved rounds in this one process so the ratios are side by
side on the same (possibly shared) machine. Writes into `--out`:
  <name>.json      every number, the command, the resolved recipe, the machine's load
  <name>.md        the table and the command in the header
  <name>_curves.png validation bits/token against step, from each run's CSV log
  summary.json     a compact entry under key <name> (merged, so several experiments share one report folder)

Resumable: a method whose run reached train.max_steps is reused (and marked with a DONE file), an interrupted
one resumes, evaluations are cached in <run>/eval/compare.json keyed by step and t-samples. A run whose
recorded recipe differs from the requested one is refused, naming the keys, instead of being silently reused.
`--until train` stops after training and `--until eval` after the test evaluation (to train and score methods in
separate processes first; the final call then reuses both).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import RunConfig, SampleConfig, from_dict, load_run_config, to_dict
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.data.text_files import read_text_file
from seqdiff.errors import SeqdiffError
from seqdiff.evaluation.generate import generate, write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.figures import pyplot, save_figure
from seqdiff.quickstart import _run_state, _train_or_reuse
from seqdiff.training.csv_log import metric_curve, read_metrics

# A method variant: a label and the `method.*` overrides that select it (everything else is shared).
METHOD_VARIANTS: dict[str, dict[str, Any]] = {
    "ar": {"name": "ar"},
    "mdlm": {"name": "mdlm"},
    "sedd_absorbing": {"name": "sedd", "graph": "absorbing"},
    "sedd_uniform": {"name": "sedd", "graph": "uniform"},
    "d3pm": {"name": "d3pm"},
}
METHOD_VARIANTS.update({f"bd3lm_{n}": {"name": "bd3lm", "block_size": n} for n in (1, 4, 8, 16)})  # L' = n
DONE_MARKER = "DONE"
# Train keys that do not change what is learned; a finished run may differ from the request in these.
_COSMETIC_TRAIN_KEYS = ("progress_bar", "log_every", "wandb", "val_every", "val_batches", "checkpoint_every")


@dataclass
class Options:
    """What one comparison runs (the parsed command line)."""

    config: str | None
    overrides: list[str]
    methods: list[str]
    run_root: Path
    out: Path
    name: str
    num_t_samples: int = 4
    sample_num: int = 8
    sample_steps: int | None = None
    speed_rounds: int = 3
    until: str = "report"
    """Last stage to run: train, eval or report."""
    max_test_windows: int | None = None
    """FASTA data: score this many evenly spaced test tiles (None: all)."""


class CompareError(SeqdiffError):
    """A bad method name or a run directory that holds a different recipe."""


def method_config(base: RunConfig, method: str) -> RunConfig:
    """The shared recipe with `method`'s variant applied (the run is named <recipe name>-<method>)."""
    if method not in METHOD_VARIANTS:
        raise CompareError(f"unknown method {method!r}; choose from {sorted(METHOD_VARIANTS)}")
    data = to_dict(base)
    data["name"] = f"{base.name}-{method}"
    data["method"].update(METHOD_VARIANTS[method])
    return from_dict(RunConfig, data)


def _flatten(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value and key != "tokenizer_options":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_same_recipe(config: RunConfig, run_dir: Path) -> None:
    """Refuse to reuse a run trained from another recipe (the keys that differ are named)."""
    recorded_path = run_dir / "config.yaml"
    if not recorded_path.is_file():
        return
    recorded = _flatten(yaml.safe_load(recorded_path.read_text()) or {})
    wanted = _flatten(to_dict(config))
    ignore = {"name"} | {f"train.{k}" for k in _COSMETIC_TRAIN_KEYS}
    differ = sorted(k for k in set(recorded) | set(wanted) if k not in ignore and recorded.get(k) != wanted.get(k))
    if differ:
        details = ", ".join(f"{k}: run has {recorded.get(k)!r}, asked {wanted.get(k)!r}" for k in differ)
        raise CompareError(f"{run_dir} was trained from another recipe ({details}); use another --run-root "
                           f"or delete that run")


def train_method(config: RunConfig, run_dir: Path) -> None:
    check_same_recipe(config, run_dir)
    _train_or_reuse(config, run_dir)
    if _run_state(run_dir, config.train.max_steps) == "done" and not (run_dir / DONE_MARKER).exists():
        (run_dir / DONE_MARKER).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ\n", time.gmtime()))


def _score_text(config: RunConfig, model, t_samples: int, max_test_windows: int | None) -> dict[str, Any]:
    """The whole test file as one token stream, tiled into blocks."""
    test_path = split_path(config.data, "test")
    tokens = tokenize_file(test_path, model.tokenizer)
    report = evaluate_tokens(model, tokens, batch_size=config.data.eval_batch_size, num_t_samples=t_samples,
                             seed=0)
    characters = len(read_text_file(test_path))
    # the same total over the file's characters: comparable across tokenizers
    report.update({"test_file": str(test_path), "test_characters": characters,
                   "bits_per_character_of_text": report["nll_nats_per_token"] * report["num_tokens"] / characters
                   / math.log(2)})
    return report


def _score_fasta(config: RunConfig, model, t_samples: int, max_test_windows: int | None) -> dict[str, Any]:
    """The test split's deterministic tiles (N never scored), evenly thinned to `max_test_windows`: the
    scoring of experiments/dna_experiment, so the numbers compare with reports/dna."""
    from experiments.dna_experiment import evenly, test_bits
    from seqdiff.data import build_data_module

    dm = build_data_module(config.data, model.tokenizer)
    dm.check_files()
    n_tiles = len(dm.eval_dataset("test"))
    index = evenly(n_tiles, max_test_windows)
    report = test_bits(model, dm, index, t_samples, config.data.eval_batch_size)
    report.update({"test_file": str(config.data.fasta.path), "test_windows": {"used": len(index), "total": n_tiles}})
    return report


# How each data kind's test split is scored.
TEST_SCORERS = {"text": _score_text, "fasta": _score_fasta}


def evaluate_method(config: RunConfig, run_dir: Path, num_t_samples: int,
                    max_test_windows: int | None = None) -> dict[str, Any]:
    """Test NLL (bound) of the finished run, cached in <run>/eval/compare.json by step, t-samples and windows."""
    model = load_checkpoint(run_dir)
    t_samples = 1 if model.method.exact_likelihood else num_t_samples
    cache = run_dir / "eval" / "compare.json"
    if cache.is_file():
        cached = json.loads(cache.read_text())
        if (cached.get("step"), cached.get("num_t_samples_asked"), cached.get("max_test_windows")) == (
                model.step, t_samples, max_test_windows):
            return cached
    t0 = time.perf_counter()
    report = TEST_SCORERS[config.data.kind](config, model, t_samples, max_test_windows)
    report.update({
        "num_t_samples_asked": t_samples,
        "max_test_windows": max_test_windows,
        "step": model.step,
        "eval_seconds": time.perf_counter() - t0,
        "parameters": sum(p.numel() for p in model.backbone.parameters()),
    })
    write_atomically(cache, json.dumps(report, indent=2) + "\n")
    return report


def measure_speed(run_dirs: dict[str, Path], sample: SampleConfig, rounds: int) -> dict[str, dict[str, Any]]:
    """Samples/s of each method's default sampler, rounds interleaved across methods (side by side)."""
    models = {m: load_checkpoint(d) for m, d in run_dirs.items()}
    times: dict[str, list[float]] = {m: [] for m in models}
    calls: dict[str, int] = {}
    texts: dict[str, list[str]] = {}
    samplers: dict[str, str] = {}
    for _ in range(rounds):
        for method, model in models.items():
            gen = generate(model, sample)
            times[method].append(gen.seconds)
            calls[method], samplers[method] = gen.denoiser_calls, gen.sampler
            texts.setdefault(method, gen.texts)
    out = {}
    for method, model in models.items():
        median = statistics.median(times[method])
        out[method] = {"sampler": samplers[method],
                       "sample_steps": None if model.method.exact_likelihood else sample.steps,
                       "denoiser_calls": calls[method], "seconds_per_round": times[method],
                       "samples_per_second": sample.num_samples / median,
                       "tokens_per_second": sample.num_samples * sample.seq_len / median,
                       "samples": texts[method][:4]}
    return out


def _read_curve(run_dir: Path) -> tuple[list[int], list[float]]:
    return metric_curve(read_metrics(run_dir), "val/bits_per_token")


def plot_curves(run_dirs: dict[str, Path], out: Path, title: str) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method, run_dir in run_dirs.items():
        steps, values = _read_curve(run_dir)
        ax.plot(steps, values, marker="o", label=method)
    ax.set(xlabel="step", ylabel="validation bits per token (bound for diffusion)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out)


def run(opts: Options, command: str) -> dict[str, Any] | None:
    base = load_run_config(opts.config, opts.overrides)
    configs = {m: method_config(base, m) for m in opts.methods}  # every name checked before training
    run_dirs = {m: opts.run_root / m for m in opts.methods}
    torch.set_float32_matmul_precision("high")
    start = time.perf_counter()
    load_at_start = os.getloadavg()[0]
    for method in opts.methods:
        train_method(configs[method], run_dirs[method])
    if opts.until == "train":
        return None

    results: dict[str, Any] = {
        "command": command, "name": opts.name, "recipe": to_dict(base), "methods": {},
        "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "load_average_at_start": load_at_start,
        "tokens_per_step": base.data.batch_size * base.data.seq_len,
    }
    for method in opts.methods:
        report = evaluate_method(configs[method], run_dirs[method], opts.num_t_samples, opts.max_test_windows)
        timing = run_dirs[method] / "timing.json"
        report["train_seconds"] = json.loads(timing.read_text())["train_seconds"] if timing.is_file() else None
        report["tokens_seen"] = report["step"] * results["tokens_per_step"]
        report["method_config"] = to_dict(configs[method].method)
        report["validation_curve"] = dict(zip(("steps", "bits_per_token"), _read_curve(run_dirs[method])))
        results["methods"][method] = report
    if opts.until == "eval":
        return None
    sample = SampleConfig(num_samples=opts.sample_num, batch_size=opts.sample_num, seq_len=base.data.seq_len,
                          steps=opts.sample_steps or base.data.seq_len, seed=0)
    results["sampling"] = {"num_samples": sample.num_samples, "seq_len": sample.seq_len, "steps": sample.steps,
                           "rounds": opts.speed_rounds, "load_average_before": os.getloadavg()[0]}
    speed = measure_speed(run_dirs, sample, opts.speed_rounds)
    for method, s in speed.items():
        results["methods"][method].update(s)
    if "ar" in results["methods"]:
        ar = results["methods"]["ar"]
        for r in results["methods"].values():
            r["relative_gap_vs_ar"] = r["nll_nats_per_token"] / ar["nll_nats_per_token"] - 1
            r["speed_vs_ar"] = r["samples_per_second"] / ar["samples_per_second"]
    results["total_seconds"] = time.perf_counter() - start

    opts.out.mkdir(parents=True, exist_ok=True)
    plot_curves(run_dirs, opts.out / f"{opts.name}_curves.png", title=opts.name)
    write_atomically(opts.out / f"{opts.name}.json", json.dumps(results, indent=2) + "\n")
    write_atomically(opts.out / f"{opts.name}.md", markdown(results))
    _merge_summary(opts.out / "summary.json", opts.name, results)
    print(table(results))
    return results


def corpus_name(data: dict[str, Any]) -> str:
    """What the runs were trained on: the FASTA file for data.kind=fasta (its `corpus` key is unused there)."""
    if data.get("kind") == "fasta":
        return Path(data["fasta"]["path"]).name
    return data["corpus"]


def _merge_summary(path: Path, name: str, results: dict[str, Any]) -> None:
    summary = json.loads(path.read_text()) if path.is_file() else {}
    keys = ("step", "tokens_seen", "parameters", "bound", "nll_nats_per_token", "perplexity", "bits_per_token",
            "bits_per_character_of_text", "relative_gap_vs_ar", "samples_per_second", "speed_vs_ar", "sampler",
            "sample_steps", "train_seconds")
    summary[name] = {"command": results["command"], "tokenizer": results["recipe"]["data"]["tokenizer"],
                     "corpus": corpus_name(results["recipe"]["data"]),
                     "methods": {m: {k: r.get(k) for k in keys} for m, r in results["methods"].items()}}
    write_atomically(path, json.dumps(summary, indent=2) + "\n")


# Tokenizers whose tokens are characters / bases: their own bits column (others: bits per character of text).
_UNIT_BITS = {"char": ("bits/char", "bits_per_character"), "nucleotide": ("bits/base", "bits_per_base")}


def table(results: dict[str, Any]) -> str:
    unit = _UNIT_BITS.get(results["recipe"]["data"]["tokenizer"], ("bits/char", "bits_per_character_of_text"))
    rows = [f"| method | test nats/token | PPL | {unit[0]} | vs AR | kind | params | train s | sampler (steps) "
            "| samples/s | speed vs AR |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for method, r in results["methods"].items():
        kind = f"bound ({r['num_t_samples']} t)" if r["bound"] else "exact"
        gap = f"{100 * r['relative_gap_vs_ar']:+.1f}%" if "relative_gap_vs_ar" in r else "-"
        speed = f"{r['speed_vs_ar']:.2f}x" if "speed_vs_ar" in r else "-"
        steps = f" ({r['sample_steps']})" if r["sample_steps"] else ""
        bpc = r[unit[1]]
        train_s = f"{r['train_seconds']:.0f}" if r["train_seconds"] else "-"
        rows.append(f"| {method} | {r['nll_nats_per_token']:.4f} | {r['perplexity']:.3f} | {bpc:.4f} | {gap} | "
                    f"{kind} | {r['parameters']:,} | {train_s} | {r['sampler']}{steps} | "
                    f"{r['samples_per_second']:.2f} | {speed} |")
    return "\n".join(rows)


def markdown(results: dict[str, Any]) -> str:
    recipe = results["recipe"]
    m, d, t = recipe["model"], recipe["data"], recipe["train"]
    any_r = next(iter(results["methods"].values()))
    s = results["sampling"]
    lines = [
        f"# {results['name']}: {', '.join(results['methods'])} on {corpus_name(d)} ({d['tokenizer']} tokenizer)",
        "",
        f"Made by `{results['command']}` ({results['torch_threads']} torch thread(s) on {results['cpu_count']} "
        f"shared cores; load average {results['load_average_at_start']:.1f} at the start, "
        f"{s['load_average_before']:.1f} before timing the samplers: other jobs shared the machine, so seconds "
        "are noisy; ratios measured side by side are the figures to read).",
        "",
        f"Shared recipe: backbone {m['backbone']} {m['hidden_size']} wide, {m['n_layers']} layers, {m['n_heads']} "
        f"heads ({any_r['parameters']:,} parameters for the first method; sizes differ only by the time "
        f"embedding), blocks of {d['seq_len']} tokens, batch {d['batch_size']}, {t['max_steps']} steps "
        f"({results['tokens_per_step'] * t['max_steps']:,} training tokens), AdamW lr {t['lr']}, "
        f"{t['lr_schedule']} schedule, EMA {t['ema_decay']} weights for evaluation, seed {t['seed']}.",
        "Test numbers on the held-out test split: exact NLL for AR, the NELBO upper bound for diffusion methods "
        "(Monte Carlo over times). bits/char: the total over the test text's characters; bits/base: over the "
        "scored (non-N) bases of the test tiles" + _windows_note(any_r) + ".",
        f"Sampling: {s['num_samples']} samples of {s['seq_len']} tokens in one batch, each method's default "
        f"sampler, {s['steps']} steps for diffusion samplers; median of {s['rounds']} interleaved rounds.",
        "",
        table(results),
        "",
        f"![validation curves]({results['name']}_curves.png)",
        "",
        "## Samples (seed 0)",
        "",
    ]
    for method, r in results["methods"].items():
        lines += [f"### {method}", ""] + [f"    {x[:160]!r}" for x in r["samples"][:2]] + [""]
    return "\n".join(lines)


def _windows_note(report: dict[str, Any]) -> str:
    windows = report.get("test_windows")
    return f" ({windows['used']:,} of {windows['total']:,} tiles, evenly spaced)" if windows else ""


def parse_args(argv: list[str] | None) -> Options:
    p = argparse.ArgumentParser(prog="python -m experiments.compare_methods", description=__doc__.split("\n")[0])
    p.add_argument("--config", help="the shared YAML recipe (see configs/)")
    p.add_argument("--methods", default="ar,mdlm", help=f"comma-separated, from {sorted(METHOD_VARIANTS)}")
    p.add_argument("--run-root", required=True, help="one run directory per method is made under it")
    p.add_argument("--out", default="reports/compare", help="report folder")
    p.add_argument("--name", default="compare", help="name of this experiment's files and summary.json key")
    p.add_argument("--num-t-samples", type=int, default=4, help="time samples per test block (diffusion bound)")
    p.add_argument("--sample-num", type=int, default=8, help="samples per timing round")
    p.add_argument("--sample-steps", type=int, default=None, help="diffusion sampler steps (default: seq_len)")
    p.add_argument("--speed-rounds", type=int, default=3, help="interleaved timing rounds")
    p.add_argument("--until", choices=["train", "eval", "report"], default="report",
                   help="last stage: train, eval (test bound, cached per run) or report (timing and files)")
    p.add_argument("--max-test-windows", type=int, default=None,
                   help="FASTA data: evenly spaced test tiles to score (default: all)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides of the shared recipe")
    a = p.parse_args(argv)
    methods = [m for m in a.methods.split(",") if m]
    if not methods:
        p.error("--methods is empty")
    for key in ("num_t_samples", "sample_num", "speed_rounds"):
        if getattr(a, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1")
    if a.max_test_windows is not None and a.max_test_windows < 1:
        p.error("--max-test-windows must be >= 1 (leave it out to score every test tile)")
    return Options(config=a.config, overrides=a.overrides, methods=methods, run_root=Path(a.run_root),
                   out=Path(a.out), name=a.name, num_t_samples=a.num_t_samples, sample_num=a.sample_num,
                   sample_steps=a.sample_steps, speed_rounds=a.speed_rounds, until=a.until,
                   max_test_windows=a.max_test_windows)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        run(parse_args(argv), "python -m experiments.compare_methods " + shlex.join(argv))
    except (CompareError, SeqdiffError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


__all__ = ["METHOD_VARIANTS", "CompareError", "Options", "check_same_recipe", "method_config", "run", "main"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
