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

With `--orders left_to_right left_to_right+right_to_left random:16` it also scores the same blocks with
`seqdiff eval --order` (`seqdiff.evaluation.ordered`): exactly, with the denoiser decoded in a fixed order (the
bound is the mean of these exact likelihoods over all orders), or with random:K the importance-weighted bound of
MDLM's own likelihood over K random orders, tighter than the NELBO. One forward per token and order.

Writes results.json, table.md and ce_by_mask_rate.png under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from seqdiff.checkpoint import load_checkpoint
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.evaluation.generate import write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.evaluation.markov import ALPHABET, MarkovChain
from seqdiff.evaluation.ngram import WittenBellNGram
from seqdiff.evaluation.ordered import check_ordered, is_exact, parse_orders, random_orders
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


def infill_bits(window_log2: Callable[[np.ndarray], float], vocab: int, order: int,
                picks: list[tuple[np.ndarray, int]]) -> float:
    """Bits of x_i given every other token of its sequence, under a counting model's joint, averaged over the
    (sequence, i) `picks`: the counting model's cross-entropy at the lowest mask rate (one token masked).
    `window_log2(w)` is the model's log2 probability of the tokens of w scored as a sequence of its own. Only the
    factors P(x_j | the order tokens before j) with j = i .. i + order hold x_i, and they lie inside the window
    [i - order, i + order], so each candidate is scored on that window; the window's other factors cancel."""
    total = 0.0
    for seq, i in picks:
        lo, hi = max(0, i - order), min(len(seq), i + order + 1)
        window = np.repeat(seq[lo:hi][None], vocab, axis=0)  # (V, w): one row per candidate of x_i
        window[:, i - lo] = np.arange(vocab)
        log_joint = np.array([window_log2(row) for row in window])  # (V,)
        log_joint -= log_joint.max()
        total -= log_joint[seq[i]] - np.log2(np.exp2(log_joint).sum())
    return total / len(picks)


def ngram_infill_bits(model: WittenBellNGram, text: np.ndarray, positions: np.ndarray) -> float:
    """infill_bits under a Witten-Bell character n-gram, at `positions` of one stream of text."""
    return infill_bits(lambda w: float(np.log2(model._probs(w)).sum()), model.vocab_size, model.order,
                       [(text, int(i)) for i in positions])


def markov_infill_bits(chain: MarkovChain, segments: list[np.ndarray], picks: list[tuple[int, int]]) -> float:
    """infill_bits under an order-k Markov chain over A, C, G, T, at (segment index, position) picks (N-free)."""
    return infill_bits(lambda w: -chain.score([w])[0], ALPHABET, chain.order,
                       [(segments[s], i) for s, i in picks])


def unigram_bits(train: np.ndarray, tokens: np.ndarray, vocab: int) -> float:
    """Bits per token of `tokens` under the training split's add-one unigram frequencies."""
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1
    log_p = np.log2(counts / counts.sum())
    return float(-log_p[tokens].mean())


def text_source(mdlm, split: str, infill_positions: int, max_blocks: int | None = None) -> dict:
    """Whole blocks of a text split (all, or `max_blocks` evenly spaced ones) and the counting references: the
    quickstart's n-gram baseline (order chosen on the validation split; on a subset of blocks it scores each
    block on its own, as the models do), its one-masked-token conditional, the unigram."""
    from experiments.dna_experiment import evenly

    data, tok, L = mdlm.data_config, mdlm.tokenizer, mdlm.seq_len
    tokens = tokenize_file(split_path(data, split), tok)
    train_tokens = tokenize_file(split_path(data, "train"), tok)
    blocks = torch.from_numpy(np.ascontiguousarray(tokens[: len(tokens) // L * L], dtype=np.int64)).view(-1, L)
    ngram = ngram_baseline(data, tok)
    counted = WittenBellNGram(ngram["order"], tok.num_regular).fit([train_tokens])
    subset = max_blocks is not None and max_blocks < len(blocks)
    if subset:
        blocks = blocks[evenly(len(blocks), max_blocks)]
    stream = blocks.flatten().numpy()
    positions = np.random.default_rng(0).choice(len(stream), size=min(infill_positions, len(stream)), replace=False)
    whole_split = ngram["bits_per_character"] if split == "test" else \
        ngram["valid_bits_per_character_by_order"][ngram["order"]]
    return {"blocks": blocks, "ngram_order": ngram["order"],
            "ngram_label": f"n-gram (Witten-Bell, order {ngram['order']}; "
                           f"{'block by block' if subset else 'one stream'})",
            "ngram_bits": counted.bits_per_token(list(blocks.numpy())) if subset else whole_split,
            "unigram_bits": unigram_bits(train_tokens, stream, tok.num_regular),
            "ngram_infill_bits": ngram_infill_bits(counted, stream, positions),
            "ngram_infill_positions": int(len(positions))}


def fasta_source(mdlm, split: str, infill_positions: int, max_blocks: int, order: int) -> dict:
    """Evenly spaced evaluation tiles of a FASTA split that are whole and hold no N, and the order-`order`
    Markov chain counted on the training blocks (KT-smoothed, as reports/dna): next-base bits tile by tile,
    its one-masked-base conditional, and the order-0 chain as the unigram."""
    from experiments.dna_experiment import evenly, tile_segments, train_segments
    from seqdiff.data import build_data_module

    dm = build_data_module(mdlm.data_config, mdlm.tokenizer)
    dm.check_files()
    L = mdlm.seq_len
    tiles = tile_segments(dm, split, list(range(len(dm.eval_dataset(split)))))
    whole = [t for t in tiles if len(t) == L and bool((t < ALPHABET).all())]
    whole = [whole[i] for i in evenly(len(whole), max_blocks)]
    train = train_segments(dm)
    chain, zero = MarkovChain(order).fit(train), MarkovChain(0).fit(train)
    rng = np.random.default_rng(0)
    n = min(infill_positions, len(whole) * L)
    flat = rng.choice(len(whole) * L, size=n, replace=False)
    picks = [(int(f // L), int(f % L)) for f in flat]
    return {"blocks": torch.from_numpy(np.stack(whole).astype(np.int64)), "ngram_order": order,
            "ngram_label": f"Markov chain, order {order} (KT counts of the training blocks; tile by tile)",
            "ngram_bits": chain.bits_per_base(whole), "unigram_bits": zero.bits_per_base(whole),
            "ngram_infill_bits": markov_infill_bits(chain, whole, picks), "ngram_infill_positions": n,
            "tiles_total": len(tiles)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mdlm", required=True, help="an MDLM run directory (or checkpoint)")
    p.add_argument("--ar", default=None, help="an AR run directory on the same data (optional)")
    p.add_argument("--out", required=True)
    p.add_argument("--split", default="test", choices=("valid", "test"))
    p.add_argument("--grid", type=int, default=16, help="mask counts measured (midpoints of k = 1..L)")
    p.add_argument("--draws", type=int, default=2, help="random masks per block at each k")
    p.add_argument("--num-t-samples", type=int, default=4, help="time draws per block of the reference bound")
    p.add_argument("--infill-positions", type=int, default=4000,
                   help="positions at which the counting model's one-masked-token cross-entropy is measured")
    p.add_argument("--max-blocks", type=int, default=None,
                   help="evenly spaced whole blocks (FASTA: N-free tiles; default 1000; text: default all)")
    p.add_argument("--markov-order", type=int, default=8, help="FASTA data: order of the Markov chain")
    p.add_argument("--orders", nargs="*", default=[],
                   help="decoding orders scored on the same blocks: fixed or mixtures a+b (exact), random:K (bound)")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    for order in args.orders:
        parse_orders(order)
    if args.threads:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    mdlm = load_checkpoint(args.mdlm)
    ar = load_checkpoint(args.ar) if args.ar else None
    if mdlm.method.name != "mdlm":
        p.error(f"--mdlm must be an MDLM model, got a {mdlm.method.name} model")
    if args.orders:
        check_ordered(mdlm.method, mdlm.backbone)
    if ar is not None and not ar.method.exact_likelihood:  # the reference is an exact NLL
        p.error(f"--ar must be a model with an exact likelihood (AR), got a {ar.method.name} model")
    if mdlm.data_config.kind == "fasta":
        source = fasta_source(mdlm, args.split, args.infill_positions, args.max_blocks or 1000, args.markov_order)
    else:
        source = text_source(mdlm, args.split, args.infill_positions, args.max_blocks)
    blocks = source.pop("blocks")
    L = mdlm.seq_len
    ln2 = math.log(2)

    curve = []
    for i, k in enumerate(grid_counts(L, args.grid)):
        bits = masked_cross_entropy(mdlm, blocks, k, args.draws, seed=i) / ln2
        curve.append({"masked": k, "mask_rate": k / L, "bits_per_masked_token": bits})
        print(f"k={k:4d} ({k / L:.2f}): {bits:.4f} bits", file=sys.stderr)
    stream = blocks.flatten().numpy()  # the same whole blocks for every reference
    bound = evaluate_tokens(mdlm, stream, batch_size=64, num_t_samples=args.num_t_samples, seed=0)
    ordered = {}
    for order in args.orders:
        ordered[order] = evaluate_tokens(mdlm, stream, batch_size=64, order=order)["bits_per_token"]
        print(f"order {order}: {ordered[order]:.4f} bits ({'exact' if is_exact(order) else 'bound'})",
              file=sys.stderr)
    results = {
        "command": "python -m experiments.mdlm_by_mask_rate " + " ".join(argv if argv is not None else sys.argv[1:]),
        "split": args.split, "blocks": int(len(blocks)), "seq_len": L, "draws_per_block": args.draws,
        "curve": curve,
        "grid_mean_bits": float(np.mean([c["bits_per_masked_token"] for c in curve])),
        "mdlm_bound_bits": bound["bits_per_token"], "mdlm_bound_t_samples": args.num_t_samples,
        "mdlm_ordered_bits": ordered,
        "ar_bits": evaluate_tokens(ar, stream, batch_size=64)["bits_per_token"] if ar is not None else None,
        **source,
        "mdlm_step": mdlm.step, "ar_step": ar.step if ar is not None else None,
        "seconds": time.perf_counter() - start,
    }
    reference = results["ar_bits"] if ar is not None else results["ngram_bits"]
    below = [c for c in curve if c["bits_per_masked_token"] < reference]
    results["reference_for_reach"] = "exact model" if ar is not None else "counting model"
    results["mask_rate_where_mdlm_reaches_ar"] = max(c["mask_rate"] for c in below) if below else None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_atomically(out / "table.md", table(results))
    figure(results, out / "ce_by_mask_rate.png")
    print(table(results))
    return 0


def _ngram_label(r: dict) -> str:
    return r.get("ngram_label", f"n-gram (Witten-Bell, order {r['ngram_order']}; one stream)")  # older results


def table(r: dict) -> str:
    ar_step = f", AR step {r['ar_step']}" if r.get("ar_step") is not None else " (no AR model given)"
    lines = [f"Made by `{r['command']}` ({r['seconds']:.0f} s). {r['blocks']} whole blocks of {r['seq_len']} "
             f"tokens of the {r['split']} split; MDLM step {r['mdlm_step']}{ar_step}.", "",
             "| masked k | mask rate k/L | MDLM bits per masked token |", "|---:|---:|---:|"]
    lines += [f"| {c['masked']} | {c['mask_rate']:.3f} | {c['bits_per_masked_token']:.4f} |" for c in r["curve"]]
    lines += ["", "| reading | bits per token |", "|---|---:|",
              f"| MDLM: mean of the curve (the bound by the any-order sum) | {r['grid_mean_bits']:.4f} |",
              f"| MDLM: NELBO bound of evaluate_tokens ({r['mdlm_bound_t_samples']} time draws) | "
              f"{r['mdlm_bound_bits']:.4f} |"]
    for order, bits in r.get("mdlm_ordered_bits", {}).items():
        k = random_orders(order)
        what = (f"exact NLL decoded in the order {order}" if k is None else
                f"importance-weighted bound over {k} random orders per block")
        lines.append(f"| MDLM: {what} (`seqdiff eval --order {order}`) | {bits:.4f} |")
    if r.get("ar_bits") is not None:
        lines.append(f"| AR: exact NLL | {r['ar_bits']:.4f} |")
    lines += [f"| {_ngram_label(r)}, next token | {r['ngram_bits']:.4f} |",
              f"| unigram (training frequencies) | {r['unigram_bits']:.4f} |",
              f"| {_ngram_label(r)}, one token masked, the rest visible (x_i given both sides under its joint; "
              f"{r['ngram_infill_positions']} positions) | {r['ngram_infill_bits']:.4f} |", ""]
    rate = r["mask_rate_where_mdlm_reaches_ar"]
    counting = r.get("reference_for_reach") == "counting model"
    other = "the counting model's next token" if counting else "AR's next token"
    lines.append(f"MDLM's masked tokens are predicted better than {other} up to a mask rate of {rate:.2f}."
                 if rate is not None else f"MDLM is above {other} at every mask rate measured.")
    return "\n".join(lines) + "\n"


def figure(r: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    x = [c["mask_rate"] for c in r["curve"]]
    y = [c["bits_per_masked_token"] for c in r["curve"]]
    ax.plot(x, y, marker="o", label=f"MDLM, masked tokens (mean {r['grid_mean_bits']:.3f} = its bound)")
    ax.fill_between(x, y, alpha=0.15)
    counting = _ngram_label(r).split(" (")[0]
    for key, label, style in (("ar_bits", "AR exact NLL", "--"), ("ngram_bits", f"{counting}, next token", ":"),
                              ("unigram_bits", "unigram", "-.")):
        if r.get(key) is not None:
            ax.axhline(r[key], linestyle=style, color="gray" if key != "ar_bits" else "C1",
                       label=f"{label} {r[key]:.3f}")
    ax.plot([1 / r["seq_len"]], [r["ngram_infill_bits"]], marker="*", markersize=12, linestyle="none",
            color="C2", label=f"{counting}, one token masked {r['ngram_infill_bits']:.3f}")
    ax.set(xlabel="mask rate k / L", ylabel="bits per token", xlim=(0, 1),
           title=f"MDLM cross-entropy by mask rate ({r['split']} split)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)


if __name__ == "__main__":
    raise SystemExit(main())
