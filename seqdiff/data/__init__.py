"""Data: corpora on disk, block construction, and the data classes (registries DATA_CLASSES, DATA_MODULES).

Each data kind has a plain class (its splits, training batches and evaluation blocks) and that class as a Lightning
data module (seqdiff.data.modules), for training. Both are imported on first use, and evaluation builds the plain
one (`build_data`), so that commands that do not train (`seqdiff data list`, `eval`) do not load Lightning.
"""

from __future__ import annotations

from importlib import import_module

from seqdiff.config import ConfigError, DataConfig
from seqdiff.tokenizers.base import Tokenizer

DATA_CLASSES: dict[str, str] = {
    "text": "seqdiff.data.text:TextData",
    "fasta": "seqdiff.data.fasta:FastaData",
}
"""Registry: data.kind -> "module:class" of its data class (no Lightning)."""
DATA_MODULES: dict[str, str] = {
    "text": "seqdiff.data.modules:TextDataModule",
    "fasta": "seqdiff.data.modules:FastaDataModule",
}
"""Registry: data.kind -> "module:class" of its LightningDataModule (the data class with Lightning's hooks)."""


def _registered(registry: dict[str, str], kind: str) -> type:
    if kind not in registry:
        raise ConfigError(f"data.kind={kind!r} is unknown; choose one of {sorted(registry)}")
    module, name = registry[kind].split(":")
    return getattr(import_module(module), name)


def data_module_class(kind: str) -> type:
    return _registered(DATA_MODULES, kind)


def build_data_module(config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
    """The data of `config` as a LightningDataModule, for a Trainer."""
    return data_module_class(config.kind)(config, tokenizer, seed=seed)


def build_data(config: DataConfig, tokenizer: Tokenizer, seed: int = 0):
    """The data of `config` without Lightning (the same splits and blocks), for evaluation."""
    return _registered(DATA_CLASSES, config.kind)(config, tokenizer, seed=seed)
