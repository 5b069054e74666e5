"""experiments.bert_init_seeds: the per-seed test and the rule over seeds, from results.json files (mechanics on
small hand-made results; the real reports are combined by the command in reports/bert_init)."""

import json

import pytest

from experiments.bert_init_seeds import SeedReportError, combine, main

MARGIN = 0.02


def _result(seed: int, intervals: dict, lr_scale: float = 0.03) -> dict:
    probes = {task: {"before": {"accuracy": 0.70}, "after": {"accuracy": 0.70 + (lo + hi) / 2},
                     "difference_interval": [lo, hi]} for task, (lo, hi) in intervals.items()}
    return {"command": f"python -m experiments.bert_init --seed {seed}", "noninferiority_margin": MARGIN,
            "config": {"train": {"seed": seed, "backbone_lr_scale": lr_scale}, "sample": {"seed": seed}},
            "after": {"test": {"nll_nats_per_token": 7.0 + seed / 100}}, "probes": probes}


def _write(tmp_path, name, result) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(result))
    return d


MET = (-0.015, -0.005)       # lower end above -0.02
WORSE = (-0.03, -0.004)      # upper end below 0
UNSURE = (-0.03, 0.01)       # neither


def test_rule_counts_seeds_whose_every_probe_meets_the_margin(tmp_path):
    dirs = [_write(tmp_path, f"s{s}", _result(s, probes)) for s, probes in
            ((1, {"a": MET, "b": MET}), (2, {"a": WORSE, "b": MET}), (3, {"a": MET, "b": UNSURE}),
             (0, {"a": MET, "b": MET}))]  # seed 0: listed, not counted
    summary = combine(dirs, {1, 2, 3}, min_met=2)
    assert [row["seed"] for row in summary["rows"]] == [0, 1, 2, 3]
    assert [row["met"] for row in summary["rows"]] == [True, True, False, False]
    assert [row["probes"]["a"]["outcome"] for row in summary["rows"]] == ["met", "met", "worse", "met"]
    assert summary["rows"][3]["probes"]["b"]["outcome"] == "inconclusive"
    assert summary["met_count"] == 1 and summary["no_worse_shown"] is False
    assert combine(dirs, {1, 2, 3}, min_met=1)["no_worse_shown"] is True
    assert summary["difference_over_counted"]["a"]["min"] == pytest.approx((WORSE[0] + WORSE[1]) / 2)


def test_reports_that_are_not_one_recipe_or_miss_a_seed_are_refused(tmp_path):
    a = _write(tmp_path, "a", _result(1, {"p": MET}))
    b = _write(tmp_path, "b", _result(2, {"p": MET}, lr_scale=0.1))
    with pytest.raises(SeedReportError, match=r"not the same recipe.*train.backbone_lr_scale: 0.03 vs 0.1"):
        combine([a, b], {1, 2}, 1)
    wise = _write(tmp_path, "wise", {**_result(2, {"p": MET}), "encoder_alpha": 0.5})  # scored after WiSE-FT
    with pytest.raises(SeedReportError, match=r"not the same recipe.*encoder_alpha: 1.0 vs 0.5"):
        combine([a, wise], {1, 2}, 1)
    c = _write(tmp_path, "c", _result(1, {"p": MET}))
    with pytest.raises(SeedReportError, match=r"each counted seed must appear exactly once"):
        combine([a, c], {1, 2}, 1)
    with pytest.raises(SeedReportError, match=r"--min-met must lie in \[1, 2\]"):
        combine([a], {1, 2}, 3)
    with pytest.raises(SeedReportError, match="no results.json"):
        combine([tmp_path / "nowhere"], {1}, 1)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{")
    with pytest.raises(SeedReportError, match="bad/results.json: not a readable JSON file"):
        combine([tmp_path / "bad"], {1}, 1)
    (tmp_path / "bad" / "results.json").write_text("[]")
    with pytest.raises(SeedReportError, match="a JSON object is needed"):
        combine([tmp_path / "bad"], {1}, 1)


def test_cli_writes_the_table_with_its_command_and_refuses_bad_seeds(tmp_path, capsys):
    dirs = [str(_write(tmp_path, f"s{s}", _result(s, {"p": MET}))) for s in (1, 2)]
    out = tmp_path / "out"
    assert main([*dirs, "--counted-seeds", "1,2", "--min-met", "2", "--declared-in", "abc123", "--out",
                 str(out)]) == 0
    text = (out / "table.md").read_text()
    assert "python -m experiments.bert_init_seeds" in text and "declared in abc123" in text
    assert "Met for 2 of 2 counted seeds; no_worse_shown: True." in text
    assert json.loads((out / "results.json").read_text())["met_count"] == 2
    assert (out / "intervals.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        main([*dirs, "--counted-seeds", "1,x", "--min-met", "1", "--out", str(tmp_path / "o2")])
    assert "comma-separated integers" in capsys.readouterr().err and not (tmp_path / "o2").exists()
