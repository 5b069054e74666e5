"""Nucleotide tokenizer: A, C, G, T, N plus BOS / EOS / PAD / MASK, with a complement map.

Lowercase (soft-masked) bases are uppercased; IUPAC ambiguity codes (R, Y, K, M, S, W, B, D, H, V) map
to N. `complement_ids` maps every id to the id of its complement (specials to themselves), so reverse
complement of a batch is `complement_ids[ids].flip(-1)`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from seqdiff.tokenizers.base import Tokenizer, TokenizerError, build_lookup_table, encode_with_table

BASES = "ACGTN"
IUPAC_AMBIGUOUS = "RYKMSWBDHV"
COMPLEMENT = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N"}


class NucleotideTokenizer(Tokenizer):
    kind = "nucleotide"
    unit = "base"

    def __init__(self) -> None:
        super().__init__(list(BASES))
        n_id = BASES.index("N")
        extra = {c.lower(): i for i, c in enumerate(BASES)}
        extra.update({c: n_id for c in IUPAC_AMBIGUOUS})
        extra.update({c.lower(): n_id for c in IUPAC_AMBIGUOUS})
        self._table = build_lookup_table(self.symbols, extra)
        comp = list(range(self.vocab_size))
        for base, other in COMPLEMENT.items():
            comp[BASES.index(base)] = BASES.index(other)
        self.complement_ids = torch.tensor(comp, dtype=torch.long)
        self.n_id = n_id

    def encode(self, text: str) -> np.ndarray:
        return encode_with_table(text, self._table, "nucleotide tokenizer")

    def reverse_complement(self, ids: torch.Tensor) -> torch.Tensor:
        """Reverse complement along the last dimension."""
        return self.complement_ids.to(ids.device)[ids].flip(-1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NucleotideTokenizer:
        if data.get("kind") != cls.kind:
            raise TokenizerError(f"not a nucleotide tokenizer description: {data}")
        return cls()
