"""The tokenizer interface the core relies on: a vocabulary size and the special-token ids.

The core (methods, samplers, backbones) never looks inside a tokenizer beyond these ids; a domain
enters seqdiff only through a tokenizer and a data module. Every tokenizer serializes to a small dict
(`to_dict`) stored in each checkpoint, so `eval` and `sample` never ask which tokenizer was used.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from seqdiff.errors import SeqdiffError

SPECIAL_TOKENS = ("[BOS]", "[EOS]", "[PAD]", "[MASK]")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"


class TokenizerError(SeqdiffError):
    """Text that a tokenizer cannot encode, or a saved tokenizer that cannot be read."""


class Tokenizer(ABC):
    """Maps text to integer ids; special ids are appended after the regular symbols (never colliding)."""

    kind: ClassVar[str]
    """Registry key (see seqdiff.tokenizers.TOKENIZERS)."""
    unit: ClassVar[str | None] = None
    """What one regular token is ("character", "base"), so bits per unit equal bits per token; None for BPE."""

    def __init__(self, symbols: Sequence[str]):
        if len(set(symbols)) != len(symbols):
            raise TokenizerError("tokenizer symbols must be distinct")
        self.symbols: list[str] = list(symbols)
        self.num_regular = len(self.symbols)
        self.bos_id, self.eos_id, self.pad_id, self.mask_id = range(
            self.num_regular, self.num_regular + len(SPECIAL_TOKENS)
        )

    # ------------------------------------------------------------------ sizes and ids
    @property
    def vocab_size(self) -> int:
        """Embedding rows needed: regular symbols plus BOS, EOS, PAD, MASK."""
        return self.num_regular + len(SPECIAL_TOKENS)

    def __len__(self) -> int:
        return self.vocab_size

    @property
    def special_ids(self) -> list[int]:
        return [self.bos_id, self.eos_id, self.pad_id, self.mask_id]

    # ------------------------------------------------------------------ text <-> ids
    @abstractmethod
    def encode(self, text: str) -> np.ndarray:
        """Text -> int64 id array (vectorized; no special tokens added)."""

    normalizes_away: ClassVar[bool] = False
    """Whether `encode` may turn characters into something else (text8 normalization): then `outside_share`
    tells how much of a text the model does not see, and the data modules warn when it is most of it."""

    def outside_share(self, text: str) -> float:
        """Share of the text's non-whitespace characters that encoding replaces (0: every one is encoded)."""
        return 0.0

    def decode(self, ids: Sequence[int] | np.ndarray, mask_char: str = "_") -> str:
        """Ids -> text; BOS/EOS/PAD are dropped, MASK shows as `mask_char`."""
        out = []
        for i in np.asarray(ids).reshape(-1).tolist():
            if i < self.num_regular:
                out.append(self.symbols[i])
            elif i == self.mask_id:
                out.append(mask_char)
            elif i >= self.vocab_size or i < 0:
                raise TokenizerError(f"id {i} is outside the vocabulary of size {self.vocab_size}")
        return "".join(out)

    # ------------------------------------------------------------------ persistence
    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """A JSON-serializable description from which `from_dict` rebuilds an identical tokenizer."""

    @classmethod
    @abstractmethod
    def from_dict(cls, data: dict[str, Any]) -> Tokenizer:
        ...

    def save_pretrained(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / TOKENIZER_CONFIG_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_dict() == other.to_dict()

    def identity(self) -> str:
        """sha256 of the whole description (`to_dict`): equal for tokenizers that map every text to the same ids,
        so files made for one model (an NCE energy) can be matched to another without storing the vocabulary."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        """'char, 31 ids': what a message names when two models' tokenizers differ."""
        return f"{self.kind}, {self.vocab_size:,} ids"

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size})"


def read_tokenizer_config(directory: str | Path) -> dict[str, Any]:
    """The JSON object in <directory>/tokenizer_config.json; a missing or malformed file names the path."""
    path = Path(directory) / TOKENIZER_CONFIG_FILE
    if not path.is_file():
        raise TokenizerError(f"{path} does not exist: no tokenizer saved in {directory}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} must hold a JSON object")
    return data


def build_lookup_table(symbols: Sequence[str], extra: dict[str, int] | None = None) -> np.ndarray:
    """A 256-entry byte -> id table (-1 = not encodable), for vectorized encoding of ASCII text."""
    table = np.full(256, -1, dtype=np.int64)
    for i, s in enumerate(symbols):
        if len(s) != 1 or ord(s) > 127:
            raise TokenizerError(f"symbol {s!r} is not a single ASCII character")
        table[ord(s)] = i
    for ch, i in (extra or {}).items():
        table[ord(ch)] = i
    return table


def encode_with_table(text: str, table: np.ndarray, what: str) -> np.ndarray:
    """Vectorized encoding; the first unencodable character is named with its offset."""
    try:
        raw = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
    except UnicodeEncodeError as e:
        raise TokenizerError(f"{what}: non-ASCII character {text[e.start]!r} at offset {e.start}") from e
    ids = table[raw]
    bad = np.flatnonzero(ids < 0)
    if bad.size:
        pos = int(bad[0])
        raise TokenizerError(
            f"{what}: character {text[pos]!r} at offset {pos} is not in the vocabulary "
            f"({int(bad.size)} such characters in all)"
        )
    return ids
