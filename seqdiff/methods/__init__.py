"""Methods: one file each; METHODS maps config names to classes."""

from __future__ import annotations

from seqdiff.config import ConfigError, MethodConfig
from seqdiff.methods.ar import AR
from seqdiff.methods.base import Batch, Method, MethodOutput
from seqdiff.methods.d3pm import D3PM
from seqdiff.methods.mdlm import MDLM
from seqdiff.methods.sedd import SEDD
from seqdiff.tokenizers.base import Tokenizer

METHODS: dict[str, type[Method]] = {cls.name: cls for cls in (MDLM, AR, SEDD, D3PM)}


def build_method(config: MethodConfig, tokenizer: Tokenizer) -> Method:
    if config.name not in METHODS:
        raise ConfigError(f"method.name={config.name!r} is unknown; choose one of {sorted(METHODS)}")
    return METHODS[config.name](config, tokenizer)


__all__ = ["AR", "D3PM", "MDLM", "METHODS", "SEDD", "Batch", "Method", "MethodOutput", "build_method"]
