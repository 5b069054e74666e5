"""The EDLM experiment's generated files come from its summary: table.md shows summary.json's numbers, the
points beyond MDLM's range are computed from the intervals, the plots are written, bad options fail early."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from experiments.edlm_experiment import beyond_mdlm, plots, write_table

SUMMARY = Path(__file__).resolve().parents[1] / "reports" / "edlm" / "separate_oracle" / "summary.json"


@pytest.fixture()
def summary():
    return json.loads(SUMMARY.read_text())


def test_the_table_shows_the_numbers_of_the_summary(summary, tmp_path):
    write_table(summary, tmp_path)
    text = (tmp_path / "table.md").read_text()
    assert text.startswith(f"Made by `{summary['command']}`")
    for name, row in summary["bits_per_character"].items():
        assert f"| {name} | {row['bits_per_character']:.4f} |" in text
    for name, rows in summary["generation"].items():
        for r in rows:
            assert f"| {name} | {r['steps']} | {r['gen_perplexity']:.2f} |" in text
    for rerun in summary.get("likelihood_reruns", []):
        assert f"Made by `{rerun['command']}`" in text
    assert not (tmp_path / "README.md").exists()  # the README of a report is written by hand


def test_plots_are_written(summary, tmp_path):
    plots(summary, tmp_path)
    assert (tmp_path / "gen_ppl_vs_time.png").stat().st_size > 0 and (tmp_path / "ablation.png").stat().st_size > 0


def test_points_beyond_mdlms_range_are_those_better_than_every_mdlm_interval(summary, tmp_path):
    """An EDLM point whose interval lies below every MDLM interval has no interpolated speed-up; it is listed with
    its speed against MDLM's best point instead."""
    best = min(summary["generation"]["MDLM"], key=lambda m: m["gen_perplexity"])
    assert beyond_mdlm(summary, "EDLM-AR") == []  # the committed run has no such point
    fast = copy.deepcopy(summary)
    row = fast["generation"]["EDLM-AR"][0]
    row["gen_perplexity"], row["gen_perplexity_interval"] = 1.0, [0.9, 1.1]
    row["seconds_per_sample"] = best["seconds_per_sample"] / 2
    found = beyond_mdlm(fast, "EDLM-AR")
    assert [b["steps"] for b in found] == [row["steps"]]
    assert found[0]["speedup_vs_mdlm_best"] == pytest.approx(2.0)
    floor = min(m["gen_perplexity_interval"][0] for m in summary["generation"]["MDLM"])
    row["gen_perplexity_interval"] = [0.9, floor]  # touching the lowest MDLM interval: not beyond it
    assert beyond_mdlm(fast, "EDLM-AR") == []
    row["gen_perplexity_interval"] = [0.9, 1.1]
    write_table(fast, tmp_path)
    assert f"| EDLM-AR | {row['steps']} | 1.00 |" in (tmp_path / "table.md").read_text().split("below every")[1]


def test_table_without_ablation(summary, tmp_path):
    summary["ablation"] = {"k": [], "w": []}
    write_table(summary, tmp_path)
    plots(summary, tmp_path)
    assert "Ablation" not in (tmp_path / "table.md").read_text() and not (tmp_path / "ablation.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--edlm-k", "0"], "--edlm-k must be >= 1"),
    (["--edlm-window", "1.5"], r"--edlm-window must be in \[0, 1\]"),
    (["--from-summary"], "summary.json does not exist"),
])
def test_bad_options_fail_before_any_work(tmp_path, capsys, args, message):
    from experiments.edlm_experiment import main

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "none"), *args])
    assert re.search(message, capsys.readouterr().err)
