"""Backbones: nn.Modules that map token ids (+ an optional noise level) to logits / hidden states.

`BACKBONES` maps the `model.backbone` config key to a class built as `cls(cfg, vocab_size, causal)`.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from seqdiff.backbones.dit import DiT, KVCache
from seqdiff.config import ConfigError, ModelConfig

BACKBONES: dict[str, type] = {"dit": DiT}


def build_backbone(cfg: ModelConfig, vocab_size: int, causal: bool) -> nn.Module:
    """Instantiate the backbone named by `cfg.backbone`."""
    try:
        cls = BACKBONES[cfg.backbone]
    except KeyError:
        raise ConfigError(f"model.backbone={cfg.backbone!r} is unknown; choose one of {sorted(BACKBONES)}") from None
    if cfg.time_conditioning is None:  # left to the method (seqdiff.methods.build_model); a bare backbone: off
        cfg = dataclasses.replace(cfg, time_conditioning=False)
    return cls(cfg, vocab_size=vocab_size, causal=causal)


__all__ = ["BACKBONES", "DiT", "KVCache", "build_backbone"]
