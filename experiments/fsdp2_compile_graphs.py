"""What torch.compile captures of a backbone sharded by fsdp2: the whole backbone compiled against each block.

    python -m experiments.fsdp2_compile_graphs --out reports/bench/fsdp2_compile

On one CPU process (a gloo group of one), the DiT of the `test` preset with --layers blocks, sharded as
train.strategy=fsdp2 shards it (seqdiff.training.fsdp2.shard_backbone), runs an MDLM training step (forward and
backward) a few times under each way of compiling, and torch._dynamo's counters say how many frames it compiled,
how many graph breaks it hit, how many operator calls it captured into graphs and how many distinct graphs it
made. `unsharded whole` is the plain single-device case for scale. Counts, not timings: Inductor's CPU code says
little about a GPU's host overhead, which is what the counts are for (reports/bench/README.md, the GPU section).

Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import sys
import tempfile
from pathlib import Path

import torch

from experiments.report import command_line, write_results

WAYS = ("unsharded whole", "sharded whole", "sharded per block")


def count(way: str, backbone, method, ids: torch.Tensor, steps: int) -> dict:
    import torch._dynamo as dynamo

    from seqdiff.methods.base import Batch
    from seqdiff.training.fsdp2 import compile_sharded, shard_backbone

    model = copy.deepcopy(backbone)
    if way.startswith("sharded"):
        from torch.distributed.device_mesh import init_device_mesh

        shard_backbone(model, init_device_mesh("cpu", (1,)))
    dynamo.reset()
    dynamo.utils.counters.clear()
    if way == "sharded per block":
        compile_sharded(model)
    else:
        model.compile()
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        method.loss(model, Batch(input_ids=ids), g).loss.backward()
    c = dynamo.utils.counters
    return {"frames": c["frames"].get("total", 0), "frames_ok": c["frames"].get("ok", 0),
            "graph_breaks": sum(c["graph_break"].values()), "calls_captured": c["stats"].get("calls_captured", 0),
            "unique_graphs": c["stats"].get("unique_graphs", 0),
            "break_reasons": sorted({r.splitlines()[0] for r in c["graph_break"]})}


def table(results: dict) -> str:
    c = results["config"]
    lines = ["# torch.compile of a backbone sharded by fsdp2: what it captures\n",
             f"Made by `{results['command']}` on {results['date']} (torch {results['torch']}). DiT `test` preset with "
             f"{c['layers']} blocks, MDLM loss, {c['batch']} x {c['seq_len']} tokens, {c['steps']} forward + backward "
             "passes, one CPU process (gloo). Counters of torch._dynamo.\n",
             "| compiled | frames (ok) | graph breaks | operator calls captured | distinct graphs |",
             "|---|---:|---:|---:|---:|"]
    for way, r in results["ways"].items():
        lines.append(f"| {way} | {r['frames']} ({r['frames_ok']}) | {r['graph_breaks']} | {r['calls_captured']} | "
                     f"{r['unique_graphs']} |")
    reasons = {w: r["break_reasons"] for w, r in results["ways"].items() if r["break_reasons"]}
    if reasons:
        lines.append("\nGraph breaks: " + "; ".join(f"{w}: {' / '.join(rs)}" for w, rs in reasons.items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.fsdp2_compile_graphs", description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default="reports/bench/fsdp2_compile")
    args = p.parse_args(argv)
    for key in ("layers", "batch", "seq_len", "steps"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")

    import torch.distributed as dist

    from seqdiff.config import MethodConfig, ModelConfig
    from seqdiff.methods import build_model
    from seqdiff.tokenizers.char import CharTokenizer
    from seqdiff.training.module import compile_unavailable

    reason = compile_unavailable(torch.device("cpu"))
    if reason is not None:
        print(f"torch.compile is unavailable here: {reason}", file=sys.stderr)
        return 2
    tok = CharTokenizer()
    torch.manual_seed(0)
    method, backbone, _ = build_model(ModelConfig(preset="test", n_layers=args.layers, max_seq_len=args.seq_len,
                                                  dropout=0.0), MethodConfig(name="mdlm"), tok)
    ids = torch.randint(4, tok.vocab_size, (args.batch, args.seq_len), generator=torch.Generator().manual_seed(0))
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(str(Path(tmp) / "store"), 1), rank=0, world_size=1)
        try:
            ways = {way: count(way, backbone, method, ids, args.steps) for way in WAYS}
        finally:
            dist.destroy_process_group()
    results = {"command": command_line("fsdp2_compile_graphs", argv),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
               "config": {k: v for k, v in vars(args).items() if k != "out"}, "ways": ways}
    write_results(args.out, results, table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
