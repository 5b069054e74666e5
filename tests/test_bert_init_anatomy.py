"""experiments.bert_init_anatomy: encoders between the pretrained and the fine-tuned one, scored like bert_init."""

import json

import pytest
import torch

from experiments.bert_init_anatomy import AnatomyError, main, parse_alphas, part_of, restore, variants
from seqdiff.backbones import build_backbone
from seqdiff.backbones.wise_ft import encoder_keys, interpolate
from seqdiff.config import ModelConfig


def _states():
    pre = {"a": torch.tensor([0.0, 2.0]), "b": torch.tensor([1.0]), "head": torch.tensor([5.0])}
    post = {"a": torch.tensor([4.0, 2.0]), "b": torch.tensor([3.0]), "head": torch.tensor([7.0])}
    return pre, post


def test_interpolation_is_the_weight_space_line_and_spares_other_keys():
    pre, post = _states()
    for alpha in (0.0, 0.25, 1.0):
        out = interpolate(pre, post, ["a", "b"], alpha)
        assert torch.equal(out["a"], pre["a"] + alpha * (post["a"] - pre["a"]))
        assert torch.equal(out["b"], torch.tensor([1.0 + 2.0 * alpha]))
        assert torch.equal(out["head"], post["head"])  # the fine-tuned head stays
    assert torch.equal(interpolate(pre, post, ["a"], 0.0)["a"], pre["a"])
    assert torch.equal(interpolate(pre, post, ["a"], 1.0)["a"], post["a"])


def test_restore_puts_back_only_the_named_keys():
    pre, post = _states()
    out = restore(pre, post, ["b"])
    assert torch.equal(out["b"], pre["b"]) and torch.equal(out["a"], post["a"]) and torch.equal(out["head"],
                                                                                                post["head"])


def test_every_bert_encoder_weight_falls_in_one_part_and_the_head_in_none():
    cfg = ModelConfig(backbone="bert", hidden_size=16, n_layers=4, n_heads=2, max_seq_len=8, activation="gelu")
    bert = build_backbone(cfg, vocab_size=11, causal=False)
    keys = encoder_keys(bert)
    head = {n for n, p in bert.named_parameters() if any(p is q for q in bert.head_parameters())}
    assert head and not head & set(keys) and set(keys) | head == {n for n, _ in bert.named_parameters()}
    parts = {k: part_of(k, 4) for k in keys}
    assert parts["embeddings.word.weight"] == "embeddings"
    assert {p for k, p in parts.items() if k.startswith("layers.1.")} == {"lower blocks"}
    assert {p for k, p in parts.items() if k.startswith("layers.2.")} == {"upper blocks"}
    with pytest.raises(AnatomyError, match="head.dense.weight"):
        part_of("head.dense.weight", 4)
    pre = {k: torch.zeros(()) for k in bert.state_dict()}
    post = {k: torch.ones(()) for k in bert.state_dict()}
    names = list(variants(pre, post, keys, 4, [0.5]))
    assert names[:3] == ["alpha=0", "alpha=0.5", "alpha=1"] and len(names) == 6
    lower = variants(pre, post, keys, 4, [0.5])["fine-tuned, lower blocks pretrained"][1]()
    assert all(lower[k] == (0 if k.startswith(("layers.0.", "layers.1.")) else 1) for k in keys)


@pytest.mark.parametrize("text", ["", "0.5,x", "1.5", "-0.1"])
def test_bad_alphas_are_refused(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="--alphas"):
        parse_alphas(text)


def test_a_run_dir_without_a_checkpoint_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--run-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")])
    assert str(tmp_path / "nothing") in capsys.readouterr().err and not (tmp_path / "out").exists()


@pytest.mark.slow  # trains and scores the 6-layer MiniLM twice: 1-3 minutes on 2 cores
@pytest.mark.requires_source("bert-vocab", "austen", "shakespeare")
def test_the_endpoints_reproduce_the_bert_init_report(tmp_path, capsys):
    """alpha = 1 is the fine-tuned model that experiments.bert_init scored; alpha = 0 its pretrained encoder."""
    from experiments import bert_init

    common = ["--eval-blocks", "2", "--t-samples", "1", "--austen-passages", "10", "--batch-size", "4"]
    assert bert_init.main(["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "report"), "--max-steps", "2",
                           "--seq-len", "32", "--shakespeare-passages", "3", "--num-samples", "2", *common]) == 0
    assert main(["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "anatomy"), "--alphas", "0.5",
                 *common]) == 0
    report = json.loads((tmp_path / "report" / "results.json").read_text())
    r = json.loads((tmp_path / "anatomy" / "results.json").read_text())
    v = r["variants"]
    assert v["alpha=1"]["test_nll_nats_per_token"] == report["after"]["test"]["nll_nats_per_token"]
    probe = report["probes"]["austen-novel"]
    assert v["alpha=1"]["probe"]["accuracy"] == probe["after"]["accuracy"]
    assert v["alpha=0"]["probe"]["accuracy"] == probe["before"]["accuracy"]
    assert v["alpha=0"]["difference"] == 0 and v["alpha=0"]["difference_interval"] == [0.0, 0.0]
    assert v["alpha=1"]["difference_interval"] == probe["difference_interval"]
    assert len(v) == 6 and r["command"] in (tmp_path / "anatomy" / "table.md").read_text()
    assert (tmp_path / "anatomy" / "tradeoff.png").is_file()
    # bert_init --encoder-alpha scores the interpolated encoder: its bound is anatomy's alpha=0.5 row
    assert bert_init.main(["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "wise"), "--max-steps", "2",
                           "--seq-len", "32", "--shakespeare-passages", "3", "--num-samples", "2",
                           "--encoder-alpha", "0.5", *common]) == 0
    wise = json.loads((tmp_path / "wise" / "results.json").read_text())
    assert wise["encoder_alpha"] == 0.5 and not wise["trained_in_this_call"]
    assert wise["after"]["test"]["nll_nats_per_token"] == v["alpha=0.5"]["test_nll_nats_per_token"]
    assert wise["probes"]["austen-novel"]["after"]["accuracy"] == v["alpha=0.5"]["probe"]["accuracy"]
    assert "WiSE-FT encoder, alpha 0.5" in (tmp_path / "wise" / "table.md").read_text()
    # the 'before' encoder is read from the run's model.init_from: a moved data directory is named, no traceback
    run = tmp_path / "run"
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    original = ckpt["hyper_parameters"]["model"]["init_from"]
    ckpt["hyper_parameters"]["model"]["init_from"] = str(tmp_path / "moved")
    torch.save(ckpt, run / "checkpoints" / "last.ckpt")
    with pytest.raises(SystemExit):
        main(["--run-dir", str(run), "--out", str(tmp_path / "out")])
    assert str(tmp_path / "moved") in capsys.readouterr().err and not (tmp_path / "out").exists()
    # without --seed the run's config.yaml gives it; a missing one is named
    ckpt["hyper_parameters"]["model"]["init_from"] = original
    torch.save(ckpt, run / "checkpoints" / "last.ckpt")
    (run / "config.yaml").unlink()
    with pytest.raises(SystemExit):
        main(["--run-dir", str(run), "--out", str(tmp_path / "out")])
    assert "config.yaml: no readable train.seed" in capsys.readouterr().err

