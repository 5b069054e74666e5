"""The depthwise convolution of model.local_conv in several forms: CPU time of forward + backward side by side.

    python -m experiments.local_conv_kernels --out reports/bench/local_conv

Forms (FORMS): `conv1d` on (B, H, L); `conv2d (height 1)` on a transposed (B, H, 1, L) copy, autograd's backward
(the form seqdiff.backbones.local_conv uses); `conv2d channels-last` on the (B, L, H) tensor read as NHWC,
autograd's backward; `tap weight gradient` = the height-1 forward with a hand-written backward (`DepthwiseConv`),
the weight gradient summed tap by tap. Values and both gradients are checked against `conv2d (height 1)` before any
timing. Timed: forward and backward of the convolution alone at the quickstart's shape
(batch 32, 128 positions, 128 channels, K = 9, centred and causal), on 1 and on all torch threads, the forms in an
order rotating from round to round, inside `reuse_freed_memory` as the quickstart trains; speed-up: the median of
per-round ratios of `conv2d (height 1)`'s time over each form's. Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F
from torch import Tensor

from experiments.quickstart_step_time import cpu_name
from experiments.report import command_line, write_results
from seqdiff.bench.measure import load_average, rotated, spread
from seqdiff.host_memory import reuse_freed_memory


def conv1d(x, weight, left, right):
    y = F.pad(x.transpose(1, 2), (left, right))
    return F.conv1d(y, weight[:, None, :], groups=weight.shape[0]).transpose(1, 2)


def conv2d(x, weight, left, right):
    y = F.pad(x.transpose(1, 2)[:, :, None, :], (left, right))
    return F.conv2d(y, weight[:, None, None, :], groups=weight.shape[0]).squeeze(2).transpose(1, 2)


def channels_last(x, weight, left, right):
    y = F.pad(x, (0, 0, left, right)).permute(0, 2, 1)[:, :, None, :]  # (B, H, 1, L'), NHWC strides: no copy
    return F.conv2d(y, weight[:, None, None, :], groups=weight.shape[0])[:, :, 0, :].permute(0, 2, 1)


class DepthwiseConv(torch.autograd.Function):
    """`conv2d` with a hand-written backward.

    Why tried: in the quickstart's training step on a 2-core AVX2 host, oneDNN's depthwise backward took 5.4-5.9 ms
    a call against 0.7-0.8 ms for the forward, most of it on the weight gradient, a reduction of B * L products per
    tap. Here that gradient is K multiply-and-sum passes over (B, L, H) views, and the input gradient the
    convolution of the output gradient with the reversed kernel."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, left: int, right: int) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.left, ctx.right = left, right
        return conv2d(x, weight, left, right)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        left, right, K = ctx.left, ctx.right, weight.shape[1]
        grad_x = grad_w = None
        if ctx.needs_input_grad[0]:
            # x[p] enters y[p + left - j] through tap j: a convolution of grad with the kernel reversed
            grad_x = conv2d(grad, weight.flip(1), K - 1 - left, K - 1 - right)
        if ctx.needs_input_grad[1]:
            L, out_len = x.shape[1], grad.shape[1]
            taps = []
            for j in range(K):  # tap j pairs y[i] with x[i + j - left], for the i where that position exists
                lo, hi = max(0, left - j), min(out_len, L + left - j)
                taps.append((grad[:, lo:hi] * x[:, lo + j - left:hi + j - left]).sum((0, 1), dtype=torch.float32)
                            if lo < hi else grad.new_zeros(grad.shape[-1], dtype=torch.float32))
            grad_w = torch.stack(taps, 1).to(weight.dtype)
        return grad_x, grad_w, None, None


def tap_weight_gradient(x, weight, left, right):
    return DepthwiseConv.apply(x, weight, left, right)


REFERENCE = "conv2d (height 1)"
"""The form speed-ups are measured against: the one seqdiff.backbones.local_conv uses."""
FORMS = {"conv1d": conv1d, "conv2d (height 1)": conv2d, "conv2d channels-last": channels_last,
         "tap weight gradient": tap_weight_gradient}


def step_time(form, x, weight, grad, left, right, repeats: int) -> float:
    """Seconds of one forward + backward, the mean over `repeats` after two warm-up calls."""
    def once():
        x.grad = weight.grad = None
        form(x, weight, left, right).backward(grad)
    once(), once()
    start = time.perf_counter()
    for _ in range(repeats):
        once()
    return (time.perf_counter() - start) / repeats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/bench/local_conv")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    all_threads = torch.get_num_threads()
    gen = torch.Generator().manual_seed(0)
    B, L, H, K = 32, 128, 128, 9
    x = torch.randn(B, L, H, generator=gen, requires_grad=True)
    weight = torch.randn(H, K, generator=gen, requires_grad=True)
    grad = torch.randn(B, L, H, generator=gen)
    rows, loads = [], []
    for kind, left in (("centred", K // 2), ("causal", K - 1)):
        right = K - 1 - left
        grads = {}
        for name, form in FORMS.items():  # the same values and gradients, before any timing
            x.grad = weight.grad = None
            out = form(x, weight, left, right)
            out.backward(grad)
            grads[name] = (out.detach(), x.grad.clone(), weight.grad.clone())
        difference = {name: max((a - b).abs().max().item() for a, b in zip(grads[REFERENCE], grads[name]))
                      for name in FORMS}
        for threads in sorted({1, all_threads}):
            torch.set_num_threads(threads)
            seconds = {name: [] for name in FORMS}
            with reuse_freed_memory():
                for r in range(args.rounds):
                    loads.append(load_average())
                    for name in rotated(list(FORMS), r):
                        seconds[name].append(step_time(FORMS[name], x, weight, grad, left, right, args.repeats))
            rows.append({"kernel": kind, "threads": threads, "max_abs_difference": difference,
                         "ms": {n: spread([1e3 * s for s in v]) for n, v in seconds.items()},
                         "speedup": {n: spread([a / b for a, b in zip(seconds[REFERENCE], v)])
                                     for n, v in seconds.items()}})
    torch.set_num_threads(all_threads)
    results = {"command": command_line("local_conv_kernels", argv), "cpu": cpu_name(), "torch": torch.__version__,
               "shape": {"batch": B, "length": L, "channels": H, "kernel": K}, "reference": REFERENCE,
               "load_averages": loads, "rows": rows}
    names = list(FORMS)
    table = "\n".join([
        f"Made by `{results['command']}` on {results['cpu']}, torch {results['torch']} (load averages at each "
        f"round's start: {min(loads)}-{max(loads)}).",
        "",
        f"Forward + backward of the depthwise convolution at batch {B}, {L} positions, {H} channels, K = {K}: "
        f"milliseconds, median of {args.rounds} rounds of {args.repeats} calls; in brackets the speed-up over "
        f"`{REFERENCE}` (median of per-round ratios). Largest difference from `{REFERENCE}` in the output and both "
        "gradients, float32: " + ", ".join(f"{n} {max(r['max_abs_difference'][n] for r in rows):.1e}"
                                          for n in names if n != REFERENCE) + ".",
        "",
        "| kernel | threads | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
        *(f"| {r['kernel']} | {r['threads']} | " + " | ".join(
            f"{r['ms'][n]['median']:.2f} ({r['speedup'][n]['median']:.2f}x)" for n in names) + " |" for r in rows),
        "",
    ])
    write_results(args.out, results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
