"""What more training buys: the quickstart's recipe trained for several step counts, MDLM and AR side by side as the
quickstart trains them, each scored on the unseen test play next to the n-gram baseline.

    python -m experiments.quickstart_ladder --out reports/text/ladder --run-root runs/quickstart_ladder \
        [--steps 550,1100,2200,4400]

Each step count is one `seqdiff quickstart --max-steps N` (its report under OUT/steps_N, its runs under
RUN_ROOT/steps_N; the cosine learning rate decays over the N steps, the learning rates stay the quickstart's, chosen at
1,100 steps). A step count whose report exists is read, not retrained, so an interrupted ladder resumes where it
stopped (the quickstart itself resumes an interrupted training). Writes results.json (every step count: test bits of
both models and the n-gram, the gap, known-word shares, training tokens and seconds, each model's validation curve
and its last training bits), table.md (the table, the command in its header), bits_vs_tokens.png and
validation_curves.png. The report's README.md is written by hand from them.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

from seqdiff.checkpoint import load_checkpoint
from seqdiff.data.text import split_path, tokenize_file
from seqdiff.evaluation.generate import write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.figures import pyplot, save_figure
from seqdiff.quickstart import LEARNING_RATES, NUM_T_SAMPLES, QUICKSTART, run_quickstart
from seqdiff.safe_io import written_together
from seqdiff.training.guards import TrainingInterrupted
from seqdiff.training.run import LAST_CHECKPOINT


def parse_steps(text: str) -> list[int]:
    """'550,1100' -> [550, 1100], sorted and without repeats; every count >= 1."""
    try:
        steps = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SystemExit(f"--steps: comma-separated whole numbers, got {text!r}") from None
    if not steps or steps[0] < 1:
        raise SystemExit(f"--steps: counts >= 1, got {text!r}")
    return steps


def training_log(run_dir: Path) -> dict[str, Any] | None:
    """From a run's logs/metrics.csv: its validation curve [[step, bits per character], ...] and the mean training
    bits of its last 10 logged steps (MDLM: its NELBO estimate on training batches; AR: exact). None without a log
    (the runs of a reused report removed)."""
    path = run_dir / "logs" / "metrics.csv"
    if not path.is_file():
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    curve = [[int(r["step"]) + 1, float(r["val/bits_per_token"])] for r in rows if r.get("val/bits_per_token")]
    train = [float(r["train/bits_per_token"]) for r in rows if r.get("train/bits_per_token")][-10:]
    return {"validation": curve, "train_bits_last_10_logs": sum(train) / len(train) if train else math.nan}


def validation_bits(run_dir: Path) -> float | None:
    """The run's bits per character on the whole validation play, scored as experiments.quickstart_sweep scores its
    candidates (EMA weights; MDLM: NELBO with the quickstart's time samples per block, seed 0), so that ladder rows
    and sweep candidates (other recipes at these step counts) compare. None without the run."""
    if not (run_dir / LAST_CHECKPOINT).is_file():
        return None
    return score_validation(load_checkpoint(run_dir), QUICKSTART.data)["bits_per_character"]


def score_validation(model, data) -> dict[str, Any]:
    """The quickstart experiments' validation score of a loaded model: the whole validation play of `data` (a
    DataConfig), EMA weights, MDLM's NELBO with the quickstart's time samples per block, seed 0."""
    tokens = tokenize_file(split_path(data, "valid"), model.tokenizer)
    return evaluate_tokens(model, tokens, batch_size=data.eval_batch_size,
                           num_t_samples=1 if model.method.exact_likelihood else NUM_T_SAMPLES, seed=0)


def ladder_row(steps: int, results: dict[str, Any]) -> dict[str, Any]:
    """One step count's line from the quickstart's results.json."""
    mdlm, ar = results["models"]["mdlm"], results["models"]["ar"]
    ngram = results["ngram"]["bits_per_character"]
    return {
        "steps": steps,
        "tokens": ar["tokens_seen"],
        "mdlm_bits": mdlm["bits_per_character"],
        "ar_bits": ar["bits_per_character"],
        "ngram_bits": ngram,
        "ngram_order": results["ngram"]["order"],
        "ngram_valid_bits": results["ngram"]["valid_bits_per_character_by_order"][str(results["ngram"]["order"])],
        "gap": mdlm["bits_per_character"] / ar["bits_per_character"] - 1,
        "ar_minus_ngram": ar["bits_per_character"] - ngram,
        "mdlm_minus_ngram": mdlm["bits_per_character"] - ngram,
        "mdlm_known_words": mdlm["known_word_share"],
        "ar_known_words": ar["known_word_share"],
        "mdlm_train_seconds": mdlm["train_seconds"],
        "ar_train_seconds": ar["train_seconds"],
        "total_seconds": results["total_seconds"],
    }


def render(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        "# What more training buys: the quickstart recipe at several step counts",
        "",
        f"Made by `{command}`. Each row is `seqdiff quickstart --max-steps N` (MDLM at lr "
        f"{LEARNING_RATES['mdlm']:g}, AR at {LEARNING_RATES['ar']:g}, cosine "
        "decay over the N steps, 32 x 128 characters a step), scored on the unseen test play (Romeo and Juliet); "
        "MDLM's figure is its NELBO bound (4 time samples per block), AR's and the n-gram's are exact.",
        "",
        "| steps | training characters | MDLM bits/char | AR bits/char | n-gram | MDLM / AR - 1 | MDLM known words "
        "| AR known words | training s (MDLM / AR) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['steps']:,} | {r['tokens'] / 1e6:.1f} M | {r['mdlm_bits']:.4f} | {r['ar_bits']:.4f} | "
            f"{r['ngram_bits']:.4f} | {r['gap']:+.1%} | {r['mdlm_known_words']:.0%} | {r['ar_known_words']:.0%} | "
            f"{r['mdlm_train_seconds']:.0f} / {r['ar_train_seconds']:.0f} |")
    lines += ["", "Training against validation (the validation play, EMA weights, every 250 steps; training bits: the "
              "mean of the last 10 logged batches, raw weights; the curve reads 8 batches of the play, the last column "
              "all of it, as experiments.quickstart_sweep scores): a validation curve that turns up while the training "
              "bits still fall is overfitting.", "",
              "| steps | model | training bits | last validation bits | best validation bits (step) | whole validation "
              "play |",
              "|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        for method, name in (("mdlm", "MDLM"), ("ar", "AR")):
            log = r.get(f"{method}_log")
            if not log or not log["validation"]:
                continue
            best_step, best = min(log["validation"], key=lambda point: point[1])
            whole = r.get(f"{method}_valid_bits")
            lines.append(f"| {r['steps']:,} | {name} | {log['train_bits_last_10_logs']:.4f} | "
                         f"{log['validation'][-1][1]:.4f} | {best:.4f} ({best_step:,}) | "
                         f"{'-' if whole is None else format(whole, '.4f')} |")
    lines += ["", f"The n-gram (order {rows[0]['ngram_order']}, chosen on the validation play) scores "
              f"{rows[0]['ngram_valid_bits']:.4f} bits per character on the validation play."]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (bits, gap) = plt.subplots(1, 2, figsize=(10, 4))
    tokens = [r["tokens"] / 1e6 for r in rows]
    bits.plot(tokens, [r["mdlm_bits"] for r in rows], "o-", label="MDLM (NELBO bound)")
    bits.plot(tokens, [r["ar_bits"] for r in rows], "s-", label="AR")
    bits.axhline(rows[0]["ngram_bits"], color="grey", linestyle="--", label="n-gram (Witten-Bell)")
    gap.plot(tokens, [100 * r["gap"] for r in rows], "o-")
    for ax in (bits, gap):
        ax.set_xscale("log")
        ax.set_xticks(tokens, [f"{t:.1f}" for t in tokens])  # one tick per rung, no 10^k labels
        ax.minorticks_off()
        ax.set_xlabel("training characters (millions, log scale)")
    bits.set_ylabel("test bits per character")
    bits.legend()
    gap.set_ylabel("MDLM / AR - 1 (%)")
    fig.tight_layout()
    save_figure(fig, path)


def previous_rows(path: Path) -> dict[tuple[int, str], dict[str, Any]]:
    """What an earlier ladder report kept of each run, by (steps, method): its training log (used where the runs
    are gone) and its validation bits (not scored again)."""
    if not path.is_file():
        return {}
    return {(r["steps"], m): {"log": r.get(f"{m}_log"), "valid_bits": r.get(f"{m}_valid_bits")}
            for r in json.loads(path.read_text())["rows"] for m in ("mdlm", "ar")}


def plot_validation(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, method, title in zip(axes, ("mdlm", "ar"), ("MDLM (NELBO bound)", "AR")):
        for r in rows:
            log = r.get(f"{method}_log")
            if log and log["validation"]:
                steps, bits = zip(*log["validation"])
                ax.plot(steps, bits, "o-", markersize=3, label=f"{r['steps']:,} steps")
        ax.axhline(rows[0]["ngram_valid_bits"], color="grey", linestyle="--", label="n-gram (validation play)")
        ax.set_xlabel("training step")
        ax.set_title(title)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("validation bits per character (EMA weights)")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/text/ladder")
    p.add_argument("--run-root", default="runs/quickstart_ladder")
    p.add_argument("--steps", default="550,1100,2200,4400")
    args = p.parse_args(argv)
    steps = parse_steps(args.steps)
    out, run_root = Path(args.out), Path(args.run_root)
    command = "python -m experiments.quickstart_ladder " + shlex.join(
        ["--out", str(out), "--run-root", str(run_root), "--steps", ",".join(map(str, steps))])
    earlier = previous_rows(out / "results.json")
    rows = []
    for n in steps:
        report = out / f"steps_{n}" / "results.json"
        if report.is_file():
            results = json.loads(report.read_text())
            print(f"[ladder] {n} steps: reusing {report}", file=sys.stderr)
        else:
            print(f"[ladder] {n} steps: training (seqdiff quickstart --max-steps {n})", file=sys.stderr)
            try:
                results = run_quickstart(out_dir=out / f"steps_{n}", run_root=run_root / f"steps_{n}", max_steps=n)
            except TrainingInterrupted as e:  # its checkpoint is saved: the same command goes on from it
                print(f"[ladder] stopped ({e}); the same command resumes", file=sys.stderr)
                return e.exit_status
        row = ladder_row(n, results)
        for method in ("mdlm", "ar"):
            run_dir, kept = run_root / f"steps_{n}" / method, earlier.get((n, method), {})
            row[f"{method}_log"] = training_log(run_dir) or kept.get("log")
            valid = kept.get("valid_bits")  # scored once: a reused row keeps its figure
            row[f"{method}_valid_bits"] = valid if valid is not None else validation_bits(run_dir)
        rows.append(row)
    with written_together():
        write_atomically(out / "results.json", json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
        write_atomically(out / "table.md", render(rows, command))
        plot(rows, out / "bits_vs_tokens.png")
        plot_validation(rows, out / "validation_curves.png")
    print(render(rows, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
