"""What train.activation_checkpointing costs and saves on CPU: peak memory and time of a training step, off and on.

    python -m experiments.activation_checkpointing --out reports/bench/activation_checkpointing

For each shape (SHAPES: the `cpu-small` preset with 4 layers at 1,024 characters x batch 8 and at 4,096 x 2, and
with 12 layers at 1,024 x 8) and method (MDLM, AR): the model and its AdamW are built once; the bytes autograd
keeps for the backward are counted once per setting; then rounds alternate the two settings on the same weights,
in an order rotating from round to round: each setting takes one warm-up step, then its step time is the median
of `--steps` steps and its peak memory the peak resident set of one more step above the level before it
(seqdiff.bench.measure.PeakMemory; the weights and optimizer state exist before). Ratios are on over off, the
median of per-round ratios. Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from experiments.quickstart_step_time import cpu_name
from experiments.report import command_line, write_results
from seqdiff.backbones.checkpointing import set_activation_checkpointing
from seqdiff.bench.measure import PeakMemory, load_average, rotated, spread
from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.methods import Batch, build_model
from seqdiff.optim import adamw_with_warmup, decay_groups, lr_multiplier
from seqdiff.tokenizers import CharTokenizer

SHAPES = {"4 layers, 1024 x 8": (4, 1024, 8), "4 layers, 4096 x 2": (4, 4096, 2), "12 layers, 1024 x 8": (12, 1024, 8)}
"""name -> (layers, sequence length, batch rows) of the cpu-small preset (256 wide, 4 heads)."""
SETTINGS = ("off", "on")


def training_step(method_name: str, layers: int, seq_len: int, rows: int):
    """(step, loss, backbone): one AdamW training step of the method on a fixed random batch, and its loss alone,
    as closures."""
    tok = CharTokenizer()
    torch.manual_seed(0)
    method, backbone, _ = build_model(ModelConfig(preset="cpu-small", n_layers=layers, max_seq_len=seq_len),
                                      MethodConfig(name=method_name), tok)
    params = [p for p in backbone.parameters() if p.requires_grad]
    optimizer, _ = adamw_with_warmup(decay_groups(params, 0.0), lr_multiplier(1), lr=1e-4)
    ids = torch.randint(0, tok.vocab_size - 4, (rows, seq_len), generator=torch.Generator().manual_seed(0))

    def loss() -> torch.Tensor:
        return method.loss(backbone, Batch(input_ids=ids), torch.Generator().manual_seed(1)).loss

    def step() -> None:
        loss().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, loss, backbone


def kept_for_backward(loss) -> int:
    """Bytes of the tensors autograd keeps from the forward for the backward (each storage once): the part of a
    step's memory that grows with depth and that checkpointing removes."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        value = loss()
    value.backward()
    return sum(seen.values())


def measure(method_name: str, layers: int, seq_len: int, rows: int, rounds: int, steps: int) -> dict:
    step, loss, backbone = training_step(method_name, layers, seq_len, rows)
    meter = PeakMemory(torch.device("cpu"))
    kept = {}
    for setting in SETTINGS:
        set_activation_checkpointing(backbone, setting == "on")
        kept[setting] = kept_for_backward(loss) / 2**20
    seconds: dict[str, list[float]] = {s: [] for s in SETTINGS}
    peak_mb: dict[str, list[float]] = {s: [] for s in SETTINGS}
    for r in range(rounds):
        for setting in rotated(list(SETTINGS), r):
            set_activation_checkpointing(backbone, setting == "on")
            step()
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                step()
                times.append(time.perf_counter() - start)
            seconds[setting].append(statistics.median(times))
            peak_mb[setting].append(meter.measure(step) / 2**20)
    backbone.zero_grad(set_to_none=True)
    return {"method": method_name, "layers": layers, "seq_len": seq_len, "rows": rows, "memory_method": meter.method,
            "kept_for_backward_mb": kept,
            "step_s": {s: spread(v) for s, v in seconds.items()}, "peak_mb": {s: spread(v) for s, v in peak_mb.items()},
            "time_ratio": spread([a / b for a, b in zip(seconds["on"], seconds["off"])]),
            "memory_ratio": spread([a / b for a, b in zip(peak_mb["on"], peak_mb["off"])])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/bench/activation_checkpointing")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    started, load_start = time.time(), load_average()
    rows = [{"shape": name, **measure(method, layers, seq_len, batch, args.rounds, args.steps)}
            for name, (layers, seq_len, batch) in SHAPES.items() for method in ("mdlm", "ar")]
    results = {"command": command_line("activation_checkpointing", argv), "cpu": cpu_name(),
               "torch": torch.__version__, "threads": torch.get_num_threads(), "load_average_start": load_start,
               "load_average_end": load_average(), "seconds": round(time.time() - started, 1), "rows": rows}
    table = "\n".join([
        f"Made by `{results['command']}` on {results['cpu']} ({results['threads']} torch threads, torch "
        f"{results['torch']}, load average {load_start} at the start, {results['load_average_end']} at the end; "
        f"{results['seconds']:.0f} s).",
        "",
        f"One AdamW training step of the `cpu-small` preset (256 wide, 4 heads; layers, length x batch as named), "
        f"character vocabulary, float32; {args.rounds} rounds, each setting's step time the median of {args.steps} "
        f"steps. Kept: the tensors autograd keeps from the forward for the backward (each storage once). Peak "
        f"memory: {rows[0]['memory_method']}, of one step above the level before it (what is kept, plus each "
        "operator's temporaries, the gradients, the allocator's slack). Ratios: on / off, median of per-round "
        "ratios [min, max].",
        "",
        "| shape | method | kept MB (off) | kept MB (on) | step s (off) | step s (on) | time on / off | peak MB (off) "
        "| peak MB (on) | peak on / off |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *(f"| {r['shape']} | {r['method']} | {r['kept_for_backward_mb']['off']:.0f} | "
          f"{r['kept_for_backward_mb']['on']:.0f} | {r['step_s']['off']['median']:.2f} | "
          f"{r['step_s']['on']['median']:.2f} "
          f"| {r['time_ratio']['median']:.2f} [{r['time_ratio']['min']:.2f}, {r['time_ratio']['max']:.2f}] "
          f"| {r['peak_mb']['off']['median']:.0f} | {r['peak_mb']['on']['median']:.0f} "
          f"| {r['memory_ratio']['median']:.2f} [{r['memory_ratio']['min']:.2f}, {r['memory_ratio']['max']:.2f}] |"
          for r in rows),
        "",
    ])
    write_results(args.out, results, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
