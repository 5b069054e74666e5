"""The EDLM experiment's report is computed from its summary: counts against intervals, entropy ratios and
speed-ups come from the numbers, and the oracle note follows the settings (separate oracle or not)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from pipelines.edlm_experiment import _generation_reading, plots, write_readme

SUMMARY = Path(__file__).resolve().parents[1] / "reports" / "edlm" / "separate_oracle" / "summary.json"


@pytest.fixture()
def summary():
    return json.loads(SUMMARY.read_text())


def test_generation_reading_counts_what_the_rows_say(summary):
    gen = summary["generation"]
    lower = sum(e["gen_perplexity"] < m["gen_perplexity"] for e, m in zip(gen["EDLM-AR"], gen["MDLM"]))
    assert f"EDLM-AR is lower than MDLM at {lower} of {len(gen['MDLM'])} step counts" in _generation_reading(summary)
    # make every EDLM-AR row clearly better: the count of disjoint intervals must follow
    changed = copy.deepcopy(summary)
    for row in changed["generation"]["EDLM-AR"]:
        row["gen_perplexity"], row["gen_perplexity_interval"] = 1.0, [0.9, 1.1]
    n = len(gen["MDLM"])
    assert f"EDLM-AR is lower than MDLM at {n} of {n} step counts, with disjoint ±2 s.e. intervals at {n}" in \
        _generation_reading(changed)


@pytest.mark.parametrize("separate", [True, False])
def test_readme_names_the_oracle_it_was_scored_by(summary, tmp_path, separate):
    summary["settings"]["separate_oracle"] = separate
    write_readme(summary, tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert ("separate from the EDLM-AR energy" in text) == separate
    assert ("flattered by construction" in text) == (not separate)
    assert f"Total {summary['seconds_total'] / 60:.1f} min" in text


def test_plots_are_written(summary, tmp_path):
    plots(summary, tmp_path)
    assert (tmp_path / "gen_ppl_vs_time.png").stat().st_size > 0 and (tmp_path / "ablation.png").stat().st_size > 0
