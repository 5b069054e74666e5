"""Where the in-domain probe drop of a BERT -> MDLM fine-tuning lives: encoders between "before" and "after".

    python -m experiments.bert_init_anatomy --run-dir DIR --out DIR [--alphas 0.25,0.5,0.75]

Why: every LP-FT run of `experiments.bert_init` lowers the austen-novel probe by about one point, whatever the
encoder's learning rate (0.03 .. 0.3 x the head's). This command asks two questions of one finished run
without training anything:
1. Does the drop grow with how far the encoder moved? Weight-space interpolation (WiSE-FT; Wortsman et al.
   2022, arXiv:2109.01903): encoder = (1 - alpha) * pretrained + alpha * fine-tuned, for each alpha, the
   fine-tuned head kept. alpha = 0 is the pretrained encoder under the fine-tuned head (its probe is the
   "before" probe exactly), alpha = 1 the fine-tuned model.
2. Is the drop in one part of the encoder? The fine-tuned model with one part put back to its pretrained
   weights: the embeddings, the lower half of the blocks, the upper half.

Every variant gets the MDLM test bound (nats per token, the same blocks and draws for all) and the austen-novel
probe of `experiments.bert_init` (same passages, splits, C grid and seed), with a paired bootstrap interval of
its accuracy minus the pretrained encoder's and the non-inferiority outcome at the run's margin.

Writes <out>/results.json, <out>/table.md (its numbers as a table) and <out>/tradeoff.png; the report's
README.md is written by hand.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from experiments.bert_init import NONINFERIORITY_MARGIN, PROBE_CS, austen_task
from seqdiff.backbones.wise_ft import State, encoder_keys, interpolate, pretrained_and_finetuned
from seqdiff.checkpoint import CheckpointError, LoadedModel, load_checkpoint
from seqdiff.config import ConfigError
from seqdiff.data.datasets import get_dataset
from seqdiff.data.text import tokenize_file
from seqdiff.evaluation.generate import write_atomically
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.evaluation.probe import logistic_probe, mean_pooled_features
from seqdiff.evaluation.stats import noninferiority, paired_bootstrap
from seqdiff.figures import pyplot, save_figure
from seqdiff.training.run import LAST_CHECKPOINT


class AnatomyError(ValueError):
    """A run this command cannot take apart."""


def part_of(key: str, n_layers: int) -> str:
    """'embeddings', 'lower blocks' (the first half of the blocks) or 'upper blocks' for an encoder key."""
    if key.startswith("embeddings."):
        return "embeddings"
    parts = key.split(".")
    if parts[0] == "layers" and parts[1].isdigit():
        return "lower blocks" if int(parts[1]) < n_layers // 2 else "upper blocks"
    raise AnatomyError(f"encoder weight {key!r} is neither an embedding nor in a block")


def restore(pre: State, post: State, keys: list[str]) -> State:
    """post with the given keys put back to their pretrained values."""
    return {**post, **{k: pre[k] for k in keys}}


def variants(pre: State, post: State, keys: list[str], n_layers: int,
             alphas: list[float]) -> dict[str, tuple[str, Callable[[], State]]]:
    """name -> (kind, state builder), in the order the report lists them."""
    out: dict[str, tuple[str, Callable[[], State]]] = {}
    for a in sorted({0.0, *alphas, 1.0}):
        out[f"alpha={a:g}"] = ("interpolation", lambda a=a: interpolate(pre, post, keys, a))
    for part in ("embeddings", "lower blocks", "upper blocks"):
        chosen = [k for k in keys if part_of(k, n_layers) == part]
        out[f"fine-tuned, {part} pretrained"] = ("restore", lambda chosen=chosen: restore(pre, post, chosen))
    return out


def parse_alphas(text: str) -> list[float]:
    try:
        alphas = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--alphas: comma-separated numbers expected, got {text!r}") from None
    if not alphas or any(not 0.0 <= a <= 1.0 for a in alphas):
        raise argparse.ArgumentTypeError(f"--alphas: numbers in [0, 1] expected, got {text!r}")
    return alphas


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.bert_init_anatomy", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="a finished training run of experiments.bert_init")
    p.add_argument("--out", required=True, help="report folder")
    p.add_argument("--alphas", type=parse_alphas, default=[0.25, 0.5, 0.75],
                   help="interpolation weights of the fine-tuned encoder (0 and 1 are always added)")
    p.add_argument("--eval-blocks", type=int, default=128, help="test blocks scored per variant")
    p.add_argument("--t-samples", type=int, default=4, help="Monte Carlo (t, mask) draws per test block")
    p.add_argument("--austen-passages", type=int, default=1400, help="probe passages per novel")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seed", type=int, default=None,
                   help="draws of the test bound and the probe's folds (default: the run's train.seed, as "
                        "experiments.bert_init used)")
    p.add_argument("--noninferiority-margin", type=float, default=NONINFERIORITY_MARGIN)
    return p


def load_run(run_dir: Path) -> tuple[LoadedModel, State, State]:
    """The fine-tuned model, the pretrained encoder's state (under the fine-tuned head) and the fine-tuned state."""
    if not (run_dir / LAST_CHECKPOINT).is_file():
        raise AnatomyError(f"--run-dir {run_dir}: no {LAST_CHECKPOINT} there (a finished run of experiments.bert_init "
                           "is needed)")
    model = load_checkpoint(run_dir)
    pre, post = pretrained_and_finetuned(model)  # refuses a model trained from scratch
    return model, pre, post


def run_seed(run_dir: Path) -> int:
    """train.seed of a run, from its config.yaml (what experiments.bert_init drew its test draws and folds with)."""
    import yaml

    path = run_dir / "config.yaml"
    try:
        return int(yaml.safe_load(path.read_text(encoding="utf-8"))["train"]["seed"])
    except (OSError, UnicodeDecodeError, yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise AnatomyError(f"{path}: no readable train.seed ({type(e).__name__}: {e}); pass --seed") from None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    start = time.perf_counter()
    run_dir, out_dir = Path(args.run_dir), Path(args.out)
    try:
        model, pre, post = load_run(run_dir)
        seed = args.seed if args.seed is not None else run_seed(run_dir)
    except (AnatomyError, ConfigError, CheckpointError) as e:  # ConfigError: model.init_from is gone or unreadable
        parser.error(str(e))

    def log(msg: str) -> None:
        print(f"[bert_init_anatomy {time.perf_counter() - start:7.1f}s] {msg}", file=sys.stderr, flush=True)

    keys = encoder_keys(model.backbone)
    n_layers = model.model_config.n_layers
    test_file = get_dataset(model.data_config.corpus).files("test")[0]
    test_tokens = tokenize_file(test_file, model.tokenizer)[: args.eval_blocks * model.seq_len]
    task = austen_task(model.tokenizer, args.austen_passages, model.seq_len)
    rows, correct = {}, {}
    for name, (kind, build) in variants(pre, post, keys, n_layers, args.alphas).items():
        log(name)
        model.backbone.load_state_dict(build())
        test = evaluate_tokens(model, test_tokens, batch_size=args.batch_size, num_t_samples=args.t_samples, seed=seed)
        feats = {s: mean_pooled_features(model.backbone, torch.from_numpy(task[f"x_{s}"]), batch_size=args.batch_size)
                 for s in ("train", "test")}
        fit = logistic_probe(feats["train"], task["y_train"], feats["test"], task["y_test"], Cs=PROBE_CS, seed=seed)
        correct[name] = fit.pop("correct")
        rows[name] = {"kind": kind, "test_nll_nats_per_token": test["nll_nats_per_token"], "probe": fit}
    reference = correct["alpha=0"]
    for name, row in rows.items():
        interval = paired_bootstrap(reference, correct[name], seed=seed)
        row["difference"] = row["probe"]["accuracy"] - rows["alpha=0"]["probe"]["accuracy"]
        row["difference_interval"] = interval
        row["noninferiority"] = noninferiority(interval, args.noninferiority_margin)
    result = {"command": shlex.join(["python", "-m", "experiments.bert_init_anatomy", *argv]),
              "run_dir": str(run_dir), "step": model.step, "seed": seed, "n_layers": n_layers,
              "test_file": test_file.name, "eval_blocks": args.eval_blocks, "t_samples": args.t_samples,
              "probe_passages": {"train": len(task["y_train"]), "test": len(task["y_test"])},
              "noninferiority_margin": args.noninferiority_margin, "variants": rows,
              "total_seconds": time.perf_counter() - start}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomically(out_dir / "results.json", json.dumps(result, indent=2) + "\n")
    write_atomically(out_dir / "table.md", table(result))
    save_figure(tradeoff_figure(result), out_dir / "tradeoff.png")
    log(f"written: {out_dir}/results.json, table.md, tradeoff.png")
    return 0


def table(r: dict) -> str:
    """table.md: the numbers of results.json as a table (the report's README.md is written by hand)."""
    lines = [f"Made by `{r['command']}`; numbers from `results.json`. Difference: probe accuracy minus the pretrained "
             f"encoder's (alpha = 0), 95% paired bootstrap interval; outcome at margin {r['noninferiority_margin']:g}.",
             "", "| encoder | test bound (nats / token) | probe accuracy | difference [95%] | outcome | C |",
             "| --- | ---: | ---: | ---: | --- | ---: |"]
    for name, row in r["variants"].items():
        lo, hi = row["difference_interval"]
        lines.append(f"| {name} | {row['test_nll_nats_per_token']:.3f} | {row['probe']['accuracy']:.3f} | "
                     f"{row['difference']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {row['noninferiority']} | "
                     f"{row['probe']['C']:g} |")
    return "\n".join(lines) + "\n"


def tradeoff_figure(r: dict):
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for kind, marker in (("interpolation", "o-"), ("restore", "s")):
        names = [n for n, row in r["variants"].items() if row["kind"] == kind]
        xs = [r["variants"][n]["test_nll_nats_per_token"] for n in names]
        ys = [r["variants"][n]["difference"] for n in names]
        lo = [y - r["variants"][n]["difference_interval"][0] for n, y in zip(names, ys)]
        hi = [r["variants"][n]["difference_interval"][1] - y for n, y in zip(names, ys)]
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt=marker, capsize=3, label=kind)
        for n, x, y in zip(names, xs, ys):
            ax.annotate(n.replace("fine-tuned, ", ""), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(-r["noninferiority_margin"], color="red", ls="--", lw=1, label="-margin")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel("test bound, nats / token (lower is better)")
    ax.set_ylabel("austen-novel accuracy - pretrained")
    ax.set_title(f"{Path(r['run_dir']).name}, step {r['step']}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


if __name__ == "__main__":
    sys.exit(main())
