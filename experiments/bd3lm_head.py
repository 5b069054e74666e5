"""BD3LM's output head at GPT-2's vocabulary: the whole x_t half, its masked positions, and those fused with the loss.

    python -m experiments.bd3lm_head --out reports/bench/bd3lm_head

BD3LM's one training pass reads x_t + x_0 (2L tokens) and scores the masked positions of the x_t half. Three
ways to run its head, same loss and gradients (tests/test_head_at_masked.py, tests/test_fused_loss.py):
`full` (method.head_at_masked=false: the head on every x_t position, as the reference does), `sparse` (the
default head at the masked positions, method.fused_loss=false) and `sparse fused` (the default at a vocabulary
of 4,096 ids or more: no logits). One AdamW step of the DiT (seqdiff.bench's cpu-small shape, 256 wide, 4
layers, 8 x 256 tokens, GPT-2's 50,261 ids) with block size 16, timed in rounds with the order rotated; ratios
are medians of per-round ratios (the machine is shared). Writes <out>/results.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from seqdiff.backbones import build_backbone
from seqdiff.bench.measure import OtherLoad, load_average, quiet_rounds, rotated, spread, timed
from seqdiff.bench.models import Shape, vocab_stub
from seqdiff.config import MethodConfig
from seqdiff.methods import BD3LM, Batch
from seqdiff.optim import adamw_implementation

VARIANTS = {"full": {"head_at_masked": False, "fused_loss": False},
            "sparse": {"head_at_masked": True, "fused_loss": False},
            "sparse fused": {"head_at_masked": True, "fused_loss": None}}
"""Name -> method options (fused_loss None: the default, on at this vocabulary)."""


def make_step(variant: str, shape: Shape, block_size: int, seed: int):
    vocab = vocab_stub(shape.vocab_size)
    method = BD3LM(MethodConfig(name="bd3lm", block_size=block_size, **VARIANTS[variant]), vocab)
    torch.manual_seed(seed)
    model = build_backbone(shape.model_config(), shape.vocab_size, causal=False)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, **adamw_implementation(params))
    gen = torch.Generator().manual_seed(seed)
    batch = Batch(torch.randint(0, vocab.bos_id, (shape.batch_size, shape.seq_len), generator=gen))
    assert method.uses_sparse_head(model) == VARIANTS[variant]["head_at_masked"]

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        method.loss(model, batch, gen).loss.backward()
        opt.step()

    return step, method


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m experiments.bd3lm_head", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="reports/bench/bd3lm_head")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=50261)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    shape = Shape(256, 4, 4, seq_len=args.seq_len, batch_size=args.batch_size, vocab_size=args.vocab_size)
    t0 = time.perf_counter()
    results = {"command": shlex.join(["python", "-m", "experiments.bd3lm_head", *argv]),
               "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "load_average_start": load_average(), "shape": vars(shape),
               "block_size": args.block_size}
    steps, masked_share = {}, None
    for name in VARIANTS:
        steps[name], method = make_step(name, shape, args.block_size, args.seed)
        masked_share = method.masked_share()
        for _ in range(args.warmup):
            steps[name]()
    names, times, others = list(VARIANTS), {name: [] for name in VARIANTS}, []
    for r in range(args.rounds):
        before = OtherLoad.snapshot()
        for name in rotated(names, r):
            times[name].append(timed(steps[name], torch.device("cpu")))
        others.append(OtherLoad.between(before, OtherLoad.snapshot()))
        print(f"[{time.perf_counter() - t0:6.1f}s] round {r + 1}: "
              + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names), flush=True)
    quiet = quiet_rounds(others)
    use = [i for i, q in enumerate(quiet) if q] if sum(quiet) >= 3 else list(range(args.rounds))
    tokens = shape.seq_len * shape.batch_size
    results.update({
        "masked_share": masked_share,
        "tokens_per_s": {n: spread([tokens / times[n][i] for i in use]) for n in names},
        "ratio_over_full": {n: spread([times["full"][i] / times[n][i] for i in use]) for n in names[1:]},
        "rounds_used": len(use), "rounds_quiet": sum(quiet), "others_cpu": others,
        "load_average_end": load_average(), "elapsed_s": time.perf_counter() - t0})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [f"Made by `{results['command']}` on {results['date']} ({results['elapsed_s']:.0f} s, torch "
             f"{results['torch']}, {results['threads']} threads; load average {results['load_average_start']} at "
             f"the start, {results['load_average_end']} at the end). BD3LM, block size {args.block_size}, DiT 256 "
             f"wide, 4 layers, {shape.batch_size} x {shape.seq_len} tokens, vocabulary {shape.vocab_size}; expected "
             f"masked share of the x_t "
             f"half {masked_share:.3f}; {len(use)} rounds used ({sum(quiet)} quiet).", "",
             "| head | tokens/s, median [min–max] | step time of `full` / this, median [min–max] |",
             "| --- | ---: | ---: |"]
    for n in names:
        t = results["tokens_per_s"][n]
        r = results["ratio_over_full"].get(n)
        ratio = "1" if r is None else f"{r['median']:.2f}x [{r['min']:.2f}–{r['max']:.2f}]"
        lines.append(f"| {n} | {t['median']:,.0f} [{t['min']:,.0f}–{t['max']:,.0f}] | {ratio} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
