"""reports/bd3lm: AR, MDLM and BD3-LM (L' = 4, 8, 16) with the same backbone and token budget, on Shakespeare
characters and GRCh37 chr20: test bound, and the quality-speed frontier of the KV-cached and uncached samplers.

    python -m experiments.bd3lm_experiment --run-root runs/bd3lm --out reports/bd3lm
    python -m experiments.bd3lm_experiment --corpora shakespeare --run-root runs/bd3lm --out reports/bd3lm \\
        train.max_steps=3000           # dotted overrides apply to every corpus' shared recipe

For each corpus (CORPORA: its MDLM recipe is the shared recipe; only the method.* keys of each variant differ):
  1. experiments.compare_methods trains (or reuses, or resumes) every method under <run-root>/<corpus>/<method>
     and writes <out>/<corpus>.json, <corpus>.md, <corpus>_curves.png (test bound: AR exact NLL, diffusion
     NELBO; nats/token, PPL, bits per character / base; samples/s of each default sampler);
  2. `seqdiff frontier` runs every sampler of every run (bd3lm: KV-cached and uncached; MDLM: cached and
     ancestral; AR) at each step count (bd3lm: steps per block) with the AR run as the generative-perplexity
     oracle, and writes <out>/frontier_<corpus>/ (frontier.json, README.md, two PNG figures).
The numbers come from these commands; the prose of reports/bd3lm/README.md is for a person to write.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from experiments import compare_methods
from seqdiff.cli import main as seqdiff_main

CORPORA: dict[str, str] = {
    "shakespeare": "configs/shakespeare_char_mdlm.yaml",
    "chr20": "configs/dna_chr20_cpu_mdlm.yaml",
}
"""Corpus name -> the shared recipe (its method section is replaced by each variant's)."""
METHODS = "ar,mdlm,bd3lm_4,bd3lm_8,bd3lm_16"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m experiments.bd3lm_experiment", description=__doc__.split("\n")[0])
    p.add_argument("--corpora", default=",".join(CORPORA), help=f"comma-separated, from {sorted(CORPORA)}")
    p.add_argument("--methods", default=METHODS, help="compare_methods variants; must include ar (the oracle)")
    p.add_argument("--run-root", required=True, help="runs go to <run-root>/<corpus>/<method>")
    p.add_argument("--out", default="reports/bd3lm", help="report folder")
    p.add_argument("--num-t-samples", type=int, default=4, help="time samples per test block (diffusion bound)")
    p.add_argument("--frontier-steps", default="8,16,32,64,128,256", help="step counts of the frontier")
    p.add_argument("--num-samples", type=int, default=16, help="frontier samples per sampler and step count")
    p.add_argument("--max-test-windows", type=int, default=None, help="FASTA: test tiles to score (default: all)")
    p.add_argument("overrides", nargs="*", help="section.key=value overrides of every shared recipe")
    args = p.parse_args(argv)
    args.corpora = [c for c in args.corpora.split(",") if c]
    unknown = sorted(set(args.corpora) - set(CORPORA))
    if unknown or not args.corpora:
        p.error(f"--corpora: unknown {unknown}; choose from {sorted(CORPORA)}")
    if "ar" not in args.methods.split(","):
        p.error("--methods must include ar: the AR run is the frontier's generative-perplexity oracle")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    for corpus in args.corpora:
        runs = Path(args.run_root) / corpus
        compare = ["--config", CORPORA[corpus], "--methods", args.methods, "--run-root", str(runs), "--out",
                   str(out), "--name", corpus, "--num-t-samples", str(args.num_t_samples)]
        if args.max_test_windows is not None:
            compare += ["--max-test-windows", str(args.max_test_windows)]
        status = compare_methods.main([*compare, *args.overrides])
        if status != 0:
            return status
        frontier = ["frontier", "--oracle", str(runs / "ar"), "--steps", args.frontier_steps, "--num-samples",
                    str(args.num_samples), "--out", str(out / f"frontier_{corpus}")]
        for method in args.methods.split(","):
            frontier += ["--checkpoint", str(runs / method)]
        status = seqdiff_main(frontier)
        if status != 0:
            return status
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
