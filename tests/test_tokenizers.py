import numpy as np
import pytest
import torch

from seqdiff.tokenizers import (
    CharTokenizer,
    NucleotideTokenizer,
    TokenizerError,
    build_tokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)


def test_char_text8_normalization_and_round_trip():
    tok = CharTokenizer()
    ids = tok.encode("To be, or NOT to be:\n that's it!")
    assert tok.decode(ids) == "to be or not to be that s it "
    assert ids.dtype == np.int64 and ids.max() < tok.num_regular


def test_special_ids_are_distinct_and_outside_the_alphabet():
    for tok in (CharTokenizer(), NucleotideTokenizer(), CharTokenizer("ab", normalize="none")):
        specials = tok.special_ids
        assert len(set(specials)) == 4
        assert min(specials) == tok.num_regular and max(specials) == tok.vocab_size - 1
        assert tok.mask_id != tok.pad_id


def test_char_custom_alphabet_refuses_unknown_characters():
    tok = CharTokenizer("abc ", normalize="none")
    with pytest.raises(TokenizerError, match=r"'d' at offset 2"):
        tok.encode("abd")
    with pytest.raises(TokenizerError, match="non-ASCII"):
        tok.encode("aé")
    with pytest.raises(TokenizerError, match="text8"):
        CharTokenizer("ab", normalize="text8")


def test_nucleotide_encoding_soft_mask_and_iupac():
    tok = NucleotideTokenizer()
    assert tok.decode(tok.encode("ACGTNacgtn")) == "ACGTNACGTN"
    assert tok.decode(tok.encode("RYKMSWBDHV")) == "N" * 10
    with pytest.raises(TokenizerError, match=r"'X' at offset 1"):
        tok.encode("AXC")


def test_reverse_complement():
    tok = NucleotideTokenizer()
    ids = torch.from_numpy(tok.encode("AACGTN"))
    assert tok.decode(tok.reverse_complement(ids)) == "NACGTT"
    assert torch.equal(tok.reverse_complement(tok.reverse_complement(ids)), ids)
    special = torch.tensor([tok.mask_id, tok.pad_id])
    assert torch.equal(tok.complement_ids[special], special)


@pytest.mark.parametrize("tok", [CharTokenizer(), CharTokenizer("xyz", normalize="none"), NucleotideTokenizer()])
def test_save_and_load(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again == tok and again.vocab_size == tok.vocab_size
    assert tokenizer_from_dict(tok.to_dict()) == tok


def test_bad_tokenizer_descriptions(tmp_path):
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="char"):
        tokenizer_from_dict({"kind": "bpe"})
    with pytest.raises(TokenizerError, match="allowed"):
        build_tokenizer("wordpiece")
