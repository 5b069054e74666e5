"""MDLM sampling at a large vocabulary: x_theta's probabilities only where a step reveals, against every position.

    python -m experiments.sampler_lazy --out reports/generation/lazy_probs

The MDLM ancestral and cached samplers keep the denoiser's logits at the masked positions and make float64
probabilities (temperature, nucleus filter) only for the tokens a step reveals (seqdiff.samplers.mdlm_ancestral).
Before, every step built (B, L, V) float64 probabilities at every position and, with top_p < 1, sorted each row
over the vocabulary. This times both ways side by side (the `dense` arm is the same sampler with `lazy` off) on
an untrained DiT with GPT-2's vocabulary, in rounds with the order alternated, each run in its own process so
that its peak resident memory is its own, and checks that both draw the same tokens.

Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ARMS = ("lazy", "dense")


def one_run(args: argparse.Namespace) -> dict:
    """Build the model, sample once, report seconds, peak RSS and a checksum of the tokens (child process)."""
    from seqdiff.bench.models import Shape, build_model, method_of
    from seqdiff.samplers import MDLMCachedSampler

    class Dense(MDLMCachedSampler):
        lazy = False  # every position's float64 probabilities at every step

    torch.set_num_threads(args.threads)
    shape = Shape(args.hidden, args.layers, args.heads, seq_len=args.seq_len, batch_size=args.batch,
                  vocab_size=args.vocab_size)
    torch.manual_seed(0)
    backbone = build_model("seqdiff_bidirectional", shape).eval()
    with torch.no_grad():  # the DiT zero-initializes its output layer; random weights give varied logits
        for p in backbone.parameters():
            p.normal_(0.0, 0.05)
    method = method_of("seqdiff_bidirectional", shape)
    cls = Dense if args.arm == "dense" else MDLMCachedSampler
    sampler = cls(method, backbone, steps=args.steps, top_p=args.top_p)
    start = time.perf_counter()
    out = sampler.generate(args.batch, args.seq_len, torch.Generator().manual_seed(0))
    seconds = time.perf_counter() - start
    tokens = out.tokens.to(torch.int64)
    checksum = int((tokens * torch.arange(1, tokens.numel() + 1).view_as(tokens)).sum())
    return {"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "denoiser_calls": out.num_denoiser_calls, "checksum": checksum}


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.sampler_lazy", description=__doc__.splitlines()[0])
    p.add_argument("--vocab-size", type=int, default=50261, help="GPT-2's 50,257 ids plus 4 specials")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--top-p", default="1.0,0.9", help="comma-separated nucleus settings")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="reports/generation/lazy_probs")
    p.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a child process: one run, JSON on stdout
    args = p.parse_args(argv)
    for key in ("vocab_size", "hidden", "layers", "heads", "batch", "seq_len", "steps", "rounds", "threads"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    try:
        values = [float(x) for x in str(args.top_p).split(",")]
    except ValueError:
        p.error(f"--top-p takes comma-separated numbers in (0, 1], got {args.top_p!r}")
    if not all(0.0 < v <= 1.0 for v in values):
        p.error(f"--top-p values must lie in (0, 1], got {args.top_p!r}")
    return args


def child(args: argparse.Namespace, arm: str, top_p: float) -> dict:
    cmd = [sys.executable, "-m", "experiments.sampler_lazy", "--arm", arm, "--top-p", str(top_p)]
    for key in ("vocab_size", "hidden", "layers", "heads", "batch", "seq_len", "steps", "threads"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict) -> str:
    c = results["config"]
    lines = ["# MDLM cached sampler: probabilities where a step reveals (lazy) against everywhere (dense)\n",
             f"Made by `{results['command']}` on {results['date']} ({results['seconds']:.0f} s, torch "
             f"{results['torch']}, {c['threads']} threads, load average {results['load_average']:.2f} at the start). "
             f"Untrained DiT {c['hidden']} wide, {c['layers']} layers, vocabulary {c['vocab_size']:,}; {c['batch']} x "
             f"{c['seq_len']} tokens, {c['steps']} steps. Median over {c['rounds']} rounds, arms alternated, each run "
             f"in its own process.\n",
             "| top_p | lazy s | dense s | dense / lazy | lazy peak RSS (MB) | dense peak RSS (MB) | denoiser calls | "
             "same tokens |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in results["rows"]:
        lines.append(f"| {row['top_p']} | {row['lazy_s']:.2f} | {row['dense_s']:.2f} | {row['speedup']:.2f}x | "
                     f"{row['lazy_rss_mb']:.0f} | {row['dense_rss_mb']:.0f} | {row['denoiser_calls']} | "
                     f"{row['same_tokens']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.arm is not None:
        args.top_p = float(args.top_p)
        print(json.dumps(one_run(args)))
        return 0
    start, load = time.perf_counter(), os.getloadavg()[0]
    rows = []
    for top_p in [float(x) for x in args.top_p.split(",")]:
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for r in range(args.rounds):
            for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                runs[arm].append(child(args, arm, top_p))
                print(f"top_p {top_p} round {r} {arm}: {runs[arm][-1]['seconds']:.2f} s", flush=True)
        lazy_s = statistics.median(x["seconds"] for x in runs["lazy"])
        dense_s = statistics.median(x["seconds"] for x in runs["dense"])
        rows.append({"top_p": top_p, "lazy_s": lazy_s, "dense_s": dense_s, "speedup": dense_s / lazy_s,
                     "lazy_rss_mb": max(x["peak_rss_mb"] for x in runs["lazy"]),
                     "dense_rss_mb": max(x["peak_rss_mb"] for x in runs["dense"]),
                     "denoiser_calls": runs["lazy"][0]["denoiser_calls"],
                     "same_tokens": len({x["checksum"] for x in runs["lazy"] + runs["dense"]}) == 1,
                     "runs": runs})
    results = {"command": "python -m experiments.sampler_lazy" + "".join(
                   f" {shlex.quote(a)}" for a in (argv if argv is not None else sys.argv[1:])),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
               "load_average": load, "seconds": time.perf_counter() - start,
               "config": {k: v for k, v in vars(args).items() if k not in ("arm", "out")}, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "table.md").write_text(table(results))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
