"""A `tokenizer.json` that transformers loads as it is, so an exported model can be tokenized for.

`AutoTokenizer.from_pretrained(EXPORT_DIR)` reads `tokenizer_config.json` (`tokenizer_class:
PreTrainedTokenizerFast`, the special tokens, `model_max_length`) and builds the tokenizer from
`tokenizer.json` (the `tokenizers` library's own format), with no seqdiff code and no trust_remote_code.
Its ids equal seqdiff's `Tokenizer.encode` (tested on real text and DNA):

- gpt2: GPT-2's byte-level BPE, with seqdiff's appended [MASK] (50257) and [PAD] (50258);
- bert: WordPiece with BERT's normalizer and pre-tokenizer; [CLS] / [SEP] / [PAD] / [MASK] / [UNK] from the
  vocabulary; no [CLS] / [SEP] is added around a text (seqdiff's encode adds none either);
- char and nucleotide: a word-level model over single characters (text8 normalization, or upper-casing and
  IUPAC ambiguity codes to N, done by the normalizer), the specials appended as in seqdiff.

One difference is inherent to transformers: a literal "[MASK]" or "<|endoftext|>" inside a text becomes
the special id there, where seqdiff encodes it as ordinary text. A character outside a character
vocabulary is refused by both.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as FastTokenizer

from seqdiff.tokenizers import BertTokenizer, CharTokenizer, GPT2Tokenizer, NucleotideTokenizer, Tokenizer
from seqdiff.tokenizers.base import SPECIAL_TOKENS, TOKENIZER_CONFIG_FILE, TokenizerError
from seqdiff.tokenizers.char import TEXT8_ALPHABET
from seqdiff.tokenizers.hf import BERT_SPECIALS, ENDOFTEXT
from seqdiff.tokenizers.nucleotide import IUPAC_AMBIGUOUS

TOKENIZER_JSON = "tokenizer.json"
GPT2_APPENDED = ("[MASK]", "[PAD]")
"""seqdiff's GPT-2 ids after the vocabulary, in order (mask_id = 50257, pad_id = 50258)."""


def _special(content: str) -> AddedToken:
    return AddedToken(content, special=True, normalized=False)


def _gpt2(tok: GPT2Tokenizer) -> tuple[FastTokenizer, dict[str, str]]:
    fast = FastTokenizer.from_str(tok._fast.to_str())  # a copy: the BPE, byte-level pre-tokenizer and decoder
    fast.add_special_tokens([_special(ENDOFTEXT), *map(_special, GPT2_APPENDED)])
    return fast, {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "mask_token": "[MASK]", "pad_token": "[PAD]",
                  "unk_token": ENDOFTEXT}


def _bert(tok: BertTokenizer) -> tuple[FastTokenizer, dict[str, str]]:
    fast = FastTokenizer.from_str(tok._fast.to_str())
    fast.add_special_tokens([_special(t) for t in BERT_SPECIALS.values()])
    s = BERT_SPECIALS
    return fast, {"bos_token": s["bos"], "eos_token": s["eos"], "cls_token": s["bos"], "sep_token": s["eos"],
                  "pad_token": s["pad"], "mask_token": s["mask"], "unk_token": s["unk"]}


def _characters(tok: Tokenizer, normalizer) -> tuple[FastTokenizer, dict[str, str]]:
    """Word level over single characters; specials appended after the symbols, as seqdiff numbers them."""
    vocab = {s: i for i, s in enumerate(tok.symbols)}
    vocab.update(zip(SPECIAL_TOKENS, (tok.bos_id, tok.eos_id, tok.pad_id, tok.mask_id)))
    if sorted(vocab.values()) != list(range(tok.vocab_size)):
        raise TokenizerError(f"{tok.kind} tokenizer: ids are not 0..{tok.vocab_size - 1}; no tokenizer.json written")
    fast = FastTokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))  # no [UNK]: unknown characters fail
    if normalizer is not None:
        fast.normalizer = normalizer
    fast.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    fast.decoder = decoders.Fuse()
    fast.add_special_tokens([_special(t) for t in SPECIAL_TOKENS])
    bos, eos, pad, mask = SPECIAL_TOKENS
    return fast, {"bos_token": bos, "eos_token": eos, "pad_token": pad, "mask_token": mask}


def _char(tok: CharTokenizer) -> tuple[FastTokenizer, dict[str, str]]:
    text8 = None
    if tok.normalize == "text8":  # seqdiff.tokenizers.char.text8_normalize
        assert set(tok.alphabet) == set(TEXT8_ALPHABET)
        text8 = normalizers.Sequence([normalizers.Lowercase(), normalizers.Replace(Regex("[^a-z]+"), " ")])
    return _characters(tok, text8)


def _nucleotide(tok: NucleotideTokenizer) -> tuple[FastTokenizer, dict[str, str]]:
    steps = [normalizers.Replace(b.lower(), b) for b in "ACGTN"]  # soft-masked bases are upper-cased
    steps.append(normalizers.Replace(Regex(f"[{IUPAC_AMBIGUOUS}{IUPAC_AMBIGUOUS.lower()}]"), "N"))
    return _characters(tok, normalizers.Sequence(steps))


BUILDERS: dict[str, Callable[[Tokenizer], tuple[FastTokenizer, dict[str, str]]]] = {
    GPT2Tokenizer.kind: _gpt2,
    BertTokenizer.kind: _bert,
    CharTokenizer.kind: _char,
    NucleotideTokenizer.kind: _nucleotide,
}


def fast_tokenizer(tok: Tokenizer) -> tuple[FastTokenizer, dict[str, str]]:
    """seqdiff tokenizer -> (`tokenizers` tokenizer with the same ids, the special-token strings)."""
    if tok.kind not in BUILDERS:
        raise TokenizerError(f"no tokenizer.json for tokenizer kind {tok.kind!r}; known: {sorted(BUILDERS)}")
    return BUILDERS[tok.kind](tok)


def write_hf_tokenizer(tok: Tokenizer, directory: str | Path, model_max_length: int) -> Path:
    """Write tokenizer.json and add transformers' keys to the tokenizer_config.json seqdiff wrote there.

    seqdiff's own keys (`kind`, the vocabulary, ...) stay, so seqdiff reads the directory as before.
    """
    directory = Path(directory)
    fast, specials = fast_tokenizer(tok)
    fast.save(str(directory / TOKENIZER_JSON))
    path = directory / TOKENIZER_CONFIG_FILE
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else tok.to_dict()
    config.update(specials)
    config.update({"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(model_max_length),
                   "padding_side": "right", "model_input_names": ["input_ids", "attention_mask"]})
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return directory / TOKENIZER_JSON


__all__ = ["BUILDERS", "TOKENIZER_JSON", "fast_tokenizer", "write_hf_tokenizer"]
