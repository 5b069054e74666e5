"""Text block modes (wrapped, padded), the on-disk tokenized cache, parquet files, the dataset registry,
detokenizers, the Austen split, and short training runs in each block mode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from seqdiff.config import DataConfig, TextDataConfig, load_run_config
from seqdiff.data import cache, datasets
from seqdiff.data.blocks import PackedBlocks, RandomBlockBatches, pack_padded, pack_wrapped
from seqdiff.data.modules import TextDataModule
from seqdiff.data.text import load_split_arrays
from seqdiff.data.text_files import DataFileError, read_documents, read_text_file
from seqdiff.methods.base import Batch
from seqdiff.tokenizers import CharTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
BOS, EOS, PAD = 100, 101, 102


def _docs(rng, n=20, max_len=30):
    return [rng.integers(0, 50, size=int(rng.integers(1, max_len))) for _ in range(n)]


# ------------------------------------------------------------------------------------------- wrapped
def test_wrapped_blocks_rebuild_the_eos_joined_stream():
    docs = _docs(np.random.default_rng(0))
    blocks, lengths = pack_wrapped(docs, 16, BOS, EOS, PAD)
    assert (blocks[:, 0] == BOS).all()
    assert (blocks[np.arange(len(blocks)), lengths - 1] == EOS).all()
    assert (lengths[:-1] == 16).all() and 3 <= lengths[-1] <= 16
    assert (blocks[-1, lengths[-1]:] == PAD).all() and (blocks != PAD).sum() == lengths.sum()
    stream = np.concatenate([blocks[i, 1 : lengths[i] - 1] for i in range(len(blocks))])
    expected = np.concatenate([p for d in docs for p in (d, [EOS])])
    np.testing.assert_array_equal(stream, expected)  # documents in order, each followed by EOS, none lost


def test_padded_blocks_truncate_and_mask_padding():
    docs = [np.arange(3), np.arange(20), np.arange(14)]
    blocks, lengths, truncated = pack_padded(docs, 16, BOS, EOS, PAD)
    assert truncated == 1  # 20 > 14 = 16 - 2; exactly 14 fits
    np.testing.assert_array_equal(lengths, [5, 16, 16])
    np.testing.assert_array_equal(blocks[0], [BOS, 0, 1, 2, EOS] + [PAD] * 11)
    np.testing.assert_array_equal(blocks[1], [BOS, *range(14), EOS])
    item = PackedBlocks(blocks, lengths)[0]
    assert item["attention_mask"].tolist() == [True] * 5 + [False] * 11
    batch = Batch.from_any({k: v[None] for k, v in item.items()})
    scored = batch.scored(PAD)
    assert scored.sum() == 5 and not scored[0, 5:].any()  # padding never scored


@pytest.mark.parametrize("use_cache", [False, True])
def test_padded_truncation_says_what_share_of_tokens_is_lost(tmp_path, monkeypatch, capsys, use_cache):
    """One document per line read as paragraphs (no blank lines): the whole file is one document, padded mode
    keeps seq_len - 2 of its tokens, and the message says so and names documents=lines; with documents=lines
    nothing is lost and nothing is printed. The cache (streaming builder) reports the same."""
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"review number {i} was good\n" for i in range(200)))
    tokens = len(CharTokenizer().encode(path.read_text()))

    def message(documents):
        text = TextDataConfig(block_mode="padded", documents=documents, cache=use_cache)
        cfg = DataConfig(train_file=str(path), valid_file=str(path), test_file=str(path), seq_len=32, text=text)
        TextDataModule(cfg, CharTokenizer()).split_arrays("train")
        return capsys.readouterr().err

    err = message("paragraphs")
    assert f"1 of 1 train documents truncated to data.seq_len=32: {1 - 30 / tokens:.1%} of the split's" in err
    assert "data.text.documents=lines" in err and err.count("\n") == 1
    assert message("lines") == ""


def test_text_mostly_outside_a_text8_alphabet_is_announced(tmp_path, capsys):
    """A text8 character model reads Chinese (or a table of numbers) as runs of spaces: training or scoring on
    it says so, naming the file; English with digits and punctuation does not, nor does a tokenizer that
    encodes every character."""
    from seqdiff.evaluation.zeroshot import file_tokens

    chinese, english = tmp_path / "zh.txt", tmp_path / "en.txt"
    chinese.write_text("\n\n".join(["机器学习是人工智能的一个分支 (2024)。"] * 50))
    english.write_text("\n\n".join(["It was 1984, and the clocks struck thirteen."] * 50))
    assert CharTokenizer().outside_share("ab, 12") == pytest.approx(3 / 5)  # a b , 1 2: three of five visible
    for mode in ("stream", "padded"):
        for path, warned in ((chinese, True), (english, False)):
            cfg = DataConfig(train_file=str(path), valid_file=str(path), test_file=str(path), seq_len=16,
                             text=TextDataConfig(block_mode=mode, cache=False))
            TextDataModule(cfg, CharTokenizer()).split_arrays("test")
            err = capsys.readouterr().err
            assert (f"{path}: " in err and "outside the model's alphabet (abcdefghijklmnopqrstuvwxyz)" in err) == \
                warned, err
    file_tokens(chinese, CharTokenizer())
    assert "outside the model's alphabet" in capsys.readouterr().err
    numbers = tmp_path / "numbers.txt"
    numbers.write_text("".join(f"{i}, {i * i}\n" for i in range(300)))
    file_tokens(numbers, CharTokenizer())
    assert f"{numbers}: 100% of its non-space" in capsys.readouterr().err
    file_tokens(numbers, CharTokenizer(alphabet="0123456789, \n", normalize="none"))  # encodes every character
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("mode", ["wrapped", "padded"])
def test_block_batches_are_step_indexed_and_rank_sliced(mode):
    docs = _docs(np.random.default_rng(1), n=40)
    pack = pack_wrapped if mode == "wrapped" else pack_padded
    blocks, lengths = pack(docs, 12, BOS, EOS, PAD)[:2]
    data = RandomBlockBatches(blocks, lengths, 8, seed=5)
    a = [data.batch_at(k)["input_ids"] for k in range(12)]  # crosses epochs (N rows < 12 * 8)
    resumed = RandomBlockBatches(blocks, lengths, 8, seed=5, start_step=7)
    assert torch.equal(next(iter(resumed))["input_ids"], a[7])  # batch k depends only on (seed, k)
    assert not torch.equal(RandomBlockBatches(blocks, lengths, 8, seed=6).batch_at(0)["input_ids"], a[0])
    parts = [RandomBlockBatches(blocks, lengths, 8, seed=5, rank=r, world_size=4).batch_at(9) for r in range(4)]
    whole = data.batch_at(9)
    for key in ("input_ids", "attention_mask"):
        assert torch.equal(torch.cat([p[key] for p in parts]), whole[key])
    n = len(blocks)  # the first epoch visits every row exactly once
    rows = torch.cat([data.batch_at(k)["input_ids"] for k in range(-(-n // 8))])[:n]
    assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, blocks.tolist()))


# ------------------------------------------------------------------------------------------- files
def _corpus(folder: Path, paragraphs=30) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = FIXTURES.joinpath("shakespeare_tiny.txt").read_text()[:6000]
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text(text)
    return folder


def test_text_documents_are_paragraphs_or_lines(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("one\ntwo\n\n\nthree\n  \nfour\n")
    assert read_documents(path) == ["one\ntwo", "three", "four"]
    assert read_documents(path, "lines") == ["one", "two", "three", "four"]
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "x y"}) + "\n" + json.dumps({"text": " "}) + "\n")
    assert read_documents(tmp_path / "b.jsonl") == ["x y"]


def test_parquet_files(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["first doc", "", "second doc"], "label": [1, 2, 3]}), tmp_path / "t.parquet")
    assert read_documents(tmp_path / "t.parquet") == ["first doc", "second doc"]
    assert read_text_file(tmp_path / "t.parquet") == "first doc\n\nsecond doc"
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "bad.parquet")
    with pytest.raises(DataFileError, match="no 'text' column.*body"):
        read_documents(tmp_path / "bad.parquet")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataFileError, match="junk.parquet: not a readable parquet"):
        read_documents(tmp_path / "junk.parquet")
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        pq.write_table(pa.table({"text": ["to be or not to be", "that is the question"]}), folder / f"{split}.parquet")
    cfg = DataConfig(corpus=str(folder), seq_len=32, text=TextDataConfig(block_mode="padded", cache=False))
    arrays = TextDataModule(cfg, CharTokenizer()).split_arrays("valid")
    assert arrays["blocks"].shape == (2, 32) and arrays["lengths"].tolist() == [20, 22]


# ------------------------------------------------------------------------------------------- cache
class CountingChar(CharTokenizer):
    calls = 0

    def encode(self, text):
        CountingChar.calls += 1
        return super().encode(text)


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def test_cache_is_reused_and_keyed(tmp_path, data_home):
    folder = _corpus(tmp_path / "c")
    cfg = DataConfig(corpus=str(folder), seq_len=32, text=TextDataConfig(block_mode="wrapped", cache=True))
    tok = CountingChar()
    CountingChar.calls = 0
    first, _ = load_split_arrays(cfg, tok, "train")
    built = CountingChar.calls
    assert built > 0 and isinstance(first["blocks"], np.memmap)
    second, _ = load_split_arrays(cfg, tok, "train")
    assert CountingChar.calls == built  # reused: no tokenization on the second load
    np.testing.assert_array_equal(first["blocks"], second["blocks"])
    assert len(list((data_home / "cache").iterdir())) == 1
    load_split_arrays(DataConfig(corpus=str(folder), seq_len=16, text=TextDataConfig(block_mode="wrapped", cache=True)),
                      tok, "train")
    load_split_arrays(cfg, CharTokenizer(alphabet=" abcdefghijklmnopqrstuvwxyz"), "train")  # same symbols, new ids
    load_split_arrays(DataConfig(corpus=str(folder), seq_len=32, text=TextDataConfig(block_mode="padded", cache=True)),
                      tok, "train")
    assert len(list((data_home / "cache").iterdir())) == 4  # seq_len, tokenizer, mode: new keys
    (folder / "train.txt").write_text("changed text\n")  # size / mtime change: new key, fresh blocks
    changed, _ = load_split_arrays(cfg, tok, "train")
    assert len(changed["blocks"]) == 1


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_corrupted_cache_is_detected_and_rebuilt(tmp_path, data_home, capsys, damage):
    folder = _corpus(tmp_path / "c")
    cfg = DataConfig(corpus=str(folder), seq_len=32, text=TextDataConfig(block_mode="padded", cache=True))
    good, _ = load_split_arrays(cfg, CharTokenizer(), "valid")
    good = np.array(good["blocks"])
    (entry,) = (data_home / "cache").iterdir()
    shard = entry / "blocks.npy"
    raw = bytearray(shard.read_bytes())
    if damage == "flip":
        raw[-3] ^= 0xFF
    else:
        raw = raw[:-7]
    shard.write_bytes(bytes(raw))
    capsys.readouterr()
    CountingChar.calls = 0
    again, _ = load_split_arrays(cfg, CountingChar(), "valid")
    message = capsys.readouterr().err
    assert "corrupt" in message and "rebuilding" in message and "blocks.npy" in message
    assert CountingChar.calls > 0  # retokenized, not used as is
    np.testing.assert_array_equal(np.array(again["blocks"]), good)
    assert not cache._problems(entry)


def test_cache_write_is_atomic(tmp_path, data_home):
    def failing_build():
        raise RuntimeError("tokenizer crashed")

    with pytest.raises(RuntimeError):
        cache.load_or_build({"x": 1}, failing_build)
    arrays = {"a": np.arange(5)}
    cache.load_or_build({"x": 1}, lambda: (arrays, {}))
    names = [p.name for p in (data_home / "cache").iterdir()]
    assert len(names) == 1 and not names[0].startswith(".")  # no leftover temporary folder


def test_parallel_tokenization_matches_serial(monkeypatch):
    from seqdiff.data import text

    docs = [f"paragraph number {i} " * (i % 7 + 1) for i in range(300)]
    serial = text.tokenize_documents(docs, CharTokenizer(), workers=1)
    monkeypatch.setattr(text, "PARALLEL_MIN_CHARS", 10)
    monkeypatch.setattr(text, "CHUNK_CHARS", 1000)
    parallel = text.tokenize_documents(docs, CharTokenizer(), workers=2)
    assert len(parallel) == len(serial) and all(np.array_equal(a, b) for a, b in zip(parallel, serial))
    with pytest.raises(DataFileError, match="document 2"):
        text.tokenize_documents(["ok", "fine", "caf\u00e9"], CharTokenizer(normalize="none"), workers=2)


def test_block_mode_config_errors_name_the_key():
    from seqdiff.config import ConfigError

    with pytest.raises(ConfigError, match=r"data\.text\.block_mode"):
        load_run_config(None, ["data.block_mode=wrap"])
    with pytest.raises(ConfigError, match="data.seq_len must be >= 3"):
        DataConfig(seq_len=2, text=TextDataConfig(block_mode="padded"))


# ------------------------------------------------------------------------------------------- registry
def test_unknown_dataset_lists_the_known_ones():
    with pytest.raises(datasets.DatasetError, match="known datasets: .*lm1b.*openwebtext.*wikitext103"):
        datasets.load_documents("wikitext-9", "train")


def test_hub_dataset_offline_says_how_to_use_local_files(monkeypatch, data_home):
    calls = []

    def offline(path, name, split):
        calls.append((path, name, split))
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "_hub_load", offline)
    with pytest.raises(datasets.DatasetError, match=r"data.corpus=/folder.*\.parquet"):
        datasets.load_documents("openwebtext", "valid")
    assert calls == [("openwebtext", None, "train[-100000:]")]  # the last 100k documents validate
    with pytest.raises(datasets.DatasetError, match="wikitext-103-raw-v1"):
        TextDataModule(DataConfig(corpus="wikitext103", text=TextDataConfig(block_mode="wrapped")),
                       CharTokenizer()).check_files()


def test_hub_dataset_rows_become_detokenized_documents(monkeypatch):
    monkeypatch.setattr(datasets, "_hub_load", lambda p, n, s: {"text": [" = Title = \n", "", "a @-@ b , c\n"]})
    cfg = DataConfig(corpus="wikitext2", seq_len=16, tokenizer="char",
                     text=TextDataConfig(block_mode="padded", cache=False))
    dm = TextDataModule(cfg, CharTokenizer(alphabet="abcdefghijklmnopqrstuvwxyzT -,=\n", normalize="none"))
    rows = dm.split_arrays("test")
    assert [dm.tokenizer.decode(r) for r in rows["blocks"]] == [" = Title =\n", "a-b, c\n"]


def test_detokenizers():
    assert datasets.wikitext_detokenize("the 1 @,@ 000 @-@ year war ( in 1990 ) , he said") == \
        "the 1,000-year war (in 1990), he said"
    assert datasets.wikitext_detokenize(" = = Early life = = \n") == " == Early life ==\n"
    assert datasets.ptb_detokenize("it 's N years and they do n't <unk> it") == "it's 1 years and they don't ? it"
    assert datasets.ptb_detokenize("a \\/ b costs $ N each") == "a / b costs $1 each"
    assert datasets.lm1b_detokenize('He said " yes , it is " ; see http : / / x.org .') == \
        'He said "yes, it is"; see http://x.org.'
    assert datasets.lm1b_detokenize("That 's it ( really ) !") == "That's it (really)!"
    assert datasets.lambada_detokenize(" \u201cHi,\u201d she said \u2018no\u2019 ") == "\"Hi,\" she said 'no'"
    with pytest.raises(datasets.DatasetError, match="known|choose one of"):
        datasets.get_detokenizer("wiki")


@pytest.mark.requires_source("austen")
def test_austen_split_by_whole_novels(data_home, tmp_path, monkeypatch):
    with pytest.raises(datasets.DatasetError, match="seqdiff data fetch austen"):
        datasets.load_documents("austen", "train")
    monkeypatch.undo()  # back to the session's data directory, where requires_source fetched it
    from seqdiff.data.fetch import is_present, source_path

    assert is_present("austen")
    files = {s: set(datasets.DATASETS["austen"].splits[s]) for s in ("train", "valid", "test")}
    assert files["train"] | files["valid"] | files["test"] == {p.name for p in source_path("austen").glob("*.txt")}
    assert not (files["train"] & files["valid"]) and not (files["train"] & files["test"])
    valid = datasets.load_documents("austen", "valid")
    assert any("NORTHANGER ABBEY" in d.upper() for d in valid[:5])
    assert not any("Emma Woodhouse" in d for d in valid)


# ------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("mode", ["wrapped", "padded"])
def test_three_step_train(tmp_path, data_home, mode):
    from seqdiff.training.run import train

    overrides = [
        "model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        *(f"data.{s}_file={FIXTURES / 'shakespeare_tiny.txt'}" for s in ("train", "valid", "test")),
        "train.max_steps=3", "train.val_every=3", "train.val_batches=1", "train.checkpoint_every=3",
        "train.progress_bar=false", "train.warmup_steps=1", f"data.block_mode={mode}", "data.documents=lines",
        "data.tokenizer=gpt2", f"data.tokenizer_options={{vocab_dir: {FIXTURES / 'gpt2'}}}",
    ]
    cfg = load_run_config(None, overrides)
    result = train(cfg, tmp_path / "run")
    assert result.trainer.global_step == 3
    dm = result.trainer.datamodule
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (4, 32) and (batch["input_ids"][:, 0] == dm.tokenizer.bos_id).all()
    pads = batch["input_ids"] == dm.tokenizer.pad_id
    assert torch.equal(pads, ~batch["attention_mask"])  # padded mode pads short lines; wrapped rows are full
    assert pads.any() == (mode == "padded")
    assert all(np.isfinite(v.item()) for k, v in result.trainer.callback_metrics.items() if "loss" in k)


def test_the_data_classes_without_lightning_and_the_lightning_modules_built_on_them():
    """Training gets a LightningDataModule (seqdiff.data.modules), evaluation the same class without Lightning
    (build_data), both from one registry entry per data kind."""
    import lightning as L

    from seqdiff.data import DATA_MODULES, build_data, build_data_module
    from seqdiff.data.fasta import FastaData
    from seqdiff.data.modules import FastaDataModule
    from seqdiff.data.text import TextData

    assert issubclass(TextDataModule, TextData) and issubclass(TextDataModule, L.LightningDataModule)
    assert issubclass(FastaDataModule, FastaData) and issubclass(FastaDataModule, L.LightningDataModule)
    assert not issubclass(TextData, L.LightningDataModule) and set(DATA_MODULES) == {"text", "fasta"}
    config = DataConfig(corpus="shakespeare", tokenizer="char", seq_len=64, eval_batch_size=4)
    plain, module = build_data(config, CharTokenizer()), build_data_module(config, CharTokenizer())
    assert type(plain) is TextData and type(module) is TextDataModule and module.trainer is None
    a, b = next(iter(plain.eval_dataloader("valid"))), next(iter(module.eval_dataloader("valid")))
    assert torch.equal(a["input_ids"], b["input_ids"])
    assert torch.equal(next(iter(plain.train_dataloader()))["input_ids"],
                       next(iter(module.train_dataloader()))["input_ids"])  # no trainer: from step 0, rank 0


def test_evaluation_data_does_not_import_lightning():
    """`seqdiff eval` reads its split through build_data: a fresh process that builds it and takes a batch never
    imports Lightning (seconds of start-up, with torchmetrics and transformers behind it)."""
    import subprocess
    import sys

    script = ("import sys\n"
              "from seqdiff.config import DataConfig\n"
              "from seqdiff.data import build_data\n"
              "from seqdiff.tokenizers import CharTokenizer\n"
              "data = build_data(DataConfig(corpus='shakespeare', tokenizer='char', seq_len=64, eval_batch_size=4),"
              " CharTokenizer())\n"
              "batch = next(iter(data.eval_dataloader('test')))\n"
              "assert batch['input_ids'].shape == (4, 64)\n"
              "print('lightning' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"
