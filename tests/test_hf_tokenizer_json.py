"""tokenizer.json: transformers' AutoTokenizer reads an exported tokenizer and gives seqdiff's ids on real data."""

import gzip
from pathlib import Path

import pytest

from seqdiff.hf.tokenizer_json import TOKENIZER_JSON, write_hf_tokenizer
from seqdiff.tokenizers import BertTokenizer, CharTokenizer, GPT2Tokenizer, NucleotideTokenizer, load_tokenizer

FIXTURES = Path("tests/fixtures")
SHAKESPEARE = Path("seqdiff/data/corpora/shakespeare/test.txt.gz")


def _shakespeare(n=20_000):
    return gzip.open(SHAKESPEARE, "rt", encoding="utf-8").read()[:n]


def _dna():
    lines = (FIXTURES / "grch37_chr20_slices.fa").read_text().splitlines()
    seq = "".join(line for line in lines if not line.startswith(">"))
    middle = seq[40_000:46_000]  # bases and the N run of the second record's gap
    return seq[4_000:6_000] + middle + seq[-3_000:].lower() + "RYKMSWBDHVrykmswbdhv" + "acgtnACGTN"


def _auto(tok, tmp_path, max_len=128):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    write_hf_tokenizer(tok, tmp_path, model_max_length=max_len)
    assert (tmp_path / TOKENIZER_JSON).is_file()
    assert load_tokenizer(tmp_path) == tok  # seqdiff still reads the directory as its own
    return AutoTokenizer.from_pretrained(str(tmp_path))


def _check(tok, hf, text):
    assert hf(text)["input_ids"] == tok.encode(text).tolist()
    assert (hf.mask_token_id, hf.pad_token_id) == (tok.mask_id, tok.pad_id)
    assert (hf.bos_token_id, hf.eos_token_id) == (tok.bos_id, tok.eos_id)
    assert len(hf) == tok.vocab_size


@pytest.mark.parametrize("kind", ["gpt2", "bert", "char-text8", "char-raw"])
def test_text_tokenizers_give_seqdiffs_ids_on_real_text(kind, tmp_path):
    text = _shakespeare()
    tok = {"gpt2": lambda: GPT2Tokenizer(FIXTURES / "gpt2"), "bert": lambda: BertTokenizer(FIXTURES / "bert"),
           "char-text8": CharTokenizer,
           "char-raw": lambda: CharTokenizer(alphabet="".join(sorted(set(text))), normalize="none")}[kind]()
    hf = _auto(tok, tmp_path)
    _check(tok, hf, text)
    assert hf.model_max_length == 128
    if kind == "char-raw":  # every character, newlines and runs of spaces included, is its own token
        assert hf.decode(tok.encode(text).tolist()) == text


def test_nucleotide_tokenizer_gives_seqdiffs_ids_on_real_dna(tmp_path):
    tok = NucleotideTokenizer()
    hf = _auto(tok, tmp_path)
    dna = _dna()
    _check(tok, hf, dna)
    assert set(tok.encode("RYKmsw").tolist()) == {tok.n_id}  # the normalizer did what seqdiff's table does


def test_a_character_outside_the_vocabulary_is_refused_by_both(tmp_path):
    from seqdiff.tokenizers import TokenizerError

    tok = CharTokenizer(alphabet="abc ", normalize="none")
    hf = _auto(tok, tmp_path)
    with pytest.raises(TokenizerError):
        tok.encode("abz")
    with pytest.raises(Exception, match="UNK"):
        hf("abz")
