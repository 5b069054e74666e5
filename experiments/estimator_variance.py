"""`python -m experiments.estimator_variance`: variance of the MDLM loss and gradient for each time sampler.

A tiny MDLM (DiT, character tokenizer) is trained for a few hundred steps on the shipped Shakespeare slice,
so that its weights are those of a model in training rather than a random initialization; then, with the
weights fixed, seqdiff.evaluation.estimator_variance.measure draws each estimator's loss and gradient many
times, with the batch held fixed (the time sampler's own variance) and with a fresh batch every draw (the
whole gradient noise of a step). Every estimator costs the same per draw: B rows, one forward and backward.

Writes <out>/results.json and <out>/table.md (its numbers as tables; each file to a temporary file, then
renamed); the report's README.md is written by hand.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from seqdiff.config import MODEL_PRESETS, DataConfig, MethodConfig, ModelConfig
from seqdiff.data.blocks import RandomWindowBatches, step_generator
from seqdiff.data.text import load_split_arrays
from seqdiff.evaluation.estimator_variance import Estimator, mean_gradient_agreement, measure
from seqdiff.methods import Batch, build_method, build_model
from seqdiff.tokenizers import build_tokenizer

BASELINE = "antithetic"
"""The estimator the ratios are taken against: seqdiff's time sampler before method.time_sampling had a choice."""
ESTIMATORS = [Estimator("uniform"), Estimator("antithetic"), Estimator("antithetic_jitter"), Estimator("mask_count"),
              Estimator("antithetic", masks_per_sequence=2), Estimator("antithetic", complementary=True),
              Estimator("mask_count", masks_per_sequence=2), Estimator("mask_count", complementary=True),
              Estimator("mask_count", mask_count_law="inverse_sqrt"),
              Estimator("mask_count", complementary=True, mask_count_law="inverse_sqrt")]
"""Each at B rows per forward: the two-mask estimators (independent or complementary) on B / 2 windows."""
DEFAULT_OUT = Path("reports") / "variance"
REGIMES = {"fixed_batch": "Fixed batch: only the noise (times, masks) redrawn",
           "fresh_batch": "Fresh batch every draw: data and noise",
           "batch_noise": "Fresh batches, the noise's variance within each: E_x Var(g | x)"}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m experiments.estimator_variance", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="cpu-tiny", choices=sorted(MODEL_PRESETS), help="DiT size preset")
    p.add_argument("--seq-len", type=int, default=64, help="characters per row")
    p.add_argument("--batch-size", type=int, default=16, help="rows per draw (the training batch)")
    p.add_argument("--train-steps", type=int, default=200, help="AdamW steps before the weights are fixed")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate of those steps")
    p.add_argument("--draws", type=int, default=150, help="draws per estimator and regime")
    p.add_argument("--seed", type=int, default=0, help="seed of the initialization, the data and the noise")
    p.add_argument("--groups", type=int, default=5,
                   help="disjoint groups of draws whose spread gives the standard errors")
    p.add_argument("--regimes", default="fixed_batch fresh_batch",
                   help="which regimes to measure, space- or comma-separated: fixed_batch (only the noise redrawn), "
                        "fresh_batch (data and noise), batch_noise (the noise within fresh batches, --per-batch draws "
                        "each)")
    p.add_argument("--per-batch", type=int, default=10,
                   help="batch_noise: draws of each fresh batch (the draws are --draws / this batches)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--estimators", default="",
                   help="comma-separated labels of the estimators to measure, in the table's order (default: all); "
                        f"{BASELINE!r} is always measured, the ratios are taken against it")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder")
    p.add_argument("--render", action="store_true", help="only rewrite <out>/table.md from <out>/results.json")
    return p


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def render(result: dict) -> str:
    groups = result["config"].get("groups", 5)  # runs before --groups used 5
    lines = [f"Made by `{result['command']}` on {result['date']} ({result['elapsed_s']:.0f} s, torch "
             f"{result['torch']}, {result['threads']} threads). Model: DiT preset {result['config']['preset']} "
             f"({result['params']:,} parameters), character tokenizer, trained {result['config']['train_steps']} "
             f"AdamW steps on the Shakespeare training split (final training loss {result['train_loss_final']:.3f} "
             f"nats/char), then fixed. Each draw: {result['config']['batch_size']} rows of "
             f"{result['config']['seq_len']} characters, one forward and backward; {result['config']['draws']} draws "
             f"per estimator and regime"
             + (f" (batch_noise: {result['config']['draws'] // result['config']['per_batch']} fresh batches, "
                f"{result['config']['per_batch']} draws each)" if "batch_noise" in result["results"] else "")
             + ".\n",
             "grad var = E ||g - E g||^2 (trace of the gradient covariance); abs(E g)^2 = squared norm of the mean "
             f"gradient; s.e. of a variance = spread over {groups} disjoint groups of draws / sqrt({groups}). "
             "mask_count estimates "
             "the untruncated NELBO, the time-based draws the one truncated at t_min (O(t_min + eps) apart). "
             f"Ratios are `{result['baseline']}` (seqdiff's sampler before method.time_sampling had a choice) "
             "divided by "
             "the estimator (> 1: lower variance); a ratio's s.e. by the delta method from the two variances' (their "
             "errors taken as independent).\n"]
    for regime, title in REGIMES.items():
        if regime not in result["results"]:  # not measured (--regimes)
            continue
        rows = result["results"][regime]
        base = next(row for row in rows if row["label"] == result["baseline"])
        lines += [f"\n## {title}\n", "| estimator | loss mean ± s.e. | loss var ± s.e. | grad var ± s.e. | "
                  "abs(E g)^2 | loss var ratio | grad var ratio ± s.e. |", "|---|---|---|---|---|---|---|"]
        for row in rows:
            ratio = result["ratios"][regime][row["label"]]
            spread = "" if row is base else f" ± {ratio_stderr(base, row):.2f}"
            lines.append(f"| {row['label']} | {row['loss_mean']:.4f} ± {row['loss_mean_stderr']:.4f} | "
                         f"{row['loss_var']:.2e} ± {row['loss_var_stderr']:.1e} | "
                         f"{row['grad_var']:.2e} ± {row['grad_var_stderr']:.1e} | {row['grad_norm2']:.2e} | "
                         f"{ratio['loss_var']:.2f} | {ratio['grad_var']:.2f}{spread} |")
        if regime == "batch_noise" and "fresh_batch" in result["results"]:
            lines += ["", data_part(result)]
        agree = result.get("mean_gradient_agreement", {}).get(regime)
        if agree:
            lines += ["", f"Mean gradient against `{result['baseline']}` on the same batches, "
                      "||g_bar - g_bar_base||^2 / ((grad var + grad var_base) / draws) (about 1 if they agree, far "
                      "above 1 if one is biased): " + ", ".join(f"{k} {v:.2f}" for k, v in agree.items())]
    return "\n".join(lines) + "\n"


def data_part(result: dict) -> str:
    """One paragraph: the data's part of the fresh-batch gradient variance, fresh_batch - batch_noise (law of total
    variance), per estimator measured in both, and the ratio no estimator of a batch's loss can pass with fresh data:
    the baseline's fresh_batch variance over that part."""
    fresh = {row["label"]: row for row in result["results"]["fresh_batch"]}
    parts = {}
    for row in result["results"]["batch_noise"]:
        if row["label"] in fresh:
            f = fresh[row["label"]]
            parts[row["label"]] = (f["grad_var"] - row["grad_var"],
                                   (f["grad_var_stderr"] ** 2 + row["grad_var_stderr"] ** 2) ** 0.5)
    if not parts:
        return "No estimator was measured in both fresh_batch and batch_noise."
    mean_part = sum(p for p, _ in parts.values()) / len(parts)
    base = fresh[result["baseline"]]["grad_var"]
    return ("The data's part of the fresh-batch gradient variance, Var_x E(g | x) = fresh_batch - batch_noise: "
            + ", ".join(f"{label} {p:.2e} ± {e:.1e}" for label, (p, e) in parts.items())
            + f" (each estimator gives its own reading of the same quantity). With fresh data no estimator of a "
            f"batch's loss goes below it: `{result['baseline']}`'s fresh-batch variance over their mean, "
            f"{base:.2e} / {mean_part:.2e} = **{base / mean_part:.2f}x**, is the largest ratio any can reach.")


def ratio_stderr(base: dict, row: dict) -> float:
    """Standard error of base grad var / row grad var, to first order from the two variances' standard errors."""
    ratio = base["grad_var"] / row["grad_var"]
    return ratio * ((base["grad_var_stderr"] / base["grad_var"]) ** 2
                    + (row["grad_var_stderr"] / row["grad_var"]) ** 2) ** 0.5


def chosen_regimes(names: str) -> list[str]:
    """The regimes named in `names` (space- or comma-separated), in REGIMES' order."""
    wanted = set(names.replace(",", " ").split())
    unknown = sorted(wanted - set(REGIMES))
    if unknown or not wanted:
        raise SystemExit(f"--regimes: {'unknown ' + str(unknown) if unknown else 'none given'}; choose from "
                         f"{list(REGIMES)}")
    return [r for r in REGIMES if r in wanted]


def chosen_estimators(labels: str) -> list[Estimator]:
    """The estimators named in `labels` (comma-separated, as in the table), the baseline always among them."""
    if not labels.strip():
        return list(ESTIMATORS)
    by_label = {e.label: e for e in ESTIMATORS}
    wanted = {name.strip() for name in labels.split(",") if name.strip()} | {BASELINE}
    unknown = sorted(wanted - set(by_label))
    if unknown:
        raise SystemExit(f"--estimators: unknown {unknown}; choose from {sorted(by_label)}")
    return [e for e in ESTIMATORS if e.label in wanted]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    estimators = chosen_estimators(args.estimators)
    regimes = chosen_regimes(args.regimes)
    if args.groups < 2 or args.draws < 2 * args.groups:
        raise SystemExit(f"--draws {args.draws} --groups {args.groups}: need at least 2 groups of at least 2 draws")
    if "batch_noise" in regimes and (args.per_batch < 2 or args.draws % args.per_batch
                                     or args.draws // args.per_batch < 2 * args.groups):
        raise SystemExit(f"--draws {args.draws} --per-batch {args.per_batch} --groups {args.groups}: batch_noise needs "
                         "--per-batch >= 2 dividing --draws, and at least 2 batches per group")
    if args.render:  # the tables from the numbers on disk (after a change of wording)
        result = json.loads((Path(args.out) / "results.json").read_text())
        _write_atomically(Path(args.out) / "table.md", render(result))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    command = shlex.join(["python", "-m", "experiments.estimator_variance", *argv])
    tokenizer = build_tokenizer("char")
    data_config = DataConfig(seq_len=args.seq_len, batch_size=args.batch_size)
    tokens = load_split_arrays(data_config, tokenizer, "train")[0]["tokens"]
    windows = RandomWindowBatches(np.asarray(tokens), args.seq_len, args.batch_size, seed=args.seed)
    model_config = ModelConfig(preset=args.preset, max_seq_len=args.seq_len, **MODEL_PRESETS[args.preset])
    method_config = MethodConfig(name="mdlm", time_sampling=BASELINE)
    torch.manual_seed(args.seed)
    method, backbone, _ = build_model(model_config, method_config, tokenizer)

    # a few hundred steps, so that the gradient is measured where training is, not at the initialization
    optimizer = torch.optim.AdamW(backbone.parameters(), lr=args.lr)
    loss = torch.tensor(float("nan"))
    for step in range(args.train_steps):
        batch = Batch(windows.batch_at(10_000_000 + step)["input_ids"])  # apart from the measured batches
        loss = method.loss(backbone, batch, step_generator(args.seed + 1, step)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    train_loss = loss.item()
    print(f"[{time.perf_counter() - t0:.0f}s] trained {args.train_steps} steps, loss {train_loss:.3f}", flush=True)

    def batch_at(k: int, rows: int | None) -> torch.Tensor:
        x = windows.batch_at(k)["input_ids"]  # (B, L)
        return x if rows is None else x[:rows]

    def factory(time_sampling: str, **options):
        return build_method(MethodConfig(name="mdlm", time_sampling=time_sampling, **options), tokenizer)

    results, ratios, agreement = {}, {}, {}
    for regime in regimes:
        means: dict = {}
        stats = measure(factory, backbone, batch_at, estimators, args.draws, regime=regime, seed=args.seed,
                        groups=args.groups, mean_gradients=means, per_batch=args.per_batch)
        results[regime] = [s.to_dict() for s in stats]
        same_data = [s for s in stats if s.label == BASELINE or s.masks_per_sequence == 1 and not s.complementary]
        agreement[regime] = mean_gradient_agreement({s.label: means[s.label] for s in same_data}, same_data, BASELINE)
        base = next(s for s in stats if s.label == BASELINE)
        ratios[regime] = {s.label: {"loss_var": base.loss_var / s.loss_var, "grad_var": base.grad_var / s.grad_var}
                          for s in stats}
        print(f"[{time.perf_counter() - t0:.0f}s] {regime}: " + ", ".join(
            f"{s.label} grad var {s.grad_var:.3e}" for s in stats), flush=True)
    result = {
        "command": command,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "config": vars(args),
        "params": sum(p.numel() for p in backbone.parameters()),
        "train_loss_final": train_loss,
        "baseline": BASELINE,
        "results": results,
        "ratios": ratios,
        "mean_gradient_agreement": agreement,
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
    out = Path(args.out)
    _write_atomically(out / "results.json", json.dumps(result, indent=2) + "\n")
    _write_atomically(out / "table.md", render(result))
    print(render(result))
    print(f"written: {out / 'results.json'}, {out / 'table.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
