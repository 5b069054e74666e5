"""Frozen-embedding probes and the BERT-init pipeline's pieces: pooling, the probe, passages, the bootstrap."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import experiments.bert_init as bert_init
from experiments.bert_init import (
    AUSTEN_NOVELS,
    OLD_PROBE_CS,
    PROBE_CS,
    SHAKESPEARE_GENRES,
    goal_outcome,
    grid_edge_counts,
    passage_starts,
    passages,
)
from seqdiff.backbones import build_backbone
from seqdiff.config import ModelConfig
from seqdiff.evaluation.probe import logistic_probe, mean_pooled_features
from seqdiff.evaluation.stats import noninferiority, paired_bootstrap
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
    rows, _ = passages(tok, text, n=5, seq_len=12)
    assert rows.shape == (5, 12)
    assert (rows[:, 0] == tok.bos_id).all() and (rows[:, -1] == tok.eos_id).all()
    ids = tok.encode(text)
    starts = [int(s) for s in np.linspace(52, 988 - 10, 5)]  # the first and last 5% are skipped
    for row, s in zip(rows, starts, strict=True):
        np.testing.assert_array_equal(row[1:-1], ids[s:s + 10])
    with pytest.raises(ValueError, match="too short"):
        passages(tok, "short text", n=5, seq_len=12)


def _probe(before, after, margin=0.02):
    """A probe entry as main() writes it, from per-passage correctness arrays; the interval is the bootstrap's."""
    b, a = np.asarray(before), np.asarray(after)
    interval = paired_bootstrap(b.tolist(), a.tolist())
    return {"before": {"accuracy": float(b.mean())}, "after": {"accuracy": float(a.mean())},
            "difference_interval": interval, "noninferiority": noninferiority(interval, margin)}


def test_goal_met_inconclusive_worse_on_hand_made_arrays():
    rng = np.random.default_rng(0)
    before = rng.random(4000) < 0.6
    # met: after equals before except 1% of passages flipped to wrong (difference -0.01, half-width ~0.003)
    flip = np.zeros(4000, bool)
    flip[rng.choice(np.flatnonzero(before), 40, replace=False)] = True
    met = _probe(before, before & ~flip)
    assert -0.02 < met["difference_interval"][0] and met["difference_interval"][1] < 0  # below 0, within margin
    assert goal_outcome({"austen-novel": met}) == "met"
    # inconclusive: 200 passages, 10 of them newly wrong and 8 newly right: the interval spans -0.02 and 0
    b = np.array([True] * 100 + [False] * 100)
    a = b.copy()
    a[:10] = False
    a[100:108] = True
    inc, inc_after = _probe(b, a), a
    assert inc["difference_interval"][0] < -0.02 < 0 < inc["difference_interval"][1]
    assert goal_outcome({"austen-novel": met, "shakespeare-genre": inc}) == "inconclusive"
    # worse: a quarter of the right answers lost; one worse task makes the goal worse
    a = before.copy()
    a[np.flatnonzero(before)[::4]] = False
    worse = _probe(before, a)
    assert worse["difference_interval"][1] < 0 and worse["noninferiority"] == "worse"
    assert goal_outcome({"austen-novel": worse, "shakespeare-genre": inc}) == "worse"
    # a wider margin declared in advance turns the small loss into a met test; the rule is the margin's alone
    assert goal_outcome({"t": _probe(b, inc_after, margin=0.1)}) == "met"


def test_grid_edges_and_the_widened_grid():
    assert PROBE_CS[0] == pytest.approx(1e-4) and PROBE_CS[-1] == pytest.approx(100.0) and len(PROBE_CS) == 7
    assert np.allclose(np.diff(np.log10(PROBE_CS)), 1.0)
    assert set(OLD_PROBE_CS) < set(PROBE_CS)  # the old grid is inside the new one, strictly
    assert grid_edge_counts([0.01, 10.0, 0.01, 1.0], OLD_PROBE_CS) == (2, 1)
    assert grid_edge_counts([0.01, 10.0, 0.01, 1.0], PROBE_CS) == (0, 0)
    assert grid_edge_counts([1e-4, 100.0, 100.0], PROBE_CS) == (1, 2)
    assert grid_edge_counts([0.01, 10.0, 0.01, 0.01], OLD_PROBE_CS) == (3, 1)


def test_passage_starts_at_capacity_do_not_overlap():
    for n_ids, seq_len in ((1000, 12), (98_009, 64), (24_397, 64), (5_003, 7)):
        width = seq_len - 2
        lo, hi = int(0.05 * n_ids), int(0.95 * n_ids) - width
        cap = (hi - lo) // width
        starts = passage_starts(n_ids, cap, seq_len)
        assert len(starts) == cap and starts[0] >= lo and starts[-1] + width <= int(0.95 * n_ids)
        assert np.diff(starts).min() >= width  # consecutive windows never share a token
        with pytest.raises(ValueError, match=f"holds {cap}"):
            passage_starts(n_ids, cap + 1, seq_len)


def _fake_sources(tmp_path, monkeypatch, n_chars):
    """Plain-text stand-ins for the austen and shakespeare data sources (random letters, one file per text)."""
    rng = np.random.default_rng(0)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    for source, names in (("austen", [f"{n}.txt" for n in AUSTEN_NOVELS]),
                          ("shakespeare", [f"{p}_gut.txt" for g in SHAKESPEARE_GENRES.values() for p in g])):
        (tmp_path / source).mkdir()
        for name in names:
            (tmp_path / source / name).write_text("".join(rng.choice(letters, n_chars)))
    monkeypatch.setattr(bert_init, "source_path", lambda name: tmp_path / name)


def _check_no_overlap(spans, width):
    by_text = {}
    for text, start in spans:
        by_text.setdefault(text, []).append(start)
    for starts in by_text.values():
        assert np.diff(sorted(starts)).min() >= width


def test_tasks_keep_their_split_rules_with_many_passages(tmp_path, monkeypatch):
    _fake_sources(tmp_path, monkeypatch, n_chars=4000)
    tok, seq_len = CharTokenizer(), 12
    n_ids = min(len(tok.encode((tmp_path / "austen" / f"{n}.txt").read_text())) for n in AUSTEN_NOVELS)
    cap = (int(0.95 * n_ids) - 10 - int(0.05 * n_ids)) // 10  # as many windows of 10 as the middle 90% holds
    task = bert_init.austen_task(tok, cap, seq_len)
    cut = int(0.7 * cap)
    assert task["x_train"].shape == (6 * cut, seq_len) and task["x_test"].shape == (6 * (cap - cut), seq_len)
    _check_no_overlap(task["spans_train"] + task["spans_test"], seq_len - 2)
    for novel in AUSTEN_NOVELS:  # each novel's first 70% of passages train, the last 30% test
        tr = [s for t, s in task["spans_train"] if t == novel]
        te = [s for t, s in task["spans_test"] if t == novel]
        assert len(tr) == cut and max(tr) + seq_len - 2 <= min(te)
    assert task["groups_test"] == [t for t, _ in task["spans_test"]]
    assert np.bincount(task["y_test"]).tolist() == [cap - cut] * 6
    ids = tok.encode((tmp_path / "austen" / "emma.txt").read_text())
    novel, start = task["spans_test"][0]
    np.testing.assert_array_equal(task["x_test"][0, 1:-1], ids[start:start + seq_len - 2])

    task = bert_init.shakespeare_task(tok, 40, seq_len)
    held = {t for t, _ in task["spans_test"]}
    assert held.isdisjoint(t for t, _ in task["spans_train"])  # split by play
    for plays in SHAKESPEARE_GENRES.values():  # every third play of a genre (sorted) is held out
        assert {p for i, p in enumerate(sorted(plays)) if i % 3 == 2} == held & set(plays)
    assert len(task["spans_train"]) == len(task["x_train"]) == 40 * (34 - len(held))
    assert len(task["groups_test"]) == len(task["x_test"]) == 40 * len(held) == 40 * 10
    _check_no_overlap(task["spans_train"] + task["spans_test"], seq_len - 2)
    with pytest.raises(ValueError, match="too short"):
        bert_init.shakespeare_task(tok, cap + 1, seq_len)


def test_genre_lists_name_shakespeare_files_once():
    plays = [p for group in SHAKESPEARE_GENRES.values() for p in group]
    assert len(plays) == len(set(plays)) == 34


@pytest.mark.slow
@pytest.mark.requires_source("bert-vocab", "austen", "shakespeare")
def test_bert_init_pipeline_end_to_end(tmp_path):
    from experiments.bert_init import main

    argv = ["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "report"), "--max-steps", "2",
            "--batch-size", "4", "--seq-len", "32", "--eval-blocks", "2", "--t-samples", "1", "--austen-passages",
            "10", "--shakespeare-passages", "3", "--num-samples", "2"]
    assert main(argv) == 0
    result = json.loads((tmp_path / "report" / "results.json").read_text())
    assert result["after"]["step"] == 2 and result["before"]["step"] == 0
    assert set(result["probes"]) == {"austen-novel", "shakespeare-genre"}
    assert result["config"]["model"]["n_layers"] == 6 and result["config"]["model"]["activation"] == "gelu"
    table_md = (tmp_path / "report" / "table.md").read_text()
    assert result["command"] in table_md and (tmp_path / "report" / "loss_curves.png").is_file()
    assert not (tmp_path / "report" / "README.md").exists()  # the README of a report is written by hand
    assert result["noninferiority_margin"] == 0.02 and result["probe_cs"] == list(PROBE_CS)
    assert result["goal_outcome"] == goal_outcome(result["probes"])
    for task, p in result["probes"].items():  # the table shows the JSON's numbers
        assert f"| {task} | " in table_md and f"{p['after']['accuracy']:.3f}" in table_md
    for p in result["probes"].values():
        assert p["noninferiority"] == noninferiority(p["difference_interval"], 0.02)
        assert len(p["difference_interval_by_text"]) == 2 and p["test_texts"] in (6, 10)
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
    assert result["trained_in_this_call"]
    assert "| probe | accuracy baseline | accuracy this run |" in (tmp_path / "lpft_report" / "table.md").read_text()
    # the finished run again: reused, not retrained, and the header says so
    assert main([*argv[:2], "--out", str(tmp_path / "again"), *argv[4:]]) == 0
    result = json.loads((tmp_path / "again" / "results.json").read_text())
    assert result["trained_in_this_call"] is False and result["after"]["step"] == 2


def test_probe_texts_that_are_short_or_missing_are_named(tmp_path):
    from experiments.bert_init import text_passages

    tok = CharTokenizer()
    short = tmp_path / "short.txt"
    short.write_text("too short for five passages")
    with pytest.raises(ValueError, match=r"short\.txt: a text of .* too short"):
        text_passages(tok, short, n=5, seq_len=12)
    with pytest.raises(ValueError, match=r"missing\.txt"):
        text_passages(tok, tmp_path / "missing.txt", n=5, seq_len=12)


@pytest.mark.requires_source("bert-vocab")
def test_a_frozen_parameters_typo_is_named_before_any_scoring(tmp_path, capsys):
    from experiments.bert_init import main

    with pytest.raises(SystemExit):
        main(["--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "out"), "--frozen-parameters", "layer.*"])
    assert "--frozen-parameters: train.frozen_parameters: 'layer.*' matches no parameter" in capsys.readouterr().err
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


def test_frozen_parameters_reach_the_recipe():
    from experiments.bert_init import build_parser, run_config

    args = build_parser().parse_args(["--frozen-parameters", "layers.*", "--max-steps", "350",
                                      "--freeze-backbone-steps", "100"])
    assert run_config(args).train.frozen_parameters == ["layers.*"]
    assert run_config(build_parser().parse_args([])).train.frozen_parameters == []


def test_the_table_of_a_committed_report_shows_its_numbers():
    """table.md from a committed results.json (a WiSE-FT run): every probe's accuracies, interval and outcome."""
    from experiments.bert_init import table

    result = json.loads(Path("reports/bert_init/lpft03_wise05_seed1/results.json").read_text())
    text = table(result)
    assert text.startswith(f"Made by `{result['command']}`") and "WiSE-FT encoder, alpha 0.5" in text
    for task, p in result["probes"].items():
        lo, hi = p["difference_interval"]
        row = next(line for line in text.splitlines() if line.startswith(f"| {task} | "))
        assert f"| {p['before']['accuracy']:.3f} | {p['after']['accuracy']:.3f} |" in row
        assert f"[{lo:+.3f}, {hi:+.3f}]" in row and f"| {p['noninferiority']} |" in row
    assert f"met): {goal_outcome(result['probes'])}." in text


def test_render_only_names_a_missing_or_malformed_results_file(tmp_path, capsys):
    from experiments.bert_init import main

    for content in (None, "{not json"):
        if content is not None:
            (tmp_path / "results.json").write_text(content)
        with pytest.raises(SystemExit):
            main(["--out", str(tmp_path), "--render-only"])
        err = capsys.readouterr().err
        assert f"--render-only: {tmp_path / 'results.json'} is not a readable results.json" in err
    assert not (tmp_path / "table.md").exists()
