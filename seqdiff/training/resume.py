"""What `seqdiff train --resume` may change, and the refusal of everything else.

A resumed run continues the recipe its checkpoint was trained with. The keys in `RESUMABLE_KEYS` may take
new values on resume: they say how long to train, how often to log, validate and checkpoint, where the data
files now live and on what hardware to run, none of which changes what is being trained. Any other
difference between the checkpoint's recipe and the new one (the model, the method, the tokenizer, the data's
shape, the optimization) is refused, naming every changed key with its old and new value. Values are
compared after both recipes are read through the same dataclasses, so a key an old checkpoint lacks counts
as its default.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from seqdiff.config import (
    ConfigError,
    DataConfig,
    MethodConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    from_dict,
    to_dict,
    upgrade_data_section,
)
from seqdiff.optim import LR_SCHEDULES
from seqdiff.training.guards import RunError

RESUMABLE_KEYS: tuple[str, ...] = (
    # how long, how often
    "train.max_steps", "train.log_every", "train.val_every", "train.val_batches", "train.checkpoint_every",
    "train.progress_bar", "train.wandb",
    # hardware and speed (the same recipe on other devices)
    "train.accelerator", "train.devices", "train.num_nodes", "train.strategy", "train.precision",
    "train.deterministic", "train.compile", "train.micro_batch_size", "train.activation_checkpointing",
    "method.head_at_masked", "method.fused_loss",
    # where the same data now lives, and how it is read
    "data.corpus", "data.train_file", "data.valid_file", "data.test_file", "data.fasta.path", "data.fasta.bed",
    "data.num_workers", "data.eval_batch_size", "data.text.cache", "data.text.cache_min_bytes",
    "data.text.tokenize_workers",
    # weights come from the checkpoint on resume, not from model.init_from
    "model.init_from",
)
"""Keys that may change on `--resume`; every other recipe key must equal the checkpoint's. train.strategy
is further limited to strategies with the same optimizer-state layout, train.frozen_parameters is refused
with its own message."""

DATA_LOCATION_KEYS = ("data.corpus", "data.train_file", "data.valid_file", "data.test_file", "data.fasta.path",
                      "data.fasta.bed")
"""Resumable keys that name the data: a change is allowed (a moved copy) but announced."""

SECTIONS = {"model": ModelConfig, "method": MethodConfig, "train": TrainConfig, "data": DataConfig}


def _flat(section: str, values: dict[str, Any]) -> dict[str, Any]:
    """Dotted keys of a section, parts included (data.text.cache), so each key is compared on its own."""
    out: dict[str, Any] = {}
    for k, v in values.items():
        if isinstance(v, dict) and section == "data" and k in ("text", "fasta"):
            out.update(_flat(f"{section}.{k}", v))
        else:
            out[f"{section}.{k}"] = v
    return out


def _normalized(section: str, values: dict[str, Any] | None) -> dict[str, Any]:
    """A section of a saved recipe as the current dataclass reads it (defaults for keys it lacks)."""
    cls = SECTIONS[section]
    if section == "data" and isinstance(values, dict):
        try:
            values = upgrade_data_section(values)  # checkpoints of the release with flat data.* keys
        except ConfigError:
            return dict(values)
    known = {f.name for f in cls.__dataclass_fields__.values()}
    values = {k: v for k, v in (values or {}).items() if k in known}  # keys a later seqdiff dropped
    try:
        return to_dict(from_dict(cls, values, prefix=f"{section}."))
    except ConfigError:
        return dict(values)


def recipe_changes(saved: dict[str, Any], config: RunConfig, tokenizer: dict[str, Any]) -> dict[str, tuple]:
    """{key: (old, new)} for every key whose value differs between a checkpoint's hyper_parameters and `config`."""
    changes: dict[str, tuple] = {}
    for section in SECTIONS:
        if section == "data" and not saved.get("data"):
            continue  # checkpoints of early versions hold no data section
        old = _flat(section, _normalized(section, saved.get(section)))
        new = _flat(section, to_dict(getattr(config, section)))
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                changes[key] = (old.get(key), new.get(key))
    if "seq_len" in saved and int(saved["seq_len"]) != config.data.seq_len and "data.seq_len" not in changes:
        changes["data.seq_len"] = (int(saved["seq_len"]), config.data.seq_len)
    if saved.get("tokenizer") and saved["tokenizer"] != tokenizer:
        changes["tokenizer"] = (_short(saved["tokenizer"]), _short(tokenizer))
    return changes


def _short(tokenizer: dict[str, Any]) -> str:
    keys = ("kind", "vocab_size", "sha256")
    return "{" + ", ".join(f"{k}: {tokenizer[k]!r}" for k in keys if k in tokenizer) + "}"


def _same_file(old: Any, new: Any) -> bool:
    """Whether two spellings of a data path name one existing file or folder from the current directory
    (`my.txt`, `./my.txt`, its absolute path): nothing moved, so nothing to announce."""
    if not (isinstance(old, str) and isinstance(new, str) and old and new):
        return False
    try:
        return Path(old).exists() and Path(new).exists() and os.path.samefile(old, new)
    except OSError:
        return False


def check_resume(ckpt: dict[str, Any], ckpt_path: Path, config: RunConfig, tokenizer: dict[str, Any]) -> int:
    """Refuse a changed recipe or a max_steps at or below the checkpoint's step; returns the checkpoint's step.

    train.max_steps equal to the checkpoint's step is not an error (a finished run resumed is a no-op), but
    it says so.
    """
    saved = ckpt.get("hyper_parameters", {})
    step = int(ckpt.get("global_step", 0))
    changes = recipe_changes(saved, config, tokenizer)
    refused = {k: v for k, v in changes.items() if k not in RESUMABLE_KEYS and k != "train.frozen_parameters"}
    if refused:
        listed = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in refused.items())
        raise RunError(f"--resume: {ckpt_path} was trained with another recipe ({listed}); resume with the "
                       f"checkpoint's values, or start a new --run-dir (keys that may change on resume: "
                       f"{', '.join(RESUMABLE_KEYS)})")
    moved = [f"{k}={new!r} (was {old!r})" for k, (old, new) in changes.items()
             if k in DATA_LOCATION_KEYS and not _same_file(old, new)]
    if moved:
        print(f"seqdiff: resuming with {', '.join(moved)}: it must be the same data", file=sys.stderr)
    if config.train.max_steps < step:
        raise RunError(f"--resume: train.max_steps={config.train.max_steps} is below the step of {ckpt_path} "
                       f"({step}): nothing to train; give train.max_steps above {step} to train further")
    if config.train.max_steps == step:
        print(f"seqdiff: {ckpt_path} is already at train.max_steps={step}: nothing to train (give a larger "
              f"train.max_steps to train further)", file=sys.stderr)
    note_stretched_schedule(changes, config.train, step)
    return step


def note_stretched_schedule(changes: dict[str, tuple], tcfg: TrainConfig, step: int) -> None:
    """One line on stderr when a new train.max_steps moves the learning rate of the resumed step (a cosine decays
    to 0 at max_steps: a finished run resumed with more steps starts again from a high rate). Not an error: it is
    what a longer run means, but the jump is easy to miss."""
    if "train.max_steps" not in changes or tcfg.max_steps <= step or changes["train.max_steps"][0] is None:
        return
    decay, old_max = LR_SCHEDULES[tcfg.lr_schedule], int(changes["train.max_steps"][0])
    was, now = (tcfg.lr * decay(step, tcfg.warmup_steps, m) for m in (old_max, tcfg.max_steps))
    if not math.isclose(was, now, rel_tol=0.01, abs_tol=1e-12):
        print(f"seqdiff: train.max_steps {old_max} -> {tcfg.max_steps} stretches train.lr_schedule="
              f"{tcfg.lr_schedule}: the learning rate at step {step} becomes {now:.3g} (it was {was:.3g}), and "
              f"decays to 0 at step {tcfg.max_steps}", file=sys.stderr)
