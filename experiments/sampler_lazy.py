"""MDLM sampling at a large vocabulary: x_theta's probabilities only where a step reveals, against every position.

    python -m experiments.sampler_lazy --out reports/generation/lazy_probs

The MDLM ancestral and cached samplers keep the denoiser's logits at the masked positions and make float64
probabilities (temperature, nucleus filter) only for the tokens a step reveals (seqdiff.samplers.mdlm_ancestral).
Before, every step built (B, L, V) float64 probabilities at every position and, with top_p < 1, sorted each row
over the vocabulary. This times both ways side by side (the `dense` arm is the same sampler with `lazy` off) on
an untrained DiT with GPT-2's vocabulary, in rounds with the order alternated, each run in its own process so
that its peak resident memory is its own, and checks that both draw the same tokens.

    python -m experiments.sampler_lazy --sampler edlm --batch 4 --seq-len 256 --steps 64 --top-p 1 \
        --out reports/generation/lazy_probs_edlm

does the same for the EDLM importance sampler (carry-over AR energy of an untrained causal model of the same
shape): `lazy` draws each row's k candidates from its probabilities at the masked positions, one (L, V) draw of
uniforms at a time; `dense` is the draw it replaced, (B, L, V) float64 probabilities and (B, k, L, V) uniforms
(seqdiff.edlm.base.draw_candidates_rows), made from the same logits.

Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from experiments.report import command_line, write_results

ARMS = ("lazy", "dense")


def one_run(args: argparse.Namespace) -> dict:
    """Build the model, sample once, report seconds, peak RSS and a checksum of the tokens (child process)."""
    from seqdiff.bench.models import Shape, build_model, method_of

    torch.set_num_threads(args.threads)
    shape = Shape(args.hidden, args.layers, args.heads, seq_len=args.seq_len, batch_size=args.batch,
                  vocab_size=args.vocab_size)
    torch.manual_seed(0)
    backbone = build_model("seqdiff_bidirectional", shape).eval()
    with torch.no_grad():  # the DiT zero-initializes its output layer; random weights give varied logits
        for p in backbone.parameters():
            p.normal_(0.0, 0.05)
    method = method_of("seqdiff_bidirectional", shape)
    sampler = build_sampler(args, shape, method, backbone)
    start = time.perf_counter()
    out = sampler.generate(args.batch, args.seq_len, torch.Generator().manual_seed(0))
    seconds = time.perf_counter() - start
    tokens = out.tokens.to(torch.int64)
    checksum = int((tokens * torch.arange(1, tokens.numel() + 1).view_as(tokens)).sum())
    return {"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "denoiser_calls": out.num_denoiser_calls, "checksum": checksum,
            "importance_steps": len(getattr(sampler, "ess", []))}


def dense_probs(probs_at, x: torch.Tensor, mask_id: int) -> torch.Tensor:
    """(B, L, V) float64 x_theta from a masked-position lookup, SUBS's one-hot carry-over elsewhere (what the
    EDLM sampler held at every step before)."""
    positions = (x == mask_id).flatten().nonzero()[:, 0]
    p = probs_at(positions)
    out = torch.zeros(x.numel(), p.shape[-1], dtype=torch.float64, device=x.device)
    out.scatter_(1, x.flatten()[:, None], 1.0)
    out[positions] = p
    return out.view(*x.shape, -1)


def build_sampler(args: argparse.Namespace, shape, method, backbone):
    """The sampler of this run's arm: MDLM cached or EDLM importance, lazy or dense."""
    from seqdiff.samplers import EDLMImportanceSampler, MDLMCachedSampler

    if args.sampler == "cached":
        class Dense(MDLMCachedSampler):
            lazy = False  # every position's float64 probabilities at every step

        cls = Dense if args.arm == "dense" else MDLMCachedSampler
        return cls(method, backbone, steps=args.steps, top_p=args.top_p)
    from seqdiff.bench.models import build_model, vocab_stub
    from seqdiff.checkpoint import LoadedModel
    from seqdiff.config import MethodConfig
    from seqdiff.edlm.base import candidates_log_mu, draw_candidates_rows
    from seqdiff.edlm.coar_energy import CarryOverAREnergy
    from seqdiff.methods import AR

    class DenseEDLM(EDLMImportanceSampler):
        """The candidate draw and MDLM steps as they were: dense probabilities, (B, k, L, V) uniforms."""

        def candidates(self, probs_at, xt, gens):
            probs = dense_probs(probs_at, xt, self.method.mask_id)
            cands = draw_candidates_rows(probs, xt, self.method.mask_id, self.k, gens)
            return cands, candidates_log_mu(probs, cands, xt, self.method.mask_id)

        def mdlm_step_rows(self, probs_at, x, t, s, gens):
            probs = dense_probs(probs_at, x, self.method.mask_id)
            return super().mdlm_step_rows(probs.flatten(0, 1).__getitem__, x, t, s, gens)

    torch.manual_seed(1)
    ar_net = build_model("seqdiff_causal", shape).eval()
    ar_method_cfg = MethodConfig(name="ar")
    stub = vocab_stub(shape.vocab_size)
    ar = LoadedModel(ar_net, AR(ar_method_cfg, stub), stub, shape.model_config(), ar_method_cfg, None,
                     shape.seq_len, 0, Path("untrained"), False)
    energy = CarryOverAREnergy(ar, shape.vocab_size, method.mask_id)
    cls = DenseEDLM if args.arm == "dense" else EDLMImportanceSampler
    return cls(method, backbone, steps=args.steps, top_p=args.top_p, energy=energy, k=args.edlm_k)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.sampler_lazy", description=__doc__.splitlines()[0])
    p.add_argument("--vocab-size", type=int, default=50261, help="GPT-2's 50,257 ids plus 4 specials")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--sampler", choices=("cached", "edlm"), default="cached")
    p.add_argument("--edlm-k", type=int, default=4, help="EDLM candidates per row (--sampler edlm)")
    p.add_argument("--top-p", default="1.0,0.9", help="comma-separated nucleus settings")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="reports/generation/lazy_probs")
    p.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a child process: one run, JSON on stdout
    args = p.parse_args(argv)
    for key in ("vocab_size", "hidden", "layers", "heads", "batch", "seq_len", "steps", "rounds", "threads",
                "edlm_k"):
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
    for key in ("sampler", "edlm_k", "vocab_size", "hidden", "layers", "heads", "batch", "seq_len", "steps",
                "threads"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict) -> str:
    c = results["config"]
    title = {"cached": "MDLM cached sampler: probabilities where a step reveals (lazy) against everywhere (dense)",
             "edlm": f"EDLM importance sampler (k = {c.get('edlm_k')}): candidates drawn row by row at the masked "
                     "positions (lazy) against dense (B, L, V) probabilities and (B, k, L, V) uniforms (dense)"}
    lines = [f"# {title[c.get('sampler', 'cached')]}\n",
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
    results = {"command": command_line("sampler_lazy", argv),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
               "load_average": load, "seconds": time.perf_counter() - start,
               "config": {k: v for k, v in vars(args).items() if k not in ("arm", "out")}, "rows": rows}
    write_results(args.out, results, table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
