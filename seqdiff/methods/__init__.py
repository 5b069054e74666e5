"""Methods: one file each; METHODS maps config names to classes."""

from __future__ import annotations

import dataclasses
import sys

from torch import nn

from seqdiff.backbones import BACKBONES, build_backbone
from seqdiff.backbones.rc_equivariant import CONJOINABLE_METHODS
from seqdiff.config import ConfigError, MethodConfig, ModelConfig
from seqdiff.methods.ar import AR
from seqdiff.methods.base import Batch, Method, MethodOutput
from seqdiff.methods.bd3lm import BD3LM
from seqdiff.methods.d3pm import D3PM
from seqdiff.methods.mdlm import MDLM
from seqdiff.methods.sedd import SEDD
from seqdiff.tokenizers.base import Tokenizer

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (MDLM, AR, SEDD, D3PM)}
METHODS[BD3LM.name] = BD3LM
DEFAULT_SAMPLERS: dict[str, str] = {name: cls.default_sampler for name, cls in METHODS.items()}
"""Method name -> the sampler it uses when sample.sampler is null (for help text; code reads the attribute)."""


def build_method(config: MethodConfig, tokenizer: Tokenizer) -> Method:
    if config.name not in METHODS:
        raise ConfigError(f"method.name={config.name!r} is unknown; choose one of {sorted(METHODS)}")
    method = METHODS[config.name](config, tokenizer)
    if config.fused_loss is True and not method.fusable_loss:
        raise ConfigError(f"method.fused_loss=true is for methods whose loss is a weighted cross-entropy of the "
                          f"head ({sorted(n for n, c in METHODS.items() if c.fusable_loss)}); method.name="
                          f"{config.name} needs the full logits: set it to null or false")
    return method


def resolve_model_config(model: ModelConfig, method: Method) -> ModelConfig:
    """Fill what the recipe left to the method (time conditioning)."""
    if model.time_conditioning is None:
        model = dataclasses.replace(model, time_conditioning=method.default_time_conditioning)
    if model.time_conditioning and not method.noise_level_input:  # else it fails at the first training step
        raise ConfigError(f"model.time_conditioning=true needs a method that gives the backbone a noise level; "
                          f"method.name={method.name} has none (leave model.time_conditioning null or set it false)")
    return model


def build_model(model: ModelConfig, method_config: MethodConfig, tokenizer: Tokenizer
                ) -> tuple[Method, nn.Module, ModelConfig]:
    """Method + a backbone that suits it (causal or not, time-conditioned or not); the one place both meet."""
    method = build_method(method_config, tokenizer)
    model = resolve_model_config(model, method)
    if model.rc_equivariant == "conjoined" and not method.causal and method.name not in CONJOINABLE_METHODS:
        raise ConfigError(f"model.rc_equivariant=conjoined averages predicted probabilities: for methods "
                          f"{list(CONJOINABLE_METHODS)}, not method.name={method.name!r} (use shared)")
    backbone = build_backbone(model, tokenizer.vocab_size, causal=method.causal,
                              complement_ids=getattr(tokenizer, "complement_ids", None))
    method.check_backbone(backbone)
    if getattr(method_config, "fused_loss", None) is True and not getattr(backbone, "fuses_loss", False):
        raise ConfigError(f"method.fused_loss=true needs a backbone that computes its loss without the logits "
                          f"(dit, bert, not wrapped for reverse-complement equivariance); model.backbone="
                          f"{model.backbone}, "
                          f"model.rc_equivariant={model.rc_equivariant}: set method.fused_loss to null or false")
    return method, backbone, model


def check_trainable(config, tokenizer: Tokenizer, warn: bool = True) -> Method:
    """The recipe's method, once the checks that need only the recipe (RunConfig) and its tokenizer pass: train
    runs them before anything is written, and `seqdiff config` too, so that it never prints a recipe train would
    refuse (bd3lm's block size must divide data.seq_len, packing needs a method that keeps documents apart).
    `warn`: also say on stderr which keys the method ignores (`foreign_keys`; one process of a multi-process run)."""
    if config.data.seq_len > config.model.max_seq_len:
        raise ConfigError(f"data.seq_len={config.data.seq_len} exceeds model.max_seq_len={config.model.max_seq_len}")
    method = build_method(config.method, tokenizer)
    for note in foreign_keys(config.method, method) if warn else ():  # before training, where the recipe is read
        print(f"seqdiff: warning: {note}", file=sys.stderr)
    method.check_recipe(config)
    check_packing(config, method)
    resolve_model_config(config.model, method)  # time conditioning the method cannot feed
    return method


def foreign_keys(config: MethodConfig, method: Method) -> list[str]:
    """The method.* keys that only another method reads (`Method.own_keys`), set away from their defaults: this
    one ignores them (method.block_size=16 under method.name=mdlm trains no blocks), one line each. Not an error:
    a recipe shared by several methods (experiments.compare_methods) holds every method's keys."""
    defaults, notes = MethodConfig(), []
    for name, cls in METHODS.items():
        if isinstance(method, cls):  # its own keys, and those of the methods it extends
            continue
        notes += [f"method.{key}={getattr(config, key)} is read by method.name={name} only; method.name="
                  f"{method.name} ignores it" for key in cls.own_keys
                  if key not in type(method).own_keys and getattr(config, key) != getattr(defaults, key)]
    return notes


def check_packing(config, method: Method) -> None:
    """data.text.block_mode=packed needs a `packable` method and a backbone class that takes segment ids (not
    wrapped for reverse-complement equivariance): a ConfigError naming the key and what is allowed, before
    anything is written."""
    if config.data.kind != "text" or config.data.text.block_mode != "packed":
        return
    if not method.packable:
        able = sorted(name for name, cls in METHODS.items() if cls.packable)
        raise ConfigError(f"data.text.block_mode=packed needs a method that trains on packed documents "
                          f"({', '.join(able)}); method.name={method.name} cannot (use data.text.block_mode=padded or "
                          f"wrapped)")
    backbone = BACKBONES.get(config.model.backbone)
    if not getattr(backbone, "takes_segment_ids", False) or config.model.rc_equivariant != "none":
        able = sorted(name for name, cls in BACKBONES.items() if getattr(cls, "takes_segment_ids", False))
        raise ConfigError(f"data.text.block_mode=packed needs a backbone with document-aware attention (model.backbone "
                          f"in {able} with model.rc_equivariant=none); got model.backbone={config.model.backbone}, "
                          f"model.rc_equivariant={config.model.rc_equivariant} (use data.text.block_mode=padded)")


__all__ = ["AR", "D3PM", "DEFAULT_SAMPLERS", "MDLM", "METHODS", "SEDD", "Batch", "Method", "MethodOutput",
           "build_method", "build_model", "resolve_model_config", "BD3LM", "foreign_keys", "check_packing"]
