"""Data: corpora on disk, block construction, and Lightning data modules (registry DATA_MODULES).

Data modules are imported on first use, so that light commands (`seqdiff data list`) do not load
Lightning.
"""

from __future__ import annotations

from importlib import import_module

from seqdiff.config import ConfigError, DataConfig
from seqdiff.tokenizers.base import Tokenizer

DATA_MODULES: dict[str, str] = {
    "text": "seqdiff.data.text:TextDataModule",
    "fasta": "seqdiff.data.fasta:FastaDataModule",
}
"""Registry: data.kind -> "module:class" of its LightningDataModule."""


def data_module_class(kind: str) -> type:
    if kind not in DATA_MODULES:
        raise ConfigError(f"data.kind={kind!r} is unknown; choose one of {sorted(DATA_MODULES)}")
    module, name = DATA_MODULES[kind].split(":")
    return getattr(import_module(module), name)


def build_data_module(config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
    return data_module_class(config.kind)(config, tokenizer, seed=seed)
