"""`python -m experiments.estimator_training`: how fast each MDLM training estimator trains, side by side.

reports/variance measures the variance of each estimator at fixed weights; this measures what a user cares about:
validation NELBO after the same number of steps at the same cost. Every run starts from the same initialization,
sees the same windows of the Shakespeare training split at every step (an estimator that scores each window
twice, `complementary`, sees the first half of them: the same rows per forward, so the same cost), the same
AdamW, warm-up and gradient clipping as `seqdiff train`, and is scored every `--eval-every` steps on the same
validation windows by one common estimator (`mask_count`, several draws), so that the numbers differ only by
the training estimator. The loop is a plain PyTorch loop, not Lightning, so nothing but the estimator differs.

Writes <out>/results.json and <out>/table.md (each to a temporary file, then renamed).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from seqdiff.config import MODEL_PRESETS, DataConfig, MethodConfig, ModelConfig
from seqdiff.data.blocks import RandomWindowBatches, step_generator
from seqdiff.data.text import load_split_arrays
from seqdiff.methods import Batch, build_method, build_model
from seqdiff.optim import adamw_with_warmup, lr_multiplier
from seqdiff.safe_io import atomic_write_text
from seqdiff.tokenizers import build_tokenizer

DEFAULT_OUT = Path("reports") / "variance" / "training"


@dataclass(frozen=True)
class Arm:
    """One training estimator: method.time_sampling, complementary pairs or not."""

    time_sampling: str
    complementary: bool = False
    mask_count_law: str = "uniform"

    @property
    def label(self) -> str:
        name = self.time_sampling + ("" if self.mask_count_law == "uniform" else f" {self.mask_count_law}")
        return f"{name} complementary pairs" if self.complementary else name


ARMS = [Arm("antithetic"), Arm("uniform"), Arm("antithetic_jitter"), Arm("mask_count"), Arm("antithetic", True),
        Arm("mask_count", True), Arm("mask_count", mask_count_law="inverse_sqrt")]
EVAL_SAMPLING = "mask_count"
"""The estimator every checkpoint is scored with (the lowest-variance one; unbiased for the untruncated bound)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.estimator_training", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="cpu-tiny", choices=sorted(MODEL_PRESETS), help="DiT size preset")
    p.add_argument("--seq-len", type=int, default=128, help="characters per row")
    p.add_argument("--batch-size", type=int, default=32, help="rows per forward (the quickstart's)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (the quickstart's)")
    p.add_argument("--warmup", type=int, default=50, help="linear warm-up steps, then constant")
    p.add_argument("--eval-every", type=int, default=100, help="steps between validation scores")
    p.add_argument("--eval-windows", type=int, default=256, help="validation windows")
    p.add_argument("--eval-draws", type=int, default=4, help="noise draws per validation window")
    p.add_argument("--seeds", type=int, default=1, help="initialization and data seeds (0..N-1)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder")
    p.add_argument("--arms", default="", help="comma-separated arm labels to train (default: every arm)")
    return p


def validation_bits(method, backbone, windows: torch.Tensor, draws: int, batch: int = 64) -> float:
    """Bits per character of the NELBO on `windows`, `draws` seeded noise draws each."""
    total = count = 0.0
    with torch.no_grad():
        for r in range(draws):
            for i in range(0, len(windows), batch):
                out = method.loss(backbone, Batch(windows[i:i + batch]), step_generator(10_000 + r, i))
                total += out.nll_sum.item()
                count += out.num_tokens.item()
    return total / count / math.log(2)


def train_arm(arm: Arm, seed: int, args, tokenizer, train_windows, valid: torch.Tensor) -> dict:
    """Train one estimator from the seed's initialization; its validation curve."""
    model_config = ModelConfig(preset=args.preset, max_seq_len=args.seq_len, **MODEL_PRESETS[args.preset])
    torch.manual_seed(seed)
    method, backbone, _ = build_model(model_config, MethodConfig(
        name="mdlm", time_sampling=arm.time_sampling, complementary_masks=arm.complementary,
        mask_count_law=arm.mask_count_law), tokenizer)
    scorer = build_method(MethodConfig(name="mdlm", time_sampling=EVAL_SAMPLING), tokenizer)
    optimizer, scheduler = adamw_with_warmup(backbone.parameters(), lr_multiplier(args.warmup), lr=args.lr)
    rows = args.batch_size // 2 if arm.complementary else args.batch_size  # windows per step at equal cost
    curve = {"step": [], "valid_bits": []}
    start = time.perf_counter()
    for step in range(args.steps):
        x = train_windows.batch_at(step)["input_ids"][:rows]  # the same windows for every arm
        loss = method.loss(backbone, Batch(x), step_generator(seed + 1, step)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(backbone.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve["step"].append(step + 1)
            curve["valid_bits"].append(validation_bits(scorer, backbone, valid, args.eval_draws))
    return {"label": arm.label, "seed": seed, "windows_per_step": rows, "curve": curve,
            "seconds": time.perf_counter() - start}


def render(result: dict) -> str:
    cfg = result["config"]
    lines = [f"Made by `{result['command']}` on {result['date']} ({result['elapsed_s']:.0f} s, "
             f"torch {result['torch']}, "
             f"{result['threads']} threads). DiT preset {cfg['preset']}, {cfg['batch_size']} rows of {cfg['seq_len']} "
             f"characters per forward, AdamW lr {cfg['lr']} ({cfg['warmup']} warm-up steps, then constant), "
             f"gradient clip 1.0, {cfg['steps']} steps, seeds 0..{cfg['seeds'] - 1}. Validation: "
             f"{cfg['eval_windows']} windows of the validation split, scored by `{EVAL_SAMPLING}` with "
             f"{cfg['eval_draws']} draws each (bits per character, an upper bound). Complementary pairs train on "
             f"half the windows per step (each scored twice): the same cost per step.", "",
             "| estimator | windows / step | " + " | ".join(f"step {s}" for s in result["steps"]) + " | s / run |",
             "|---|---|" + "---|" * (len(result["steps"]) + 1)]
    for label, summary in result["summary"].items():
        cells = [f"{m:.4f}" + (f" [{lo:.4f}, {hi:.4f}]" if cfg["seeds"] > 1 else "")
                 for m, lo, hi in zip(summary["mean"], summary["min"], summary["max"])]
        lines.append(f"| {label} | {summary['windows_per_step']} | " + " | ".join(cells)
                     + f" | {summary['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def summarize(runs: list[dict]) -> tuple[list[int], dict]:
    steps = runs[0]["curve"]["step"]
    out: dict = {}
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        bits = np.array([r["curve"]["valid_bits"] for r in mine])  # (seeds, evals)
        out[label] = {"mean": bits.mean(0).tolist(), "min": bits.min(0).tolist(), "max": bits.max(0).tolist(),
                      "windows_per_step": mine[0]["windows_per_step"],
                      "seconds": float(np.mean([r["seconds"] for r in mine]))}
    return steps, out


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.batch_size % 2:
        raise SystemExit(f"--batch-size {args.batch_size}: complementary pairs need an even number of rows")
    unknown = set(args.arms.split(",")) - {a.label for a in ARMS} if args.arms else set()
    if unknown:
        raise SystemExit(f"--arms: unknown {sorted(unknown)}; choose among {[a.label for a in ARMS]}")
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = build_tokenizer("char")
    data_config = DataConfig(seq_len=args.seq_len, batch_size=args.batch_size)
    train_tokens = np.asarray(load_split_arrays(data_config, tokenizer, "train")[0]["tokens"])
    valid_tokens = np.asarray(load_split_arrays(data_config, tokenizer, "valid")[0]["tokens"])
    valid = RandomWindowBatches(valid_tokens, args.seq_len, args.eval_windows, seed=12345).batch_at(0)["input_ids"]
    runs = []
    for seed in range(args.seeds):
        train_windows = RandomWindowBatches(train_tokens, args.seq_len, args.batch_size, seed=seed)
        for arm in [a for a in ARMS if not args.arms or a.label in args.arms.split(",")]:
            run = train_arm(arm, seed, args, tokenizer, train_windows, valid)
            runs.append(run)
            print(f"[{time.perf_counter() - t0:.0f}s] seed {seed} {arm.label}: "
                  + ", ".join(f"{b:.4f}" for b in run["curve"]["valid_bits"]), flush=True)
    steps, summary = summarize(runs)
    result = {"command": shlex.join(["python", "-m", "experiments.estimator_training", *argv]),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "config": vars(args), "steps": steps, "summary": summary,
              "runs": runs, "elapsed_s": round(time.perf_counter() - t0, 1)}
    out = Path(args.out)
    atomic_write_text(out / "results.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out / "table.md", render(result))
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
