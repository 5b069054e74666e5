"""`seqdiff edlm eval` (EDLM NLL bound of an MDLM + energy) and `seqdiff edlm train-nce` (fit an NCE energy).

Entries of the command table of seqdiff.cli (`_commands()["edlm"]`); their options are typed like every checkpoint
command's (seqdiff.options): `edlm.*` (EdlmEvalOptions) and `nce.*` (NCEOptions), each key also a flag
(`--num-partition-samples 4` is `edlm.num_partition_samples=4`). Sampling with an energy is
`seqdiff sample --sampler edlm --energy KIND:PATH`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from seqdiff.atomic import write_atomically
from seqdiff.config import ConfigError


@dataclass
class EdlmEvalOptions:
    """edlm.*: `seqdiff edlm eval`, the NLL of an MDLM + energy."""
    out_is_file: ClassVar[bool] = True  # `out` names a file: checked before any work (cli.resolve_options)

    energy: str | None = None
    """Required: the energy, KIND:PATH (ar:AR_RUN, coar:AR_RUN or nce:ENERGY.pt)."""
    data: str | None = None
    """A .txt / .txt.gz file (default: the run's own corpus split)."""
    split: Literal["train", "valid", "test"] = "test"
    """Split of the run's corpus scored without data."""
    num_t_samples: int = 1
    """Monte Carlo time samples per block."""
    num_partition_samples: int = 8
    """Draws n of mu for the log-partition estimate (ar, nce; n >= 2)."""
    form: Literal["marginal", "sequence"] = "marginal"
    """marginal: a valid NLL bound; sequence: the paper's whole-sequence form (exact for coAR, not a bound for a
    joint denoiser); see seqdiff.edlm.likelihood."""
    batch_size: int = 16
    """Blocks per batch."""
    out: str | None = None
    """JSON file for the results (default: <run or export>/eval/edlm-<energy>-<form>-<data>-<hash>.json)."""
    seed: int = 0
    """Seed of every random draw."""
    device: str = "cpu"
    """cpu, cuda, cuda:1, ..."""
    no_ema: bool = False
    """Use the raw weights instead of the EMA weights."""

    def __post_init__(self) -> None:
        for key in ("num_t_samples", "num_partition_samples", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"edlm.{key} must be >= 1, got {getattr(self, key)}")


@dataclass
class NCEOptions:
    """nce.*: `seqdiff edlm train-nce`, an NCE energy fitted against a frozen MDLM (seqdiff.edlm.nce_train)."""
    out_is_file: ClassVar[bool] = True  # `out` names a file: checked before any work (cli.resolve_options)

    out: str | None = None
    """Required: file for the trained energy (e.g. runs/edlm/energy.pt)."""
    data: str | None = None
    """Training text (default: the run's split)."""
    split: Literal["train", "valid", "test"] = "train"
    """Split of the run's corpus read without data."""
    steps: int = 500
    """Optimizer steps."""
    batch_size: int = 32
    """Blocks of data (positives) per step; as many negatives."""
    lr: float = 3e-4
    """AdamW learning rate after warm-up."""
    warmup_steps: int = 50
    """Linear warm-up of the learning rate."""
    seed: int = 0
    """Seed of every draw (windows, times, masks, negatives)."""
    device: str = "cpu"
    """cpu, cuda, cuda:1, ..."""
    no_ema: bool = False
    """Use the raw weights of the MDLM instead of the EMA weights."""

    def __post_init__(self) -> None:
        for key in ("steps", "batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"nce.{key} must be >= 1, got {getattr(self, key)}")
        if self.warmup_steps < 0:
            raise ConfigError(f"nce.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.lr < 0:
            raise ConfigError(f"nce.lr must be >= 0, got {self.lr}")

# The handlers import what they run late: seqdiff.cli imports this module on every start, and the evaluation
# and data modules would load Lightning for `seqdiff --help`.


def _data_tokens(o: EdlmEvalOptions | NCEOptions, model):
    from seqdiff.data.text import split_path
    from seqdiff.edlm.base import EnergyError
    from seqdiff.evaluation.zeroshot import file_tokens

    if o.data:
        path = Path(o.data)
    elif model.data_config is not None and model.data_config.kind == "text":
        path = split_path(model.data_config, o.split)
    elif model.data_config is not None and model.data_config.kind == "fasta":  # its split is intervals of a genome
        raise EnergyError(f"this checkpoint was trained on the intervals of {model.data_config.fasta.path}, which "
                          f"the EDLM commands do not cut out; pass --data FILE (a FASTA of held-out sequence)")
    else:
        raise EnergyError("this checkpoint records no text corpus; pass --data FILE")
    tokens, loss_mask = file_tokens(path, model.tokenizer)
    return path, tokens, loss_mask


def _check_energy_fits(o: EdlmEvalOptions, energy, mdlm, num_tokens: int) -> None:
    """Refuse, before scoring, an energy that cannot read the MDLM's blocks and a batch of n candidates per block
    that cannot fit in memory (int64 ids and float64 probabilities of each candidate token, roughly)."""
    from seqdiff.edlm.base import check_energy_length
    from seqdiff.evaluation.limits import available_memory

    check_energy_length(energy, f"--energy {o.energy}", mdlm.seq_len, f"blocks {mdlm.path} scores")
    blocks = min(o.batch_size, -(-num_tokens // mdlm.seq_len))
    need, have = blocks * o.num_partition_samples * mdlm.seq_len * 48, available_memory()
    if have and need > 0.9 * have:
        raise ConfigError(f"--num-partition-samples {o.num_partition_samples} candidates for each of a batch of "
                          f"{blocks} blocks of {mdlm.seq_len} tokens need about {need / 2**30:.1f} GiB by a rough "
                          f"estimate, more than the {have / 2**30:.1f} GiB available; lower --num-partition-samples "
                          f"or --batch-size")


def cmd_edlm_eval(args: argparse.Namespace) -> int:
    import torch

    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.edlm import load_energy
    from seqdiff.edlm.likelihood import edlm_model
    from seqdiff.evaluation.likelihood import evaluate_tokens
    from seqdiff.evaluation.limits import check_device
    from seqdiff.evaluation.zeroshot import eval_results_path

    o: EdlmEvalOptions = args.edlm
    if o.energy is None:
        raise ConfigError("seqdiff edlm eval needs an energy: --energy KIND:PATH (edlm.energy=KIND:PATH)")
    check_device(o.device)
    mdlm = load_checkpoint(args.checkpoint, device=o.device, use_ema=not o.no_ema)
    energy = load_energy(o.energy, mdlm, device=o.device)
    model = edlm_model(mdlm, energy, o.num_partition_samples, o.form)
    torch.manual_seed(o.seed)
    path, tokens, loss_mask = _data_tokens(o, mdlm)
    _check_energy_fits(o, energy, mdlm, len(tokens))
    report = evaluate_tokens(model, tokens, batch_size=o.batch_size, num_t_samples=o.num_t_samples,
                             seed=o.seed, loss_mask=loss_mask, progress=True)
    report.update({"checkpoint": str(mdlm.path), "energy": o.energy, "data": str(path), "form": o.form,
                   "bound": o.form == "marginal", "num_partition_samples": o.num_partition_samples,
                   "log_partition": "exact (Z = 1)" if energy.self_normalized else
                   "(2n-1) log Z_n - 2(n-1) log Z_{n-1} (leave-one-out)"})
    if o.out:
        out = Path(o.out)
    else:  # where `seqdiff eval` writes (the run's or export's eval/), one file per energy and data file
        sources = f"{Path(o.energy.partition(':')[2]).resolve()}\n{path.resolve()}"
        stem = f"edlm-{energy.name}-{o.form}-{path.name}-{hashlib.sha256(sources.encode()).hexdigest()[:8]}"
        out = eval_results_path(args.checkpoint, [], own_split=stem)
    write_atomically(out, json.dumps(report, indent=2) + "\n")
    kind = "upper bound" if o.form == "marginal" else "sequence form: the paper's estimate, not a bound"
    print(f"{report['method']} on {path} ({report['num_tokens']} tokens, {kind}):")
    for key in ("nll_nats_per_token", "bits_per_token", "perplexity", "bits_per_character", "bits_per_base"):
        if key in report:
            print(f"  {key:<20} {report[key]:.4f}")
    print(f"written: {out}")
    return 0


def cmd_edlm_train_nce(args: argparse.Namespace) -> int:
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.edlm.base import EnergyError
    from seqdiff.edlm.nce_train import NCEConfig, train_nce
    from seqdiff.evaluation.limits import check_device

    o: NCEOptions = args.nce
    if o.out is None:
        raise ConfigError("seqdiff edlm train-nce needs an output file: --out FILE (nce.out=FILE)")
    check_device(o.device)
    mdlm = load_checkpoint(args.checkpoint, device=o.device, use_ema=not o.no_ema)
    if mdlm.method.name != "mdlm":
        raise EnergyError(f"{mdlm.path} is a {mdlm.method.name!r} model; NCE trains an energy for an MDLM")
    _, tokens, _ = _data_tokens(o, mdlm)
    cfg = NCEConfig(steps=o.steps, batch_size=o.batch_size, lr=o.lr, warmup_steps=o.warmup_steps, seed=o.seed)
    train_nce(mdlm, tokens, cfg, o.out)
    print(f"energy: {o.out} (use it as --energy nce:{o.out})")
    return 0
