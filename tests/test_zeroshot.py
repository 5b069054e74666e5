"""`seqdiff eval` on several sources in one run (the zero-shot table)."""

import json
import math

import numpy as np
import pytest

from seqdiff.checkpoint import load_checkpoint
from seqdiff.cli import main
from seqdiff.data import datasets
from seqdiff.data.text_files import corpus_split_path, read_text_file
from seqdiff.evaluation.likelihood import batch_nlls, evaluate_batches, evaluate_tokens
from seqdiff.evaluation.zeroshot import format_table

FIXTURE = "tests/fixtures/shakespeare_tiny.txt"
TINY = ["model.preset=test", "model.max_seq_len=64", "data.seq_len=32", "data.batch_size=4",
        f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}", f"data.test_file={FIXTURE}",
        "train.max_steps=2", "train.val_every=2", "train.val_batches=1", "train.progress_bar=false"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("zeroshot")
    assert main(["train", "--run-dir", str(root / "mdlm"), *TINY, "method.name=mdlm"]) == 0
    return root / "mdlm"


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))


def _direct(run, text: str, seed: int = 0) -> float:
    """nats/token of `text` scored directly as one tiled token stream (what a stream-mode run validates on)."""
    model = load_checkpoint(run)
    return evaluate_tokens(model, model.tokenizer.encode(text), seed=seed)["nll_nats_per_token"]


def test_several_sources_in_one_run(run, tmp_path, capsys):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "test.jsonl").write_text(json.dumps({"text": "to be or not to be"}) + "\n"
                                       + json.dumps({"text": "that is the question"}) + "\n")
    out = tmp_path / "zs.json"
    assert main(["eval", str(run), "--data", FIXTURE, "--dataset", "shakespeare:valid", "--data", str(folder),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    rows = result["results"]
    assert [r["dataset"] for r in rows] == ["shakespeare_tiny.txt", "shakespeare/valid", "corpus/test"]  # in order
    assert result["checkpoint"] and all(r["bound"] for r in rows)
    texts = [read_text_file(FIXTURE), read_text_file(corpus_split_path("shakespeare", "valid")),
             "to be or not to be\n\nthat is the question"]
    model = load_checkpoint(run)
    for row, text in zip(rows, texts):  # the same tokens and draws as scoring each text on its own
        assert row["num_tokens"] == len(model.tokenizer.encode(text))
        assert row["nll_nats_per_token"] == pytest.approx(_direct(run, text), rel=1e-9)
        assert row["bits_per_character"] == pytest.approx(row["nll_nats_per_token"] / math.log(2))
        assert row["dataset"] in printed
    assert "BPC" in printed and "nats/token" in printed


def test_registered_detokenizer_is_applied_before_scoring(run, tmp_path, monkeypatch, capsys):
    rows = {"sentence": ["i do n't know , he said", "", "it 's the company 's \\/ unit"]}
    monkeypatch.setattr(datasets, "_hub_load", lambda path, name, split: rows)
    out = tmp_path / "ptb.json"
    assert main(["eval", str(run), "--dataset", "ptb", "--out", str(out)]) == 0
    (report,) = json.loads(out.read_text())["results"]
    assert report["detokenizer"] == "ptb" and report["dataset"] == "ptb/test"
    clean = "\n\n".join(datasets.ptb_detokenize(d) for d in rows["sentence"] if d)
    assert report["nll_nats_per_token"] == pytest.approx(_direct(run, clean), rel=1e-9)
    assert main(["eval", str(run), "--dataset", "ptb", "--detokenizer", "none", "--out", str(out)]) == 0
    (raw,) = json.loads(out.read_text())["results"]
    assert raw["detokenizer"] is None and raw["num_tokens"] > report["num_tokens"]  # "do n t" vs "don t"


def test_json_output(run, capsys, tmp_path):
    assert main(["eval", str(run), "--dataset", "shakespeare:test", "--json", "--out", str(tmp_path / "r.json")]) == 0
    (report,) = json.loads(capsys.readouterr().out)["results"]
    assert report["perplexity"] == pytest.approx(math.exp(report["nll_nats_per_token"]))


def _error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1
    return err


def test_bad_sources_fail_clearly(run, tmp_path, monkeypatch, capsys, data_home):
    err = _error(capsys, ["eval", str(tmp_path / "no.ckpt"), "--dataset", "wikitext-9"])  # before loading
    assert "unknown dataset 'wikitext-9'" in err and "wikitext103" in err
    assert "split 'dev'" in _error(capsys, ["eval", str(run), "--dataset", "shakespeare:dev"])
    assert "missing.txt: no such file" in _error(capsys, ["eval", str(run), "--data", str(tmp_path / "missing.txt")])
    assert "expected one of test.txt" in _error(capsys, ["eval", str(run), "--data", str(tmp_path)])

    def offline(path, name, split):
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "_hub_load", offline)
    assert "wikitext-103-raw-v1" in _error(capsys, ["eval", str(run), "--dataset", "wikitext103"])
    # several sources: the one that fails is named, the others are still scored and written (exit 2)
    out = tmp_path / "zs.json"
    assert main(["eval", str(run), "--dataset", "wikitext103", "--dataset", "shakespeare", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "seqdiff eval: wikitext103/test: dataset 'wikitext103'" in err and "point at local files" in err
    assert "1 of 2 sources could not be scored (wikitext103/test" in err
    assert [r["dataset"] for r in json.loads(out.read_text())["results"]] == ["shakespeare/test"]
    err = _error(capsys, ["eval", str(run), "--dataset", "wikitext103", "--dataset", "ptb"])  # none: one error
    assert "no source could be scored (wikitext103/test, ptb/test" in err
    assert "not in the data directory" in _error(capsys, ["eval", str(run), "--dataset", "austen"])
    # a corpus not fetched is refused before the model is loaded or any other source scored (no file written)
    err = _error(capsys, ["eval", str(tmp_path / "no.ckpt"), "--data", FIXTURE, "--dataset", "austen"])
    assert "corpus 'austen' is not in the data directory" in err and "seqdiff data fetch austen" in err


def test_per_batch_nlls_are_the_draws_the_evaluation_sums(run):
    from torch.utils.data import DataLoader

    from seqdiff.data.blocks import TiledBlocks

    model = load_checkpoint(run)
    tokens = model.tokenizer.encode(read_text_file(FIXTURE)[:2000])
    loader = DataLoader(TiledBlocks(tokens, 32, model.tokenizer.pad_id), batch_size=8)
    rows = list(batch_nlls(model, loader, num_t_samples=2, seed=3))
    assert len(rows) == len(loader) > 1
    report = evaluate_batches(model, loader, num_t_samples=2, seed=3)
    assert sum(float(t) for t, _ in rows) / sum(float(n) for _, n in rows) == pytest.approx(
        report["nll_nats_per_token"], rel=1e-12)
    again = list(batch_nlls(model, loader, num_t_samples=2, seed=4))
    assert any(float(a) != float(b) for (a, _), (b, _) in zip(rows, again))  # the seed changes the draws


def test_table_columns():
    rows = [{"dataset": "a/test", "num_tokens": 1234, "nll_nats_per_token": 1.0, "perplexity": math.e,
             "bits_per_character": 1 / math.log(2), "bound": True},
            {"dataset": "longer-name/valid", "num_tokens": 5, "nll_nats_per_token": 2.0, "perplexity": math.e**2,
             "bound": False}]
    lines = format_table(rows).splitlines()
    assert lines[0].split() == ["dataset", "tokens", "nats/token", "PPL", "BPC", "kind"]
    assert lines[2].split() == ["a/test", "1,234", "1.0000", "2.718", "1.4427", "bound"]
    assert lines[3].split() == ["longer-name/valid", "5", "2.0000", "7.389", "exact"]
    assert len({len(line) for line in lines[:3]}) == 1
    assert np.isclose(float(lines[2].split()[4]), 1 / math.log(2), atol=1e-4)
