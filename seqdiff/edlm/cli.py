"""`seqdiff edlm eval` (EDLM NLL bound of an MDLM + energy) and `seqdiff edlm train-nce` (fit an NCE energy).

Registered by seqdiff.cli; sampling with an energy is `seqdiff sample --sampler edlm --energy KIND:PATH`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from seqdiff.atomic import write_atomically
from seqdiff.config import finite_float
from seqdiff.edlm.base import EnergyError

# The handlers import what they run late: seqdiff.cli builds this parser on every start, and the evaluation
# and data modules would load Lightning for `seqdiff --help`.


def _data_tokens(args, model):
    from seqdiff.data.text import split_path
    from seqdiff.evaluation.zeroshot import file_tokens

    if args.data:
        path = Path(args.data)
    elif model.data_config is not None and model.data_config.kind == "text":
        path = split_path(model.data_config, args.split)
    else:
        raise EnergyError("this checkpoint records no text corpus; pass --data FILE")
    tokens, loss_mask = file_tokens(path, model.tokenizer)
    return path, tokens, loss_mask


def cmd_edlm_eval(args: argparse.Namespace) -> int:
    import torch

    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.edlm import load_energy
    from seqdiff.edlm.likelihood import edlm_model
    from seqdiff.evaluation.likelihood import evaluate_tokens

    mdlm = load_checkpoint(args.checkpoint, device=args.device, use_ema=not args.no_ema)
    energy = load_energy(args.energy, mdlm, device=args.device)
    model = edlm_model(mdlm, energy, args.num_partition_samples, args.form)
    torch.manual_seed(args.seed)
    path, tokens, loss_mask = _data_tokens(args, mdlm)
    report = evaluate_tokens(model, tokens, batch_size=args.batch_size, num_t_samples=args.num_t_samples,
                             seed=args.seed, loss_mask=loss_mask, progress=True)
    report.update({"checkpoint": str(mdlm.path), "energy": args.energy, "data": str(path), "form": args.form,
                   "bound": args.form == "marginal", "num_partition_samples": args.num_partition_samples,
                   "log_partition": "exact (Z = 1)" if energy.self_normalized else
                   "(2n-1) log Z_n - 2(n-1) log Z_{n-1} (leave-one-out)"})
    out = Path(args.out) if args.out else \
        mdlm.path.parent.parent / "eval" / f"edlm-{energy.name}-{args.form}-{path.name}.json"
    write_atomically(out, json.dumps(report, indent=2) + "\n")
    kind = "upper bound" if args.form == "marginal" else "sequence form: the paper's estimate, not a bound"
    print(f"{report['method']} on {path} ({report['num_tokens']} tokens, {kind}):")
    for key in ("nll_nats_per_token", "bits_per_token", "perplexity", "bits_per_character", "bits_per_base"):
        if key in report:
            print(f"  {key:<20} {report[key]:.4f}")
    print(f"written: {out}")
    return 0


def cmd_edlm_train_nce(args: argparse.Namespace) -> int:
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.edlm.nce_train import NCEConfig, train_nce

    mdlm = load_checkpoint(args.checkpoint, device=args.device, use_ema=not args.no_ema)
    if mdlm.method.name != "mdlm":
        raise EnergyError(f"{mdlm.path} is a {mdlm.method.name!r} model; NCE trains an energy for an MDLM")
    _, tokens, _ = _data_tokens(args, mdlm)
    cfg = NCEConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, warmup_steps=args.warmup_steps,
                    seed=args.seed)
    train_nce(mdlm, tokens, cfg, args.out)
    print(f"energy: {args.out} (use it as --energy nce:{args.out})")
    return 0


def add_parser(sub, common: argparse.ArgumentParser) -> None:
    """The `edlm` subcommand with its `eval` and `train-nce` actions; `common` holds checkpoint, device, seed."""
    p = sub.add_parser("edlm", help="energy-based diffusion (EDLM): likelihood bound and NCE energy training")
    actions = p.add_subparsers(dest="edlm_command", required=True)
    q = actions.add_parser("eval", parents=[common], help="NLL upper bound of an MDLM + energy")
    q.add_argument("--energy", required=True, help="KIND:PATH: ar:AR_RUN, coar:AR_RUN or nce:ENERGY.pt")
    q.add_argument("--data", help="a .txt / .txt.gz file (default: the run's own corpus split)")
    q.add_argument("--split", default="test", choices=["train", "valid", "test"])
    q.add_argument("--num-t-samples", type=int, default=1, help="Monte Carlo time samples per block")
    q.add_argument("--num-partition-samples", type=int, default=8,
                   help="draws n of mu for the log-partition estimate (ar, nce; n >= 2)")
    q.add_argument("--form", choices=["marginal", "sequence"], default="marginal",
                   help="marginal: a valid NLL bound; sequence: the paper's whole-sequence form (exact for coAR, "
                        "not a bound for a joint denoiser); see seqdiff.edlm.likelihood")
    q.add_argument("--batch-size", type=int, default=16)
    q.add_argument("--out", help="JSON file for the results (default: <run>/eval/edlm-<energy>-<data>.json)")
    q.set_defaults(func=cmd_edlm_eval, command="edlm eval")
    q = actions.add_parser("train-nce", parents=[common], help="fit an NCE energy against a frozen MDLM")
    q.add_argument("--out", required=True, help="file for the trained energy (e.g. runs/edlm/energy.pt)")
    q.add_argument("--data", help="training text (default: the run's train split)")
    q.add_argument("--split", default="train", choices=["train", "valid", "test"])
    q.add_argument("--steps", type=int, default=500)
    q.add_argument("--batch-size", type=int, default=32)
    q.add_argument("--lr", type=finite_float, default=3e-4)
    q.add_argument("--warmup-steps", type=int, default=50)
    q.set_defaults(func=cmd_edlm_train_nce, command="edlm train-nce")
