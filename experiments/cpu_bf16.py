"""bf16 autocast on the CPU (train.precision=bf16-mixed) against float32: training throughput side by side.

    python -m experiments.cpu_bf16 --out reports/bench/cpu_bf16_speedup

CPUs with bf16 dot-product instructions (AVX512_BF16 on AMD Zen 4 / Intel Cooper Lake and later, AMX on Intel
Sapphire Rapids and later) run oneDNN's bf16 matmuls several times faster than float32 ones. Whether a training
step gains depends on how much of it is matmul: this measures, for the seqdiff DiT with the MDLM loss
(bidirectional) and with the AR loss (causal), one optimizer step in float32 and under bf16 autocast, at a few
shapes from the quickstart's to a 384-wide model. The four contenders of a shape are timed in rounds with the
order rotated, and the ratio is the median of per-round ratios (the machine is shared). The weights, AdamW and the
loss stay float32 in both (autocast runs the matmuls, attention included, in bf16); training quality is a
separate question, answered by training (the quickstart report).

A third contender, `bf16 fused`, is the bf16 step with PyTorch's fused CPU attention kernel at every length
(seqdiff.backbones.attention.EXPLICIT_MAX_LEN = 0): seqdiff's own bf16 step writes attention out at up to 128
keys, where that kernel is slow, and `bf16 / bf16 fused` is what that choice buys.

Writes <out>/results.json, <out>/table.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shlex
import statistics
import sys
import time

import torch

from experiments.report import write_results
from seqdiff.backbones import attention as attention_module
from seqdiff.bench.measure import OtherLoad, load_average, make_matmul, quiet_rounds, rotated, spread, timed
from seqdiff.bench.models import Shape, build_model, make_train_step

SHAPES = {
    "quickstart (128 wide, 2 layers, 128 x 32)": Shape(128, 2, 2, seq_len=128, batch_size=32, vocab_size=31),
    "DNA cpu-small (256 wide, 4 layers, 128 x 32)": Shape(256, 4, 4, seq_len=128, batch_size=32, vocab_size=12),
    "cpu-small (256 wide, 4 layers, 256 x 8)": Shape(256, 4, 4, seq_len=256, batch_size=8, vocab_size=31),
    "384 wide, 4 layers, 256 x 8": Shape(384, 4, 6, seq_len=256, batch_size=8, vocab_size=31),
}
"""Shapes timed: (hidden, layers, heads, sequence length x batch, vocabulary). The DNA one is the chr20 CPU recipe's
model (nucleotide vocabulary with its special tokens)."""

MODELS = ("seqdiff_bidirectional", "seqdiff_causal")


VARIANTS = ("float32", "bf16", "bf16 fused")


def with_fused_attention(step):
    """`step` with PyTorch's fused attention kernel at every length (the explicit form switched off)."""
    def run():
        saved, attention_module.EXPLICIT_MAX_LEN = attention_module.EXPLICIT_MAX_LEN, 0
        try:
            return step()
        finally:
            attention_module.EXPLICIT_MAX_LEN = saved
    return run


def bench_shape(shape: Shape, args: argparse.Namespace) -> dict:
    steps, names = {}, []
    for m, model_name in enumerate(MODELS):
        for variant in VARIANTS:
            name = f"{model_name} {variant}"
            torch.manual_seed(args.seed + m)
            model = build_model(model_name, shape)
            step = make_train_step(model_name, model, shape, torch.device("cpu"), args.seed, variant != "float32")
            steps[name] = with_fused_attention(step) if variant == "bf16 fused" else step
            names.append(name)
    for name in names:
        for _ in range(args.warmup):
            steps[name]()
    times = {name: [] for name in names}
    others = []
    for r in range(args.rounds):
        before = OtherLoad.snapshot()
        for name in rotated(names, r):
            times[name].append(timed(lambda n=name: [steps[n]() for _ in range(args.steps)], torch.device("cpu"))
                               / args.steps)
        others.append(OtherLoad.between(before, OtherLoad.snapshot()))
    quiet = quiet_rounds(others)
    use = [i for i, q in enumerate(quiet) if q] if sum(quiet) >= 3 else list(range(args.rounds))
    tokens = shape.seq_len * shape.batch_size
    tok_s = {name: spread([tokens / times[name][i] for i in use]) for name in names}
    def ratio(fast: str, slow: str) -> dict[str, dict]:
        return {m: spread([times[f"{m} {slow}"][i] / times[f"{m} {fast}"][i] for i in use]) for m in MODELS}

    return {"shape": vars(shape), "tokens_per_s": tok_s, "bf16_over_float32": ratio("bf16", "float32"),
            "bf16_over_bf16_fused": ratio("bf16", "bf16 fused"), "rounds_used": len(use),
            "rounds_quiet": sum(quiet), "others_cpu": others}


def matmul_rates(args: argparse.Namespace) -> dict[str, float]:
    rates = {}
    for dtype in (torch.float32, torch.bfloat16):
        fn, flop = make_matmul(args.matmul_size, torch.device("cpu"), args.seed, dtype)
        fn()
        rates[str(dtype).removeprefix("torch.")] = statistics.median(
            flop / timed(fn, torch.device("cpu")) for _ in range(5))
    return rates


def table(results: dict) -> str:
    mm = results["matmul_flops_per_s"]
    lines = [f"Made by `{results['command']}` on {results['date']} ({results['elapsed_s']:.0f} s, torch "
             f"{results['torch']}, {results['threads']} threads, {results['cpu']}; load average "
             f"{results['load_average_start']} at the start, {results['load_average_end']} at the end).", "",
             f"Matmul {results['matmul_size']}²: float32 {mm['float32'] / 1e9:.0f} GFLOP/s, bf16 "
             f"{mm['bfloat16'] / 1e9:.0f} GFLOP/s ({mm['bfloat16'] / mm['float32']:.2f}x).", "",
             "| shape | model | float32 tokens/s | bf16 fused tokens/s | bf16 tokens/s | bf16 / float32, median "
             "of rounds [min–max] | bf16 / bf16 fused | rounds used (quiet) |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, res in results["shapes"].items():
        for model_name in MODELS:
            f32, b16, fused = (res["tokens_per_s"][f"{model_name} {v}"]["median"] for v in VARIANTS)
            r, a = res["bf16_over_float32"][model_name], res["bf16_over_bf16_fused"][model_name]
            lines.append(f"| {label} | {model_name} | {f32:,.0f} | {fused:,.0f} | {b16:,.0f} | {r['median']:.2f}x "
                         f"[{r['min']:.2f}–{r['max']:.2f}] | {a['median']:.2f}x [{a['min']:.2f}–{a['max']:.2f}] | "
                         f"{res['rounds_used']} ({res['rounds_quiet']}) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m experiments.cpu_bf16", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/bench/cpu_bf16_speedup")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps", type=int, default=2, help="optimizer steps per contender per round")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--matmul-size", type=int, default=2048)
    p.add_argument("--shapes", default="all", help="comma-separated indices into SHAPES, or all")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    labels = list(SHAPES) if args.shapes == "all" else [list(SHAPES)[int(i)] for i in args.shapes.split(",")]
    t0 = time.perf_counter()
    results = {"command": shlex.join(["python", "-m", "experiments.cpu_bf16", *argv]),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
               "cpu": platform.processor() or platform.machine(), "load_average_start": load_average(),
               "matmul_size": args.matmul_size, "matmul_flops_per_s": matmul_rates(args), "shapes": {}}
    for label in labels:
        print(f"[{time.perf_counter() - t0:6.1f}s] {label}", flush=True)
        results["shapes"][label] = bench_shape(SHAPES[label], args)
    results["load_average_end"] = load_average()
    results["elapsed_s"] = time.perf_counter() - t0
    write_results(args.out, results, table(results), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
