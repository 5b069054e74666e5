"""Load what `eval`, `sample` and the benchmarks need from a checkpoint: backbone (EMA weights by
default), method, tokenizer and configs.

Accepts a `.ckpt` file, a run directory, or a directory written by `seqdiff export` (config.json +
model.safetensors + tokenizer_config.json; read here without transformers).

A `last.ckpt` that cannot be read (truncated, corrupted) is not fatal: `latest_readable_checkpoint` falls
back to the newest readable `step*.ckpt` in the same folder and says so on stderr. `eval`, `sample`,
`export` and `train --resume` all go through it.
"""

from __future__ import annotations

import json
import pickle
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seqdiff.config import ConfigError, DataConfig, MethodConfig, ModelConfig, from_dict
from seqdiff.errors import SeqdiffError
from seqdiff.methods import METHODS, Method, build_model
from seqdiff.tokenizers import Tokenizer, load_tokenizer, tokenizer_from_dict

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"
EXPORT_CONFIG = "config.json"
"""The config file of an exported directory (a transformers config, model_type "seqdiff")."""
EXPORT_WEIGHTS = "model.safetensors"
"""The weights file of an exported directory: the backbone's state dict, keys prefixed with "backbone."."""
EXPORT_MODEL_TYPE = "seqdiff"


class CheckpointError(SeqdiffError):
    """A checkpoint that is missing, unreadable, not from seqdiff, or inconsistent with its tokenizer."""


@dataclass
class LoadedModel:
    backbone: nn.Module
    method: Method
    tokenizer: Tokenizer
    model_config: ModelConfig
    method_config: MethodConfig
    data_config: DataConfig | None
    seq_len: int
    step: int
    path: Path
    ema: bool


def is_exported_dir(path: str | Path) -> bool:
    """Whether `path` is a directory written by `seqdiff export` (config.json + model.safetensors)."""
    path = Path(path)
    return path.is_dir() and (path / EXPORT_CONFIG).is_file() and (path / EXPORT_WEIGHTS).is_file()


def step_checkpoints(folder: Path) -> list[Path]:
    """The `step*.ckpt` files of a checkpoint folder, newest (highest step) first."""
    def key(p: Path) -> tuple[int, float]:
        m = re.fullmatch(r"step[=_-]?(\d+)(?:-v\d+)?\.ckpt", p.name)
        try:
            mtime = p.stat().st_mtime
        except OSError:  # removed meanwhile (a running training keeps only the newest)
            mtime = 0.0
        return (int(m.group(1)) if m else -1, mtime)

    return sorted(folder.glob("step*.ckpt"), key=key, reverse=True)


def resolve_checkpoint_path(path: str | Path) -> Path:
    """A .ckpt file, or the last.ckpt of a run directory (which may be missing if step*.ckpt files exist)."""
    path = Path(path)
    if path.is_dir():
        candidate = path / LAST_CHECKPOINT
        if not candidate.is_file() and not step_checkpoints(candidate.parent):
            if (path / "config.yaml").is_file():  # a run that has not reached its first checkpoint
                raise CheckpointError(f"{path} is a seqdiff run with no checkpoint yet (the first is written at "
                                      f"train.checkpoint_every, or when training ends or is stopped)")
            ckpts = [path / LAST_CHECKPOINT.name] if (path / LAST_CHECKPOINT.name).is_file() else []
            ckpts = ckpts or step_checkpoints(path)
            if ckpts:  # the checkpoints/ folder of a run, given for the run
                run = path.parent if path.name == LAST_CHECKPOINT.parent.name else None
                which = f"the run directory {run}" if run is not None else "the run directory"
                raise CheckpointError(f"{path} is a folder of checkpoints, not a run directory: give {which} or "
                                      f"one checkpoint file in it, e.g. {ckpts[0]}")
            raise CheckpointError(f"{path} is a directory, but not a seqdiff run directory (no "
                                  f"{path / LAST_CHECKPOINT}) nor a model exported by `seqdiff export` (no "
                                  f"{path / EXPORT_CONFIG} + {EXPORT_WEIGHTS}); expected a .ckpt file, a run "
                                  f"directory or an exported directory")
        return candidate
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def _notify(message: str) -> None:
    print(f"seqdiff: {message}", file=sys.stderr, flush=True)


def latest_readable_checkpoint(last: str | Path) -> tuple[Path, dict[str, Any]]:
    """(path, contents) of `last` when it reads; else of the newest readable step*.ckpt beside it.

    A fallback is announced on stderr, naming the unreadable file and the one used instead. Raises
    CheckpointError when nothing in the folder can be read.
    """
    last = Path(last)
    try:
        return last, read_checkpoint(last)
    except CheckpointError as e:
        error = f"{last} does not exist" if not last.exists() else str(e).splitlines()[0]
    skipped = []
    for candidate in step_checkpoints(last.parent):
        if candidate == last:
            continue
        try:
            ckpt = read_checkpoint(candidate)
        except CheckpointError:
            skipped.append(candidate.name)
            continue
        also = f" (also unreadable: {', '.join(skipped)})" if skipped else ""
        _notify(f"{error}; falling back to {candidate} (step {ckpt.get('global_step', '?')}){also}")
        return candidate, ckpt
    tried = (f"; step checkpoints tried, unreadable too: {', '.join(skipped)}" if skipped else
             "; no step*.ckpt beside it to fall back to")
    raise CheckpointError(f"{error}{tried}")


def load_plain(path: Path, what: str) -> Any:
    """torch.load of a file seqdiff wrote: tensors and plain values only (torch's weights-only unpickler).

    Why: a pickle may name any class, and the full unpickler imports and runs it, so a checkpoint from elsewhere
    could run code on `seqdiff export` or `sample`. seqdiff's own files hold nothing else. A foreign file is
    refused in one line (one of the MDLM reference code, with OmegaConf objects inside, named as such: its weights
    convert without running anything through seqdiff.hf.convert_mdlm); raises SeqdiffError's CheckpointError."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        names = sorted(set(re.findall(r"GLOBAL ([\w.]+)", str(e))))  # the classes the safe loader refused
        if not names:  # not a pickle it could read at all: garbage, a truncated file
            cause = re.search(r"WeightsUnpickler error:\s*(.+)", str(e))  # torch's own reason, after its advice
            raise CheckpointError(unreadable_message(what, path, cause.group(1) if cause else "")) from e
        if any(name.startswith("omegaconf") for name in names):
            raise CheckpointError(f"{what} {path} is a checkpoint of another code base (it holds {names[0]}, as "
                                  f"the MDLM reference's do); convert its weights with `python -m "
                                  f"seqdiff.hf.convert_mdlm {path} OUT`") from e
        raise CheckpointError(f"{what} {path} holds Python objects other than tensors and plain values "
                              f"({', '.join(names)}); "
                              f"seqdiff reads only files it wrote (loading those objects would run code from the "
                              f"file)") from e
    except Exception as e:  # torch raises many types for a truncated or foreign file
        raise CheckpointError(unreadable_message(what, path, str(e))) from e


def unreadable_message(what: str, path: Path, cause: str) -> str:
    """One whole line for a file torch cannot load: the file, its size, and the first sentence of torch's reason
    (the rest of torch's text is advice about torch.load, not about the file)."""
    try:
        size = f"{Path(path).stat().st_size:,} bytes"
    except OSError:
        size = "size unknown"
    first = re.split(r"(?<=[.!?])\s", " ".join(cause.split()), maxsplit=1)[0].rstrip(".") if cause.strip() else ""
    reason = f"; torch: {first}" if first else ""
    return f"{what} {path} cannot be read: it is truncated or not a torch file ({size}{reason})"


def read_checkpoint(path: Path) -> dict[str, Any]:
    ckpt = load_plain(path, "checkpoint")
    if not isinstance(ckpt, dict) or "hyper_parameters" not in ckpt or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {path} was not written by seqdiff (no hyper_parameters/state_dict)")
    return ckpt


def read_checkpoint_or_run(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(path, contents) of a .ckpt file or of a run directory's last.ckpt, which falls back to the newest
    readable step*.ckpt (`latest_readable_checkpoint`); the path returned is the file actually read."""
    path = resolve_checkpoint_path(path)
    if path.name == LAST_CHECKPOINT.name:
        return latest_readable_checkpoint(path)
    return path, read_checkpoint(path)


def _build(model_config: ModelConfig, method_config: MethodConfig, tokenizer: Tokenizer, path: Path):
    try:
        return build_model(model_config, method_config, tokenizer)
    except ConfigError as e:
        raise CheckpointError(f"{path}: {e}") from e


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", use_ema: bool = True,
                    tokenizer: Tokenizer | None = None) -> LoadedModel:
    """Rebuild the model of a checkpoint, run directory or exported directory.

    A `tokenizer` given here must match the checkpoint's vocabulary. An exported directory holds one set of
    weights (EMA unless exported with --no-ema); `use_ema` does not apply to it.
    """
    if is_exported_dir(path):
        return load_exported(path, device=device, tokenizer=tokenizer)
    path, ckpt = read_checkpoint_or_run(path)
    return model_from_checkpoint(ckpt, path, device=device, use_ema=use_ema, tokenizer=tokenizer)


def model_from_checkpoint(ckpt: dict[str, Any], path: Path, device: str | torch.device = "cpu",
                          use_ema: bool = True, tokenizer: Tokenizer | None = None) -> LoadedModel:
    """Rebuild the model from the contents of a checkpoint already read (see `read_checkpoint`)."""
    hp = ckpt["hyper_parameters"]
    try:
        model_config = from_dict(ModelConfig, hp["model"])
        method_config = from_dict(MethodConfig, hp["method"])
        data_config = from_dict(DataConfig, hp["data"]) if hp.get("data") else None
        saved_tokenizer = tokenizer_from_dict(hp["tokenizer"])
    except KeyError as e:
        raise CheckpointError(f"checkpoint {path} lacks the {e} configuration") from e
    tokenizer = tokenizer or saved_tokenizer
    method, backbone, model_config = _build(model_config, method_config, tokenizer, path)

    weights = {k.removeprefix("backbone."): v for k, v in ckpt["state_dict"].items() if k.startswith("backbone.")}
    ema = use_ema and "ema_state_dict" in ckpt
    if ema:
        weights.update(ckpt["ema_state_dict"])
    _load_weights(backbone, weights, path, tokenizer)
    backbone.to(device).eval()
    return LoadedModel(backbone=backbone, method=method, tokenizer=tokenizer, model_config=model_config,
                       method_config=method_config, data_config=data_config, seq_len=int(hp["seq_len"]),
                       step=int(ckpt.get("global_step", 0)), path=path, ema=ema)


def _load_weights(backbone: nn.Module, weights: dict[str, torch.Tensor], path: Path, tokenizer: Tokenizer) -> None:
    expected = backbone.state_dict()
    for name, tensor in weights.items():
        if name in expected and expected[name].shape != tensor.shape:
            raise CheckpointError(
                f"checkpoint {path}: {name} has shape {tuple(tensor.shape)} but the tokenizer "
                f"({tokenizer!r}) needs {tuple(expected[name].shape)}; the vocabulary does not match the tokenizer"
            )
    missing, unexpected = backbone.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint {path}: missing weights {missing[:5]}, unexpected {unexpected[:5]}")
    bad = [n for n, t in weights.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise CheckpointError(f"checkpoint {path}: {len(bad)} weight tensors hold NaN or inf (e.g. {bad[0]}): the "
                              f"training that wrote it diverged; use an earlier checkpoint, or train again with a "
                              f"lower train.lr")


def read_export_config(path: str | Path) -> dict[str, Any]:
    """config.json of an exported directory, checked: seqdiff's model type and a method this seqdiff knows."""
    file = Path(path) / EXPORT_CONFIG
    try:
        config = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} cannot be read as JSON: {e}") from e
    if not isinstance(config, dict) or config.get("model_type") != EXPORT_MODEL_TYPE:
        found = config.get("model_type") if isinstance(config, dict) else None
        raise CheckpointError(f"{file} has model_type {found!r}, not {EXPORT_MODEL_TYPE!r}: not a model exported "
                              f"by `seqdiff export`")
    for key in ("model", "method", "tokenizer"):
        if not isinstance(config.get(key), dict):
            raise CheckpointError(f"{file} lacks the {key!r} section of a seqdiff export")
    name = config["method"].get("name")
    if name not in METHODS:
        raise CheckpointError(f"{file} names method {name!r}, which this seqdiff does not know; "
                              f"allowed methods: {sorted(METHODS)}")
    return config


def load_exported(path: str | Path, device: str | torch.device = "cpu",
                  tokenizer: Tokenizer | None = None) -> LoadedModel:
    """Rebuild a model from a directory written by `seqdiff export` (no transformers needed)."""
    path = Path(path)
    config = read_export_config(path)
    try:
        model_config = from_dict(ModelConfig, config["model"])
        method_config = from_dict(MethodConfig, config["method"])
        data_config = from_dict(DataConfig, config["data"]) if config.get("data") else None
    except ConfigError as e:
        raise CheckpointError(f"{path / EXPORT_CONFIG}: {e}") from e
    saved_tokenizer = load_tokenizer(path)
    keys = ("vocab_size", "bos_id", "eos_id", "pad_id", "mask_id")
    summary = {k: config["tokenizer"].get(k) for k in keys}
    actual = {k: getattr(saved_tokenizer, k) for k in keys}
    if config["tokenizer"].get("kind") != saved_tokenizer.kind or actual != summary:
        raise CheckpointError(f"{path}: tokenizer_config.json ({saved_tokenizer.kind}, {actual}) does not match "
                              f"the tokenizer recorded in {EXPORT_CONFIG} ({config['tokenizer']})")
    tokenizer = tokenizer or saved_tokenizer
    method, backbone, model_config = _build(model_config, method_config, tokenizer, path)
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path / EXPORT_WEIGHTS))
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{path / EXPORT_WEIGHTS} cannot be read: {e}") from e
    weights = {k.removeprefix("backbone."): v for k, v in tensors.items()}
    _load_weights(backbone, weights, path / EXPORT_WEIGHTS, tokenizer)
    backbone.to(device).eval()
    return LoadedModel(backbone=backbone, method=method, tokenizer=tokenizer, model_config=model_config,
                       method_config=method_config, data_config=data_config, seq_len=int(config.get("seq_len", 0)),
                       step=int(config.get("step", 0)), path=path / EXPORT_WEIGHTS,
                       ema=bool(config.get("ema_weights", False)))
