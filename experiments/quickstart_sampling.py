"""How the quickstart models' samples change with the sampler and nucleus (top-p) filtering, next to real text.

    python -m experiments.quickstart_sampling --runs runs/quickstart --out reports/quickstart/sampling \
        [--num-samples 32] [--threads 2]

The quickstart reports one sampler setting per model (MDLM: the cached ancestral sampler at temperature 1,
AR: exact ancestral sampling), and the share of sampled words found in the training text. A share can rise
because samples got better or because they collapsed onto a few frequent words ("the the the"), so every
setting is scored on four readings, and the same readings of real text (windows of the unseen test play, the
same number and length) say where a good model would land:

- known words: the share of whole words found in the training text (seqdiff.evaluation.metrics.known_word_share);
- n-gram bits/char: the samples scored by the quickstart's Witten-Bell n-gram (fitted on the training plays,
  its order chosen on the validation play): far below real text's means the samples are more predictable than
  text (repetitive), far above means they are not text-like;
- distinct word pairs: unique adjacent word pairs / pairs, per sample (low: repetition);
- repeated words: the share of words equal to the word before them.

Writes results.json (every setting, with its samples) and table.md; the README next to them is written by hand.
Nothing here changes a model: the settings are choices a user makes at `seqdiff generate` time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from seqdiff.checkpoint import load_checkpoint
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.data.text_files import read_text_file
from seqdiff.evaluation.generate import generate, write_atomically
from seqdiff.evaluation.metrics import known_word_share
from seqdiff.evaluation.ngram import WittenBellNGram
from seqdiff.quickstart import NGRAM_ORDERS, QUICKSTART
from seqdiff.tokenizers.char import text8_normalize

SETTINGS: dict[str, list[tuple[str, dict]]] = {
    "mdlm": [
        ("cached, top_p 1 (the quickstart's)", {"sampler": "cached"}),
        ("cached, top_p 0.95", {"sampler": "cached", "top_p": 0.95}),
        ("cached, top_p 0.9", {"sampler": "cached", "top_p": 0.9}),
        ("cached, top_p 0.8", {"sampler": "cached", "top_p": 0.8}),
        ("cached, 512 steps", {"sampler": "cached", "steps": 512}),
        ("confidence", {"sampler": "confidence"}),
        ("remdm cap, 256 steps", {"sampler": "remdm", "steps": 256}),
    ],
    "ar": [
        ("ancestral, top_p 1 (the quickstart's)", {}),
        ("ancestral, top_p 0.95", {"top_p": 0.95}),
        ("ancestral, top_p 0.9", {"top_p": 0.9}),
        ("ancestral, top_p 0.8", {"top_p": 0.8}),
    ],
}
"""Per model: (label, SampleConfig overrides of the quickstart's sample section)."""


def word_pair_distinct(text: str) -> float:
    """Unique adjacent word pairs / adjacent word pairs of one text (1 when it has fewer than two words)."""
    words = text.split()
    pairs = list(zip(words, words[1:]))
    return len(set(pairs)) / len(pairs) if pairs else 1.0


def repeated_word_share(text: str) -> float:
    """Share of a text's words (after the first) equal to the word before them (0 with fewer than two words)."""
    words = text.split()
    return sum(a == b for a, b in zip(words, words[1:])) / (len(words) - 1) if len(words) > 1 else 0.0


def readings(texts: list[str], vocabulary: set[str], ngram: WittenBellNGram, tokenizer) -> dict:
    """The four readings of module docstring for a list of texts."""
    share, counted = known_word_share(texts, vocabulary)
    ids = [np.asarray(tokenizer.encode(t), dtype=np.int64) for t in texts]
    return {"known_word_share": share, "words_counted": counted,
            "ngram_bits_per_char": ngram.bits_per_token(ids),
            "distinct_word_pairs": float(np.mean([word_pair_distinct(t) for t in texts])),
            "repeated_word_share": float(np.mean([repeated_word_share(t) for t in texts]))}


def fit_ngram(tokenizer) -> tuple[WittenBellNGram, int]:
    """The quickstart's n-gram baseline model: the order with the best validation bits, fitted on train."""
    ids = {split: tokenize_file(split_path(QUICKSTART.data, split), tokenizer) for split in ("train", "valid")}
    bits = {order: WittenBellNGram(order, tokenizer.num_regular).fit([ids["train"]]).bits_per_token([ids["valid"]])
            for order in NGRAM_ORDERS}
    best = min(bits, key=bits.get)
    return WittenBellNGram(best, tokenizer.num_regular).fit([ids["train"]]), best


def real_windows(tokenizer, count: int, length: int) -> list[str]:
    """`count` evenly spaced windows of `length` characters of the test play, decoded as the models see it."""
    ids = tokenize_file(split_path(QUICKSTART.data, "test"), tokenizer)
    starts = np.linspace(0, len(ids) - length, count).astype(int)
    return [tokenizer.decode(torch.as_tensor(ids[s : s + length])) for s in starts]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs/quickstart"),
                        help="the quickstart's run root (holds mdlm/ and ar/)")
    parser.add_argument("--out", type=Path, default=Path("reports/quickstart/sampling"))
    parser.add_argument("--num-samples", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    command = "python -m experiments.quickstart_sampling " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    start = time.perf_counter()
    models = {method: load_checkpoint(args.runs / method) for method in SETTINGS}
    tokenizer = models["mdlm"].tokenizer
    vocabulary = set(text8_normalize(read_text_file(split_path(QUICKSTART.data, "train"))).split())
    ngram, order = fit_ngram(tokenizer)
    base = dataclasses.replace(QUICKSTART.sample, num_samples=args.num_samples, batch_size=args.num_samples)
    results = {"command": command, "num_samples": args.num_samples, "seq_len": base.seq_len, "ngram_order": order,
               "torch_threads": torch.get_num_threads(), "steps": {m: models[m].step for m in models},
               "real": readings(real_windows(tokenizer, args.num_samples, base.seq_len), vocabulary, ngram,
                                tokenizer),
               "settings": []}
    for method, settings in SETTINGS.items():
        for label, overrides in settings:
            cfg = dataclasses.replace(base, **overrides)
            gen = generate(models[method], cfg)
            row = {"model": method, "setting": label, "sampler": gen.sampler, "steps": cfg.steps,
                   "top_p": cfg.top_p, "seconds": gen.seconds, "denoiser_calls": gen.denoiser_calls,
                   **readings(gen.texts, vocabulary, ngram, tokenizer), "samples": gen.texts}
            results["settings"].append(row)
            print(f"{method:4s} {label:40s} known {row['known_word_share']:.3f}  n-gram "
                  f"{row['ngram_bits_per_char']:.3f}  pairs {row['distinct_word_pairs']:.3f}  repeats "
                  f"{row['repeated_word_share']:.3f}", file=sys.stderr)
    results["seconds"] = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out / "results.json", json.dumps(results, indent=2) + "\n")
    write_atomically(args.out / "table.md", table(results))
    print(table(results))
    return 0


def table(results: dict) -> str:
    real = results["real"]
    lines = [f"Made by `{results['command']}` ({results['seconds']:.0f} s, {results['torch_threads']} torch threads). "
             f"{results['num_samples']} samples of {results['seq_len']} characters per setting, seed 0; models at "
             f"steps {results['steps']}. n-gram: the quickstart's Witten-Bell baseline, order "
             f"{results['ngram_order']}. Numbers from `results.json`.", "",
             "| model | setting | known words | words | n-gram bits/char | distinct word pairs | repeated words | "
             "denoiser calls |", "|---|---|---:|---:|---:|---:|---:|---:|",
             f"| real text | {results['num_samples']} windows of the test play | {real['known_word_share']:.3f} | "
             f"{real['words_counted']} | {real['ngram_bits_per_char']:.3f} | {real['distinct_word_pairs']:.3f} | "
             f"{real['repeated_word_share']:.3f} | - |"]
    for r in results["settings"]:
        lines.append(f"| {r['model'].upper()} | {r['setting']} | {r['known_word_share']:.3f} | {r['words_counted']} | "
                     f"{r['ngram_bits_per_char']:.3f} | {r['distinct_word_pairs']:.3f} | "
                     f"{r['repeated_word_share']:.3f} | {r['denoiser_calls']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
