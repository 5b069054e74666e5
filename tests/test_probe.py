"""Frozen-embedding probes and the BERT-init pipeline's pieces: pooling, the probe, passages, the bootstrap."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines.bert_init import SHAKESPEARE_GENRES, _verdict, paired_bootstrap, passages
from seqdiff.backbones import build_backbone
from seqdiff.config import ModelConfig
from seqdiff.evaluation.probe import logistic_probe, mean_pooled_features
from seqdiff.tokenizers import CharTokenizer


def test_mean_pooling_averages_real_tokens_only():
    torch.manual_seed(0)
    model = build_backbone(ModelConfig(backbone="bert", hidden_size=16, n_layers=1, n_heads=2, max_seq_len=12), 20,
                           causal=False)
    model.train()  # the helper must switch dropout off and restore the mode
    ids = torch.randint(0, 20, (5, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(5, 12, dtype=torch.bool)
    mask[2, 7:] = False
    feats = mean_pooled_features(model, ids, mask, batch_size=2)  # batches of 2: the split must not matter
    assert model.training and feats.shape == (5, 16) and feats.dtype == np.float64
    model.eval()
    with torch.no_grad():
        h = model.hidden_states(ids, None, mask).double()
        np.testing.assert_allclose(feats[2], h[2, :7].mean(0).numpy(), rtol=1e-6)
        np.testing.assert_allclose(feats[0], h[0].mean(0).numpy(), rtol=1e-6)
        # the padded row's features are those of the unpadded prefix
        np.testing.assert_allclose(feats[2], model.hidden_states(ids[2:3, :7]).double()[0].mean(0).numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_logistic_probe_reads_a_linear_signal_and_not_noise():
    rng = np.random.default_rng(0)
    y = np.repeat(np.arange(3), 60)
    centers = rng.normal(size=(3, 10)) * 3
    x = centers[y] + rng.normal(size=(180, 10))
    idx = rng.permutation(180)
    tr, te = idx[:120], idx[120:]
    fit = logistic_probe(x[tr], y[tr], x[te], y[te], Cs=(0.1, 1.0), folds=3)
    assert fit["accuracy"] > 0.95 and fit["n_train"] == 120 and fit["n_test"] == 60 and len(fit["correct"]) == 60
    noise = rng.normal(size=(180, 10))  # features that say nothing about the label: near chance (1/3)
    assert logistic_probe(noise[tr], y[tr], noise[te], y[te], Cs=(0.1, 1.0), folds=3)["accuracy"] < 0.6


def test_passages_are_evenly_spaced_windows_framed_by_cls_and_sep():
    tok = CharTokenizer()
    text = "abcdefghijklmnopqrstuvwxyz" * 40  # 1040 characters
    rows = passages(tok, text, n=5, seq_len=12)
    assert rows.shape == (5, 12)
    assert (rows[:, 0] == tok.bos_id).all() and (rows[:, -1] == tok.eos_id).all()
    ids = tok.encode(text)
    starts = [int(s) for s in np.linspace(52, 988 - 10, 5)]  # the first and last 5% are skipped
    for row, s in zip(rows, starts, strict=True):
        np.testing.assert_array_equal(row[1:-1], ids[s:s + 10])
    with pytest.raises(ValueError, match="too short"):
        passages(tok, "short text", n=5, seq_len=12)


def test_paired_bootstrap_and_verdict():
    same = [True, False] * 50
    assert paired_bootstrap(same, same) == [0.0, 0.0]
    lo, hi = paired_bootstrap([False] * 100, [True] * 60 + [False] * 40)
    assert 0.5 < lo <= 0.6 <= hi < 0.7  # the difference is exactly 0.6 on the full set
    probe = {"before": {"accuracy": 0.8}, "after": {"accuracy": 0.75}, "difference_interval": [-0.1, 0.02]}
    assert "not met" in _verdict({"t": probe}) and "includes 0" in _verdict({"t": probe})
    probe = {"before": {"accuracy": 0.8}, "after": {"accuracy": 0.82}, "difference_interval": [-0.01, 0.05]}
    assert "**met**" in _verdict({"t": probe})


def test_genre_lists_name_shakespeare_files_once():
    plays = [p for group in SHAKESPEARE_GENRES.values() for p in group]
    assert len(plays) == len(set(plays)) == 34


MINILM = Path(os.environ.get("SEQDIFF_DATA", Path.home() / ".cache" / "seqdiff" / "data"))


@pytest.mark.slow
@pytest.mark.skipif(not all((MINILM / s).is_dir() for s in ("bert-vocab", "austen", "shakespeare")),
                    reason="needs the bert-vocab, austen and shakespeare data sources (seqdiff data fetch ...)")
def test_bert_init_pipeline_end_to_end(tmp_path):
    from pipelines.bert_init import main

    argv = ["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "report"), "--max-steps", "2",
            "--batch-size", "4", "--seq-len", "32", "--eval-blocks", "2", "--t-samples", "1", "--austen-passages",
            "10", "--shakespeare-passages", "3", "--num-samples", "2"]
    assert main(argv) == 0
    result = json.loads((tmp_path / "report" / "results.json").read_text())
    assert result["after"]["step"] == 2 and result["before"]["step"] == 0
    assert set(result["probes"]) == {"austen-novel", "shakespeare-genre"}
    assert result["config"]["model"]["n_layers"] == 6 and result["config"]["model"]["activation"] == "gelu"
    readme = (tmp_path / "report" / "README.md").read_text()
    assert result["command"] in readme and (tmp_path / "report" / "loss_curves.png").is_file()
    # LP-FT against the run above: the encoder frozen for the first step, then at half the head's lr
    lpft = ["--run-dir", str(tmp_path / "lpft"), "--out", str(tmp_path / "lpft_report"), "--max-steps", "3",
            "--freeze-backbone-steps", "1", "--backbone-lr-scale", "0.5", "--val-every", "1",
            "--baseline-run-dir", str(tmp_path / "run"), *argv[6:]]
    assert main(lpft) == 0
    result = json.loads((tmp_path / "lpft_report" / "results.json").read_text())
    assert result["after"]["step"] == 3 and result["config"]["train"]["freeze_backbone_steps"] == 1
    assert result["config"]["train"]["backbone_lr_scale"] == 0.5
    assert [v["after_steps"] for v in result["val_curve"]] == [1, 2, 3]
    assert result["baseline"]["step"] == 2 and result["baseline"]["train"]["freeze_backbone_steps"] == 0
    assert all("difference_interval_vs_baseline" in p and "baseline" in p for p in result["probes"].values())
    readme = (tmp_path / "lpft_report" / "README.md").read_text()
    assert "LP-FT" in readme and "Compared with the baseline run" in readme
