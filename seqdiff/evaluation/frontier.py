"""`seqdiff frontier`: the quality-speed frontier of every sampler, side by side, in one run.

    seqdiff frontier --checkpoint runs/mdlm --checkpoint runs/sedd --checkpoint runs/ar --oracle runs/ar-big \
        --steps 8,16,32,64,128,256 --num-samples 16 --batch-size 1 --out reports/generation/my_run

Each checkpoint brings the samplers of its method (`FRONTIER_SAMPLERS`: MDLM uncached ancestral, cached and
first-hitting, ReMDM remasking (--remdm-schedule, --remdm-eta), confidence-ordered top-k and Fast-dLLM's
threshold (--threshold), and EDLM importance sampling on the MDLM when an energy is given with --edlm-energy;
SEDD analytic; AR with its KV cache). Every sampler whose cost is set by a step count runs at every step count;
the others (AR, first-hitting, threshold: `Sampler.uses_steps` false) run once, listed at steps = length. A
(sampler, steps) pair the sampler refuses (e.g. a ReMDM loop band with no step in it) is skipped with a note.
Each row carries the sampler's `exact` flag (it draws from the model's own reverse process, or approximates
it), and the report shows it next to the name. For each (sampler, steps):
seconds per sample (wall-clock), denoiser calls, generative perplexity under the oracle and the per-sample
unigram entropy, distinct-n and repetition (seqdiff.evaluation.metrics: one implementation for all jobs).
Entropy is always reported next to generative perplexity: a low perplexity from collapsed samples is not
quality. Real held-out text windows of the same length are scored the same way as a reference row.

Timing is fair on a busy machine: batches are interleaved across samplers (batch b of every sampler runs
before batch b + 1 of any), every sampler has a warm-up batch first, and the figures are medians over
batches. The cached and uncached MDLM samplers share the generator seed of each batch, so their tokens
must be identical (recorded as `cached_equals_uncached`). Writes frontier.json, README.md and PNG figures.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqdiff.config import ConfigError
from seqdiff.errors import SeqdiffError
from seqdiff.safe_io import check_output_file, ensure_dir, written_together

FRONTIER_SAMPLERS: dict[str, tuple[str, ...]] = {
    "mdlm": ("ancestral", "cached", "edlm",
             "first_hitting",
             "remdm",
             "confidence",
             "threshold"),
    "sedd": ("analytic",),
    "d3pm": ("d3pm",),
    "ar": ("ar",),
    "bd3lm": ("bd3lm", "bd3lm_uncached",  # steps are per block of method.block_size tokens
              "bd3lm_first_hitting", "bd3lm_remdm", "bd3lm_confidence", "bd3lm_threshold"),
}
"""Registry: a checkpoint's method -> the samplers the frontier runs on it (edlm: with --edlm-energy only)."""
LABELS = {"ancestral": "MDLM uncached", "cached": "MDLM cached", "analytic": "SEDD analytic", "edlm": "EDLM",
          "d3pm": "D3PM ancestral",
          "ar": "AR (KV cache)", "first_hitting": "MDLM first-hitting", "remdm": "ReMDM",
          "confidence": "MDLM confidence top-k", "threshold": "MDLM confidence threshold"}
LABELS.update({"bd3lm": "BD3-LM (KV cache)", "bd3lm_uncached": "BD3-LM uncached"})
LABELS.update({"bd3lm_first_hitting": "BD3-LM first-hitting", "bd3lm_remdm": "BD3-LM ReMDM",
               "bd3lm_confidence": "BD3-LM confidence top-k", "bd3lm_threshold": "BD3-LM confidence threshold"})


@dataclass
class Arm:
    """One sampler on one checkpoint."""

    label: str
    sampler: str
    model: Any
    path: str
    options: dict[str, Any] | None = None
    """Sampler options beyond the config (edlm: energy, k, window)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", action="append", metavar="RUN",
                   help="a run directory / .ckpt (MDLM, SEDD, EDLM or AR); repeat for each model")
    p.add_argument("--oracle",
                   help="causal LM for generative perplexity: a seqdiff AR run or a Hugging Face causal LM directory")
    p.add_argument("--edlm-energy", metavar="KIND:PATH",
                   help="also run EDLM importance sampling on each MDLM checkpoint with this energy (ar:AR_RUN, "
                        "coar:AR_RUN or nce:ENERGY.pt)")
    p.add_argument("--edlm-k", type=int, default=2, help="EDLM: candidates per importance step")
    from seqdiff.config import SampleConfig, field_help, finite_float

    p.add_argument("--edlm-window", type=finite_float, default=0.2, help="EDLM: importance steps for t >= 1 - window")

    docs = field_help(SampleConfig)
    for key in ("remdm_schedule", "remdm_eta", "threshold"):
        p.add_argument("--" + key.replace("_", "-"), type=str if key == "remdm_schedule" else finite_float,
                       default=getattr(SampleConfig, key), help=docs[key])
    p.add_argument("--steps", default="8,16,32,64,128,256", help="comma-separated step counts (diffusion)")
    p.add_argument("--length", type=int, default=None, help="tokens per sample (default: the models' block length)")
    p.add_argument("--num-samples", type=int, default=16, help="samples per sampler and step count")
    p.add_argument("--batch-size", type=int, default=1, help="samples generated together (1: the latency target)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples (each sampler and step count draws "
                   "from the same seed)")
    p.add_argument("--device", default="cpu", help="device to sample on: cpu, cuda, cuda:1, ...")
    p.add_argument("--no-ema", action="store_true", help="use the raw weights instead of the EMA weights")
    p.add_argument("--out", default="reports/generation/frontier",
                   help="report folder (default: %(default)s; reports/generation holds the hand-written overview)")
    p.add_argument("--render-only", action="store_true",
                   help="only rewrite README.md and the figures from <out>/frontier.json (no sampling)")


def build_arms(paths: list[str], device: str, use_ema: bool, edlm: dict[str, Any] | None = None,
               sample_config=None) -> list[Arm]:
    """Every (checkpoint, sampler) pair to run; `edlm` ({"energy": spec, "k", "window"}) adds EDLM on MDLM;
    `sample_config` (a SampleConfig) gives the other samplers' options (ReMDM's schedule and eta, the threshold)."""
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.config import SampleConfig
    from seqdiff.samplers import SAMPLERS

    arms = []
    for path in paths:
        model = load_checkpoint(path, device=device, use_ema=use_ema)
        names = FRONTIER_SAMPLERS.get(model.method.name, ())
        if not names:  # said, not dropped: the report would otherwise just lack this checkpoint
            print(f"[frontier] {path}: no frontier sampler for method {model.method.name!r} (registered: "
                  f"{sorted(FRONTIER_SAMPLERS)}); skipped", file=sys.stderr)
        for name in names:
            if name not in SAMPLERS:
                print(f"[frontier] sampler {name!r} is not available in this seqdiff; skipped", file=sys.stderr)
                continue
            if name == "cached" and getattr(model.backbone.config, "time_conditioning", False):
                print(f"[frontier] {path} is time-conditioned: no cached sampler", file=sys.stderr)
                continue
            options = SAMPLERS[name].options_from_config(sample_config or SampleConfig()) or None
            if name == "edlm":
                if not edlm:
                    continue  # EDLM needs an energy: --edlm-energy
                from seqdiff.edlm import load_energy

                options = {"energy": load_energy(edlm["energy"], model, device), "k": edlm["k"],
                           "window": edlm["window"]}
            label = LABELS.get(name, name)
            if name == "edlm":
                label = f"EDLM ({edlm['energy'].split(':')[0]} energy, k={edlm['k']}, window {edlm['window']})"
            if name == "remdm":
                label = f"ReMDM-{options['schedule']} (eta {options['eta']})"
            if name == "threshold":
                label = f"{label} (tau {options['threshold']})"
            arms.append(Arm(label, name, model, str(model.path), options))
    return arms


def _generate(arm: Arm, steps: int, length: int, batch: int, seed: int):
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate

    cfg = SampleConfig(sampler=arm.sampler, steps=steps, num_samples=batch, batch_size=batch, seq_len=length,
                       seed=seed)
    return generate(arm.model, cfg, sampler_options=arm.options)


def reference_windows(model, length: int, count: int, seed: int) -> list:
    """`count` windows of `length` tokens at random offsets of the test split of `model`'s corpus."""
    import torch

    from seqdiff.data import build_data

    data = build_data(model.data_config, model.tokenizer)
    g = torch.Generator().manual_seed(seed)
    if model.data_config.kind == "fasta":  # whole test tiles with no N and no padding, cut to `length`
        tiles = data.eval_dataset("test")
        out = []
        for i in torch.randperm(len(tiles), generator=g).tolist():
            ids = tiles[i]["input_ids"][tiles[i]["attention_mask"]][:length]
            text = model.tokenizer.decode(ids)
            if len(ids) == length and "N" not in text.upper():
                out.append(torch.as_tensor(ids).long())
            if len(out) == count:
                break
        return out
    tokens = data.split_tokens("test")
    starts = torch.randint(0, len(tokens) - length + 1, (count,), generator=g).tolist()
    return [torch.as_tensor(tokens[s : s + length]).long() for s in starts]


def _source_name(data) -> str:
    """What the reference windows come from: the text corpus, or the FASTA file."""
    return Path(data.fasta.path).name if data.kind == "fasta" else data.corpus


def run_frontier(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from seqdiff.edlm.base import check_energy_length
    from seqdiff.evaluation.limits import check_device
    from seqdiff.evaluation.metrics import check_oracle_fits, generation_metrics, load_oracle

    if not args.checkpoint or not args.oracle:
        raise ConfigError("give the models (--checkpoint, repeated) and the --oracle")
    try:
        steps_list = sorted({int(s) for s in args.steps.split(",") if s.strip()})
    except ValueError:
        steps_list = []
    if not steps_list or min(steps_list) < 1:
        raise ConfigError(f"--steps {args.steps!r}: give positive step counts, e.g. 8,16,32")
    if args.num_samples < 1 or args.batch_size < 1 or args.num_samples % args.batch_size:
        raise ConfigError(f"--num-samples {args.num_samples} must be a positive multiple of --batch-size "
                          f"{args.batch_size}")
    if args.length is not None and args.length < 1:
        raise ConfigError(f"--length must be >= 1, got {args.length}")
    check_device(args.device)
    started = time.time()
    load_start = os.getloadavg()[0]
    edlm = ({"energy": args.edlm_energy, "k": args.edlm_k, "window": args.edlm_window}
            if args.edlm_energy else None)
    from seqdiff.config import SampleConfig
    from seqdiff.samplers import SAMPLERS, SamplerError, build_sampler

    options = SampleConfig(remdm_schedule=args.remdm_schedule, remdm_eta=args.remdm_eta, threshold=args.threshold)
    arms = build_arms(args.checkpoint, args.device, not args.no_ema, edlm, options)
    if not arms:
        raise ConfigError(f"no sampler to run: give checkpoints of {sorted(FRONTIER_SAMPLERS)}")
    length = args.length if args.length is not None else min(a.model.seq_len for a in arms)
    for arm in arms:
        if arm.sampler == "edlm":  # the energy reads every sample whole
            check_energy_length(arm.options["energy"], f"--edlm-energy {args.edlm_energy}", length,
                                f"samples drawn from {arm.path}")
    oracle = load_oracle(args.oracle, device=args.device)
    for arm in arms:
        check_oracle_fits(oracle, arm.model.tokenizer, arm.path)
    grid, warm_up = [], []  # warm_up: each arm at the fewest steps it runs at
    for arm in arms:
        accepted = []
        for s in steps_list if SAMPLERS[arm.sampler].uses_steps else [length]:
            try:  # options the sampler refuses at this step count (e.g. an empty ReMDM loop band): skipped
                build_sampler(arm.sampler, arm.model.method, arm.model.backbone, steps=s, **(arm.options or {}))
                accepted.append(s)
            except SamplerError as e:
                print(f"[frontier] {arm.label} at {s} steps skipped: {e}", file=sys.stderr)
                refused = e
        if not accepted:  # refused at every step count (--edlm-k 0): nothing of it would be measured
            raise ConfigError(f"{arm.label} runs at none of --steps {args.steps}: {refused}")
        grid += [(arm, s) for s in accepted]
        warm_up.append((arm, accepted[0]))
    batches = args.num_samples // args.batch_size
    seconds: dict[int, list[float]] = {i: [] for i in range(len(grid))}
    tokens: dict[int, list] = {i: [] for i in range(len(grid))}
    texts: dict[int, list[str]] = {i: [] for i in range(len(grid))}
    calls: dict[int, int] = {i: 0 for i in range(len(grid))}
    for arm, steps in warm_up:  # warm-up: first calls pay for allocation and kernel selection
        _generate(arm, steps, length, args.batch_size, seed=10**6)
    for b in range(batches):  # interleaved: batch b of every (sampler, steps) before batch b + 1 of any
        for i, (arm, steps) in enumerate(grid):
            gen = _generate(arm, steps, length, args.batch_size, seed=args.seed * 100_003 + b)
            seconds[i].append(gen.seconds / args.batch_size)
            tokens[i].extend(gen.tokens)
            texts[i].extend(gen.texts)
            calls[i] += gen.denoiser_calls
        print(f"[frontier] batch {b + 1}/{batches} done ({time.time() - started:.0f} s)", file=sys.stderr)
    rows = []
    for i, (arm, steps) in enumerate(grid):
        metrics = generation_metrics(tokens[i], texts[i], oracle=oracle)
        rows.append({"sampler": arm.sampler, "label": arm.label, "exact": SAMPLERS[arm.sampler].exact,
                     "checkpoint": arm.path,
                     "training_steps": arm.model.step, "steps": steps,
                     "seconds_per_sample": statistics.median(seconds[i]),
                     "seconds_per_sample_min": min(seconds[i]), "seconds_per_sample_max": max(seconds[i]),
                     "tokens_per_second": length / statistics.median(seconds[i]),
                     "denoiser_calls_per_sample": calls[i] / batches,
                     "gen_perplexity": metrics["gen_perplexity"],
                     "log_gen_perplexity_se": metrics["oracle_nll_se"],
                     "unigram_entropy_nats": metrics["unigram_entropy_nats"],
                     **{k: metrics[k] for k in ("distinct_1", "distinct_2", "distinct_4", "repetition_4")}})
    reference_model = next((a.model for a in arms if a.model.data_config is not None
                            and a.model.data_config.kind in ("text", "fasta")), None)
    reference = None
    if reference_model is not None:
        real = reference_windows(reference_model, length, args.num_samples, args.seed)
        m = generation_metrics(real, [reference_model.tokenizer.decode(t) for t in real], oracle=oracle)
        reference = {"what": f"{len(real)} random {length}-token windows of the test split "
                             f"({_source_name(reference_model.data_config)})",
                     "gen_perplexity": m["gen_perplexity"], "unigram_entropy_nats": m["unigram_entropy_nats"],
                     **{k: m[k] for k in ("distinct_1", "distinct_2", "distinct_4", "repetition_4")}}
    identical = _cached_equals_uncached(grid, tokens)
    return {
        "command": "seqdiff " + shlex.join(args.argv) if getattr(args, "argv", None) else  # as parsed by the CLI
                   "seqdiff frontier " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["frontier"] else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                    "device": args.device, "load_average_start": load_start, "load_average_end": os.getloadavg()[0],
                    "torch": torch.__version__},
        "length": length, "num_samples": args.num_samples, "batch_size": args.batch_size, "seed": args.seed,
        "oracle": str(args.oracle), "wall_seconds": time.time() - started,
        "rows": rows, "reference": reference, "cached_equals_uncached": identical,
        "targets": targets(rows, length, reference, args.batch_size),
    }


def _cached_equals_uncached(grid, tokens) -> dict[str, bool]:
    import torch

    out = {}
    for i, (arm, steps) in enumerate(grid):
        if arm.sampler != "cached":
            continue
        for j, (other, s) in enumerate(grid):
            if other.sampler == "ancestral" and other.model is arm.model and s == steps:
                out[str(steps)] = all(torch.equal(a, b) for a, b in zip(tokens[i], tokens[j]))
    return out


def _row(rows, sampler: str, steps: int | None = None):
    return next((r for r in rows if r["sampler"] == sampler and (steps is None or r["steps"] == steps)), None)


def targets(rows: list[dict[str, Any]], length: int, reference: dict[str, Any] | None = None,
            batch_size: int = 1) -> dict[str, Any]:
    """Issue 21's three targets, from rows measured side by side (ratios of medians over interleaved batches).

    - first_hitting_vs_ancestral: first-hitting against ancestral sampling at steps = 4 x length: the same
      quality (|log PPL ratio| <= 2 s.e. of the difference) at >= 4x less wall-clock;
    - approximate_at_quarter_calls: every approximate sampler at <= length / 4 denoiser calls per sample, against
      the best exact diffusion row of its checkpoint (gen PPL within 10%), real text (entropy within 2%), and AR
      with its KV cache (faster; the issue asks this at batch 1);
    - edlm_vs_mdlm_equal_quality: each EDLM row against the cheapest cached-MDLM row of its checkpoint whose gen
      PPL is no worse (the issue asks >= 1.3x at batch 16); None where no MDLM row reaches it.
    """
    out: dict[str, Any] = {"batch_size": batch_size}
    fh, anc = _row(rows, "first_hitting"), _row(rows, "ancestral", 4 * length)
    if fh and anc:
        speedup = anc["seconds_per_sample"] / fh["seconds_per_sample"]
        diff = math.log(fh["gen_perplexity"] / anc["gen_perplexity"])
        se = math.hypot(fh.get("log_gen_perplexity_se", math.nan), anc.get("log_gen_perplexity_se", math.nan))
        same = abs(diff) <= 2 * se
        out["first_hitting_vs_ancestral"] = {
            "steps": 4 * length, "speedup": speedup, "target_speedup": 4.0,
            "first_hitting_gen_perplexity": fh["gen_perplexity"], "ancestral_gen_perplexity": anc["gen_perplexity"],
            "log_ratio": diff, "log_ratio_se": se, "within_2se": same,
            "first_hitting_entropy": fh["unigram_entropy_nats"], "ancestral_entropy": anc["unigram_entropy_nats"],
            "met": bool(speedup >= 4 and same)}
    ar = _row(rows, "ar")
    candidates = []
    for r in rows:
        if r["exact"] or r["denoiser_calls_per_sample"] > length / 4:
            continue
        exact = [e for e in rows if e["exact"] and e["checkpoint"] == r["checkpoint"]]  # its own model
        best = min(exact, key=lambda e: e["gen_perplexity"]) if exact else None
        c = {"label": r["label"], "steps": r["steps"], "calls": r["denoiser_calls_per_sample"],
             "gen_perplexity": r["gen_perplexity"], "entropy": r["unigram_entropy_nats"],
             "best_exact": None if best is None else f"{best['label']} at {best['steps']} steps",
             "ppl_ratio_to_best_exact": None if best is None else r["gen_perplexity"] / best["gen_perplexity"],
             "entropy_rel_to_real": None if not reference else
             r["unigram_entropy_nats"] / reference["unigram_entropy_nats"] - 1,
             "speedup_over_ar": None if ar is None else ar["seconds_per_sample"] / r["seconds_per_sample"]}
        c["met"] = bool(c["ppl_ratio_to_best_exact"] is not None and c["ppl_ratio_to_best_exact"] <= 1.10
                        and c["entropy_rel_to_real"] is not None and abs(c["entropy_rel_to_real"]) <= 0.02
                        and c["speedup_over_ar"] is not None and c["speedup_over_ar"] > 1)
        candidates.append(c)
    if candidates:
        out["approximate_at_quarter_calls"] = {"max_calls": length / 4, "rows": candidates,
                                               "met": any(c["met"] for c in candidates)}
    edlm_rows = [r for r in rows if r["sampler"] == "edlm"]
    if edlm_rows:
        pairs = []
        for e in edlm_rows:
            mdlm = [m for m in rows if m["sampler"] == "cached" and m["checkpoint"] == e["checkpoint"]
                    and m["gen_perplexity"] <= e["gen_perplexity"]]
            m = min(mdlm, key=lambda m: m["seconds_per_sample"]) if mdlm else None
            pairs.append({"edlm_steps": e["steps"], "edlm_gen_perplexity": e["gen_perplexity"],
                          "edlm_seconds": e["seconds_per_sample"],
                          "mdlm_steps": None if m is None else m["steps"],
                          "mdlm_gen_perplexity": None if m is None else m["gen_perplexity"],
                          "mdlm_seconds": None if m is None else m["seconds_per_sample"],
                          "speedup": None if m is None else m["seconds_per_sample"] / e["seconds_per_sample"]})
        best = max((p["speedup"] for p in pairs if p["speedup"] is not None), default=None)
        out["edlm_vs_mdlm_equal_quality"] = {"pairs": pairs, "best_speedup": best, "target": 1.3,
                                             "met": bool(best is not None and best >= 1.3)}
    return out


# ---------------------------------------------------------------------------------------------- report
def run_name(checkpoint: str) -> str:
    """The run directory's name of a checkpoint path (runs/x/checkpoints/last.ckpt -> x)."""
    path = Path(checkpoint)
    return path.parent.parent.name if path.parent.name == "checkpoints" else path.name


def distinct_labels(rows: list[dict[str, Any]]) -> None:
    """Where one sampler label covers several checkpoints (two BD3-LM block sizes, say), append each row's run
    name, so the table and the figures tell them apart."""
    runs: dict[str, set[str]] = {}
    for r in rows:
        runs.setdefault(r["label"], set()).add(r["checkpoint"])
    for r in rows:
        if len(runs[r["label"]]) > 1:
            r["label"] = f"{r['label']} [{run_name(r['checkpoint'])}]"


def write_report(result: dict[str, Any], out: Path) -> None:
    """frontier.json, the two figures and README.md, written as one (a Ctrl-C takes effect after the last)."""
    ensure_dir(out, "report folder")
    distinct_labels(result["rows"])
    with written_together():
        _write_report(result, out)


def _write_report(result: dict[str, Any], out: Path) -> None:
    from seqdiff.evaluation.generate import write_atomically
    from seqdiff.figures import pyplot, save_figure

    plt = pyplot()
    write_atomically(out / "frontier.json", json.dumps(result, indent=2) + "\n")
    rows, ref = result["rows"], result["reference"]
    labels = list(dict.fromkeys(r["label"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label in labels:
        rs = [r for r in rows if r["label"] == label]
        xs = [r["steps"] for r in rs]
        style = {"marker": "o"} if len(rs) > 1 else {"marker": "*", "markersize": 14, "linestyle": "none"}
        for ax, key in zip(axes, ("gen_perplexity", "unigram_entropy_nats", "seconds_per_sample")):
            ax.plot(xs, [r[key] for r in rs], label=f"{label} ({_kind(rs[0])})", **style)
    if ref:
        axes[0].axhline(ref["gen_perplexity"], color="gray", linestyle="--", label="real text")
        axes[1].axhline(ref["unigram_entropy_nats"], color="gray", linestyle="--", label="real text")
    for ax, title in zip(axes, ("generative perplexity (oracle)", "unigram entropy per sample (nats)",
                                "wall-clock seconds per sample")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sampling steps (AR: one per token)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "frontier_vs_steps.png")
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for label in labels:
        rs = [r for r in rows if r["label"] == label]
        ax.plot([r["seconds_per_sample"] for r in rs], [r["gen_perplexity"] for r in rs], marker="o",
                label=f"{label} ({_kind(rs[0])})")
        for r in rs:
            ax.annotate(str(r["steps"]), (r["seconds_per_sample"], r["gen_perplexity"]), fontsize=7,
                        textcoords="offset points", xytext=(3, 3))
    if ref:
        ax.axhline(ref["gen_perplexity"], color="gray", linestyle="--", label="real text")
    ax.set_xscale("log")
    ax.set_xlabel(f"wall-clock seconds per sample (batch {result['batch_size']})")
    ax.set_ylabel("generative perplexity (oracle)")
    ax.set_title("quality-speed frontier (labels: steps)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "frontier.png")
    write_atomically(out / "README.md", markdown(result))


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Generation: quality-speed frontier",
        "",
        f"Made by `{result['command']}` on {result['date']} ({result['wall_seconds']:.0f} s). Machine: "
        f"{m['device']} ({m['cpus']} CPUs, {m['torch_threads']} torch thread(s)), torch {m['torch']}; 1-minute load "
        f"average {m['load_average_start']:.1f} at the start and {m['load_average_end']:.1f} at the end — the "
        "machine was shared with other jobs, so absolute times are noisy; the ratios come from batches "
        "interleaved across samplers (medians over batches).",
        "",
        f"Samples: {result['num_samples']} per row, {result['length']} tokens each, batch {result['batch_size']}, "
        f"temperature 1, seed {result['seed']}. Generative perplexity: oracle `{result['oracle']}`, "
        "token-weighted (exp of the total NLL over all samples' oracle tokens / their number). Entropy: unigram "
        "entropy of each sample's tokens in nats, averaged over samples — read it next to the perplexity.",
        "",
        "| sampler | exact / approximate | steps | s / sample [min–max] | tokens/s | denoiser calls | gen PPL | "
        "s.e. of log PPL | entropy | distinct-4 | repetition-4 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    trained = {r["checkpoint"]: (r["label"].split()[0], r["training_steps"]) for r in result["rows"]}
    lines[6:6] = ["Checkpoints: " + "; ".join(f"{name} `{path}` ({steps} training steps)"
                                              for path, (name, steps) in trained.items())
                  + ". Each one's recipe is the config.yaml of its run directory.", ""]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {_kind(r)} | {r['steps']} | {r['seconds_per_sample']:.3f} "
                     f"[{r['seconds_per_sample_min']:.3f}–{r['seconds_per_sample_max']:.3f}] | "
                     f"{r['tokens_per_second']:.0f} | "
                     f"{r['denoiser_calls_per_sample']:.1f} | {r['gen_perplexity']:.2f} | "
                     f"{r.get('log_gen_perplexity_se', math.nan):.3f} | "
                     f"{r['unigram_entropy_nats']:.3f} | {r['distinct_4']:.3f} | {r['repetition_4']:.3f} |")
    ref = result["reference"]
    if ref:
        lines.append(f"| real text ({ref['what']}) | | | | | | {ref['gen_perplexity']:.2f} | | "
                     f"{ref['unigram_entropy_nats']:.3f} | {ref['distinct_4']:.3f} | {ref['repetition_4']:.3f} |")
    lines += ["", "exact: the sampler draws from the model's own reverse process (so an exact denoiser reproduces the "
              "data); approximate: it trades that for speed or quality (tau-leaping, importance sampling with finite "
              "k, remasking, confidence-ordered decoding). Samplers whose cost does not depend on a step count "
              "(AR, first-hitting, threshold) are listed at steps = length.", ""]
    lines += ["![frontier vs steps](frontier_vs_steps.png)", "", "![frontier](frontier.png)", "", "## Targets", ""]
    lines += target_lines(result)
    return "\n".join(lines) + "\n"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def ar_speed(speedup: float | None) -> str:
    """The AR comparison of a target line; without an AR checkpoint in the run there is nothing to time against."""
    return "no AR checkpoint to time against" if speedup is None else f"{speedup:.2f}× AR's speed"


def _met(flag: bool) -> str:
    return "met" if flag else "not met"


def target_lines(result: dict[str, Any]) -> list[str]:
    """The measured targets as bullet lines: numbers and met / not met, no interpretation (that is for the
    hand-written report that cites frontier.json)."""
    t, lines = result["targets"], []
    f = t.get("first_hitting_vs_ancestral")
    if f:
        lines.append(
            f"- First-hitting vs ancestral at {f['steps']} steps (4 × length): {f['speedup']:.2f}× less wall-clock "
            f"(target ≥ 4×); gen PPL {f['first_hitting_gen_perplexity']:.2f} vs {f['ancestral_gen_perplexity']:.2f}, "
            f"log ratio {f['log_ratio']:+.3f} ± {2 * f['log_ratio_se']:.3f} (2 s.e.): "
            f"{'inside' if f['within_2se'] else 'outside'} ±2 s.e.; entropy {f['first_hitting_entropy']:.3f} vs "
            f"{f['ancestral_entropy']:.3f} — {_met(f['met'])}.")
    q = t.get("approximate_at_quarter_calls")
    if q:
        lines.append(f"- Approximate samplers at ≤ {q['max_calls']:g} denoiser calls (length / 4), against the best "
                     "exact diffusion row of the same checkpoint (gen PPL ≤ 1.10×), real text (entropy within 2%) "
                     f"and AR with its KV cache (faster; batch {t.get('batch_size', result['batch_size'])}) — "
                     f"{_met(q['met'])}:")
        for c in q["rows"]:
            ent = "—" if c["entropy_rel_to_real"] is None else f"{100 * c['entropy_rel_to_real']:+.1f}%"
            lines.append(f"  - {c['label']} at {c['steps']} steps ({c['calls']:.1f} calls): gen PPL "
                         f"{c['gen_perplexity']:.2f} = {_ratio(c['ppl_ratio_to_best_exact'])} {c['best_exact']}; "
                         f"entropy {ent} vs real text; {ar_speed(c['speedup_over_ar'])} — {_met(c['met'])}")
    e = t.get("edlm_vs_mdlm_equal_quality")
    if e:
        lines.append(f"- EDLM against the cheapest cached-MDLM row at least as good in gen PPL (target ≥ 1.3× at "
                     f"batch 16; this run: batch {t.get('batch_size', result['batch_size'])}): best "
                     f"{_ratio(e['best_speedup'])} — {_met(e['met'])}:")
        for p in e["pairs"]:
            match = ("no MDLM row reaches it" if p["mdlm_steps"] is None else
                     f"MDLM {p['mdlm_steps']} steps, gen PPL {p['mdlm_gen_perplexity']:.2f}, "
                     f"{p['mdlm_seconds']:.3f} s: "
                     f"EDLM {_ratio(p['speedup'])} faster")
            lines.append(f"  - EDLM {p['edlm_steps']} steps, gen PPL {p['edlm_gen_perplexity']:.2f}, "
                         f"{p['edlm_seconds']:.3f} s/sample; {match}")
    same = result["cached_equals_uncached"]
    if same:
        lines.append(f"- Cached and uncached MDLM drew identical tokens at every step count: {all(same.values())} "
                     f"({', '.join(f'{k}: {v}' for k, v in same.items())}).")
    return lines


def _kind(row: dict[str, Any]) -> str:
    """'exact' or 'approximate' for a row (rows written before the flag existed: the sampler's class says)."""
    exact = row.get("exact")
    if exact is None:
        from seqdiff.samplers import SAMPLERS

        cls = SAMPLERS.get(row["sampler"])
        if cls is None:
            return "?"
        exact = cls.exact
    return "exact" if exact else "approximate"


REPORT_FILES = ("frontier.json", "README.md", "frontier_vs_steps.png", "frontier.png")
"""What `write_report` writes into --out."""


def check_report_folder(out: Path) -> None:
    """Refuse, before any model loads, an --out the report cannot be written into (a file, a path under a file,
    a folder without write permission, a report file name taken by a folder). Creates nothing."""
    for name in REPORT_FILES:
        check_output_file(out / name, "frontier report")
    if (out / "README.md").is_file() and not (out / "frontier.json").is_file():
        raise SeqdiffError(f"--out {out} holds a README.md that no `seqdiff frontier` wrote (no frontier.json "
                           f"beside it); the report would replace it: name another folder, e.g. {out / 'new'}")


def render_existing(out: Path) -> dict[str, Any]:
    """README / figures again from an earlier run's frontier.json (no sampling; the targets are recomputed
    from its rows, so a change in how they are summarized reaches old numbers)."""
    path = out / "frontier.json"
    if not path.is_file():
        where = (f"{out} does not exist" if not out.exists() else f"{out} is a file, not a report folder"
                 if not out.is_dir() else f"{out} holds no frontier.json")
        raise SeqdiffError(f"--render-only: {where}; it re-renders the report of an earlier `seqdiff frontier "
                           f"--out {out}` from its frontier.json")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
        result["targets"] = targets(result["rows"], result["length"], result.get("reference"), result["batch_size"])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        cause = f"no key {e}" if isinstance(e, KeyError) else str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SeqdiffError(f"--render-only: {path} is not a frontier.json written by `seqdiff frontier` "
                           f"({cause})") from e
    check_report_folder(out)
    write_report(result, out)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="seqdiff frontier", description=__doc__.split("\n")[0])
    add_arguments(parser)
    try:
        return run_command(parser.parse_args(argv))
    except SeqdiffError as e:  # as `seqdiff frontier` says it: one line, exit 2
        print(f"seqdiff frontier: error: {e}", file=sys.stderr)
        return 2


def run_command(args: argparse.Namespace) -> int:
    """`seqdiff frontier`, `python -m seqdiff.evaluation.frontier`: run (or with --render-only re-render), report."""
    out = Path(args.out)
    if args.render_only:  # README / figures again from an earlier run's numbers
        render_existing(out)
        print(f"written: {', '.join(str(out / name) for name in REPORT_FILES[1:])} (from {out / 'frontier.json'})")
        return 0
    check_report_folder(out)  # a bad --out is said now, not after the sampling
    result = run_frontier(args)
    write_report(result, out)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

