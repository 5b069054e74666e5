"""Tokenizers: the only way a domain (text, DNA) enters the core. Registry: TOKENIZERS[kind]."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from seqdiff.tokenizers.base import Tokenizer, TokenizerError, read_tokenizer_config
from seqdiff.tokenizers.char import CharTokenizer
from seqdiff.tokenizers.hf import BertTokenizer, GPT2Tokenizer
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer

TOKENIZERS: dict[str, type[Tokenizer]] = {
    CharTokenizer.kind: CharTokenizer,
    NucleotideTokenizer.kind: NucleotideTokenizer,
    GPT2Tokenizer.kind: GPT2Tokenizer,
    BertTokenizer.kind: BertTokenizer,
}


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from the description stored in a checkpoint."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in TOKENIZERS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; allowed: {sorted(TOKENIZERS)}")
    return TOKENIZERS[kind].from_dict(data)


def build_tokenizer(kind: str, **options: Any) -> Tokenizer:
    """Tokenizer from a config: `kind` plus its constructor options (data.tokenizer_options).

    e.g. build_tokenizer("gpt2", vocab_dir="path/to/gpt2") or build_tokenizer("bert"); without vocab_dir
    the GPT-2 and BERT tokenizers read the files that `seqdiff data fetch gpt2-vocab / bert-vocab` put in
    the data directory.
    """
    if kind not in TOKENIZERS:
        raise TokenizerError(f"data.tokenizer={kind!r} is unknown; allowed: {sorted(TOKENIZERS)}")
    cls = TOKENIZERS[kind]
    allowed = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TokenizerError(f"data.tokenizer_options has {unknown}, which the {kind!r} tokenizer does not take; "
                             f"allowed: {allowed}")
    return cls(**options)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    return tokenizer_from_dict(read_tokenizer_config(directory))


__all__ = [
    "TOKENIZERS",
    "BertTokenizer",
    "CharTokenizer",
    "GPT2Tokenizer",
    "NucleotideTokenizer",
    "Tokenizer",
    "TokenizerError",
    "build_tokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
]
