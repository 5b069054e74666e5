"""MDLM against the order-k Markov chain on the same chr20 test tiles, paired, with standard errors.

    python -m experiments.dna_paired_test --mdlm /work/runs/dna_conv17_kmer_22k/mdlm --max-test-windows 4000 \
        --repeats 4 --num-t-samples 2 --out reports/dna/cpu_small_bf16_conv17_kmer_22k/paired

`dna_experiment` reports one Monte Carlo estimate of MDLM's NELBO on the test tiles. When that number lands
within a few thousandths of a bit of the chain's, one estimate cannot say which is lower. This script scores the
same tiles (`evenly` spaced, as there) `--repeats` times with independent time and mask draws (repeat r uses the
seeds `evaluate_batches(seed=r)` uses, so repeat 0 is dna_experiment's number) and the chain once (it is exact),
batch by batch, and reports

- the NELBO's mean over repeats and its Monte Carlo standard error (spread of the repeats / sqrt(repeats)): how
  well the bound on these tiles is known;
- the paired difference MDLM - chain per scored base, with the standard error over batches of 32 consecutive
  tiles (ratio-estimator form): how much the difference would move on other tiles like these; it includes the
  Monte Carlo noise.

Writes paired.json and paired.md under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Subset

from experiments.dna_experiment import evenly, tile_segments, train_segments
from seqdiff.checkpoint import load_checkpoint
from seqdiff.data import build_data_module
from seqdiff.errors import SeqdiffError
from seqdiff.evaluation.likelihood import batch_nlls
from seqdiff.evaluation.markov import MarkovChain
from seqdiff.evaluation.metrics import ratio_standard_error


def batch_nll(model, loader, seed: int, num_t_samples: int) -> tuple[np.ndarray, np.ndarray]:
    """(nats per batch, scored tokens per batch) with evaluate_batches' draws for `seed`."""
    rows = [(float(total), float(n)) for total, n in batch_nlls(model, loader, num_t_samples, seed)]
    return np.array([t for t, _ in rows]), np.array([n for _, n in rows])


def paired(mdlm_bits: np.ndarray, chain_bits: np.ndarray, counts: np.ndarray) -> dict:
    """mdlm_bits: (repeats, batches) bits per batch; chain_bits, counts: (batches,)."""
    n = counts.sum()
    per_repeat = mdlm_bits.sum(1) / n
    r = len(per_repeat)
    diff = mdlm_bits.mean(0) - chain_bits
    return {
        "mdlm_bits_per_base": float(per_repeat.mean()),
        "mdlm_per_repeat": per_repeat.tolist(),
        "mdlm_mc_stderr": float(per_repeat.std(ddof=1) / math.sqrt(r)) if r > 1 else math.nan,
        "chain_bits_per_base": float(chain_bits.sum() / n),
        "difference": float(diff.sum() / n),
        "difference_stderr_over_batches": ratio_standard_error(diff.tolist(), counts.tolist()),
        "batches_where_mdlm_lower": int((diff < 0).sum()),
        "batches": int(len(counts)),
        "scored_bases": int(n),
    }


def table(r: dict) -> str:
    p = r["paired"]
    return "\n".join([
        f"Made by `{r['command']}` on {r['date']} ({r['seconds']:.0f} s, {r['threads']} threads).", "",
        f"Run: {r['mdlm']} (step {r['step']}); {p['scored_bases']:,} scored bases in {r['tiles']} test tiles "
        f"({p['batches']} batches of {r['batch_size']}); NELBO with {r['num_t_samples']} time draws per tile, "
        f"{r['repeats']} independent repeats.", "",
        "| reading | bits per base |", "|---|---:|",
        f"| MDLM NELBO, mean of the repeats | {p['mdlm_bits_per_base']:.4f} ± {p['mdlm_mc_stderr']:.4f} (MC s.e.) |",
        *[f"| MDLM NELBO, repeat {i} | {v:.4f} |" for i, v in enumerate(p["mdlm_per_repeat"])],
        f"| Markov chain, order {r['order']} (exact) | {p['chain_bits_per_base']:.4f} |",
        f"| **MDLM - chain** | **{p['difference']:+.4f} ± {p['difference_stderr_over_batches']:.4f}** "
        f"(s.e. over batches) |", "",
        f"MDLM is lower than the chain in {p['batches_where_mdlm_lower']} of {p['batches']} batches.", "",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mdlm", required=True, help="an MDLM run directory on the FASTA recipe")
    p.add_argument("--out", required=True)
    p.add_argument("--max-test-windows", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--num-t-samples", type=int, default=2)
    p.add_argument("--order", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    for name in ("repeats", "max_test_windows", "num_t_samples"):
        if getattr(args, name) < 1:
            raise SystemExit(f"[paired] --{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        model = load_checkpoint(Path(args.mdlm))
    except SeqdiffError as e:
        raise SystemExit(f"[paired] {e}") from None
    if model.method.exact_likelihood:
        raise SystemExit(f"[paired] {args.mdlm} is not a bound-estimating method ({model.method.name})")
    cfg = model.data_config
    dm = build_data_module(cfg, model.tokenizer)
    dm.check_files()
    index = evenly(len(dm.eval_dataset("test")), args.max_test_windows)
    loader = DataLoader(Subset(dm.eval_dataset("test"), index), batch_size=cfg.eval_batch_size, shuffle=False)
    rows, counts = [], None
    for rep in range(args.repeats):
        t = time.perf_counter()
        nats, counts = batch_nll(model, loader, rep, args.num_t_samples)
        rows.append(nats / math.log(2))
        print(f"[paired] repeat {rep}: {rows[-1].sum() / counts.sum():.4f} bits/base "
              f"({time.perf_counter() - t:.0f} s)", file=sys.stderr)
    chain = MarkovChain(args.order).fit(train_segments(dm))
    segs = tile_segments(dm, "test", index)
    bs = cfg.eval_batch_size
    chain_bits, chain_counts = zip(*(chain.score(segs[i:i + bs]) for i in range(0, len(segs), bs)))
    if not np.array_equal(np.array(chain_counts, dtype=float), counts):
        raise SystemExit("[paired] the chain and MDLM scored different bases per batch; cannot pair them")
    result = {
        "command": "python -m experiments.dna_paired_test " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "mdlm": args.mdlm, "step": model.step,
        "tiles": len(index), "batch_size": bs, "num_t_samples": args.num_t_samples, "repeats": args.repeats,
        "order": args.order, "threads": args.threads,
        "paired": paired(np.stack(rows), np.array(chain_bits), counts),
    }
    result["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "paired.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "paired.md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
