"""`python -m seqdiff.bench.gpu_check` (scripts/gpu_check.sh): does seqdiff train well on a CUDA GPU?

On one CUDA device it trains MDLM and then AR with `seqdiff.training.run.train`, the path `seqdiff train` takes,
at the `small` preset (768 wide, 12 layers, 12 heads) and 1,024 tokens per row, with every GPU-scale feature on
at once: train.compile, bf16 autocast, gradient accumulation (train.micro_batch_size) and train.strategy=fsdp2
(on one device: the sharding code runs, nothing is split; `--strategy auto` measures the same run without it).
Data: the shipped Shakespeare slice, characters.

Measured per method, over the steps after the first `--skip-steps` (compilation, warm-up):
- tokens/s: global batch x seq_len / median step time (from the start of a training batch to its end, CUDA
  synchronized: forward, backward, optimizer; data loading and validation excluded);
- MFU: model FLOPs per token (DiT.flops_per_token: 6 N + 12 n_layers d L, PaLM's convention; MDLM's output
  head counted at the share of positions where it runs, `Method.head_share`) x tokens/s over
  the device's dense bf16 peak (seqdiff.training.device_peaks by device name, or --peak-tflops);
- peak memory: torch.cuda.max_memory_allocated over the run;
and MDLM's step time over AR's; and one torch.profiler run over the last step (`StepProfiler`: the device's busy
share of the step and the host's operator time; the first GPU run was host-bound at micro-batches of 16 under
fsdp2, and this says where the host time goes; `--no-profile` skips it). Writes <out>/gpu_check.json and
<out>/README.md (numbers only from the run).

On a machine without CUDA it refuses (exit 2) unless --allow-cpu, which runs the same code at whatever size
is asked (the tests use it with the test preset, float32 and no compile).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from seqdiff.backbones import build_backbone
from seqdiff.config import MODEL_PRESETS, ModelConfig, load_run_config
from seqdiff.methods import METHODS
from seqdiff.safe_io import atomic_write_text, ensure_dir, written_together
from seqdiff.tokenizers import build_tokenizer
from seqdiff.training.device_peaks import mfu, peak_bf16_flops

DEFAULT_OUT = Path("reports") / "bench" / "gpu"
CATEGORY_COLUMNS = ("matmul", "attention", "elementwise", "copies", "optimizer", "autograd", "unattributed")
"""Host-time kinds shown in the README table (all of seqdiff.bench.profile.CATEGORIES are in the JSON)."""
MFU_TARGET = 0.40
STEP_RATIO_TARGET = 1.05


def model_flops_per_token(preset: str, seq_len: int, vocab_size: int, causal: bool, head_share: float = 1.0) -> int:
    """DiT.flops_per_token for the preset, built on the meta device (no memory); `head_share`: the share of
    positions whose output head runs (MDLM's method.head_at_masked: its expected masked share)."""
    cfg = ModelConfig(**MODEL_PRESETS[preset], max_seq_len=seq_len, time_conditioning=False)
    with torch.device("meta"):
        backbone = build_backbone(cfg, vocab_size, causal=causal)
    return int(backbone.flops_per_token(seq_len, head_share))


def overrides(method: str, args: argparse.Namespace, cuda: bool) -> list[str]:
    """The recipe of one run (dotted overrides of seqdiff's RunConfig)."""
    return [
        f"method.name={method}", f"model.preset={args.preset}", f"model.max_seq_len={args.seq_len}",
        "model.dropout=0.0", "data.corpus=shakespeare", "data.tokenizer=char", f"data.seq_len={args.seq_len}",
        f"data.batch_size={args.batch_size}", f"train.micro_batch_size={args.micro_batch_size}",
        f"train.max_steps={args.steps}", f"train.val_every={args.steps}", "train.val_batches=1",
        f"train.checkpoint_every={args.steps}", "train.progress_bar=false",
        f"train.log_every={max(1, args.steps // 10)}",
        "train.warmup_steps=10", "train.lr=3e-4", f"train.compile={str(args.compile).lower()}",
        f"train.precision={'bf16-mixed' if cuda else 'auto'}", f"train.strategy={args.strategy}", "train.devices=1",
        f"train.accelerator={'gpu' if cuda else 'cpu'}",
        f"train.activation_checkpointing={str(args.activation_checkpointing).lower()}",
    ]


def dynamo_counters():
    """torch._dynamo's process-wide counters (graphs compiled, graph breaks by reason)."""
    from torch._dynamo.utils import counters

    return counters


def _compiled_cell(r: dict[str, Any]) -> str:
    """`True (1 graph, 0 breaks)`; reports written before the counters were recorded show the flag alone."""
    if not r["compiled"] or "dynamo_graphs" not in r:
        return str(r["compiled"])
    return f"True ({r['dynamo_graphs']} graph(s), {r['dynamo_graph_breaks']} break(s))"


def run_one(method: str, args: argparse.Namespace, cuda: bool, peak: float | None, work: Path) -> dict[str, Any]:
    from seqdiff.bench.gpu_callbacks import StepProfiler, StepTimer  # Lightning: only once a run starts
    from seqdiff.training.run import train

    recipe = overrides(method, args, cuda)
    timer = StepTimer()
    profiler = StepProfiler(args.steps - 1) if args.profile else None  # the last step: one slowed step barely
    # moves the median
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    counters = dynamo_counters()
    counters.clear()  # this run's graphs and graph breaks only
    start = time.perf_counter()
    callbacks = [timer, profiler] if profiler else [timer]
    result = train(load_run_config(None, recipe), work / method, extra_callbacks=callbacks)
    wall = time.perf_counter() - start
    timed = timer.times[args.skip_steps:]
    step_s = statistics.median(timed)
    tokens_per_s = args.batch_size * args.seq_len / step_s
    vocab = build_tokenizer("char").vocab_size
    share = result.module.method.head_share(result.module.backbone)  # MDLM: the head runs at the masked positions
    fpt = model_flops_per_token(args.preset, args.seq_len, vocab, causal=METHODS[method].causal, head_share=share)
    loss = result.trainer.callback_metrics.get("train/loss")
    return {
        "recipe": recipe,
        "steps": len(timer.times),
        "timed_steps": len(timed),
        "step_s_median": step_s,
        "step_s_spread": [min(timed), max(timed)],
        "tokens_per_s": tokens_per_s,
        "flops_per_token": fpt,
        "mfu": mfu(fpt, tokens_per_s, peak),
        "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "final_train_loss": float(loss) if loss is not None else None,
        "wall_s": round(wall, 1),
        "compiled": bool(result.module._compiled),
        # what torch.compile made of it: how many graphs, and how often it fell back to eager mid-function
        "dynamo_graphs": counters["stats"].get("unique_graphs", 0),
        "dynamo_graph_breaks": sum(counters["graph_break"].values()),
        "profile": profiler.summary if profiler else None,
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "# seqdiff on a GPU: throughput, MFU and memory\n",
        f"Made by `{result['command']}` on {result['date']} — device {result['device_name']}, torch {result['torch']}; "
        f"preset {result['config']['preset']}, {result['config']['seq_len']} tokens per row, global batch "
        f"{result['config']['batch_size']} in micro-batches of {result['config']['micro_batch_size']}, "
        f"{result['config']['steps']} steps ({result['config']['skip_steps']} untimed), train.compile="
        f"{str(result['config']['compile']).lower()}, {result['precision']}, "
        f"train.strategy={result['config'].get('strategy', 'fsdp2')} on one device"
        f"{', train.activation_checkpointing=true' if result['config'].get('activation_checkpointing') else ''}. "
        f"Peak used for MFU: {result['peak_flops'] / 1e12 if result['peak_flops'] else 'unknown'} TFLOP/s "
        f"({result['peak_source']}).\n",
        "| method | tokens/s | step (s, median) | MFU | peak memory (GiB) | compiled | final train loss |",
        "|---|---|---|---|---|---|---|",
    ]
    for method, r in result["runs"].items():
        mfu_s = f"{r['mfu']:.1%}" if r["mfu"] is not None else "n/a"
        mem = f"{r['peak_memory_gb']:.1f}" if r["peak_memory_gb"] is not None else "n/a"
        loss = f"{r['final_train_loss']:.3f}" if r["final_train_loss"] is not None else "n/a"
        lines.append(f"| {method} | {r['tokens_per_s']:,.0f} | {r['step_s_median']:.4f} | {mfu_s} | {mem} | "
                     f"{_compiled_cell(r)} | {loss} |")
    profiles = {m: r["profile"] for m, r in result["runs"].items() if r.get("profile")}
    profiled = {m: pr for m, pr in profiles.items() if "error" not in pr}
    failed = {m: pr["error"] for m, pr in profiles.items() if "error" in pr}
    if failed:
        lines.append("\nThe step profile failed: " + "; ".join(f"{m}: {e}" for m, e in failed.items()))
    if profiled:
        lines += ["\nOne profiled step per method (the last; torch.profiler slows the host, so the device's busy "
                  "share is a lower bound): wall time, the device's kernel time, and the host's operator time "
                  "by kind (ms).\n",
                  "| method | wall | device busy | busy share | " + " | ".join(CATEGORY_COLUMNS) + " |",
                  "|---|---|---|---|" + "---|" * len(CATEGORY_COLUMNS)]
        for method, pr in profiled.items():
            busy = "n/a" if pr["device_busy_ms"] is None else f"{pr['device_busy_ms']:.1f}"
            share = "n/a" if pr["device_busy_share"] is None else f"{pr['device_busy_share']:.0%}"
            cats = " | ".join(f"{pr['host_ms_by_category'].get(c, 0.0):.1f}" for c in CATEGORY_COLUMNS)
            lines.append(f"| {method} | {pr['wall_ms']:.1f} | {busy} | {share} | {cats} |")
        lines.append("\nTop operators of each profiled step are in gpu_check.json (`profile.top_host_ops`, "
                     "`profile.top_device_ops`).")
    ratio = result.get("mdlm_over_ar_step_time")
    lines.append(f"\nMDLM step time / AR step time: {ratio:.3f} (target <= {STEP_RATIO_TARGET}); MFU target for "
                 f"MDLM: >= {MFU_TARGET:.0%}.\n" if ratio is not None else "")
    return "\n".join(lines) + "\n"


def write_report(out: Path, result: dict[str, Any]) -> None:
    ensure_dir(out, "report folder")
    with written_together():  # a Ctrl-C here takes effect after both files
        atomic_write_text(out / "gpu_check.json", json.dumps(result, indent=2) + "\n")
        atomic_write_text(out / "README.md", render(result))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m seqdiff.bench.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", choices=sorted(MODEL_PRESETS), help="DiT size preset")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens per row")
    p.add_argument("--batch-size", type=int, default=32, help="global batch (rows per optimizer step)")
    p.add_argument("--micro-batch-size", type=int, default=16, help="rows per forward / backward (accumulation)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per method")
    p.add_argument("--skip-steps", type=int, default=30, help="first steps left out of the timing")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="train eagerly")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="train.activation_checkpointing=true: recompute each block in the backward (less memory)")
    p.add_argument("--strategy", default="fsdp2", choices=["fsdp2", "auto"],
                   help="fsdp2 (the issue's recipe: the sharding code runs on one device) or auto (plain single "
                        "device), to measure what the sharding wrapper costs")
    p.add_argument("--no-profile", dest="profile", action="store_false",
                   help="skip the torch.profiler run over the last step (host vs device time, top operators)")
    p.add_argument("--peak-tflops", type=float, default=None, help="the device's dense bf16 peak, if not in the table")
    p.add_argument("--methods", default="mdlm,ar", help="comma-separated methods, in order")
    p.add_argument("--allow-cpu", action="store_true", help="run without CUDA (for tests; no bf16)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.allow_cpu:
        print("gpu_check: error: no CUDA device here (torch.cuda.is_available() is False); run it on a GPU "
              "machine, or pass --allow-cpu to exercise the code on the CPU", file=sys.stderr)
        return 2
    if args.skip_steps >= args.steps:
        parser.error(f"--skip-steps={args.skip_steps} leaves no step of --steps={args.steps} to time")
    if args.batch_size % args.micro_batch_size != 0:
        parser.error(f"--micro-batch-size={args.micro_batch_size} must divide --batch-size={args.batch_size}")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu"
    if args.peak_tflops:
        peak, source = args.peak_tflops * 1e12, "--peak-tflops"
    else:
        peak = peak_bf16_flops(device_name) if cuda else None
        source = "PEAK_BF16_TFLOPS table" if peak else "device not in the table"
    runs = {}
    with tempfile.TemporaryDirectory(prefix="seqdiff-gpu-check-") as work:
        for method in methods:
            print(f"gpu_check: training {method} ...", file=sys.stderr, flush=True)
            runs[method] = run_one(method, args, cuda, peak, Path(work))
    result: dict[str, Any] = {
        "command": shlex.join(["python", "-m", "seqdiff.bench.gpu_check", *argv]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device_name": device_name,
        "torch": torch.__version__,
        "precision": "bf16 autocast" if cuda else "float32",
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "peak_flops": peak,
        "peak_source": source,
        "runs": runs,
        "mdlm_over_ar_step_time": (runs["mdlm"]["step_s_median"] / runs["ar"]["step_s_median"]
                                   if {"mdlm", "ar"} <= set(runs) else None),
        "mfu_target": MFU_TARGET,
        "step_ratio_target": STEP_RATIO_TARGET,
    }
    write_report(Path(args.out), result)
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
