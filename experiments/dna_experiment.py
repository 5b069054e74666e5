"""DNA experiment: MDLM against AR on GRCh37 chromosome 20 with held-out blocks -> reports/dna/.

    python -m experiments.dna_experiment --runs /work/runs/dnaexp --out reports/dna [--train] [--recipe long]

Both models share the backbone, the data (the CPU recipes configs/dna_chr20_cpu_{mdlm,ar}.yaml: blocks of 100 kb
held out at random, one window of gap between splits) and the token budget. `RECIPES` holds the overrides:
`short` (the default) shrinks the recipes to what a 2-core machine shared with other jobs trains in about an
hour (`cpu-small`, 1.2 M bases); `long` trains a 1.3 M-parameter DiT on 24.6 M bases (about 90 minutes per
model on one core), the pretraining of issue 22. `--train` trains the runs that lack a DONE marker (resuming
partial ones); without it the runs must exist. The job then

1. scores the test split (deterministic tiles of the held-out test blocks; evenly spaced tiles when
   `--max-test-windows` caps them) in bits per base: MDLM's NELBO upper bound and AR's exact NLL, the relative
   gap, and order-k Markov chains fitted on the training blocks as a yardstick;
2. plots the validation curves logged during training, scores the Markov chains on the same validation tiles
   (the first val_batches x eval_batch_size tiles, the ones training scored) and fits each curve with a power
   law c + a * step^-b to read off the step where it would cross the best chain (`extrapolation.png`);
3. generates DNA with both models, writes it as FASTA, and compares GC content and k-mer spectra (k = 1..6,
   total variation) with held-out real sequence, next to two baselines of the same size: real windows of the
   validation blocks (what sampling noise alone gives) and the same windows shuffled base by base (composition
   kept, all structure beyond k = 1 destroyed);
4. measures the training loader's windows/s with 0 and 2 DataLoader workers, alternating in rounds inside
   one process so that both see the same machine load.

Writes summary.json (numbers), table.md (its numbers as tables), val_curves.png, extrapolation.png, realism.png and
samples_{mdlm,ar}.fa; the report's README.md is written by hand.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import SampleConfig, load_run_config
from seqdiff.data import build_data_module
from seqdiff.data.genome import encode_bases
from seqdiff.data.modules import FastaDataModule
from seqdiff.evaluation.generate import format_samples, generate, write_atomically
from seqdiff.evaluation.likelihood import evaluate_batches
from seqdiff.evaluation.markov import MarkovChain
from seqdiff.evaluation.metrics import dna_metrics, gc_content
from seqdiff.figures import pyplot, save_figure
from seqdiff.training.csv_log import metric_curve, read_metrics
from seqdiff.training.run import LAST_CHECKPOINT, train

METHODS = ("mdlm", "ar")
RECIPE = "configs/dna_chr20_cpu_{method}.yaml"
RECIPES: dict[str, list[str]] = {
    "short": [
        "data.seq_len=128", "model.max_seq_len=128", "data.batch_size=16", "data.eval_batch_size=32",
        "train.max_steps=600", "train.warmup_steps=60", "train.val_every=100", "train.val_batches=8",
        "train.checkpoint_every=100", "train.log_every=20", "train.progress_bar=false", "train.precision=auto",
    ],
    "long": [
        "model.preset=null", "model.hidden_size=192", "model.n_layers=3", "model.n_heads=3",
        "data.seq_len=128", "model.max_seq_len=128", "data.batch_size=32", "data.eval_batch_size=64",
        "train.lr=2e-3", "train.max_steps=6000", "train.warmup_steps=200", "train.val_every=500",
        "train.val_batches=16", "train.checkpoint_every=500", "train.log_every=50", "train.progress_bar=false",
        "train.precision=auto",
    ],
    "cpu_small_bf16": [
        "data.seq_len=128", "model.max_seq_len=128", "data.batch_size=32", "data.eval_batch_size=64",
        "train.lr=1e-3", "train.max_steps=11000", "train.warmup_steps=200", "train.val_every=1000",
        "train.val_batches=16", "train.checkpoint_every=1000", "train.log_every=100", "train.progress_bar=false",
        "train.precision=bf16-if-native",
    ],
}
RECIPES["cpu_small_bf16_conv9"] = [*RECIPES["cpu_small_bf16"], "model.local_conv=9"]
RECIPES["cpu_small_bf16_conv17"] = [*RECIPES["cpu_small_bf16"], "model.local_conv=17"]
RECIPES["cpu_small_bf16_conv17_mlp"] = [*RECIPES["cpu_small_bf16_conv17"], "model.local_conv_mlp=true"]
RECIPES["cpu_small_bf16_conv17_kmer"] = [*RECIPES["cpu_small_bf16_conv17"], "model.kmer_sizes=[3,5,7,9]",
                                         "model.kmer_buckets=524288"]
"""Overrides of the CPU recipes. short: a 2-core CPU shared with five other jobs, 128-nt context, 600 steps x 16
windows (1.2 M bases per model, `cpu-small`). long: 6,000 steps x 32 windows of 128 nt (24.6 M bases, 46% of
the training blocks) for a DiT of width 192 and depth 3, the size a measured 0.8 s per step on one core lets
train in about 90 minutes (in the same time `cpu-tiny` would see about 2.5x the bases at 0.4 M parameters,
`cpu-small` about half);
the learning rate of the cpu-tiny chr20 runs of reports/bd3lm at the same batch. short and long ran in float32
(train.precision=auto), which they keep now that the configs ask for bf16-if-native. cpu_small_bf16 (session 13):
the `cpu-small` DiT (256 wide, 4 layers) for 11,000 steps x 32 windows of 128 nt (45.1 M bases, 84% of the
training blocks' 53.7 M) under bf16 autocast where the CPU has it, about 2.2x the float32 step on this machine
(reports/bench/cpu_bf16_speedup); sized for under an hour on 2 threads (0.28 s per step measured). lr 1e-3, the
config's: at 2e-3 this model was no better than the unigram after 1,000 steps (reports/dna/cpu_small_bf16).
cpu_small_bf16_conv9 (session 14): the same with model.local_conv=9, a depthwise convolution over the 4 bases on
each side (MDLM; AR would see the 8 before, an order-8 chain's context). cpu_small_bf16_conv17 (session 15): the
same with 8 bases on each side, the order-8 chain's context on both sides. cpu_small_bf16_conv17_mlp (session 16):
conv17 plus model.local_conv_mlp, a second convolution before each block's MLP. cpu_small_bf16_conv17_kmer (session
17): conv17 plus k-mer input embeddings of sizes 3, 5, 7 and 9 (seqdiff.backbones.kmer_embedding; the 7- and 9-mers
hashed into 524,288 rows each), the order-8 chain's context table handed to the network."""
DONE = Path("checkpoints") / "DONE"
MARKOV_ORDERS = (0, 2, 5, 8)
PAPER = {"mdlm_perplexity": 3.199, "ar_perplexity": 3.067}  # MDLM paper, human genome (HG38), per base


def train_command(method: str, run_dir: Path, recipe: str = "short", resumed_to: int | None = None) -> str:
    """The command that trained a run; resumed_to: then resumed with a larger train.max_steps (the cosine is
    recomputed over the new total, so the learning rate rises again and anneals to zero at the new end)."""
    first = (f"seqdiff train --config {RECIPE.format(method=method)} --run-dir {run_dir} "
             + " ".join(RECIPES[recipe]))
    if resumed_to is None:
        return first
    overrides = [o for o in RECIPES[recipe] if not o.startswith("train.max_steps=")]
    return (f"{first}; then seqdiff train --config {RECIPE.format(method=method)} --run-dir {run_dir} --resume "
            + " ".join([*overrides, f"train.max_steps={resumed_to}"]))


def parse_resumed(values: list[str]) -> dict[str, int]:
    """--resumed METHOD=STEPS (repeatable) -> {method: steps}."""
    out = {}
    for v in values:
        method, _, steps = v.partition("=")
        if method not in METHODS or not steps.isdigit():
            raise SystemExit(f"[dna] --resumed {v!r}: expected METHOD=STEPS with METHOD one of {list(METHODS)}")
        out[method] = int(steps)
    return out


def train_runs(runs: Path, recipe: str = "short", resumed: dict[str, int] | None = None,
               methods: tuple[str, ...] = METHODS) -> None:
    """Train each method's run unless its DONE marker exists; a partial run is resumed. A method in `resumed` is
    then resumed to its train.max_steps (marker DONE-<steps>)."""
    for method in methods:
        run_dir = runs / method
        config = load_run_config(RECIPE.format(method=method), RECIPES[recipe])
        parts = [(DONE, config)]
        if method in (resumed or {}):
            steps = resumed[method]
            longer = load_run_config(RECIPE.format(method=method), [*RECIPES[recipe], f"train.max_steps={steps}"])
            parts.append((DONE.with_name(f"DONE-{steps}"), longer))
        for marker, part in parts:
            if (run_dir / marker).is_file():
                print(f"[dna] {run_dir / marker} exists; reusing the run", file=sys.stderr)
                continue
            train(part, run_dir, resume=(run_dir / LAST_CHECKPOINT).is_file())
            (run_dir / marker).write_text(time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + "\n")


# ---------------------------------------------------------------------------------------------- held-out data
def evenly(n: int, k: int | None) -> list[int]:
    """k indices spread evenly over range(n) (all of them when k is None or >= n)."""
    if k is None or k >= n:
        return list(range(n))
    return sorted({int(i) for i in np.linspace(0, n - 1, k).round()})


def tile_segments(dm: FastaDataModule, split: str, index: list[int]) -> list[np.ndarray]:
    """Token ids (N included, padding cut) of the chosen evaluation tiles of `split`."""
    tiles = dm.eval_dataset(split)
    out = []
    for i in index:
        item = tiles[i]
        out.append(item["input_ids"][item["attention_mask"]].numpy())
    return out


def train_segments(dm: FastaDataModule) -> list[np.ndarray]:
    """Token ids of every training interval (for the Markov yardstick)."""
    out = []
    for iv in dm.split_intervals("train"):
        raw = dm.fasta.fetch(iv.chrom, iv.start, iv.end)
        out.append(encode_bases(raw, dm.tokenizer, dm.fasta.path, iv.chrom, iv.start).ids)
    return out


def markov_yardstick(train: list[np.ndarray], test: list[np.ndarray], orders=MARKOV_ORDERS,
                     also: list[np.ndarray] | None = None) -> dict[str, float] | tuple[dict[str, float], ...]:
    """Bits per base of order-k chains counted on `train`, on `test` (and on `also`, from the same fits: the
    order-8 count over 53.7 M bases is the slow part)."""
    chains = {k: MarkovChain(k).fit(train) for k in orders}
    on_test = {f"order_{k}": c.bits_per_base(test) for k, c in chains.items()}
    if also is None:
        return on_test
    return on_test, {f"order_{k}": c.bits_per_base(also) for k, c in chains.items()}


# ---------------------------------------------------------------------------------------------- extrapolation
def fit_power_law(steps, bits, exponents=None) -> dict[str, float]:
    """Least-squares fit of bits = c + a * step^-b: for each exponent b of a grid, c and a are a linear least
    squares; the b with the smallest squared error wins. c is the curve's asymptote, b its rate."""
    x, y = np.asarray(steps, dtype=float), np.asarray(bits, dtype=float)
    if len(x) < 3 or (x <= 0).any():
        raise ValueError(f"a power-law fit needs at least 3 points at positive steps, got {len(x)}")
    grid = np.linspace(0.02, 3.0, 1491) if exponents is None else np.asarray(exponents, dtype=float)
    best = None
    for b in grid:
        design = np.stack([np.ones_like(x), x ** -b], axis=1)
        coef = np.linalg.lstsq(design, y, rcond=None)[0]
        sse = float(((design @ coef - y) ** 2).sum())
        if best is None or sse < best[0]:
            best = (sse, float(b), coef)
    sse, b, (c, a) = best
    # an exponent at the edge of the grid means no power law fits (e.g. a curve that speeds up as the
    # learning rate anneals): the fit and its crossing are then reported as failed, not read off
    return {"c": float(c), "a": float(a), "b": b, "rmse": math.sqrt(sse / len(x)), "points": len(x),
            "at_grid_edge": bool(b in (float(grid[0]), float(grid[-1])))}


def power_law(fit: dict[str, float], steps) -> np.ndarray:
    return fit["c"] + fit["a"] * np.asarray(steps, dtype=float) ** -fit["b"]


def step_to_reach(fit: dict[str, float], target: float) -> float | None:
    """The step where the fitted curve comes down to `target`; None when it never does (asymptote c at or
    above the target, or a curve that does not decrease)."""
    if fit["a"] <= 0 or fit["c"] >= target:
        return None
    return float((fit["a"] / (target - fit["c"])) ** (1 / fit["b"]))


def extrapolate(curve: dict[str, list[float]], target: float, warmup_steps: int, bases_per_step: int,
                restart_step: int | None = None) -> dict:
    """The validation curve's power-law fit (points after the warm-up) and where it meets `target`.

    One run's curve under one cosine schedule: its late points fall faster than a longer schedule's would at
    the same step (the learning rate anneals), so the crossing read off it is a rough estimate, not a bound.
    restart_step: the run was resumed there with a longer cosine (the learning rate rose again), so no single
    power law describes the curve and none is fitted."""
    steps = [s for s in curve.get("val_step", []) if s >= warmup_steps]
    bits = curve["val_bits_per_base"][len(curve["val_step"]) - len(steps):] if steps else []
    out: dict = {"target": target, "last_step": curve["val_step"][-1] if curve.get("val_step") else None,
                 "last_bits": curve["val_bits_per_base"][-1] if curve.get("val_step") else None,
                 "restart_step": restart_step}
    if restart_step is not None and out["last_bits"] is not None:
        return {**out, "fit": None, "crossing_step": None, "crossed": bool(out["last_bits"] < target)}
    if len(steps) < 3:
        return {**out, "fit": None, "crossing_step": None, "crossed": None}
    fit = fit_power_law(steps, bits)
    crossing = None if fit["at_grid_edge"] else step_to_reach(fit, target)
    return {**out, "fit": fit, "crossed": bool(out["last_bits"] < target), "crossing_step": crossing,
            "crossing_bases": None if crossing is None else crossing * bases_per_step}


# ---------------------------------------------------------------------------------------------- likelihood
def test_bits(model, dm: FastaDataModule, index: list[int], num_t_samples: int, batch_size: int) -> dict:
    loader = DataLoader(Subset(dm.eval_dataset("test"), index), batch_size=batch_size, shuffle=False)
    t0 = time.perf_counter()
    report = evaluate_batches(model, loader, num_t_samples=num_t_samples, seed=0)
    report["eval_seconds"] = time.perf_counter() - t0
    return report


def val_curve(run_dir: Path) -> dict[str, list[float]]:
    rows = read_metrics(run_dir)
    out = {}
    for key, col in (("val", "val/bits_per_token"), ("train", "train/bits_per_token")):
        if rows and col in rows[0]:
            out[f"{key}_step"], out[f"{key}_bits_per_base"] = metric_curve(rows, col)
    return out


# ---------------------------------------------------------------------------------------------- realism
def cpg_observed_expected(seqs: list[str]) -> float:
    """CpG observed / expected, pooled: (#CG dinucleotides x #bases) / (#C x #G) (Gardiner-Garden & Frommer).
    Human DNA is CpG-depleted (about 0.2-0.25 outside CpG islands); a shuffled sequence gives about 1."""
    cg = sum(s.upper().count("CG") for s in seqs)
    c, g = (sum(s.upper().count(b) for s in seqs) for b in "CG")
    n = sum(sum(s.upper().count(b) for b in "ACGT") for s in seqs)
    return cg * n / (c * g) if c and g else math.nan


def realism(samples: dict[str, list[str]], reference: str) -> dict[str, dict[str, float]]:
    """GC (mean and spread over sequences), CpG observed / expected and k-mer TV distances (k = 1..6) of each
    source to `reference`."""
    out = {}
    for name, seqs in samples.items():
        gcs = [g for g in (gc_content(s) for s in seqs) if not math.isnan(g)]
        out[name] = {**dna_metrics(seqs, reference), "gc_std": float(np.std(gcs)) if gcs else math.nan,
                     "cpg_obs_exp": cpg_observed_expected(seqs),
                     "num_sequences": len(seqs), "num_bases": sum(len(s) for s in seqs)}
    return out


def shuffled(seqs: list[str], seed: int = 0) -> list[str]:
    """Each sequence with its bases permuted: same composition, no order."""
    rng = np.random.default_rng(seed)
    return ["".join(rng.permutation(list(s))) for s in seqs]


# ---------------------------------------------------------------------------------------------- loader speed
def loader_throughput(dm: FastaDataModule, workers=(0, 2), batches: int = 200, rounds: int = 5) -> dict:
    """Windows/s of the training loader for each worker count, measured in alternating rounds (same load).
    Start-up (the first batch of every worker: a fork and a FASTA handle each) is timed apart."""
    per: dict[int, list[float]] = {w: [] for w in workers}
    startup: dict[int, list[float]] = {w: [] for w in workers}
    batch_size = dm.config.batch_size
    for r in range(rounds):
        for w in workers:
            data = dm.train_dataset(start_step=r * (batches + 1) * 7919)  # fresh windows each round
            loader = DataLoader(data, batch_size=None, num_workers=w,
                                multiprocessing_context="fork" if w else None)
            t0 = time.perf_counter()
            it = iter(loader)
            first = next(it)
            for _ in range(w - 1):  # until every worker has delivered once (started, handle opened)
                next(it)
            t1 = time.perf_counter()
            for _ in range(batches):
                batch = next(it)
                assert batch["loss_mask"].any(dim=1).all() and first["input_ids"].shape == batch["input_ids"].shape
            t2 = time.perf_counter()
            del it
            per[w].append(batches * batch_size / (t2 - t1))
            startup[w].append(t1 - t0)
    out = {"batches_per_round": batches, "rounds": rounds, "batch_size": batch_size,
           "seq_len": dm.config.seq_len, "windows_per_second": {}, "first_batch_seconds": {}}
    for w in workers:
        out["windows_per_second"][str(w)] = {"median": float(np.median(per[w])), "rounds": per[w]}
        out["first_batch_seconds"][str(w)] = float(np.median(startup[w]))
    if len(workers) == 2:
        a, b = workers
        ratios = [y / x for x, y in zip(per[a], per[b])]
        out[f"ratio_{b}_over_{a}"] = {"median": float(np.median(ratios)), "rounds": ratios}
    return out


# ---------------------------------------------------------------------------------------------- report
def _plots(results: dict, out: Path) -> None:
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, r in results["models"].items():
        c = r["curves"]
        if "train_step" in c:
            axes[0].plot(c["train_step"], c["train_bits_per_base"], alpha=0.8, label=f"{method.upper()} train")
        if "val_step" in c:
            axes[1].plot(c["val_step"], c["val_bits_per_base"], marker="o", label=f"{method.upper()} valid")
        axes[1].axhline(r["test"]["bits_per_base"], ls=":", color=axes[1].lines[-1].get_color(),
                        label=f"{method.upper()} test (final)")
    for k, v in results["markov"].items():
        if k in ("order_5", "order_8"):
            axes[1].axhline(v, ls="--", color="grey", alpha=0.6)
            axes[1].annotate(f"Markov {k.replace('_', ' ')} (test)", xy=(0.01, v), xycoords=("axes fraction", "data"),
                             va="bottom", fontsize=8, color="grey")
    axes[0].set(xlabel="step", ylabel="bits per base", title="training (MDLM: NELBO, one draw per step)")
    axes[1].set(xlabel="step", ylabel="bits per base", title="validation blocks (EMA weights)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "val_curves.png")

    _extrapolation_plot(results, out)

    fig, ax = plt.subplots(figsize=(6, 4))
    ks = list(range(1, 7))
    for name, m in results["realism"]["sources"].items():
        ax.plot(ks, [m[f"kmer_tv_k{k}"] for k in ks], marker="o", label=name)
    ax.set(xlabel="k", ylabel="total variation to held-out test sequence", title="k-mer spectrum distance",
           xticks=ks)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, out / "realism.png")


def _extrapolation_plot(results: dict, out: Path) -> None:
    """Validation bits per base against step (log axis), each fitted power law carried on to its crossing
    of the best Markov chain on the same validation tiles (or to 100x the last step)."""
    if "markov_valid" not in results:
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    last = 1
    for method, r in results["models"].items():
        c, ex = r["curves"], r.get("extrapolation") or {}
        if "val_step" not in c:
            continue
        (line,) = ax.plot(c["val_step"], c["val_bits_per_base"], marker="o", label=f"{method.upper()} valid")
        last = max(last, c["val_step"][-1])
        if ex.get("fit") and not ex["fit"].get("at_grid_edge"):  # a failed fit is not drawn
            end = min(ex["crossing_step"] or math.inf, 100 * c["val_step"][-1])
            end = max(end, c["val_step"][-1])
            xs = np.geomspace(c["val_step"][0], end, 200)
            f = ex["fit"]
            ax.plot(xs, power_law(f, xs), ls="--", color=line.get_color(),
                    label=f"{method.upper()} fit {f['c']:.3f} + {f['a']:.3g} step^-{f['b']:.2f}")
            last = max(last, end)
    for k, v in results["markov_valid"].items():
        if k in ("order_5", "order_8"):
            ax.axhline(v, ls=":", color="grey")
            ax.annotate(f"Markov {k.replace('_', ' ')} (same validation tiles)", xy=(0.01, v),
                        xycoords=("axes fraction", "data"), va="bottom", fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set(xlabel="training step", ylabel="bits per base (validation tiles)",
           title="validation curves and their power-law fits", xlim=(None, 1.3 * last))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, out / "extrapolation.png")


def extrapolation_lines(results: dict) -> list[str]:
    """The extrapolation as a table (empty for summaries written before it existed)."""
    if "markov_valid" not in results:
        return []
    lines = ["", f"Validation tiles: {results['valid_tiles']} (the ones training scored); Markov chains on them: "
             + ", ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in results["markov_valid"].items()) + ".", "",
             "| model | last valid step | last valid bits/base | fit c + a step^-b | crosses the best chain at step |",
             "|---|---|---|---|---|"]
    for method, r in results["models"].items():
        ex = r["extrapolation"]
        f = ex["fit"]
        fit = "-" if f is None else f"{f['c']:.4f} + {f['a']:.4g} step^-{f['b']:.3f} (rmse {f['rmse']:.4f})"
        if ex.get("restart_step") is not None:
            fit = f"not fitted (resumed at step {ex['restart_step']} with a longer cosine)"
        if ex["crossed"]:
            cross = "already below it"
        elif f is not None and f.get("at_grid_edge"):
            cross = "no power law fits (exponent at the grid edge): not extrapolated"
        elif ex["crossing_step"] is None:
            cross = "never (asymptote above it)" if f is not None else "-"
        else:
            cross = f"{ex['crossing_step']:,.0f} ({ex['crossing_bases'] / 1e6:,.0f} M bases)"
        lines.append(f"| {method.upper()} | {ex['last_step']} | {ex['last_bits']:.4f} | {fit} | {cross} |")
    return lines


def table(results: dict) -> str:
    """table.md: the numbers of summary.json as tables (the report's README.md is written by hand)."""
    lw = results["loader"]
    lines = [f"Made by `{results['command']}`; numbers from `summary.json`.", "",
             "| model | test bits/base | perplexity | kind | train s |", "|---|---|---|---|---|"]
    for method, r in results["models"].items():
        kind = "upper bound (NELBO)" if r["test"]["bound"] else "exact NLL"
        lines.append(f"| {method.upper()} | {r['test']['bits_per_base']:.4f} | {r['test']['perplexity']:.4f} | "
                     f"{kind} | {r['train_seconds']:.0f} |")
    lines += [f"| Markov chain, {k.replace('_', ' ')} | {v:.4f} | {2 ** v:.4f} | exact | - |"
              for k, v in results["markov"].items()]
    lines += extrapolation_lines(results)
    if results["relative_gap"] is not None:
        lines += ["", f"Relative gap (MDLM bound / AR - 1, in bits): {100 * results['relative_gap']:+.2f}%."]
    lines += ["", "| source | GC mean | GC std over sequences | CpG obs/exp | "
              + " | ".join(f"TV k={k}" for k in range(1, 7)) + " |", "|---|---|---|---|" + "---|" * 6]
    lines += [f"| {name} | {m['gc_content']:.4f} | {m['gc_std']:.4f} | {m['cpg_obs_exp']:.3f} | "
              + " | ".join(f"{m[f'kmer_tv_k{k}']:.4f}" for k in range(1, 7)) + " |"
              for name, m in results["realism"]["sources"].items()]
    lines += ["", "| loader workers | windows/s (median) | per round | start-up s |", "|---|---|---|---|"]
    for w in ("0", "2"):
        rates = lw["windows_per_second"][w]
        lines.append(f"| {w} | {rates['median']:.0f} | {', '.join(f'{x:.0f}' for x in rates['rounds'])} | "
                     f"{lw['first_batch_seconds'][w]:.2f} |")
    lines += ["", f"Loader ratio 2 workers / 0 workers: {lw['ratio_2_over_0']['median']:.2f} (median of the rounds)."]
    return "\n".join(lines) + "\n"


def run(runs: Path, out: Path, do_train: bool, max_test_windows: int | None, num_t_samples: int,
        num_samples: int, sample_steps: int, loader_batches: int, loader_rounds: int, command: str,
        recipe: str = "short", resumed: dict[str, int] | None = None, methods: tuple[str, ...] = METHODS,
        threads: int = 1) -> dict:
    """The report of the runs of `methods` (both by default; one of them reports that model alone, without the
    MDLM / AR gap). threads: torch threads for training and the report (1: the short recipe's shared machine)."""
    torch.set_num_threads(threads)
    if do_train:
        train_runs(runs, recipe, resumed, methods)
    for method in methods:
        if not (runs / method / LAST_CHECKPOINT).is_file():
            raise SystemExit(f"[dna] no checkpoint at {runs / method / LAST_CHECKPOINT}; pass --train")
    start = time.perf_counter()
    results: dict = {"command": command, "recipe": recipe,
                     "train_commands": {m: train_command(m, runs / m, recipe, (resumed or {}).get(m))
                                        for m in methods},
                     "models": {}, "seconds": {}}
    load_start = os.getloadavg()[0]
    models = {m: load_checkpoint(runs / m) for m in methods}
    first = models[methods[0]]
    cfg = first.data_config
    if any(model.data_config != cfg for model in models.values()):
        raise SystemExit("[dna] the two runs were trained on different data configs")
    dm = build_data_module(cfg, first.tokenizer)
    dm.check_files()
    n_tiles = len(dm.eval_dataset("test"))
    index = evenly(n_tiles, max_test_windows)
    results["test_windows"] = {"used": len(index), "total": n_tiles}

    for method, model in models.items():
        t = time.perf_counter()
        report = test_bits(model, dm, index, 1 if model.method.exact_likelihood else num_t_samples, cfg.eval_batch_size)
        print(f"[dna] {method}: test {report['bits_per_base']:.4f} bits/base ({time.perf_counter() - t:.0f} s)",
              file=sys.stderr)
        timing = runs / method / "timing.json"
        results["models"][method] = {
            "test": report, "steps": model.step, "bases_seen": model.step * cfg.batch_size * cfg.seq_len,
            "parameters": sum(p.numel() for p in model.backbone.parameters()),
            "train_seconds": json.loads(timing.read_text())["train_seconds"] if timing.is_file() else math.nan,
            "curves": val_curve(runs / method), "checkpoint": str(model.path),
        }
    results["relative_gap"] = None  # with one model there is no gap
    if {"mdlm", "ar"} <= set(models):
        results["relative_gap"] = (results["models"]["mdlm"]["test"]["bits_per_base"]
                                   / results["models"]["ar"]["test"]["bits_per_base"] - 1)
    results["paper_perplexity"] = PAPER  # for comparison: the MDLM paper's per-base numbers on HG38
    results["seconds"]["likelihood"] = time.perf_counter() - start

    t = time.perf_counter()
    test_segs = tile_segments(dm, "test", index)
    # the tiles training validated on: Lightning's first val_batches batches of the (unshuffled) valid loader
    train_cfg = load_run_config(runs / methods[0] / "config.yaml").train
    n_valid = len(dm.eval_dataset("valid"))
    n_val = min(n_valid, train_cfg.val_batches * cfg.eval_batch_size) if train_cfg.val_batches else n_valid
    results["markov"], results["markov_valid"] = markov_yardstick(
        train_segments(dm), test_segs, MARKOV_ORDERS, also=tile_segments(dm, "valid", list(range(n_val))))
    results["valid_tiles"] = n_val
    results["seconds"]["markov"] = time.perf_counter() - t
    best_order, best_bits = min(results["markov_valid"].items(), key=lambda kv: kv[1])
    recipe_steps = load_run_config(RECIPE.format(method=methods[0]), RECIPES[recipe]).train.max_steps  # resumes began
    for method in methods:
        results["models"][method]["extrapolation"] = {
            "markov_order": best_order,
            **extrapolate(results["models"][method]["curves"], best_bits, train_cfg.warmup_steps,
                          cfg.batch_size * cfg.seq_len,
                          restart_step=recipe_steps if method in (resumed or {}) else None)}
    results["train_bases"] = sum(len(iv) for iv in dm.split_intervals("train"))

    # realism: generated vs held-out test sequence, with real and shuffled validation windows of the same size
    t = time.perf_counter()
    tok = dm.tokenizer
    reference = "|".join(tok.decode(s) for s in test_segs)
    full = [i for i, (_, _, size) in enumerate(dm.eval_dataset("valid").tiles) if size == cfg.seq_len]
    real = [tok.decode(s) for s in tile_segments(dm, "valid", [full[i] for i in evenly(len(full), num_samples)])]
    sources = {}
    out.mkdir(parents=True, exist_ok=True)
    for method, model in models.items():
        sc = SampleConfig(steps=sample_steps, num_samples=num_samples, batch_size=min(16, num_samples),
                          seq_len=cfg.seq_len, seed=0)
        gen = generate(model, sc)
        write_atomically(out / f"samples_{method}.fa", format_samples(gen, fasta=True))
        sources[method.upper()] = gen.texts
        symbols = torch.cat(gen.tokens)  # (n,) ids; A, C, G, T are 0-3, N is 4, specials above
        results["models"][method]["sampling"] = {
            "sampler": gen.sampler, "steps": cfg.seq_len if model.method.causal else sample_steps,
            "seconds": gen.seconds, "denoiser_calls": gen.denoiser_calls,
            "non_acgt_fraction": float((symbols >= tok.n_id).float().mean())}
    sources["real (valid)"] = real
    sources["shuffled real (valid)"] = shuffled(real)
    results["realism"] = {"num_samples": num_samples, "reference_bases": sum(len(s) for s in test_segs),
                          "reference_gc_content": gc_content(reference),
                          "reference_cpg_obs_exp": cpg_observed_expected(reference.split("|")),
                          "sources": realism(sources, reference)}
    results["seconds"]["realism"] = time.perf_counter() - t

    t = time.perf_counter()
    results["loader"] = loader_throughput(dm, batches=loader_batches, rounds=loader_rounds)
    results["seconds"]["loader"] = time.perf_counter() - t
    results["setup"] = {
        "fasta": cfg.fasta.path, "block_size": cfg.fasta.block_size, "valid_fraction": cfg.fasta.valid_fraction,
        "test_fraction": cfg.fasta.test_fraction, "split_seed": cfg.fasta.split_seed, "seq_len": cfg.seq_len,
        "batch_size": cfg.batch_size, "preset": first.model_config.preset,
        "lr": load_run_config(RECIPE.format(method=methods[0]), RECIPES[recipe]).train.lr,
        "width": first.model_config.hidden_size, "depth": first.model_config.n_layers,
        "split_sizes": {k: v for k, v in _split_sizes(dm).items()}, "cpu_count": os.cpu_count(),
        "chromosomes": {c: dm.fasta.lengths[c] for c in dict.fromkeys(iv.chrom for iv in dm.intervals())},
        "torch_threads": torch.get_num_threads(), "load_average_at_start": load_start,
        "load_average_at_end": os.getloadavg()[0],
    }
    results["seconds"]["total"] = time.perf_counter() - start
    _plots(results, out)
    write_atomically(out / "summary.json", json.dumps(results, indent=2) + "\n")
    write_atomically(out / "table.md", table(results))
    gap = "" if results["relative_gap"] is None else f"gap {100 * results['relative_gap']:+.2f}%; "
    print(f"[dna] {gap}report in {out}/", file=sys.stderr)
    return results


def _split_sizes(dm: FastaDataModule) -> dict:
    from seqdiff.data.genome import summarize

    return summarize(dm.intervals())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/dna", help="folder holding the mdlm/ and ar/ runs")
    p.add_argument("--out", default="reports/dna", help="report folder")
    p.add_argument("--train", action="store_true", help="train the runs that have no DONE marker first")
    p.add_argument("--max-test-windows", type=int, default=None, help="evenly spaced test tiles (default: all)")
    p.add_argument("--num-t-samples", type=int, default=1, help="Monte Carlo time draws per tile for MDLM")
    p.add_argument("--num-samples", type=int, default=32, help="generated sequences per model")
    p.add_argument("--sample-steps", type=int, default=128, help="MDLM reverse steps")
    p.add_argument("--loader-batches", type=int, default=200, help="timed batches per round and setting")
    p.add_argument("--loader-rounds", type=int, default=5, help="alternating rounds of 0 and 2 workers")
    p.add_argument("--recipe", choices=sorted(RECIPES), default="short",
                   help="training overrides of --train and of the recorded train commands (RECIPES)")
    p.add_argument("--methods", default=",".join(METHODS),
                   help="comma-separated runs to report (default both; one reports that model alone)")
    p.add_argument("--threads", type=int, default=1, help="torch threads for --train and the report (default 1)")
    p.add_argument("--resumed", action="append", default=[], metavar="METHOD=STEPS",
                   help="the method's run was trained with --recipe, then resumed to train.max_steps=STEPS (recorded "
                        "in the train commands; repeatable)")
    args = p.parse_args(argv)
    resumed = parse_resumed(args.resumed)
    methods = tuple(m for m in args.methods.split(",") if m)
    if not methods or any(m not in METHODS for m in methods):
        p.error(f"--methods {args.methods!r}: choose from {list(METHODS)}")
    command = "python -m experiments.dna_experiment " + " ".join(sys.argv[1:] if argv is None else argv)
    run(Path(args.runs), Path(args.out), args.train, args.max_test_windows, args.num_t_samples, args.num_samples,
        args.sample_steps, args.loader_batches, args.loader_rounds, command.strip(), args.recipe, resumed, methods,
        args.threads)
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
