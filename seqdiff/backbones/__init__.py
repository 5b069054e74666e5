"""Backbones: nn.Modules that map token ids (+ an optional noise level) to logits / hidden states.

`BACKBONES` maps the `model.backbone` config key to a class built as `cls(cfg, vocab_size, causal)`.
A class that can start from published weights (`model.init_from`) also has `config_from_pretrained(path)`
(the ModelConfig fields the weights fix) and `load_pretrained(path)`. `head_parameters()` lists the output
head's parameters (what acts after the last block), for `train.freeze_backbone_steps` and
`train.backbone_lr_scale`.
`model.rc_equivariant` (shared / conjoined) wraps the backbone in `RCEquivariant`, which needs the
tokenizer's complement map (`complement_ids`).
"""

from __future__ import annotations

import dataclasses

from torch import Tensor, nn

from seqdiff.backbones.bert import Bert, BertLayer
from seqdiff.backbones.dit import DiT, DiTBlock, KVCache
from seqdiff.backbones.rc_equivariant import RCEquivariant, wrap_rc
from seqdiff.config import ConfigError, ModelConfig

BACKBONES: dict[str, type] = {"dit": DiT, "bert": Bert}
BLOCKS: tuple[type, ...] = (DiTBlock, BertLayer)
"""The transformer block classes of the backbones: FSDP shards each one as a unit (train.strategy=fsdp, fsdp2)."""


def build_backbone(cfg: ModelConfig, vocab_size: int, causal: bool, complement_ids: Tensor | None = None
                   ) -> nn.Module:
    """Instantiate the backbone named by `cfg.backbone` (RC-equivariant when `cfg.rc_equivariant` asks for it)."""
    try:
        cls = BACKBONES[cfg.backbone]
    except KeyError:
        raise ConfigError(f"model.backbone={cfg.backbone!r} is unknown; choose one of {sorted(BACKBONES)}") from None
    if cfg.time_conditioning is None:  # left to the method (seqdiff.methods.build_model); a bare backbone: off
        cfg = dataclasses.replace(cfg, time_conditioning=False)
    if cfg.rc_equivariant != "none":
        if causal:  # checked before the complement map: an AR recipe fails here whatever its tokenizer
            raise ConfigError(f"model.rc_equivariant={cfg.rc_equivariant} needs a bidirectional model; a causal "
                              "(AR) model cannot be RC-equivariant per position (set model.rc_equivariant=none)")
        if complement_ids is None:
            raise ConfigError(f"model.rc_equivariant={cfg.rc_equivariant} needs a tokenizer with a complement map "
                              "(data.tokenizer=nucleotide); this tokenizer has none")
    return wrap_rc(cls(cfg, vocab_size=vocab_size, causal=causal), cfg.rc_equivariant, complement_ids)


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


__all__ = ["BACKBONES", "BLOCKS", "Bert", "DiT", "KVCache", "RCEquivariant", "build_backbone", "load_pretrained",
           "pretrained_model_config"]
