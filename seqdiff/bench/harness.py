"""`seqdiff bench`: how fast seqdiff trains and samples, side by side with Hugging Face models of the same shape.

What one run measures (all on one device, in one process):

1. Training throughput (tokens/s of forward + backward + AdamW step; float32 on CPU, bf16 autocast on CUDA;
   `--precision bf16` autocasts on the CPU too, both sides, as train.precision=bf16-mixed does)
   of the bidirectional DiT with the MDLM loss against `BertForMaskedLM`, and of the causal DiT with the AR
   loss against `GPT2LMHeadModel` (untied embeddings, so the parameter counts match). Same width, depth,
   heads, vocabulary, sequence length, MLP width 4x, no dropout, SDPA attention. BERT runs twice: with its
   default exact GELU (what `ratio_vs_hf` uses) and with the tanh GELU (`gelu_new`). The DiT uses the tanh
   GELU by default (MDLM's choice); `--activation gelu` switches it to the exact GELU, so that the plain
   BERT is the same-activation contender (and GPT-2 runs once more with the exact GELU for the causal pair).
2. The matmul rate of the device in the training precision (float32; bf16 under bf16 autocast: a large square
   matmul) and the fraction of it the seqdiff models reach while training (model FLOPs from
   `DiT.flops_per_token`), with a torch.profiler breakdown of one training step of every model by kind of
   operator, to show where the rest of the time goes.
3. Sampling throughput at a few batch sizes: MDLM ancestral (uncached) and cached with steps = length, and
   AR with the KV cache, on untrained models (the cached sampler's savings depend on the schedule only).
4. Peak memory of a training step (CUDA: allocator peak; CPU: peak RSS above the baseline).

Every model trains with the fused AdamW where torch has it (what seqdiff's training uses, and Hugging Face
Trainer's default optimizer since torch 2.8). `--compile` compiles the seqdiff models in place, as
`train.compile` does (the warm-up steps absorb the compilation); the Hugging Face models stay eager.

Noise control (the machines this runs on are shared): every model is warmed up first; then the contenders
are timed in rounds, one after another with the order rotated every round, and the figures reported are
medians over rounds with their spread. Ratios (seqdiff / HF, cached / uncached, model FLOP/s / matmul
FLOP/s) are medians of per-round ratios, so both sides of each ratio saw the same machine load. As a cross-check
against bursts of other work (which on a 2-core machine can slow a 2-thread model several times over), the
ratio of each side's best round is reported too; the two agree when the machine was quiet. Each round also
records how much CPU other processes used meanwhile (Linux /proc); when at least 3 training rounds (1 sampling
round) were quiet (others below 10% of the CPUs), the headline figures use only the quiet rounds, and the
report says which were used.

Writes <out>/bench.json and <out>/bench.md (each to a temporary file, then renamed) and prints the tables.

This file holds the options and the three phases (training, memory, sampling); models.py the contenders,
measure.py the timers and meters, profile.py the operator breakdown, report.py the tables of bench.md.
"""


from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from seqdiff.backbones import build_backbone
from seqdiff.bench.measure import (
    QUIET_OTHERS,
    OtherLoad,
    PeakMemory,
    load_average,
    make_matmul,
    quiet_rounds,
    ratio_ceiling,
    rotated,
    spread,
    timed,
)
from seqdiff.bench.models import (
    CACHED_SPEEDUP_TARGET,
    DEFAULT_OUT,
    FULL_HEAD_MODEL,
    FULL_LAST_BLOCK_MODEL,
    OURS,
    PAIRS,
    SAMPLERS,
    TRAIN_MODELS,
    TRAIN_RATIO_TARGET,
    UNFUSED_MODELS,
    Shape,
    autocast,
    build_model,
    expected_cached_speedup,
    make_train_step,
    method_of,
    num_params,
    same_activation_pairs,
    train_models,
    vocab_stub,
)
from seqdiff.bench.profile import profile_step
from seqdiff.bench.report import GELU_NAMES, contention_note, explanation, render_tables
from seqdiff.config import MODEL_PRESETS, MethodConfig, finite_float
from seqdiff.errors import SeqdiffError
from seqdiff.evaluation.limits import check_device
from seqdiff.methods import AR, MDLM
from seqdiff.safe_io import atomic_write_text, check_output_file, written_together
from seqdiff.samplers import build_sampler


# ---------------------------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqdiff bench",
        description="Training and sampling throughput, matmul utilization and peak memory of seqdiff models, "
        "against Hugging Face BERT / GPT-2 of the same shape. Writes bench.json and bench.md.",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `seqdiff bench` (seqdiff.cli's command table adds them to its subparser)."""
    p.add_argument("--preset", default="cpu-small", choices=sorted(MODEL_PRESETS),
                   help="model size preset (hidden size, layers, heads); default cpu-small")
    p.add_argument("--activation", default="gelu_tanh", choices=["gelu_tanh", "gelu"],
                   help="MLP activation of the seqdiff models (model.activation): gelu_tanh (default, MDLM's) or "
                   "the exact gelu, BERT's default, for a same-activation comparison with plain BERT")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (training and sampling)")
    p.add_argument("--batch-size", type=int, default=8, help="training batch size (sequences)")
    p.add_argument("--vocab-size", type=int, default=31,
                   help="vocabulary size including 4 special tokens (31 = character level, text8)")
    p.add_argument("--repeats", type=int, default=12, help="interleaved timing rounds for training")
    p.add_argument("--steps-per-repeat", type=int, default=1, help="optimizer steps per model per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per model before timing")
    p.add_argument("--sample-batches", default="1,16", help="comma-separated sampling batch sizes")
    p.add_argument("--sample-repeats", type=int, default=3, help="most interleaved sampling rounds per batch size")
    p.add_argument("--sample-budget-s", type=finite_float, default=30.0,
                   help="start another sampling round for a batch size only while less than this many seconds "
                   "were spent on it (at least one round always runs; a second one, up to twice the budget, when "
                   "other processes were busy during the first)")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n @ n x n reference matmul")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the seqdiff models (train.compile); Hugging Face's stay eager, their default")
    p.add_argument("--full-head", action="store_true",
                   help="also time the MDLM with the output head at every position (method.head_at_masked=false), "
                   "side by side with the default that runs it at the masked positions only")
    p.add_argument("--full-last-block", action="store_true",
                   help="also time the MDLM with its last block's output projection and MLP at every position "
                   "(DiT.last_block_at_outputs=false), side by side with the default that runs them at the masked "
                   "positions only")
    p.add_argument("--unfused", action="store_true",
                   help="also time both seqdiff models with method.fused_loss=false (the head's logits, then the "
                   "cross-entropy), side by side with the default (fused from 4,096 ids on: use --vocab-size)")
    p.add_argument("--precision", default="auto", choices=list(PRECISIONS),
                   help="auto: bf16 autocast on CUDA, float32 on CPU (train.precision=auto); float32; bf16: bf16 "
                   "autocast on any device (train.precision=bf16-mixed), for every contender")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0 = torch's default, usually the number of cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of initializations, data and sampling")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder for bench.json and bench.md")


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int]:
    for key in ("seq_len", "batch_size", "repeats", "steps_per_repeat", "sample_repeats", "matmul_size"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.sample_budget_s < 0:
        parser.error(f"--sample-budget-s must be >= 0, got {args.sample_budget_s}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup >= 1 (the first step compiles; it must not be timed)")
    if args.vocab_size < 5:
        parser.error(f"--vocab-size must be >= 5 (4 special tokens + 1), got {args.vocab_size}")
    try:
        batches = [int(b) for b in args.sample_batches.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--sample-batches must be comma-separated integers, got {args.sample_batches!r}")
    if any(b < 1 for b in batches):
        parser.error(f"--sample-batches must be positive, got {args.sample_batches!r}")
    return batches



REPORT_FILES = ("bench.json", "bench.md")
"""What `run` writes into --out."""

PRECISIONS = {"auto": None, "float32": False, "bf16": True}
"""--precision -> the `bf16` argument of bench.models.autocast (None: bf16 on CUDA, float32 on CPU)."""


def uses_bf16(args: argparse.Namespace, device: torch.device) -> bool:
    bf16 = PRECISIONS[args.precision]
    return device.type == "cuda" if bf16 is None else bf16


# ---------------------------------------------------------------------------------------------- phases
def bench_training(shape: Shape, args: argparse.Namespace, device: torch.device,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Interleaved training rounds (+ the reference matmul as one more contender), then one profiled step each."""
    models, steps = {}, {}
    names = train_models(shape.activation, args.full_head, args.unfused, args.full_last_block)
    ours = [name for name in names if name in OURS]
    for i, name in enumerate(names):
        torch.manual_seed(args.seed + i)
        models[name] = build_model(name, shape).to(device)
        if args.compile and name in ours:  # as train.compile does it: in place, compiled at warm-up
            models[name].compile()
        steps[name] = make_train_step(name, models[name], shape, device, args.seed, uses_bf16(args, device))
    matmul, matmul_flop = make_matmul(args.matmul_size, device, args.seed,
                                      torch.bfloat16 if uses_bf16(args, device) else torch.float32)
    params = {name: num_params(m) for name, m in models.items()}
    # MDLM runs the output head at the masked positions only (method.head_at_masked): count it that often
    head_share = {name: method_of(name, shape).head_share(models[name]) for name in ours}
    flops_per_token = {name: int(models[name].flops_per_token(shape.seq_len, head_share[name])) for name in ours}

    log(f"warm-up: {args.warmup} steps per model")
    for name in names:
        for _ in range(args.warmup):
            steps[name]()
    for _ in range(3):
        matmul()

    tokens_per_step = shape.batch_size * shape.seq_len
    tok_s: dict[str, list[float]] = {name: [] for name in names}
    mm_rate: list[float] = []
    others: list[float | None] = []  # CPU share used by other processes during each round
    contenders = [*names, "matmul"]
    for r in range(args.repeats):
        load0 = OtherLoad.snapshot()
        for name in rotated(contenders, r):
            if name == "matmul":
                secs = [timed(matmul, device) for _ in range(3)]
                mm_rate.append(matmul_flop / statistics.median(secs))
                continue
            k = args.steps_per_repeat
            seconds = timed(lambda step=steps[name], k=k: [step() for _ in range(k)], device)
            tok_s[name].append(k * tokens_per_step / seconds)
        others.append(OtherLoad.between(load0, OtherLoad.snapshot()))
        busy = "" if others[-1] is None else f"; other processes {others[-1]:.0%} of the CPUs"
        log(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{n} {tok_s[n][-1]:.0f}" for n in names)
            + f" tok/s; matmul {mm_rate[-1] / 1e9:.1f} GFLOP/s{busy}")

    # Headline figures come from the quiet rounds when there are at least 3 of them, else from all rounds.
    quiet = quiet_rounds(others)
    use = quiet if sum(quiet) >= 3 else [True] * len(quiet)
    tok_s = {name: [v for v, u in zip(vals, use, strict=True) if u] for name, vals in tok_s.items()}
    mm_rate = [v for v, u in zip(mm_rate, use, strict=True) if u]

    def per_round(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(tok_s[a], tok_s[b], strict=True)]

    def best(a: str, b: str) -> float:
        return max(tok_s[a]) / max(tok_s[b])

    fraction = {name: [t * flops_per_token[name] / m for t, m in zip(tok_s[name], mm_rate, strict=True)]
                for name in ours}
    ceiling = {pair: [ratio_ceiling(m, flops_per_token[a], t) for m, t in zip(mm_rate, tok_s[b], strict=True)]
               for pair, (a, b) in PAIRS.items()}
    log("profiling training steps of each model")
    profiles = {}
    for name in names:  # of 3 profiled steps, the fastest: the least disturbed by other work
        profiles[name] = min((profile_step(steps[name], device) for _ in range(3)), key=lambda p: p["wall_ms"])
    return {
        "rounds": {"total": len(quiet), "quiet": sum(quiet), "used": "quiet" if use == quiet and not all(quiet)
                   else "all", "others_cpu": [None if o is None else round(o, 3) for o in others]},
        "tok_s": {name: spread(v) for name, v in tok_s.items()},
        "ratio": {pair: spread(per_round(a, b)) for pair, (a, b) in PAIRS.items()},
        "ratio_best": {pair: best(a, b) for pair, (a, b) in PAIRS.items()},
        "ratio_same_activation": {pair: spread(per_round(a, b))
                                  for pair, (a, b) in same_activation_pairs(shape.activation).items()},
        "ratio_head_at_masked": spread(per_round("seqdiff_bidirectional", FULL_HEAD_MODEL)) if args.full_head
        else None,
        "ratio_last_block_at_outputs": spread(per_round("seqdiff_bidirectional", FULL_LAST_BLOCK_MODEL))
        if args.full_last_block else None,
        "fused_loss": {name: method_of(name, shape).uses_fused_loss(models[name]) for name in ours},
        "ratio_fused_loss": {UNFUSED_MODELS[u]: spread(per_round(UNFUSED_MODELS[u], u)) for u in UNFUSED_MODELS}
        if args.unfused else None,
        "matmul": spread(mm_rate),
        "matmul_fraction": {name: spread(v) for name, v in fraction.items()},
        "ratio_ceiling": {pair: spread(v) for pair, v in ceiling.items()},
        "params": params,
        "flops_per_token": flops_per_token,
        "head_share": head_share,
        "profiles": profiles,
    }


def bench_memory(shape: Shape, args: argparse.Namespace, device: torch.device) -> tuple[dict[str, float], str]:
    """Peak memory (MB) of building each model + optimizer and running two training steps."""
    meter = PeakMemory(device)

    def run(name: str) -> None:
        torch.manual_seed(args.seed)
        model = build_model(name, shape).to(device)
        step = make_train_step(name, model, shape, device, args.seed, uses_bf16(args, device))
        step()
        step()

    run(TRAIN_MODELS[0])  # first-use allocations of the libraries are not any model's memory
    peak = {name: meter.measure(lambda name=name: run(name)) / 2**20
            for name in train_models(shape.activation, args.full_head, args.unfused, args.full_last_block)}
    return peak, meter.method


def bench_sampling(shape: Shape, batches: list[int], args: argparse.Namespace, device: torch.device,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Interleaved sampling rounds per batch size on untrained models, float64 draws as in `seqdiff sample`."""
    vocab = vocab_stub(shape.vocab_size)
    torch.manual_seed(args.seed)
    bi = build_backbone(shape.model_config(), shape.vocab_size, causal=False).to(device).eval()
    causal = build_backbone(shape.model_config(), shape.vocab_size, causal=True).to(device).eval()
    mdlm, ar = MDLM(MethodConfig(name="mdlm"), vocab), AR(MethodConfig(name="ar"), vocab)
    L = shape.seq_len

    def sampler(key: str, steps: int):
        method, model = (ar, causal) if key == "ar_kv" else (mdlm, bi)
        return build_sampler(SAMPLERS[key], method, model, steps=steps)

    samplers = {key: sampler(key, L) for key in SAMPLERS}
    warm = {key: sampler(key, min(4, L)) for key in SAMPLERS}
    tok_s = {key: {} for key in SAMPLERS}
    calls = {key: {} for key in SAMPLERS}
    speedup, rounds_done = {}, {}
    for B in batches:
        with autocast(device, uses_bf16(args, device)):
            for key in SAMPLERS:  # same shapes, a few steps: allocator and kernels warm
                warm[key].generate(B, L, torch.Generator(device=device).manual_seed(args.seed))
        runs = {key: [] for key in SAMPLERS}
        n_calls = {key: [] for key in SAMPLERS}
        spent, r, others = 0.0, 0, []
        # Past the budget, one more round is run only while no round so far was quiet (bursts of other work).
        while r < args.sample_repeats and (r == 0 or spent < args.sample_budget_s
                                           or (not any(quiet_rounds(others)) and spent < 2 * args.sample_budget_s
                                               and r < 2)):
            load0 = OtherLoad.snapshot()
            for key in rotated(list(SAMPLERS), r):
                gen = torch.Generator(device=device).manual_seed(args.seed + r)  # same draws for cached / uncached
                out = {}

                def go(smp=samplers[key], B=B, gen=gen, out=out) -> None:
                    with autocast(device, uses_bf16(args, device)):
                        out["s"] = smp.generate(B, L, gen)

                secs = timed(go, device)
                spent += secs
                runs[key].append(B * L / secs)
                n_calls[key].append(out["s"].num_denoiser_calls)
            r += 1
            others.append(OtherLoad.between(load0, OtherLoad.snapshot()))
            busy = "" if others[-1] is None else f"; other processes {others[-1]:.0%} of the CPUs"
            log(f"sampling batch {B}, round {r}: " + ", ".join(f"{k} {runs[k][-1]:.0f}" for k in SAMPLERS)
                + f" tok/s{busy}")
        quiet = quiet_rounds(others)
        use = quiet if any(quiet) else [True] * r  # the quiet rounds, if any
        runs = {key: [v for v, u in zip(vals, use, strict=True) if u] for key, vals in runs.items()}
        for key in SAMPLERS:
            tok_s[key][str(B)] = spread(runs[key])
            calls[key][str(B)] = statistics.median(n_calls[key])
        speedup[str(B)] = spread([c / u for c, u in zip(runs["mdlm_cached"], runs["mdlm_uncached"], strict=True)])
        rounds_done[str(B)] = {"total": r, "quiet": sum(quiet), "used": "quiet" if any(quiet) and not all(quiet)
                               else "all", "others_cpu": [None if o is None else round(o, 3) for o in others]}
    return {"tok_s": tok_s, "calls": calls, "speedup": speedup, "rounds": rounds_done,
            "expected_speedup": expected_cached_speedup(L, L)}



# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        return run(parser.parse_args(argv), parser, argv)
    except SeqdiffError as e:  # as `seqdiff bench` says it: one line, exit 2
        print(f"seqdiff bench: error: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The benchmark of parsed `args` (`parser` reports bad combinations; `argv` is named in the report)."""
    batches = _validate(args, parser)
    device = (torch.device("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else
              check_device(args.device))
    out_dir = Path(args.out)
    for name in REPORT_FILES:  # a bad --out is said now, not after the benchmark
        check_output_file(out_dir / name, "bench report")
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = MODEL_PRESETS[args.preset]
    shape = Shape(hidden_size=preset["hidden_size"], n_layers=preset["n_layers"], n_heads=preset["n_heads"],
                  seq_len=args.seq_len, batch_size=args.batch_size, vocab_size=args.vocab_size,
                  activation=args.activation)
    command = shlex.join(["seqdiff", "bench", *argv])
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[bench {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    load_start = load_average()
    log(f"device {device}, {torch.get_num_threads()} threads, load average {load_start}; {args.preset} {shape}")
    train = bench_training(shape, args, device, log)
    gc.collect()
    log("peak memory")
    peak, peak_method = bench_memory(shape, args, device)
    sampling = bench_sampling(shape, batches, args, device, log)

    import transformers

    ratio = {pair: s["median"] for pair, s in train["ratio"].items()}
    speedup = {b: s["median"] for b, s in sampling["speedup"].items()}
    result: dict[str, Any] = {
        "command": command,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "precision": "bf16 autocast" if uses_bf16(args, device) else "float32",
        "config": {"preset": args.preset, "hidden_size": shape.hidden_size, "n_layers": shape.n_layers,
                   "n_heads": shape.n_heads, "mlp_ratio": 4, "activation": shape.activation, "seq_len": shape.seq_len,
                   "batch_size": shape.batch_size, "vocab_size": shape.vocab_size, "repeats": args.repeats,
                   "steps_per_repeat": args.steps_per_repeat, "warmup": args.warmup, "sample_batches": batches,
                   "sample_repeats": args.sample_repeats, "sample_budget_s": args.sample_budget_s,
                   "sample_steps": shape.seq_len, "matmul_size": args.matmul_size, "seed": args.seed,
                   "compile": args.compile, "full_head": args.full_head,
                   "unfused": args.unfused, "full_last_block": args.full_last_block,
                   "optimizer": "AdamW fused (both sides) where torch has it"},
        "train_tokens_per_s": {name: s["median"] for name, s in train["tok_s"].items()},
        "train_tokens_per_s_spread": train["tok_s"],
        "ratio_vs_hf": ratio,
        "ratio_vs_hf_spread": train["ratio"],
        "ratio_vs_hf_best_of_rounds": train["ratio_best"],
        "ratio_head_at_masked_vs_full_head": train["ratio_head_at_masked"],
        "ratio_fused_loss_vs_unfused": train["ratio_fused_loss"],
        "ratio_last_block_at_outputs_vs_full_last_block": train["ratio_last_block_at_outputs"],
        "fused_loss": train["fused_loss"],
        "head_share": train["head_share"],
        "ratio_vs_hf_same_activation": {pair: s["median"] for pair, s in train["ratio_same_activation"].items()},
        "ratio_vs_hf_same_activation_spread": train["ratio_same_activation"],
        "train_ratio_target": TRAIN_RATIO_TARGET,
        "train_ratio_target_met": {pair: v >= TRAIN_RATIO_TARGET for pair, v in ratio.items()},
        "train_rounds": train["rounds"],
        "quiet_threshold_others_cpu": QUIET_OTHERS,
        "params": train["params"],
        "flops_per_token": train["flops_per_token"],
        "matmul_flops_per_s": train["matmul"]["median"],
        "matmul_flops_per_s_spread": train["matmul"],
        "matmul_dtype": "float32",
        "matmul_fraction": {name: s["median"] for name, s in train["matmul_fraction"].items()},
        "matmul_fraction_spread": train["matmul_fraction"],
        "ratio_vs_hf_ceiling": {pair: s["median"] for pair, s in train["ratio_ceiling"].items()},
        "ratio_vs_hf_ceiling_spread": train["ratio_ceiling"],
        "profile": train["profiles"],
        "sample_tokens_per_s": {k: {b: s["median"] for b, s in v.items()} for k, v in sampling["tok_s"].items()},
        "sample_tokens_per_s_spread": sampling["tok_s"],
        "sample_denoiser_calls": sampling["calls"],
        "sample_rounds": sampling["rounds"],
        "cached_speedup": speedup,
        "cached_speedup_spread": sampling["speedup"],
        "cached_speedup_expected_max": sampling["expected_speedup"],
        "cached_speedup_target": CACHED_SPEEDUP_TARGET,
        "cached_speedup_target_met": {b: v >= CACHED_SPEEDUP_TARGET for b, v in speedup.items()},
        "peak_memory_mb": peak,
        "peak_memory_method": peak_method,
    }
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    result["load_average"] = {"start": load_start, "end": load_average()}  # 1-minute, other work included
    tables = render_tables(result, train, sampling)
    md = (f"# seqdiff bench\n\nMade by `{command}` on {result['date']} — device {device} "
          f"({result['device_name']}, {result['threads']} threads), {result['precision']}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; preset {args.preset} ({shape.hidden_size} wide, "
          f"{shape.n_layers} layers, {shape.n_heads} heads; {GELU_NAMES[shape.activation]} in the seqdiff models), "
          f"vocabulary {shape.vocab_size}, sequence length "
          f"{shape.seq_len}, training batch {shape.batch_size}; {result['elapsed_s']:.0f} s. 1-minute load average "
          f"{result['load_average']['start']} at the start, {result['load_average']['end']} at the end, on "
          f"{result['cpu_count']} CPUs (other work on the machine lowers the absolute figures; the ratios come "
          "from interleaved rounds).\n\n" + contention_note(result) +
          f"{tables}\n\n{explanation(result, train, sampling)}\n")
    with written_together():  # a Ctrl-C here takes effect after both files
        atomic_write_text(out_dir / REPORT_FILES[0], json.dumps(result, indent=2) + "\n")
        atomic_write_text(out_dir / REPORT_FILES[1], md)
    print()
    print(tables)
    print(f"\nwritten: {', '.join(str(out_dir / name) for name in REPORT_FILES)} ({result['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
