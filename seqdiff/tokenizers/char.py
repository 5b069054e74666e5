"""Character-level tokenizer (text8 style: lowercase a-z and space by default).

With `normalize="text8"` any text is first mapped to the text8 alphabet the way text8 itself was made:
lowercased, every run of characters outside a-z becomes one space. Bits per character are then bits per
token. A custom alphabet (without normalization) is allowed for corpora that keep case and punctuation.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import numpy as np

from seqdiff.tokenizers.base import Tokenizer, TokenizerError, build_lookup_table, encode_with_table

TEXT8_ALPHABET = "abcdefghijklmnopqrstuvwxyz "
_NON_TEXT8 = re.compile(r"[^a-z]+")
_WHITESPACE = re.compile(r"\s")
_LATIN_LETTER = re.compile(r"[a-zA-Z]")


def text8_normalize(text: str) -> str:
    """Lowercase; each run of non a-z characters becomes one space (the text8 convention)."""
    return _NON_TEXT8.sub(" ", text.lower())


class CharTokenizer(Tokenizer):
    kind = "char"
    unit = "character"

    def __init__(self, alphabet: str = TEXT8_ALPHABET, normalize: Literal["text8", "none"] = "text8"):
        if normalize not in ("text8", "none"):
            raise TokenizerError(f"normalize={normalize!r} is not allowed; choose one of ['text8', 'none']")
        if normalize == "text8" and set(alphabet) != set(TEXT8_ALPHABET):
            raise TokenizerError("normalize='text8' needs the text8 alphabet (a-z and space)")
        super().__init__(list(alphabet))
        self.alphabet = alphabet
        self.normalize = normalize
        self._table = build_lookup_table(self.symbols)

    @property
    def normalizes_away(self) -> bool:  # type: ignore[override]
        return self.normalize == "text8"

    def outside_share(self, text: str) -> float:
        """text8: the share of non-whitespace characters that are not a-z / A-Z (they become spaces)."""
        if self.normalize != "text8":
            return 0.0
        visible = len(text) - len(_WHITESPACE.findall(text))
        return 0.0 if visible == 0 else 1 - len(_LATIN_LETTER.findall(text)) / visible

    def encode(self, text: str) -> np.ndarray:
        if self.normalize == "text8":
            text = text8_normalize(text)
        return encode_with_table(text, self._table, "character tokenizer")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "alphabet": self.alphabet, "normalize": self.normalize}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
        try:
            return cls(alphabet=data["alphabet"], normalize=data["normalize"])
        except KeyError as e:
            raise TokenizerError(f"character tokenizer description lacks {e}") from e
