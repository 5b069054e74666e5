"""Load what `eval`, `sample` and the benchmarks need from a checkpoint: backbone (EMA weights by
default), method, tokenizer and configs. Accepts a `.ckpt` file or a run directory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from seqdiff.backbones import build_backbone
from seqdiff.config import DataConfig, MethodConfig, ModelConfig, from_dict
from seqdiff.methods import Method, build_method
from seqdiff.tokenizers import Tokenizer, tokenizer_from_dict

LAST_CHECKPOINT = Path("checkpoints") / "last.ckpt"


class CheckpointError(ValueError):
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


def resolve_checkpoint_path(path: str | Path) -> Path:
    path = Path(path)
    if path.is_dir():
        candidate = path / LAST_CHECKPOINT
        if not candidate.is_file():
            raise CheckpointError(f"{path} is a directory without {LAST_CHECKPOINT}: not a seqdiff run directory")
        return candidate
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path


def read_checkpoint(path: Path) -> dict[str, Any]:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many types for a truncated or foreign file
        raise CheckpointError(f"checkpoint {path} cannot be read (truncated or not a torch file): {e}") from e
    if not isinstance(ckpt, dict) or "hyper_parameters" not in ckpt or "state_dict" not in ckpt:
        raise CheckpointError(f"checkpoint {path} was not written by seqdiff (no hyper_parameters/state_dict)")
    return ckpt


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu", use_ema: bool = True,
                    tokenizer: Tokenizer | None = None) -> LoadedModel:
    """Rebuild the model of a checkpoint. A `tokenizer` given here must match the checkpoint's vocabulary."""
    path = resolve_checkpoint_path(path)
    ckpt = read_checkpoint(path)
    hp = ckpt["hyper_parameters"]
    try:
        model_config = from_dict(ModelConfig, hp["model"])
        method_config = from_dict(MethodConfig, hp["method"])
        data_config = from_dict(DataConfig, hp["data"]) if hp.get("data") else None
        saved_tokenizer = tokenizer_from_dict(hp["tokenizer"])
    except KeyError as e:
        raise CheckpointError(f"checkpoint {path} lacks the {e} configuration") from e
    tokenizer = tokenizer or saved_tokenizer
    method = build_method(method_config, tokenizer)
    backbone = build_backbone(model_config, tokenizer.vocab_size, causal=method.causal)

    weights = {k.removeprefix("backbone."): v for k, v in ckpt["state_dict"].items() if k.startswith("backbone.")}
    ema = use_ema and "ema_state_dict" in ckpt
    if ema:
        weights.update(ckpt["ema_state_dict"])
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
    backbone.to(device).eval()
    return LoadedModel(backbone=backbone, method=method, tokenizer=tokenizer, model_config=model_config,
                       method_config=method_config, data_config=data_config, seq_len=int(hp["seq_len"]),
                       step=int(ckpt.get("global_step", 0)), path=path, ema=ema)
