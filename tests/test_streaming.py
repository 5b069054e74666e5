"""Streaming tokenization into the token cache: the same arrays as the in-memory path, bounded memory,
interruption-safe."""

import gzip
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from seqdiff.config import DataConfig, TextDataConfig
from seqdiff.data import cache, streaming
from seqdiff.data.text import SplitSource, build_split_arrays, load_split_arrays
from seqdiff.data.text_files import DataFileError
from seqdiff.tokenizers import CharTokenizer
from seqdiff.tokenizers.hf import BertTokenizer, GPT2Tokenizer

FIXTURES = Path(__file__).parent / "fixtures"
# Shakespeare plus what trips a naive cutter: CRLF and lone CR, blank lines holding spaces, runs of
# punctuation and newlines (one text8 space; GPT-2 "\n\n" pieces), multi-byte UTF-8 cut by tiny reads.
TRICKY = ("\ufeffFirst line\r\nsecond -- line!\r\rthird\n \t\n\n\n  indented para\nword\n\n\nWord 'quoted'\n"
          "caf\u00e9 na\u00efve \u00fcber \u4e2d\u6587 \U0001f389\n\n \n \nend.\n\n")


def _text() -> str:
    return TRICKY + (FIXTURES / "shakespeare_tiny.txt").read_text()[:6000] + TRICKY


@pytest.fixture(scope="module")
def tokenizers():
    return {"char": CharTokenizer(), "gpt2": GPT2Tokenizer(FIXTURES / "gpt2"), "bert": BertTokenizer(FIXTURES / "bert")}


def _write(folder: Path, kind: str, docs_text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"test.{kind}"
    if kind == "txt":
        path.write_bytes(docs_text.encode())
    elif kind == "txt.gz":
        path.write_bytes(gzip.compress(docs_text.encode()))
    else:
        docs = [d for d in docs_text.split("\n\n")] + ["", "  ", "tail\r"]
        if kind == "jsonl":
            path.write_text("\n".join(json.dumps({"text": d}) for d in docs) + "\n")
        else:
            pq.write_table(pa.table({"text": docs}), path, row_group_size=7)
    return path


def _both(source_folder: Path, tokenizer, tmp_path: Path, workers: int = 1, **config):
    text = {k: config.pop(k) for k in list(config) if k in TextDataConfig.__dataclass_fields__}
    cfg = DataConfig(corpus=str(source_folder), **config, text=TextDataConfig(cache=False, **text))
    source = SplitSource(cfg, "test")
    memory, memory_meta = build_split_arrays(source, tokenizer, cfg)
    out = tmp_path / f"stream-{len(list(tmp_path.glob('stream-*')))}"
    out.mkdir()
    meta = streaming.build_streaming(source, tokenizer, cfg, out, chunk_chars=9, read_bytes=5, workers=workers)
    streamed = {p.stem: np.load(p) for p in out.glob("*.npy")}
    assert not list(out.glob(".*.raw"))
    return memory, memory_meta, streamed, meta


@pytest.mark.parametrize("name", ["char", "gpt2", "bert"])
@pytest.mark.parametrize("kind", ["txt", "txt.gz", "jsonl"])
def test_stream_mode_gives_the_in_memory_tokens(tmp_path, tokenizers, name, kind):
    tokenizer = tokenizers[name]
    if name == "char":
        tokenizer = CharTokenizer()  # text8 normalization: runs of non-letters become one space
    _write(tmp_path / "c", kind, _text())
    memory, _, streamed, _ = _both(tmp_path / "c", tokenizer, tmp_path)
    assert set(streamed) == {"tokens"} and streamed["tokens"].dtype == memory["tokens"].dtype
    np.testing.assert_array_equal(streamed["tokens"], memory["tokens"])
    np.save(tmp_path / "memory.npy", memory["tokens"])  # byte for byte the shard the in-memory path would cache
    assert (tmp_path / "stream-0" / "tokens.npy").read_bytes() == (tmp_path / "memory.npy").read_bytes()


@pytest.mark.parametrize("mode", ["wrapped", "padded", "packed"])
@pytest.mark.parametrize("kind,documents", [("txt", "paragraphs"), ("txt.gz", "lines"), ("jsonl", "paragraphs"),
                                            ("parquet", "paragraphs")])
def test_block_modes_give_the_in_memory_blocks(tmp_path, tokenizers, mode, kind, documents):
    _write(tmp_path / "c", kind, _text())
    workers = 2 if kind == "jsonl" else 1  # worker processes take a second or two to start
    memory, memory_meta, streamed, meta = _both(tmp_path / "c", tokenizers["gpt2"], tmp_path, workers=workers,
                                                block_mode=mode, seq_len=16, documents=documents)
    assert meta == memory_meta and meta["documents"] > 10
    assert set(streamed) == set(memory) == {"blocks", "lengths", *(("segments",) if mode == "packed" else ())}
    for name in memory:
        assert streamed[name].dtype == memory[name].dtype
        np.testing.assert_array_equal(streamed[name], memory[name])


def test_detokenized_dataset_documents_stream(tmp_path, monkeypatch, tokenizers):
    from seqdiff.data import datasets

    rows = {"text": [" = Title = \n", "", "a @-@ b , c\n", "the 1 @,@ 000 @-@ year war ( in 1990 ) , he said"]}
    monkeypatch.setattr(datasets, "_hub_load", lambda p, n, s: rows)
    for mode in ("stream", "wrapped"):
        cfg = DataConfig(corpus="wikitext2", seq_len=8, text=TextDataConfig(block_mode=mode, cache=False))
        source = SplitSource(cfg, "test")
        memory, _ = build_split_arrays(source, tokenizers["gpt2"], cfg)
        out = tmp_path / mode
        out.mkdir()
        streaming.build_streaming(source, tokenizers["gpt2"], cfg, out, chunk_chars=3, workers=1)
        for name, array in memory.items():
            np.testing.assert_array_equal(np.load(out / f"{name}.npy"), array)


def test_chunks_are_cut_only_at_safe_positions(tokenizers):
    text = _text()[:2500]
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    for name, tok in tokenizers.items():
        chunks = list(streaming.cut_chunks(pieces, streaming.SAFE_CUTS[name], chunk_chars=40))
        assert "".join(chunks) == text and len(chunks) > 10
        assert all(c for c in chunks)
        cut = 0
        for chunk in chunks[:-1]:  # every cut is a match of the tokenizer's pattern in the whole text
            cut += len(chunk)
            assert re.compile(streaming.SAFE_CUTS[name]).match(text, cut)
            assert np.array_equal(np.concatenate([tok.encode(text[:cut]), tok.encode(text[cut:])]), tok.encode(text))
    assert list(streaming.cut_chunks(pieces, None, chunk_chars=40)) == [text]  # unknown tokenizer: no cut


def test_parallel_encoding_keeps_few_tasks_in_flight():
    produced = []

    def tasks():
        for i in range(50):
            produced.append(i)
            yield i, [f"text number {'x' * i}"]

    results = streaming.encode_in_order(tasks(), CharTokenizer(), workers=2)
    first = next(results)
    assert CharTokenizer().decode(first[0]) == "text number "
    assert len(produced) <= 1 + 2 * 2  # bounded: not the whole source submitted at once
    rest = list(results)
    assert [CharTokenizer().decode(r[0]) for r in rest] == [f"text number {'x' * i}" for i in range(1, 50)]


def test_bad_utf8_is_named_with_its_byte_offset(tmp_path):
    from seqdiff.data.text_files import read_text_file

    path = tmp_path / "bad.txt"
    path.write_bytes("caf\u00e9 ".encode() * 7 + b"ok \xff\xfe then")
    with pytest.raises(DataFileError) as memory:
        read_text_file(path)
    with pytest.raises(DataFileError) as streamed:
        list(streaming.iter_text(path, read_bytes=4))
    assert str(streamed.value) == str(memory.value) and "byte offset 45" in str(streamed.value)


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def test_interrupted_build_leaves_no_cache(tmp_path, data_home, monkeypatch):
    _write(tmp_path / "c", "txt", _text() * 3)
    cfg = DataConfig(corpus=str(tmp_path / "c"), seq_len=16,
                     text=TextDataConfig(block_mode="wrapped", cache=True))
    calls = {"n": 0}
    real = streaming.ShardWriter.append

    def dying_append(self, rows):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt  # the user pressed Ctrl-C in the middle of the build
        real(self, rows)

    monkeypatch.setattr(streaming, "CHUNK_CHARS", 200)
    monkeypatch.setattr(streaming.ShardWriter, "append", dying_append)
    with pytest.raises(KeyboardInterrupt):
        load_split_arrays(cfg, CharTokenizer(), "test")
    assert list((data_home / "cache").iterdir()) == []  # nothing under a final name, no leftover folder
    monkeypatch.setattr(streaming.ShardWriter, "append", real)
    dead = data_home / "cache" / ".abc.tmp-999999999-x"  # a build killed outright (kill -9) leaves this
    dead.mkdir()
    (dead / "blocks.npy").write_bytes(b"half")
    arrays, _ = load_split_arrays(cfg, CharTokenizer(), "test")
    memory, _ = build_split_arrays(SplitSource(cfg, "test"), CharTokenizer(), cfg)
    np.testing.assert_array_equal(arrays["blocks"], memory["blocks"])
    assert not dead.exists() and len(list((data_home / "cache").iterdir())) == 1
    assert not cache._problems(next((data_home / "cache").iterdir()))
    assert os.getpid()  # the running process' own temporary folders are never removed (remove_stale_scratch)


def test_empty_sources_fail_clearly(tmp_path):
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "test.txt").write_text("\n \n\n")
    for mode, message in [("stream", "holds no text"), ("padded", "holds no documents")]:
        cfg = DataConfig(corpus=str(folder), seq_len=8, text=TextDataConfig(block_mode=mode, cache=False))
        out = tmp_path / mode
        out.mkdir()
        with pytest.raises(DataFileError, match=message):
            streaming.build_streaming(SplitSource(cfg, "test"), CharTokenizer(), cfg, out)
