"""Data: corpora on disk, block construction, and Lightning data modules (registry DATA_MODULES)."""

from __future__ import annotations

from seqdiff.config import ConfigError, DataConfig
from seqdiff.data.text import TextDataModule
from seqdiff.tokenizers.base import Tokenizer

DATA_MODULES = {"text": TextDataModule}


def build_data_module(config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
    if config.kind not in DATA_MODULES:
        raise ConfigError(f"data.kind={config.kind!r} is unknown; choose one of {sorted(DATA_MODULES)}")
    return DATA_MODULES[config.kind](config, tokenizer, seed=seed)
