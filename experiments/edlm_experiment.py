"""EDLM on the Shakespeare character corpus: likelihood bounds, generation quality, speed, k / w ablation.

    python -m experiments.edlm_experiment --mdlm RUN --ar RUN [--out reports/edlm] [--energy-out FILE]

Base models: a character-level MDLM and AR pair trained on the shipped Shakespeare slice (by default the
`seqdiff quickstart`-sized pair in /work/runs/edlm/{mdlm,ar}, trained with configs/quickstart.yaml). The
job
  1. trains the EDLM-NCE energy against the frozen MDLM (seqdiff.edlm.nce_train), unless --energy-out exists;
  2. scores the first `--eval-tokens` characters of the test split: AR (exact), MDLM (NELBO), and EDLM-coAR,
     EDLM-AR, EDLM-NCE in both forms of seqdiff.edlm.likelihood: `marginal` (a valid upper bound, Theorem-1
     log-partition estimate with n draws) and `sequence` (the paper's form: exact for coAR, not a bound);
  3. samples MDLM (cached sampler), EDLM-AR and EDLM-NCE (importance sampling, by default the paper's k = 2,
     w = 0.2; `--edlm-k`, `--edlm-window`) at several
     step counts and reports generative perplexity under the oracle, unigram entropy and seconds per sample;
  4. ablates k (1, 2, 4, 8) and w (0.2 .. 1.0) for EDLM-AR at one step count.
Oracle: `--oracle RUN`, an AR model trained longer than the models compared, so that no sampler is scored by
its own energy; by default (no --oracle) the AR model itself, whose generative perplexity then flatters
EDLM-AR by construction (the report says which case it is).
Writes reports/edlm/{summary.json, table.md, gen_ppl_vs_time.png, ablation.png}; table.md holds summary.json's
numbers as tables, and the report's README.md is written by hand.
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

from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import SampleConfig
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.edlm import load_energy
from seqdiff.edlm.likelihood import edlm_model
from seqdiff.edlm.nce_train import NCEConfig, train_nce
from seqdiff.evaluation.generate import generate, write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.evaluation.metrics import SeqdiffAROracle, generation_metrics
from seqdiff.figures import pyplot, save_figure


def log(msg: str) -> None:
    print(f"[edlm] {msg}", flush=True)


def likelihoods(mdlm, ar, energies, tokens, args) -> dict:
    rows = {}
    start = time.perf_counter()
    rows["AR"] = evaluate_tokens(ar, tokens, batch_size=32)
    rows["MDLM"] = evaluate_tokens(mdlm, tokens, batch_size=32, num_t_samples=args.num_t_samples, seed=1)
    for name, energy in energies.items():
        for form in ("marginal", "sequence"):
            model = edlm_model(mdlm, energy, args.num_partition_samples, form)
            key = f"{name} ({form})"
            rows[key] = evaluate_tokens(model, tokens, batch_size=16, num_t_samples=args.num_t_samples, seed=1)
            rows[key]["bound"] = form == "marginal"
            rows[key]["num_partition_samples"] = args.num_partition_samples
            log(f"{key}: {rows[key]['bits_per_character']:.4f} bpc")
    log(f"likelihoods done in {time.perf_counter() - start:.0f}s")
    return {k: {key: v[key] for key in ("bits_per_character", "nll_nats_per_token", "bound", "num_tokens",
                                        "num_t_samples") if key in v} | ({"num_partition_samples":
                                        v["num_partition_samples"]} if "num_partition_samples" in v else {})
            for k, v in rows.items()}


def sample_row(model, oracle, sampler, steps, n, options=None, seed=0) -> dict:
    cfg = SampleConfig(sampler=sampler, steps=steps, num_samples=n, batch_size=n, seq_len=model.seq_len, seed=seed)
    gen = generate(model, cfg, sampler_options=options)
    m = generation_metrics(gen.tokens, gen.texts, oracle=oracle)
    per = np.array([oracle.nll([text]) for text in gen.texts], dtype=np.float64)  # (n, 2): NLL sum, tokens
    rate = per[:, 0].sum() / per[:, 1].sum()
    se = math.sqrt(((per[:, 0] - rate * per[:, 1]) ** 2).sum() / (n * (n - 1))) / per[:, 1].mean()  # ratio est.
    row = {"sampler": sampler, "steps": steps, "num_samples": n, "gen_perplexity": m["gen_perplexity"],
           "gen_perplexity_interval": [math.exp(rate - 2 * se), math.exp(rate + 2 * se)],
           "unigram_entropy_nats": m["unigram_entropy_nats"], "seconds_per_sample": gen.seconds / n,
           "denoiser_calls": gen.denoiser_calls, "example": gen.texts[0][:120]}
    if gen.stats:
        row.update(gen.stats)
    return row


def speedup_at_equal_quality(mdlm_rows, edlm_rows) -> list[dict]:
    """For each EDLM point, the MDLM time that reaches the same gen-PPL (log-log interpolation of the MDLM
    curve, monotone part only) divided by EDLM's time; None outside MDLM's range."""
    pts = sorted((r["seconds_per_sample"], r["gen_perplexity"]) for r in mdlm_rows)
    out = []
    for r in edlm_rows:
        target, found = r["gen_perplexity"], None
        for (t0, p0), (t1, p1) in zip(pts, pts[1:]):
            if min(p0, p1) <= target <= max(p0, p1) and p0 != p1:
                f = (math.log(target) - math.log(p0)) / (math.log(p1) - math.log(p0))
                found = math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
                break
        out.append({"steps": r["steps"], "edlm_gen_perplexity": target, "edlm_seconds": r["seconds_per_sample"],
                    "mdlm_seconds_at_equal_gen_ppl": found,
                    "speedup": found / r["seconds_per_sample"] if found else None})
    return out


def plots(summary: dict, out: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for name, rows in summary["generation"].items():
        rows = sorted(rows, key=lambda r: r["steps"])
        ax.plot([r["seconds_per_sample"] for r in rows], [r["gen_perplexity"] for r in rows], marker="o", label=name)
        for r in rows:
            ax.annotate(str(r["steps"]), (r["seconds_per_sample"], r["gen_perplexity"]), fontsize=7)
    ax.set(xscale="log", xlabel="seconds per sample (shared 2-core CPU)", ylabel="generative perplexity (AR oracle)",
           title="quality vs wall-clock (labels: steps)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, out / "gen_ppl_vs_time.png")
    if not summary["ablation"]["k"]:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in [(axes[0], "k", "k (w = 0.2)"), (axes[1], "w", "window w (k = 2)")]:
        rows = summary["ablation"][key]
        xs = [r["edlm_k"] if key == "k" else r["edlm_window"] for r in rows]
        ax.plot(xs, [r["gen_perplexity"] for r in rows], marker="o", label="gen PPL")
        ax.set(xlabel=label, ylabel="generative perplexity")
        ax2 = ax.twinx()
        ax2.plot(xs, [r["unigram_entropy_nats"] for r in rows], marker="s", color="tab:red", label="entropy")
        ax2.set_ylabel("unigram entropy (nats)", color="tab:red")
        ax.grid(alpha=0.3)
    fig.suptitle(f"EDLM-AR ablation, {summary['settings']['ablation_steps']} steps")
    fig.tight_layout()
    save_figure(fig, out / "ablation.png")


def edlm_setting(summary: dict) -> tuple[int, float]:
    """(k, w) of the main generation rows; summaries written before the options existed used 2, 0.2."""
    st = summary["settings"]
    return st.get("edlm_k", 2), st.get("edlm_window", 0.2)


def beyond_mdlm(summary: dict, name: str) -> list[dict]:
    """EDLM points better than every MDLM point (interval entirely below every MDLM interval), each with the
    time of MDLM's best point (lowest gen-PPL) over EDLM's time: a speed-up that also buys quality, where the
    interpolated speed-up at equal gen-PPL does not exist because MDLM's curve never gets there."""
    mdlm = summary["generation"]["MDLM"]
    floor = min(m["gen_perplexity_interval"][0] for m in mdlm)
    best = min(mdlm, key=lambda m: m["gen_perplexity"])
    return [{"steps": e["steps"], "gen_perplexity": e["gen_perplexity"], "seconds": e["seconds_per_sample"],
             "mdlm_best_steps": best["steps"], "mdlm_best_gen_perplexity": best["gen_perplexity"],
             "mdlm_best_seconds": best["seconds_per_sample"],
             "speedup_vs_mdlm_best": best["seconds_per_sample"] / e["seconds_per_sample"]}
            for e in summary["generation"][name] if e["gen_perplexity_interval"][1] < floor]


def _fmt(x, digits=2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _row(name: str, r: dict, first: str) -> str:
    lo, hi = r.get("gen_perplexity_interval", [None, None])
    return (f"| {name} | {first} | {r['gen_perplexity']:.2f} | {_fmt(lo)} - {_fmt(hi)} | "
            f"{r['unigram_entropy_nats']:.3f} | {r['seconds_per_sample']:.4f} | "
            f"{_fmt(r.get('mean_effective_sample_size'))} |")


GENERATION_HEADER = ["| sampler | {} | gen-PPL | ±2 s.e. interval | entropy | s / sample | mean ESS |",
                     "|---|---|---|---|---|---|---|"]


def write_table(summary: dict, out: Path) -> None:
    """table.md: the numbers of summary.json as tables (the report's README.md is written by hand)."""
    st = summary["settings"]
    k, w = edlm_setting(summary)
    lines = [f"Made by `{summary['command']}`; numbers from `summary.json`.", "",
             f"Bits per character, first {st['eval_tokens']} characters of the test split, {st['num_t_samples']} "
             f"(t, x_t) draws per block, n = {st['num_partition_samples']}:", "",
             "| model | bpc |", "|---|---|"]
    lines += [f"| {name} | {row['bits_per_character']:.4f} |" for name, row in summary["bits_per_character"].items()]
    for rerun in summary.get("likelihood_reruns", []):
        lines += ["", f"Made by `{rerun['command']}`: {rerun['eval_tokens']} characters, {rerun['num_t_samples']} "
                  f"draws per block, n = {rerun['num_partition_samples']}:", "", "| model | bpc |", "|---|---|"]
        lines += [f"| {name} | {row['bits_per_character']:.4f} |" for name, row in rerun["bits_per_character"].items()]
    lines += ["", f"Generation, {st['num_samples']} samples per row, EDLM k = {k}, w = {w}, seed {st.get('seed', 0)}; "
              f"AR's own samples: gen-PPL {summary['ar_samples']['gen_perplexity']:.2f}, entropy "
              f"{summary['ar_samples']['unigram_entropy_nats']:.3f}:", "",
              GENERATION_HEADER[0].format("steps"), GENERATION_HEADER[1]]
    lines += [_row(name, r, str(r["steps"])) for name, rows in summary["generation"].items() for r in rows]
    lines += ["", "Speed-up at equal gen-PPL against the cached MDLM sampler (interpolated on MDLM's curve):", "",
              "| sampler | steps | speed-up |", "|---|---|---|"]
    lines += [f"| {name} | {r['steps']} | {_fmt(r['speedup'])} |"
              for name, rows in summary["speedup_vs_mdlm_cached"].items() for r in rows]
    beyond = [(name, b) for name in ("EDLM-AR", "EDLM-NCE") for b in beyond_mdlm(summary, name)]
    if beyond:
        lines += ["", "EDLM points whose interval lies below every MDLM interval, against MDLM's best point:", "",
                  "| sampler | steps | gen-PPL | s / sample | MDLM best: steps, gen-PPL, s / sample | speed-up |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {name} | {b['steps']} | {b['gen_perplexity']:.2f} | {b['seconds']:.4f} | "
                  f"{b['mdlm_best_steps']}, {b['mdlm_best_gen_perplexity']:.2f}, {b['mdlm_best_seconds']:.4f} | "
                  f"{b['speedup_vs_mdlm_best']:.2f} |"
                  for name, b in beyond]
    if summary["ablation"]["k"] or summary["ablation"]["w"]:
        lines += ["", f"Ablation, EDLM-AR at {st['ablation_steps']} steps:", "",
                  GENERATION_HEADER[0].format("k, w"), GENERATION_HEADER[1]]
        lines += [_row("EDLM-AR", r, f"{r['edlm_k']}, {r['edlm_window']}")
                  for key in ("k", "w") for r in summary["ablation"][key]]
    write_atomically(out / "table.md", "\n".join(lines) + "\n")


def reference_entropy(mdlm, seq_len: int, blocks: int = 64) -> float:
    """Mean unigram entropy of test-split blocks of the sample length: what samples should match."""
    from seqdiff.evaluation.metrics import unigram_entropy

    tokens = np.asarray(tokenize_file(split_path(mdlm.data_config, "test"), mdlm.tokenizer))
    return float(np.mean([unigram_entropy(tokens[i * seq_len : (i + 1) * seq_len]) for i in range(blocks)]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mdlm", default="/work/runs/edlm/mdlm")
    p.add_argument("--ar", default="/work/runs/edlm/ar")
    p.add_argument("--oracle", default=None,
                   help="AR run scoring the samples (default: --ar, which flatters EDLM-AR: its energy is the oracle)")
    p.add_argument("--energy-out", default="/work/runs/edlm/nce_energy.pt")
    p.add_argument("--out", default="reports/edlm")
    p.add_argument("--nce-steps", type=int, default=400)
    p.add_argument("--eval-tokens", type=int, default=128 * 48)
    p.add_argument("--num-t-samples", type=int, default=4)
    p.add_argument("--num-partition-samples", type=int, default=8)
    p.add_argument("--num-samples", type=int, default=24)
    p.add_argument("--steps", default="8,16,32,64,128")
    p.add_argument("--ablation-steps", type=int, default=32, help="steps of the k / w ablation (0: no ablation)")
    p.add_argument("--edlm-k", type=int, default=2, help="candidates per importance step (paper: 2)")
    p.add_argument("--edlm-window", type=float, default=0.2, help="importance steps for t >= 1 - w (paper: 0.2)")
    p.add_argument("--seed", type=int, default=0, help="seed of every sampled row")
    p.add_argument("--note", default=None,
                   help="why this run (e.g. how its settings were chosen); kept in summary.json")
    p.add_argument("--likelihood-only", action="store_true",
                   help="score the test text again with these settings (--eval-tokens, --num-t-samples, "
                        "--num-partition-samples) and add the table to an existing summary.json")
    p.add_argument("--from-summary", action="store_true",
                   help="rewrite table.md and the plots from an existing summary.json (no runs)")
    args = p.parse_args(argv)
    if args.edlm_k < 1:
        p.error(f"--edlm-k must be >= 1, got {args.edlm_k}")
    if not 0.0 <= args.edlm_window <= 1.0:
        p.error(f"--edlm-window must be in [0, 1], got {args.edlm_window}")
    out = Path(args.out)
    if (args.from_summary or args.likelihood_only) and not (out / "summary.json").is_file():
        p.error(f"{out / 'summary.json'} does not exist: --from-summary and --likelihood-only need a finished run "
                f"in --out")
    out.mkdir(parents=True, exist_ok=True)
    if args.from_summary:
        summary = json.loads((out / "summary.json").read_text())
        if args.note is not None:
            summary["note"] = args.note
            write_atomically(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        if "reference_unigram_entropy_nats" not in summary:
            summary["reference_unigram_entropy_nats"] = reference_entropy(load_checkpoint(args.mdlm), 128)
            write_atomically(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        plots(summary, out)
        write_table(summary, out)
        return 0
    torch.manual_seed(0)
    t_start = time.perf_counter()
    mdlm, ar = load_checkpoint(args.mdlm), load_checkpoint(args.ar)
    energy_path = Path(args.energy_out)
    nce_log = None
    if not energy_path.is_file():
        train_tokens = tokenize_file(split_path(mdlm.data_config, "train"), mdlm.tokenizer)
        log(f"training the NCE energy for {args.nce_steps} steps")
        _, nce_log = train_nce(mdlm, train_tokens, NCEConfig(steps=args.nce_steps, batch_size=32, lr=3e-4,
                                                             warmup_steps=30), energy_path)
    else:
        nce_log = json.loads(Path(str(energy_path) + ".log.json").read_text())
    energies = {"EDLM-coAR": load_energy(f"coar:{args.ar}", mdlm), "EDLM-AR": load_energy(f"ar:{args.ar}", mdlm),
                "EDLM-NCE": load_energy(f"nce:{energy_path}", mdlm)}
    test_tokens = np.asarray(tokenize_file(split_path(mdlm.data_config, "test"), mdlm.tokenizer))[: args.eval_tokens]
    bpc = likelihoods(mdlm, ar, energies, test_tokens, args)
    if args.likelihood_only:
        summary = json.loads((out / "summary.json").read_text())
        summary.setdefault("likelihood_reruns", []).append({
            "command": "python -m experiments.edlm_experiment " + " ".join(argv if argv is not None else sys.argv[1:]),
            "eval_tokens": len(test_tokens), "num_t_samples": args.num_t_samples,
            "num_partition_samples": args.num_partition_samples, "bits_per_character": bpc,
            "seconds": time.perf_counter() - t_start})
        write_atomically(out / "summary.json", json.dumps(summary, indent=2) + "\n")
        write_table(summary, out)
        return 0

    oracle_model = load_checkpoint(args.oracle) if args.oracle else ar
    oracle = SeqdiffAROracle(oracle_model)
    n, steps_list = args.num_samples, [int(s) for s in args.steps.split(",")]
    generation = {"MDLM": [], "EDLM-AR": [], "EDLM-NCE": [], "MDLM via edlm sampler (k=1)": []}
    k, w, seed = args.edlm_k, args.edlm_window, args.seed
    for steps in steps_list:
        generation["MDLM"].append(sample_row(mdlm, oracle, "cached", steps, n, seed=seed))
        generation["MDLM via edlm sampler (k=1)"].append(sample_row(
            mdlm, oracle, "edlm", steps, n, {"energy": energies["EDLM-AR"], "k": 1, "window": w}, seed=seed))
        for name in ("EDLM-AR", "EDLM-NCE"):
            generation[name].append(sample_row(mdlm, oracle, "edlm", steps, n,
                                               {"energy": energies[name], "k": k, "window": w}, seed=seed))
        log(f"steps {steps}: " + ", ".join(f"{k} {v[-1]['gen_perplexity']:.2f}" for k, v in generation.items()))
    ar_row = sample_row(ar, oracle, "ar", 1, n, seed=seed)

    ablation = {"k": [], "w": []}
    if args.ablation_steps > 0:
        for k_ in (1, 2, 4, 8):
            ablation["k"].append(sample_row(mdlm, oracle, "edlm", args.ablation_steps, n,
                                            {"energy": energies["EDLM-AR"], "k": k_, "window": 0.2}, seed=seed))
        for w_ in (0.2, 0.4, 0.6, 0.8, 1.0):
            ablation["w"].append(sample_row(mdlm, oracle, "edlm", args.ablation_steps, n,
                                            {"energy": energies["EDLM-AR"], "k": 2, "window": w_}, seed=seed))
        log("ablation done")
    summary = {
        "command": "python -m experiments.edlm_experiment " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": vars(args) | {"mdlm_step": mdlm.step, "ar_step": ar.step, "oracle": f"AR model {oracle_model.path}",
                                  "oracle_step": oracle_model.step, "separate_oracle": bool(args.oracle),
                                  "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                                  "load_average_at_end": os.getloadavg()[0]},
        "note": args.note,
        "nce_training": nce_log[-1] if nce_log else None,
        "bits_per_character": bpc,
        "generation": generation,
        "ar_samples": ar_row,
        "speedup_vs_mdlm_cached": {name: speedup_at_equal_quality(generation["MDLM"], generation[name])
                                   for name in ("EDLM-AR", "EDLM-NCE")},
        "speedup_vs_mdlm_same_loop": {name: speedup_at_equal_quality(generation["MDLM via edlm sampler (k=1)"],
                                                                     generation[name])
                                      for name in ("EDLM-AR", "EDLM-NCE")},
        "ablation": ablation,
        "reference_unigram_entropy_nats": reference_entropy(mdlm, mdlm.seq_len),
        "seconds_total": time.perf_counter() - t_start,
    }
    write_atomically(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    plots(summary, out)
    write_table(summary, out)
    log(f"done in {summary['seconds_total']:.0f}s: {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
