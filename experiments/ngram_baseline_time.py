"""The quickstart's n-gram baseline, timed: every order fitted afresh (before session 35) against counting once at the
highest order and scoring every order in one pass (seqdiff.quickstart.ngram_baseline), side by side.

    python -m experiments.ngram_baseline_time --out reports/bench/ngram_baseline [--rounds 5]

Both procedures run on the quickstart's own splits and character tokenizer, alternating within each round in this
process, and must give the same bits for every order (checked; the run stops otherwise). Writes results.json and
README.md (the command in its header): each procedure's median seconds and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from seqdiff.data.text import split_path, tokenize_file
from seqdiff.evaluation.ngram import WittenBellNGram
from seqdiff.quickstart import NGRAM_ORDERS, QUICKSTART, ngram_baseline
from seqdiff.tokenizers import build_tokenizer


def fitted_per_order(data, tokenizer) -> dict:
    """The procedure before session 35: a model fitted afresh for every order, then again for the best one."""
    ids = {split: tokenize_file(split_path(data, split), tokenizer) for split in ("train", "valid", "test")}
    valid_bits = {order: WittenBellNGram(order, tokenizer.num_regular).fit([ids["train"]])
                  .bits_per_token([ids["valid"]]) for order in NGRAM_ORDERS}
    best = min(valid_bits, key=valid_bits.get)
    model = WittenBellNGram(best, tokenizer.num_regular).fit([ids["train"]])
    return {"order": best, "bits_per_character": model.bits_per_token([ids["test"]]),
            "valid_bits_per_character_by_order": valid_bits}


PROCEDURES = {"fitted_per_order": fitted_per_order, "counted_once": ngram_baseline}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/bench/ngram_baseline")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds must be >= 1, got {args.rounds}")
    tokenizer = build_tokenizer(QUICKSTART.data.tokenizer)
    seconds: dict[str, list[float]] = {name: [] for name in PROCEDURES}
    results: dict[str, dict] = {}
    for r in range(args.rounds):
        names = list(PROCEDURES) if r % 2 == 0 else list(reversed(PROCEDURES))  # alternate which goes first
        for name in names:
            start = time.perf_counter()
            results[name] = PROCEDURES[name](QUICKSTART.data, tokenizer)
            seconds[name].append(time.perf_counter() - start)
        a, b = (results[n] for n in PROCEDURES)
        if (a["order"], a["bits_per_character"]) != (b["order"], b["bits_per_character"]) or any(
                a["valid_bits_per_character_by_order"][k] != b["valid_bits_per_character_by_order"][k]
                for k in NGRAM_ORDERS):
            print(f"the two procedures disagree: {a} against {b}", file=sys.stderr)
            return 1
    ratios = [x / y for x, y in zip(seconds["fitted_per_order"], seconds["counted_once"])]
    command = "python -m experiments.ngram_baseline_time " + shlex.join(sys.argv[1:] if argv is None else argv)
    summary = {"command": command.strip(), "rounds": args.rounds, "seconds": seconds,
               "median_seconds": {n: statistics.median(s) for n, s in seconds.items()},
               "median_ratio_fitted_per_order_over_counted_once": statistics.median(ratios),
               "order": results["counted_once"]["order"],
               "test_bits_per_character": results["counted_once"]["bits_per_character"]}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    med = summary["median_seconds"]
    (out / "README.md").write_text(
        f"# The quickstart's n-gram baseline, timed\n\nMade by `{summary['command']}` on "
        f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}: {args.rounds} rounds, the two procedures alternating which goes "
        "first, in one process, on the quickstart's splits (orders "
        f"{NGRAM_ORDERS.start}-{NGRAM_ORDERS.stop - 1}, the best chosen on the validation play).\n\n"
        "| procedure | median s |\n|---|---:|\n"
        f"| every order fitted afresh (before session 35) | {med['fitted_per_order']:.2f} |\n"
        f"| counted once, every order scored in one pass (`ngram_baseline`) | {med['counted_once']:.2f} |\n\n"
        f"Median per-round ratio: **{summary['median_ratio_fitted_per_order_over_counted_once']:.2f}x**. Both gave "
        f"the same bits for every order (checked each round): order {summary['order']}, "
        f"{summary['test_bits_per_character']:.4f} test bits per character.\n")
    print((out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
