"""Backbones: nn.Modules that map token ids (+ an optional noise level) to logits / hidden states.

`BACKBONES` maps the `model.backbone` config key to a class built as `cls(cfg, vocab_size, causal)`.
A class that can start from published weights (`model.init_from`) also has `config_from_pretrained(path)`
(the ModelConfig fields the weights fix) and `load_pretrained(path)`. `head_parameters()` lists the output
head's parameters (what acts after the last block), for `train.freeze_backbone_steps` and
`train.backbone_lr_scale`.
"""

from __future__ import annotations

import dataclasses

from torch import nn

from seqdiff.backbones.bert import Bert, BertLayer
from seqdiff.backbones.dit import DiT, DiTBlock, KVCache
from seqdiff.config import ConfigError, ModelConfig

BACKBONES: dict[str, type] = {"dit": DiT, "bert": Bert}
BLOCKS: tuple[type, ...] = (DiTBlock, BertLayer)
"""The transformer block classes of the backbones: FSDP shards each one as a unit (train.strategy=fsdp, fsdp2)."""


def build_backbone(cfg: ModelConfig, vocab_size: int, causal: bool) -> nn.Module:
    """Instantiate the backbone named by `cfg.backbone`."""
    try:
        cls = BACKBONES[cfg.backbone]
    except KeyError:
        raise ConfigError(f"model.backbone={cfg.backbone!r} is unknown; choose one of {sorted(BACKBONES)}") from None
    if cfg.time_conditioning is None:  # left to the method (seqdiff.methods.build_model); a bare backbone: off
        cfg = dataclasses.replace(cfg, time_conditioning=False)
    return cls(cfg, vocab_size=vocab_size, causal=causal)


def _pretrained_class(cfg: ModelConfig) -> type:
    cls = BACKBONES.get(cfg.backbone)
    if cls is None or not hasattr(cls, "config_from_pretrained"):
        able = sorted(name for name, c in BACKBONES.items() if hasattr(c, "config_from_pretrained"))
        raise ConfigError(f"model.init_from needs a backbone that loads published weights ({able}); "
                          f"model.backbone={cfg.backbone!r} does not")
    return cls


def pretrained_model_config(cfg: ModelConfig) -> tuple[ModelConfig, dict[str, tuple]]:
    """The config with the fields that `model.init_from`'s weights fix (shape, activation) taken from them.

    Returns (config, {key: (recipe value, checkpoint value)} for every key that changed).
    """
    fields = _pretrained_class(cfg).config_from_pretrained(cfg.init_from)
    changed = {k: (getattr(cfg, k), v) for k, v in fields.items() if getattr(cfg, k) != v}
    return dataclasses.replace(cfg, **fields), changed


def load_pretrained(backbone: nn.Module, cfg: ModelConfig) -> dict[str, list[str]]:
    """Copy `model.init_from`'s weights into a freshly built backbone; {"loaded": names, "fresh": names}."""
    _pretrained_class(cfg)
    return backbone.load_pretrained(cfg.init_from)


__all__ = ["BACKBONES", "BLOCKS", "Bert", "DiT", "KVCache", "build_backbone", "load_pretrained",
           "pretrained_model_config"]
