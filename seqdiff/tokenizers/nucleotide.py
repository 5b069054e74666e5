"""Nucleotide tokenizer: A, C, G, T, N plus BOS / EOS / PAD / MASK, with a complement map.

Lowercase (soft-masked) bases are uppercased; IUPAC ambiguity codes (R, Y, K, M, S, W, B, D, H, V) map
to N. `complement_ids` maps every id to the id of its complement (specials to themselves), so reverse
complement of a batch is `complement_ids[ids].flip(-1)`.

`save_pretrained(dir)` writes the Hugging Face layout (`vocab.txt`, one token per line with id = line
number, `tokenizer_config.json`, `special_tokens_map.json`); `from_pretrained(dir)` and
`seqdiff.tokenizers.load_tokenizer(dir)` read it back. `transformers` is not needed for either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from seqdiff.tokenizers.base import (
    SPECIAL_TOKENS,
    TOKENIZER_CONFIG_FILE,
    Tokenizer,
    TokenizerError,
    build_lookup_table,
    encode_with_table,
    read_tokenizer_config,
)

BASES = "ACGTN"
IUPAC_AMBIGUOUS = "RYKMSWBDHV"
COMPLEMENT = {"A": "T", "C": "G", "G": "C", "T": "A", "N": "N"}
VOCAB_FILE = "vocab.txt"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"


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

    @property
    def lookup_table(self) -> np.ndarray:
        """Read-only 256-entry byte -> id table (-1 = not a nucleotide), for vectorized encoding of raw bytes."""
        view = self._table.view()
        view.flags.writeable = False
        return view

    def encode_bytes(self, raw: np.ndarray) -> np.ndarray:
        """uint8 array of FASTA bytes -> int64 ids, -1 where a byte is not a nucleotide (caller reports it)."""
        return self._table[raw]

    @property
    def tokens(self) -> list[str]:
        """Every token in id order: the bases, then the special tokens."""
        return self.symbols + list(SPECIAL_TOKENS)

    def reverse_complement(self, ids: torch.Tensor) -> torch.Tensor:
        """Reverse complement along the last dimension."""
        comp = self.complement_ids.to(ids.device)
        # gather, not comp[ids]: advanced indexing with a large index tensor is ~100x slower on CPU
        return comp.gather(0, ids.reshape(-1)).reshape(ids.shape).flip(-1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NucleotideTokenizer:
        if data.get("kind") != cls.kind:
            raise TokenizerError(f"not a nucleotide tokenizer description: {data}")
        return cls()

    # ------------------------------------------------------------------ Hugging Face layout
    def save_pretrained(self, directory: str | Path) -> Path:
        """Write vocab.txt, tokenizer_config.json (our `kind` plus the HF keys) and special_tokens_map.json."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / VOCAB_FILE).write_text("".join(t + "\n" for t in self.tokens))
        bos, eos, pad, mask = SPECIAL_TOKENS
        special = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "mask_token": mask}
        config = {
            **self.to_dict(),
            **special,
            "tokenizer_class": type(self).__name__,
            "vocab_file": VOCAB_FILE,
            "do_lower_case": False,
            "padding_side": "right",
            "model_input_names": ["input_ids", "attention_mask"],
            "complement": {b: COMPLEMENT[b] for b in BASES},
        }
        path = directory / TOKENIZER_CONFIG_FILE
        path.write_text(json.dumps(config, indent=2) + "\n")
        (directory / SPECIAL_TOKENS_MAP_FILE).write_text(json.dumps(special, indent=2) + "\n")
        return path

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> NucleotideTokenizer:
        """Read a directory written by `save_pretrained`; a vocab.txt that disagrees with ours is refused."""
        directory = Path(directory)
        data = read_tokenizer_config(directory)
        if "kind" not in data and data.get("tokenizer_class") == cls.__name__:
            data = {**data, "kind": cls.kind}
        tok = cls.from_dict(data)
        vocab = directory / data.get("vocab_file", VOCAB_FILE)
        if vocab.is_file():
            found = vocab.read_text().splitlines()
            if found != tok.tokens:
                raise TokenizerError(f"{vocab} lists {found}, but the nucleotide tokenizer has {tok.tokens}")
        return tok
