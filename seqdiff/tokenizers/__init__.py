"""Tokenizers: the only way a domain (text, DNA) enters the core. Registry: TOKENIZERS[kind]."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seqdiff.tokenizers.base import TOKENIZER_CONFIG_FILE, Tokenizer, TokenizerError
from seqdiff.tokenizers.char import CharTokenizer
from seqdiff.tokenizers.nucleotide import NucleotideTokenizer

TOKENIZERS: dict[str, type[Tokenizer]] = {
    CharTokenizer.kind: CharTokenizer,
    NucleotideTokenizer.kind: NucleotideTokenizer,
}


def tokenizer_from_dict(data: dict[str, Any]) -> Tokenizer:
    """Rebuild a tokenizer from the description stored in a checkpoint."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind not in TOKENIZERS:
        raise TokenizerError(f"unknown tokenizer kind {kind!r}; allowed: {sorted(TOKENIZERS)}")
    return TOKENIZERS[kind].from_dict(data)


def build_tokenizer(kind: str, **options: Any) -> Tokenizer:
    """Tokenizer from a config: `kind` plus its constructor options."""
    if kind not in TOKENIZERS:
        raise TokenizerError(f"data.tokenizer={kind!r} is unknown; allowed: {sorted(TOKENIZERS)}")
    return TOKENIZERS[kind](**options)


def load_tokenizer(directory: str | Path) -> Tokenizer:
    path = Path(directory) / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        raise TokenizerError(f"{path} does not exist: no tokenizer saved in {directory}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON: {e}") from e
    return tokenizer_from_dict(data)


__all__ = [
    "TOKENIZERS",
    "CharTokenizer",
    "NucleotideTokenizer",
    "Tokenizer",
    "TokenizerError",
    "build_tokenizer",
    "load_tokenizer",
    "tokenizer_from_dict",
]
