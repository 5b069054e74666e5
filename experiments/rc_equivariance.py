"""Reverse-complement equivariance on held-out chr20: a plain MDLM, the same checkpoint conjoined post hoc
(Caduceus-Ph), and its twin trained equivariant (model.rc_equivariant=shared, Caduceus-PS) -> reports/dna/rc/.

    python -m experiments.rc_equivariance --plain runs/bd3lm/chr20/mdlm --equivariant runs/rc/chr20_mdlm_rc \
        [--also runs/rc/chr20_mdlm_1000] [--train] --max-test-windows 4000 --num-t-samples 2 --out reports/dna/rc

The twin is the plain run's recipe with one key changed: its own config.yaml with model.rc_equivariant=shared
(`--train` trains it when its run directory has no checkpoint, resuming a partial one). The twin costs twice
the FLOPs per step (both strands in one batch of 2B); `--also` adds plain runs, such as the plain recipe run
for twice the steps, to compare at equal compute. For every model, on
the same held-out test tiles and with the same seeds for the time and mask draws:

1. test bits per base (MDLM's NELBO bound);
2. the strand gap on real tiles: the bits of a tile and of its reverse complement under the mirrored noise
   (same t, mask positions reversed), mean |difference| per tile, and the largest logit error
   max |f(RC x_t) - RC f(x_t)|. An equivariant model has both at float round-off; a plain one does not.

Writes results.json and table.md (the report's README.md is written by hand). Splice probes of the two
checkpoints are a `seqdiff probe` command (their README gives it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Subset

from experiments.dna_experiment import evenly
from seqdiff.backbones.rc_equivariant import conjoin_loaded, rc_logits, rc_tokens
from seqdiff.checkpoint import LoadedModel, load_checkpoint
from seqdiff.config import load_run_config
from seqdiff.data import build_data_module
from seqdiff.evaluation.generate import write_atomically
from seqdiff.evaluation.likelihood import evaluate_batches
from seqdiff.training.run import LAST_CHECKPOINT, train

LN2 = 0.6931471805599453
TWIN_OVERRIDES = ["model.rc_equivariant=shared", "train.progress_bar=false"]
"""The one key the equivariant twin changes (and a quiet log)."""


def train_twin(plain: Path, twin: Path) -> None:
    """Train the equivariant twin from the plain run's config.yaml (resuming a partial run)."""
    config = load_run_config(plain / "config.yaml", TWIN_OVERRIDES)
    train(config, twin, resume=(twin / LAST_CHECKPOINT).is_file())


@torch.no_grad()
def strand_gap(model: LoadedModel, tiles: list[torch.Tensor], seed: int = 0) -> dict[str, float]:
    """Bits per masked base of each tile and of its reverse complement under the mirrored noise (SUBS
    normalization: no mass on MASK), and the largest logit error |f(RC x_t) - RC f(x_t)| (full tiles, one
    time draw each, t uniform on [0.05, 0.95])."""
    method, backbone = model.method, model.backbone
    complement = model.tokenizer.complement_ids
    gen = torch.Generator().manual_seed(seed)
    gaps, bits, max_logit_error = [], [], 0.0
    for x0 in tiles:
        x0 = x0.unsqueeze(0)
        t = torch.rand(1, generator=gen, dtype=torch.float64) * 0.9 + 0.05
        masked = torch.rand(x0.shape, generator=gen) < t.float()
        xt = torch.where(masked, model.tokenizer.mask_id, x0)
        sigma = method.noise_level(t)
        out, out_rc = backbone(xt, noise_level=sigma), backbone(rc_tokens(xt, complement), noise_level=sigma)
        mapped = rc_logits(out, complement)
        finite = torch.isfinite(out_rc) & torch.isfinite(mapped)
        max_logit_error = max(max_logit_error, float((out_rc - mapped)[finite].abs().max()))
        per_strand = []
        for logits, target, where in ((out, x0, masked), (out_rc, rc_tokens(x0, complement), masked.flip(-1))):
            logits = logits.float().clone()
            logits[..., model.tokenizer.mask_id] = -torch.inf  # SUBS: no mass on MASK
            logp = torch.log_softmax(logits, -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
            per_strand.append(float(-logp[where].sum()) / max(1, int(where.sum())) / LN2)
        bits.append(per_strand)
        gaps.append(abs(per_strand[0] - per_strand[1]))
    return {"tiles": len(tiles), "mean_abs_strand_gap_bits": sum(gaps) / len(gaps),
            "max_abs_strand_gap_bits": max(gaps), "max_logit_error": max_logit_error,
            "mean_bits_forward": sum(b[0] for b in bits) / len(bits),
            "mean_bits_reverse": sum(b[1] for b in bits) / len(bits)}


def run(plain: Path, twin: Path, out: Path, do_train: bool, max_test_windows: int | None, num_t_samples: int,
        gap_tiles: int, command: str, also: tuple[Path, ...] = ()) -> dict:
    torch.set_num_threads(1)
    if do_train and not (twin / LAST_CHECKPOINT).is_file():
        train_twin(plain, twin)
    for run_dir in (plain, twin, *also):
        if not (run_dir / LAST_CHECKPOINT).is_file():
            hint = "" if do_train else "; pass --train"
            raise SystemExit(f"[rc] no checkpoint at {run_dir / LAST_CHECKPOINT}{hint}")
    start, load_start = time.perf_counter(), os.getloadavg()[0]
    models = {"plain": load_checkpoint(plain), "conjoined (post hoc)": conjoin_loaded(load_checkpoint(plain)),
              "equivariant (shared)": load_checkpoint(twin)}
    for extra in also:  # more plain runs on the same tiles, e.g. one trained for as many FLOPs as the twin
        loaded = load_checkpoint(extra)
        models[f"plain ({extra.name}, {loaded.step} steps)"] = loaded
    if models["equivariant (shared)"].model_config.rc_equivariant != "shared":
        raise SystemExit(f"[rc] {twin} was not trained with model.rc_equivariant=shared")
    cfg = models["plain"].data_config
    for name, model in models.items():
        if model.data_config != cfg:
            raise SystemExit(f"[rc] {name} ({model.path}) was trained on another data config than {plain}")
    dm = build_data_module(cfg, models["plain"].tokenizer)
    dm.check_files()
    tiles = dm.eval_dataset("test")
    index = evenly(len(tiles), max_test_windows)
    full = [i for i in index if bool(tiles[i]["attention_mask"].all())]
    gap_index = [full[i] for i in evenly(len(full), gap_tiles)]
    results: dict = {"command": command, "plain": str(plain), "equivariant": str(twin),
                     "twin_overrides": TWIN_OVERRIDES, "test_windows": {"used": len(index), "total": len(tiles)},
                     "num_t_samples": num_t_samples, "models": {}}
    for name, model in models.items():
        t = time.perf_counter()
        loader = DataLoader(Subset(tiles, index), batch_size=cfg.eval_batch_size, shuffle=False)
        report = evaluate_batches(model, loader, num_t_samples=num_t_samples, seed=0)
        gap = strand_gap(model, [tiles[i]["input_ids"] for i in gap_index])
        report.update(step=model.step, parameters=sum(p.numel() for p in model.backbone.parameters()),
                      seconds=time.perf_counter() - t, strand=gap)
        results["models"][name] = report
        print(f"[rc] {name}: {report['bits_per_base']:.4f} bits/base, strand gap "
              f"{gap['mean_abs_strand_gap_bits']:.2e}, logit error {gap['max_logit_error']:.2e}", file=sys.stderr)
    base = results["models"]["plain"]["bits_per_base"]
    for r in results["models"].values():
        r["delta_vs_plain_bits"] = r["bits_per_base"] - base
    results["setup"] = {"cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                        "load_average_at_start": load_start, "load_average_at_end": os.getloadavg()[0],
                        "seconds": time.perf_counter() - start, "seq_len": cfg.seq_len, "fasta": cfg.fasta.path}
    out.mkdir(parents=True, exist_ok=True)
    write_atomically(out / "results.json", json.dumps(results, indent=2) + "\n")
    write_atomically(out / "table.md", table(results))
    return results


def table(results: dict) -> str:
    """table.md: the numbers of results.json as a table."""
    lines = [f"Made by `{results['command']}`; numbers from `results.json`.", "",
             f"Test tiles: {results['test_windows']['used']} of {results['test_windows']['total']}, "
             f"{results['num_t_samples']} time draw(s) per tile; strand gap on "
             f"{next(iter(results['models'].values()))['strand']['tiles']} full tiles.", "",
             "| model | step | parameters | test bits/base (bound) | vs plain | mean strand gap (bits) | "
             "max logit error |", "|---|---|---|---|---|---|---|"]
    for name, r in results["models"].items():
        s = r["strand"]
        lines.append(f"| {name} | {r['step']} | {r['parameters']:,} | {r['bits_per_base']:.4f} | "
                     f"{r['delta_vs_plain_bits']:+.4f} | {s['mean_abs_strand_gap_bits']:.2e} | "
                     f"{s['max_logit_error']:.2e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--plain", required=True, help="run directory of the plain MDLM")
    p.add_argument("--equivariant", required=True, help="run directory of its model.rc_equivariant=shared twin")
    p.add_argument("--train", action="store_true", help="train the twin first when it has no checkpoint")
    p.add_argument("--out", default="reports/dna/rc", help="report folder")
    p.add_argument("--max-test-windows", type=int, default=None, help="evenly spaced test tiles (default: all)")
    p.add_argument("--num-t-samples", type=int, default=1, help="Monte Carlo time draws per tile")
    p.add_argument("--gap-tiles", type=int, default=64, help="full test tiles for the strand gap")
    p.add_argument("--also", type=Path, action="append", default=[],
                   help="another plain run to score on the same tiles (repeatable), e.g. one of equal FLOPs")
    args = p.parse_args(argv)
    command = "python -m experiments.rc_equivariance " + " ".join(sys.argv[1:] if argv is None else argv)
    run(Path(args.plain), Path(args.equivariant), Path(args.out), args.train, args.max_test_windows,
        args.num_t_samples, args.gap_tiles, command.strip(), tuple(args.also))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
