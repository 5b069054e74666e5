"""The depthwise convolution of model.local_conv as a 1-D and as a height-1 2-D convolution: CPU time side by side.

    python -m experiments.local_conv_kernels --out reports/bench/local_conv

`seqdiff/backbones/local_conv.py` computes h + conv(h) with F.conv2d on a (B, H, 1, L) view instead of F.conv1d on
(B, H, L): the same sum (checked here before timing), which oneDNN runs through faster depthwise kernels. Timed:
forward and backward of the convolution alone (padding and transposes as the module does them) at the
quickstart's shape (batch 32, 128 positions, 128 channels, K = 9, centred and causal), on 1 and on all torch
threads, the two forms alternating in rounds; the speed-up is the median of per-round ratios.
Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

from experiments.report import command_line, write_results
from seqdiff.bench.measure import load_average, rotated, spread


def conv1d(x, weight, left, right):
    y = F.pad(x.transpose(1, 2), (left, right))
    return F.conv1d(y, weight[:, None, :], groups=weight.shape[0]).transpose(1, 2)


def conv2d(x, weight, left, right):
    y = F.pad(x.transpose(1, 2)[:, :, None, :], (left, right))
    return F.conv2d(y, weight[:, None, None, :], groups=weight.shape[0]).squeeze(2).transpose(1, 2)


FORMS = {"conv1d": conv1d, "conv2d (height 1)": conv2d}


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
        difference = max((a - b).abs().max().item() for a, b in zip(*grads.values()))
        for threads in sorted({1, all_threads}):
            torch.set_num_threads(threads)
            seconds = {name: [] for name in FORMS}
            for r in range(args.rounds):
                loads.append(load_average())
                for name in rotated(list(FORMS), r):
                    seconds[name].append(step_time(FORMS[name], x, weight, grad, left, right, args.repeats))
            ratios = [a / b for a, b in zip(*seconds.values())]
            rows.append({"kernel": kind, "threads": threads, "max_abs_difference": difference,
                         "ms": {n: spread([1e3 * s for s in v]) for n, v in seconds.items()},
                         "speedup": spread(ratios)})
    torch.set_num_threads(all_threads)
    results = {"command": command_line("local_conv_kernels", argv), "shape": {"batch": B, "length": L,
               "channels": H, "kernel": K}, "load_averages": loads, "rows": rows}
    table = "\n".join([
        f"Made by `{results['command']}` (load averages at each round's start: {min(loads)}-{max(loads)}).",
        "",
        f"Forward + backward of the depthwise convolution at batch {B}, {L} positions, {H} channels, K = {K} "
        f"(milliseconds, median of {args.rounds} rounds of {args.repeats} calls):",
        "",
        "| kernel | threads | conv1d ms | conv2d (height 1) ms | speed-up | max abs difference |",
        "|---|---|---|---|---|---|",
        *(f"| {r['kernel']} | {r['threads']} | {r['ms']['conv1d']['median']:.2f} | "
          f"{r['ms']['conv2d (height 1)']['median']:.2f} | {r['speedup']['median']:.2f}x | "
          f"{r['max_abs_difference']:.1e} |" for r in rows),
        "",
    ])
    write_results(args.out, results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
