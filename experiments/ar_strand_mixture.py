"""An AR model and its strand mixture (p(x) + p(RC x)) / 2 against the order-k Markov chain on the same chr20
test tiles, paired, with standard errors -> reports/dna/<run>/strands/.

    python -m experiments.ar_strand_mixture --ar /work/runs/dna_cpu_small_ar/ar --max-test-windows 4000 \
        --out reports/dna/cpu_small_bf16_ar/strands

A causal model cannot be RC-equivariant per position; its strand-symmetric form is the mixture of the two
strands' sequence probabilities (seqdiff.methods.strand_mixture, `seqdiff eval --rc-conjoin`), exact like the
AR itself and at most 1/n bits per base away from it on windows of n bases. This script scores the test tiles
(`evenly` spaced, as `dna_experiment` picks them, so the plain AR row reproduces that report's number) with:
the plain AR, its strand mixture (through the library's `conjoin_strands`, the code `seqdiff eval` runs), and the
chain (exact), batch by batch, and reports each one's bits per base, the paired differences with their standard
error over batches (ratio-estimator form), and the strand gap: the mean over tiles of |log2 p(x) - log2 p(RC x)|
per base, how far the plain AR is from strand symmetry.

Writes strands.json and strands.md under --out.
"""

from __future__ import annotations

import argparse
import copy
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
from seqdiff.methods import Batch
from seqdiff.methods.strand_mixture import check_whole_rows, conjoin_strands, rc_rows

LN2 = math.log(2.0)


def per_batch_bits(model, loader) -> tuple[np.ndarray, np.ndarray]:
    """(bits per batch, scored bases per batch) of a loaded model's exact NLL (evaluate_batches' loop)."""
    rows = [(float(total), float(n)) for total, n in batch_nlls(model, loader)]
    return np.array([t for t, _ in rows]) / LN2, np.array([n for _, n in rows])


@torch.no_grad()
def strand_gaps(model, loader) -> np.ndarray:
    """Per tile |log2 p(x) - log2 p(RC x)| / n (bits per base) under the plain AR."""
    gaps = []
    complement = torch.as_tensor(model.tokenizer.complement_ids)
    for raw in loader:
        batch = Batch.from_any(raw)
        real = check_whole_rows(batch, model.method.pad_id)
        rows = []
        for ids in (batch.input_ids, rc_rows(batch.input_ids, real, complement)):
            nll, _ = model.method.token_nll(model.backbone, Batch(input_ids=ids, attention_mask=batch.attention_mask))
            rows.append(nll.double().sum(1))
        gaps.append(((rows[0] - rows[1]).abs() / real.sum(1) / LN2).numpy())
    return np.concatenate(gaps)


def pair(a: np.ndarray, b: np.ndarray, counts: np.ndarray) -> dict:
    """a - b per scored base (bits per batch in, ratio-estimator s.e. over batches)."""
    diff = a - b
    return {"difference": float(diff.sum() / counts.sum()),
            "stderr_over_batches": ratio_standard_error(diff.tolist(), counts.tolist()),
            "batches_lower": int((diff < 0).sum()), "batches": int(len(counts))}


def table(r: dict) -> str:
    b, p = r["bits_per_base"], r["paired"]
    return "\n".join([
        f"Made by `{r['command']}` on {r['date']} ({r['seconds']:.0f} s, {r['threads']} threads).", "",
        f"Run: {r['ar']} (step {r['step']}); {r['scored_bases']:,} scored bases in {r['tiles']} test tiles "
        f"({p['mixture_minus_plain']['batches']} batches of {r['batch_size']}); every number exact.", "",
        "| model | bits per base |", "|---|---:|",
        f"| AR | {b['ar']:.4f} |",
        f"| AR strand mixture (p(x) + p(RC x)) / 2 | {b['mixture']:.4f} |",
        f"| Markov chain, order {r['order']} | {b['chain']:.4f} |", "",
        "| paired difference | bits per base | s.e. over batches | batches lower |", "|---|---:|---:|---:|",
        *[f"| {name.replace('_minus_', ' - ')} | {d['difference']:+.5f} | {d['stderr_over_batches']:.5f} | "
          f"{d['batches_lower']} of {d['batches']} |" for name, d in p.items()], "",
        f"Strand gap of the plain AR, |log2 p(x) - log2 p(RC x)| per base: mean {r['strand_gap']['mean']:.4f}, "
        f"median {r['strand_gap']['median']:.4f}, max {r['strand_gap']['max']:.4f} bits "
        f"(the mixture's gain per tile is at most 1/{r['seq_len']} = {1 / r['seq_len']:.4f} bits per base).", "",
    ])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ar", required=True, help="an AR run directory on the FASTA recipe")
    p.add_argument("--out", required=True)
    p.add_argument("--max-test-windows", type=int, default=4000)
    p.add_argument("--order", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.max_test_windows < 1:
        raise SystemExit(f"[strands] --max-test-windows must be >= 1, got {args.max_test_windows}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    try:
        model = load_checkpoint(Path(args.ar))
        if not model.method.causal:
            raise SystemExit(f"[strands] {args.ar} is not an AR run ({model.method.name})")
        mixture = conjoin_strands(copy.copy(model))  # the same backbone, its method wrapped
    except SeqdiffError as e:
        raise SystemExit(f"[strands] {e}") from None
    cfg = model.data_config
    dm = build_data_module(cfg, model.tokenizer)
    dm.check_files()
    index = evenly(len(dm.eval_dataset("test")), args.max_test_windows)
    loader = DataLoader(Subset(dm.eval_dataset("test"), index), batch_size=cfg.eval_batch_size, shuffle=False)
    ar_bits, counts = per_batch_bits(model, loader)
    mix_bits, mix_counts = per_batch_bits(mixture, loader)
    gaps = strand_gaps(model, loader)
    chain = MarkovChain(args.order).fit(train_segments(dm))
    segs = tile_segments(dm, "test", index)
    bs = cfg.eval_batch_size
    chain_bits, chain_counts = zip(*(chain.score(segs[i:i + bs]) for i in range(0, len(segs), bs)))
    chain_bits = np.array(chain_bits)
    if not (np.array_equal(np.array(chain_counts, dtype=float), counts) and np.array_equal(mix_counts, counts)):
        raise SystemExit("[strands] the models scored different bases per batch; cannot pair them")
    n = counts.sum()
    result = {
        "command": "python -m experiments.ar_strand_mixture " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "ar": args.ar, "step": model.step,
        "tiles": len(index), "batch_size": bs, "order": args.order, "threads": args.threads,
        "seq_len": cfg.seq_len, "scored_bases": int(n),
        "bits_per_base": {"ar": float(ar_bits.sum() / n), "mixture": float(mix_bits.sum() / n),
                          "chain": float(chain_bits.sum() / n)},
        "paired": {"mixture_minus_plain": pair(mix_bits, ar_bits, counts),
                   "ar_minus_chain": pair(ar_bits, chain_bits, counts),
                   "mixture_minus_chain": pair(mix_bits, chain_bits, counts)},
        "strand_gap": {"mean": float(gaps.mean()), "median": float(np.median(gaps)), "max": float(gaps.max())},
    }
    result["seconds"] = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "strands.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "strands.md").write_text(table(result))
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
