"""How much could importance sampling of the number of masked tokens lower mask_count's gradient variance?

    python -m experiments.mask_count_moments --out reports/variance/mask_count_moments

`method.time_sampling=mask_count` draws k ~ U{1..n} masked tokens per row and weighs the row's cross-entropy by
n / k. Drawing k from another law q (and weighing by p(k) / q(k) more) keeps it unbiased; the q that minimizes
the second moment of a row's gradient is q(k) ∝ p(k) sqrt(m2(k)), m2(k) = E[||g||^2 | k], and then the second
moment is (E_p sqrt(m2))^2 instead of E_p m2. This measures m2(k) on the model reports/variance measures (DiT
cpu-tiny, character Shakespeare, 200 AdamW steps, then fixed): one row's gradient of the per-token loss for a
grid of k, `--draws` draws each (a fresh row and a fresh k-subset per draw), interpolated log-log over 1..n.
It reports the variance ratio of the optimal q and of the simple q(k) ∝ k^(-1/2) over uniform k, for one row.

The same m2(k) also gives the time-based `antithetic` draw's variance: a row at time t has k ~ Binomial(n, t)
masked tokens and the weight 1 / t, i.e. (k / (n t)) times mask_count's row estimate, so its second moment is
the integral over t ~ U[t_min, 1] of sum_k Binomial(k; n, t) (k / (n t))^2 m2(k). By Rao-Blackwell (condition on
k) no estimator that masks one uniform k-subset per row and weighs it by k or t beats the optimal q, so
`antithetic`'s variance over the optimal q's is the largest ratio any of them can reach against it, with fresh
rows (m2 averages over rows, so the data's part is in both).

A bound for that family of estimators, not a training result: the batch estimator also stratifies k, and lower
variance did not train faster in reports/variance/training. Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from math import lgamma
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from seqdiff.config import MODEL_PRESETS, DataConfig, MethodConfig, ModelConfig
from seqdiff.data.blocks import RandomWindowBatches, step_generator
from seqdiff.data.text import load_split_arrays
from seqdiff.methods import Batch, build_model
from seqdiff.tokenizers import build_tokenizer


def row_gradient(method, net, params, x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """The flat gradient of one row's mask_count estimate per token, (n / k) sum_masked CE / n, k masked."""
    n = x.shape[1]
    masked = torch.rand(n, generator=gen).argsort()[:k]  # a uniform k-subset
    xt = x.clone()
    xt[0, masked] = method.mask_id
    logits = method.subs_logits(net(xt))[0, masked]  # (k, V)
    estimate = (n / k) * F.cross_entropy(logits.float(), x[0, masked], reduction="sum") / n
    return torch.cat([g.flatten() for g in torch.autograd.grad(estimate, params)])


def antithetic_second_moment(moment: np.ndarray, t_min: float = 1e-3, points: int = 20_001) -> float:
    """E||g||^2 of one row's time-based estimate (1 / t) sum_masked grad CE / n, t ~ U[t_min, 1], each token
    masked with probability t (the loglinear schedule's (1 - eps) t, eps = 1e-3, taken as t), from
    moment[k - 1] = m2(k) of mask_count's row estimate (n / k) sum_masked / n.

    Given k the masked set is a uniform k-subset and the estimate is (k / (n t)) times mask_count's, so the
    integrand is sum_k Binomial(k; n, t) (k / (n t))^2 m2(k) (k = 0 adds nothing). It grows like 1 / t as t -> 0,
    so the integral runs over log t (trapezoid rule on `points` nodes)."""
    n = len(moment)
    s = np.linspace(np.log(t_min), 0.0, points)  # log t
    t = np.exp(s)[:, None]
    t[-1] = 1.0 - 1e-15  # log(1 - t) stays finite; the k = n term carries the mass there
    k = np.arange(1, n + 1)[None, :]
    log_choose = np.array([lgamma(n + 1) - lgamma(j + 1) - lgamma(n - j + 1) for j in range(1, n + 1)])[None, :]
    pmf = np.exp(log_choose + k * np.log(t) + (n - k) * np.log1p(-t))  # (points, n)
    integrand = (pmf * (k / (n * t)) ** 2 * np.asarray(moment)[None, :]).sum(1) * t[:, 0]  # d t = t d log t
    return float(np.trapezoid(integrand, s) / (1.0 - t_min))


def gains(ks: list[int], m2: list[float], mean_sq: float, n: int, t_min: float = 1e-3) -> dict[str, float]:
    """Variance of uniform k over that of the optimal q and of q ∝ k^(-1/2), from m2 interpolated log-log; and
    `antithetic`'s (times in [t_min, 1]) over each of the three."""
    k = np.arange(1, n + 1)
    moment = np.exp(np.interp(np.log(k), np.log(ks), np.log(m2)))  # (n,)
    p = np.full(n, 1 / n)
    uniform = float((p * moment).sum())
    optimal = float((p * np.sqrt(moment)).sum() ** 2)
    q = k ** -0.5 / (k ** -0.5).sum()
    root_k = float((p ** 2 / q * moment).sum())
    antithetic = antithetic_second_moment(moment, t_min)
    return {"uniform_second_moment": uniform, "optimal_second_moment": optimal, "root_k_second_moment": root_k,
            "antithetic_second_moment": antithetic,
            "optimal_variance_ratio": (uniform - mean_sq) / (optimal - mean_sq),
            "root_k_variance_ratio": (uniform - mean_sq) / (root_k - mean_sq),
            "antithetic_over_uniform": (antithetic - mean_sq) / (uniform - mean_sq),
            "antithetic_over_root_k": (antithetic - mean_sq) / (root_k - mean_sq),
            "antithetic_over_optimal": (antithetic - mean_sq) / (optimal - mean_sq)}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m experiments.mask_count_moments", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/variance/mask_count_moments")
    p.add_argument("--preset", default="cpu-tiny")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--draws", type=int, default=200, help="rows (each with its own k-subset) per k")
    p.add_argument("--ks", default="1,2,4,8,12,16,24,32,40,48,56,64", help="the grid of k (1..seq-len)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    ks = sorted({int(k) for k in args.ks.split(",")})
    if not ks or ks[0] < 1 or ks[-1] > args.seq_len:
        p.error(f"--ks must lie in 1..{args.seq_len}, got {args.ks!r}")
    t0 = time.perf_counter()
    tok = build_tokenizer("char")
    tokens = load_split_arrays(DataConfig(seq_len=args.seq_len, batch_size=16), tok, "train")[0]["tokens"]
    windows = RandomWindowBatches(np.asarray(tokens), args.seq_len, 16, seed=args.seed)
    torch.manual_seed(args.seed)
    model = ModelConfig(preset=args.preset, max_seq_len=args.seq_len, **MODEL_PRESETS[args.preset])
    method, net, _ = build_model(model, MethodConfig(name="mdlm", time_sampling="mask_count"), tok)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr)
    for step in range(args.train_steps):  # measured where training is, not at the initialization
        loss = method.loss(net, Batch(windows.batch_at(10_000_000 + step)["input_ids"]),
                           step_generator(args.seed + 1, step)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    params = list(net.parameters())
    gen = torch.Generator().manual_seed(args.seed + 5)
    m2, means = [], []
    for k in ks:
        grads = torch.stack([row_gradient(method, net, params, windows.batch_at(d)["input_ids"][d % 16:d % 16 + 1],
                                          k, gen) for d in range(args.draws)])  # (draws, P)
        m2.append(float(grads.square().sum(1).mean()))
        means.append(grads.mean(0))
        print(f"[{time.perf_counter() - t0:5.1f}s] k={k}: E||g||^2 = {m2[-1]:.4g}", flush=True)
    mean_sq = float(torch.stack(means).mean(0).square().sum())  # ||E g||^2, k uniform over the grid (approx.)
    result = {"command": shlex.join(["python", "-m", "experiments.mask_count_moments", *argv]),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
              "config": vars(args), "train_loss_final": loss.item(), "ks": ks, "second_moment": m2,
              "mean_gradient_sq": mean_sq, **gains(ks, m2, mean_sq, args.seq_len, MethodConfig().t_min),
              "elapsed_s": round(time.perf_counter() - t0, 1)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"Made by `{result['command']}` on {result['date']} ({result['elapsed_s']:.0f} s, torch "
             f"{result['torch']}). DiT {args.preset}, {args.seq_len} characters a row, trained {args.train_steps} "
             f"steps (final training loss {result['train_loss_final']:.3f} nats/char), {args.draws} rows per k.", "",
             "| k | E ‖g‖² (one row) |", "| ---: | ---: |"]
    lines += [f"| {k} | {v:.4g} |" for k, v in zip(ks, m2)]
    lines += ["", f"‖E g‖² ≈ {mean_sq:.4g}. Variance of one row's gradient with k uniform, over that with k drawn "
              f"from q (both unbiased): optimal q ∝ sqrt(m2(k)) **{result['optimal_variance_ratio']:.2f}x**, "
              f"q ∝ k^(-1/2) **{result['root_k_variance_ratio']:.2f}x**.", "",
              f"`antithetic` (times in [{MethodConfig().t_min:g}, 1], weight 1 / t) from the same m2(k), its variance "
              f"over: uniform k {result['antithetic_over_uniform']:.2f}x, q ∝ k^(-1/2) (the default) "
              f"**{result['antithetic_over_root_k']:.2f}x**, optimal q **{result['antithetic_over_optimal']:.2f}x** "
              "(the most any one-mask-per-row estimator weighed by k or t can gain over it, for one fresh row)."]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
