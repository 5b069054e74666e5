"""Where MDLM's bound loses to AR: MDLM's cross-entropy at each mask rate, against AR's exact NLL.

    python -m experiments.mdlm_by_mask_rate --mdlm runs/quickstart/mdlm --ar runs/quickstart/ar \
        --out reports/quickstart/by_mask_rate [--split test] [--grid 16] [--draws 2]

MDLM's continuous-time bound is an average over mask rates. With k of the L positions of a block masked
(a uniformly random k-subset), let CE_k be the mean cross-entropy of the masked tokens; then the NELBO per
token is (1/L) sum_{k=1..L} CE_k, the any-order form of the bound (the `mask_count` estimator samples the
same sum). This command measures CE_k on a grid of k (midpoint rule over k = 1..L), prints the grid's mean
next to the bound that `evaluate_tokens` estimates (the two must agree within Monte Carlo error: a check of
the reading), and draws the curve against AR's exact NLL, the n-gram baseline and the unigram entropy of the
split, and against the n-gram's own cross-entropy with one token masked (x_i given both sides under the
n-gram's joint), a counting reference for the lowest mask rate. Low mask rates are what a bidirectional
model is good at; near k = L no model can beat the unigram entropy (the model knows nothing else of the
block). The curve shows how much of the gap to AR comes from each part of the range.

Writes results.json, table.md and ce_by_mask_rate.png under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from seqdiff.checkpoint import load_checkpoint
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.evaluation.generate import write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.evaluation.ngram import WittenBellNGram
from seqdiff.figures import pyplot, save_figure
from seqdiff.quickstart import ngram_baseline


def grid_counts(seq_len: int, points: int) -> list[int]:
    """Midpoints of `points` equal slices of k = 1..L (the mean over them approximates the mean over all k)."""
    return sorted({min(seq_len, max(1, math.floor((j + 0.5) * seq_len / points + 0.5))) for j in range(points)})


@torch.no_grad()
def masked_cross_entropy(model, blocks: torch.Tensor, k: int, draws: int, seed: int,
                         batch_size: int = 64) -> float:
    """Mean over blocks and draws of the mean cross-entropy (nats) of k uniformly chosen masked positions."""
    method, backbone = model.method, model.backbone
    g = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for _ in range(draws):
        for start in range(0, len(blocks), batch_size):
            x0 = blocks[start:start + batch_size]  # (B, L)
            rank = torch.rand(x0.shape, generator=g).argsort(1).argsort(1)  # (B, L)
            xt = torch.where(rank < k, method.mask_id, x0)  # exactly k masked per row
            t = torch.full((x0.shape[0],), k / x0.shape[1])  # what a time-conditioned backbone would see
            index, logits = method.masked_logits(backbone, xt, t)  # (N,), (N, V)
            nll = F.cross_entropy(logits.float(), x0.flatten()[index], reduction="none").view(x0.shape[0], k)
            total += nll.mean(1).double().sum().item()
            count += x0.shape[0]
    return total / count


def ngram_infill_bits(model: WittenBellNGram, text: np.ndarray, positions: np.ndarray) -> float:
    """Bits of x_i given every other token of `text`, under the n-gram's joint, averaged over `positions`: the
    counting model's cross-entropy at the lowest mask rate (one token masked). The joint's factors that hold
    x_i are P(x_j | context) for j = i .. i + order, so each candidate is scored on the window around i."""
    n, V, order = len(text), model.vocab_size, model.order
    total = 0.0
    for i in positions:
        lo, hi = max(0, i - order), min(n, i + order + 1)
        window = np.repeat(text[lo:hi][None], V, axis=0)  # (V, w): one row per candidate of x_i
        window[:, i - lo] = np.arange(V)
        log_joint = np.array([np.log2(model._probs(row)[i - lo:]).sum() for row in window])  # (V,)
        log_joint -= log_joint.max()
        total -= log_joint[text[i]] - np.log2(np.exp2(log_joint).sum())
    return total / len(positions)


def unigram_bits(train: np.ndarray, tokens: np.ndarray, vocab: int) -> float:
    """Bits per token of `tokens` under the training split's add-one unigram frequencies."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1
    log_p = np.log2(counts / counts.sum())
    return float(-log_p[tokens].mean())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mdlm", required=True, help="an MDLM run directory (or checkpoint)")
    p.add_argument("--ar", required=True, help="an AR run directory on the same data")
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="test", choices=("valid", "test"))
    p.add_argument("--grid", type=int, default=16, help="mask counts measured (midpoints of k = 1..L)")
    p.add_argument("--draws", type=int, default=2, help="random masks per block at each k")
    p.add_argument("--num-t-samples", type=int, default=4, help="time draws per block of the reference bound")
    p.add_argument("--infill-positions", type=int, default=4000,
                   help="positions at which the n-gram's one-masked-token cross-entropy is measured")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    mdlm, ar = load_checkpoint(args.mdlm), load_checkpoint(args.ar)
    if mdlm.method.name != "mdlm":
        p.error(f"--mdlm must be an MDLM model, got a {mdlm.method.name} model")
    if not ar.method.exact_likelihood:  # the reference is an exact NLL
        p.error(f"--ar must be a model with an exact likelihood (AR), got a {ar.method.name} model")
    data = mdlm.data_config
    tokens = tokenize_file(split_path(data, args.split), mdlm.tokenizer)
    train_tokens = tokenize_file(split_path(data, "train"), mdlm.tokenizer)
    L = mdlm.seq_len
    blocks = torch.from_numpy(np.ascontiguousarray(tokens[: len(tokens) // L * L], dtype=np.int64)).view(-1, L)
    ln2 = math.log(2)

    curve = []
    for i, k in enumerate(grid_counts(L, args.grid)):
        bits = masked_cross_entropy(mdlm, blocks, k, args.draws, seed=i) / ln2
        curve.append({"masked": k, "mask_rate": k / L, "bits_per_masked_token": bits})
        print(f"k={k:4d} ({k / L:.2f}): {bits:.4f} bits", file=sys.stderr)
    full = torch.from_numpy(blocks.flatten().numpy())  # the same whole blocks for both references
    bound = evaluate_tokens(mdlm, full.numpy(), batch_size=64, num_t_samples=args.num_t_samples, seed=0)
    ar_report = evaluate_tokens(ar, full.numpy(), batch_size=64)
    ngram = ngram_baseline(data, mdlm.tokenizer)
    counted = WittenBellNGram(ngram["order"], mdlm.tokenizer.num_regular).fit([train_tokens])
    stream = blocks.flatten().numpy()
    positions = np.random.default_rng(0).choice(len(stream), size=min(args.infill_positions, len(stream)),
                                                replace=False)
    results = {
        "command": "python -m experiments.mdlm_by_mask_rate " + " ".join(argv if argv is not None else sys.argv[1:]),
        "split": args.split, "blocks": int(len(blocks)), "seq_len": L, "draws_per_block": args.draws,
        "curve": curve,
        "grid_mean_bits": float(np.mean([c["bits_per_masked_token"] for c in curve])),
        "mdlm_bound_bits": bound["bits_per_token"], "mdlm_bound_t_samples": args.num_t_samples,
        "ar_bits": ar_report["bits_per_token"],
        "ngram_bits": ngram["bits_per_character"] if args.split == "test" else
        ngram["valid_bits_per_character_by_order"][ngram["order"]],
        "ngram_order": ngram["order"],
        "ngram_infill_bits": ngram_infill_bits(counted, stream, positions),
        "ngram_infill_positions": int(len(positions)),
        "unigram_bits": unigram_bits(train_tokens, blocks.flatten().numpy(), mdlm.tokenizer.num_regular),
        "mdlm_step": mdlm.step, "ar_step": ar.step, "seconds": time.perf_counter() - start,
    }
    below = [c for c in curve if c["bits_per_masked_token"] < results["ar_bits"]]
    results["mask_rate_where_mdlm_reaches_ar"] = max(c["mask_rate"] for c in below) if below else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_atomically(out / "table.md", table(results))
    figure(results, out / "ce_by_mask_rate.png")
    print(table(results))
    return 0


def table(r: dict) -> str:
    lines = [f"Made by `{r['command']}` ({r['seconds']:.0f} s). {r['blocks']} whole blocks of {r['seq_len']} "
             f"tokens of the {r['split']} split; MDLM step {r['mdlm_step']}, AR step {r['ar_step']}.", "",
             "| masked k | mask rate k/L | MDLM bits per masked token |", "|---:|---:|---:|"]
    lines += [f"| {c['masked']} | {c['mask_rate']:.3f} | {c['bits_per_masked_token']:.4f} |" for c in r["curve"]]
    lines += ["", "| reading | bits per token |", "|---|---:|",
              f"| MDLM: mean of the curve (the bound by the any-order sum) | {r['grid_mean_bits']:.4f} |",
              f"| MDLM: NELBO bound of evaluate_tokens ({r['mdlm_bound_t_samples']} time draws) | "
              f"{r['mdlm_bound_bits']:.4f} |",
              f"| AR: exact NLL | {r['ar_bits']:.4f} |",
              f"| n-gram (Witten-Bell, order {r['ngram_order']}; one stream) | {r['ngram_bits']:.4f} |",
              f"| unigram (training frequencies) | {r['unigram_bits']:.4f} |",
              f"| n-gram, one token masked, the rest visible (x_i given both sides under its joint; "
              f"{r['ngram_infill_positions']} positions) | {r['ngram_infill_bits']:.4f} |", ""]
    rate = r["mask_rate_where_mdlm_reaches_ar"]
    lines.append("MDLM's masked tokens are predicted better than AR's next token up to a mask rate of "
                 f"{rate:.2f}." if rate is not None else "MDLM is above AR's NLL at every mask rate measured.")
    return "\n".join(lines) + "\n"


def figure(r: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [c["mask_rate"] for c in r["curve"]]
    y = [c["bits_per_masked_token"] for c in r["curve"]]
    ax.plot(x, y, marker="o", label=f"MDLM, masked tokens (mean {r['grid_mean_bits']:.3f} = its bound)")
    ax.fill_between(x, y, alpha=0.15)
    for key, label, style in (("ar_bits", "AR exact NLL", "--"), ("ngram_bits", "n-gram", ":"),
                              ("unigram_bits", "unigram", "-.")):
        ax.axhline(r[key], linestyle=style, color="gray" if key != "ar_bits" else "C1",
                   label=f"{label} {r[key]:.3f}")
    ax.plot([1 / r["seq_len"]], [r["ngram_infill_bits"]], marker="*", markersize=12, linestyle="none",
            color="C2", label=f"n-gram, one token masked {r['ngram_infill_bits']:.3f}")
    ax.set(xlabel="mask rate k / L", ylabel="bits per token", xlim=(0, 1),
           title=f"MDLM cross-entropy by mask rate ({r['split']} split)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
