"""The generated tables of experiments/estimator_variance and experiments/quickstart_sweep show the numbers of
the committed results.json (the reports' README.md files are written by hand)."""

import json
from pathlib import Path

import pytest

REPORTS = Path(__file__).resolve().parents[1] / "reports"


def test_the_variance_table_shows_every_estimator_and_ratio():
    from experiments.estimator_variance import render

    result = json.loads((REPORTS / "variance" / "results.json").read_text())
    text = render(result)
    assert text.startswith(f"Made by `{result['command']}`")
    for regime, rows in result["results"].items():
        for row in rows:
            ratio = result["ratios"][regime][row["label"]]
            assert (f"| {row['label']} | {row['loss_mean']:.4f} ± {row['loss_mean_stderr']:.4f} | "
                    f"{row['loss_var']:.2e}") in text
            assert f"| {ratio['loss_var']:.2f} | {ratio['grad_var']:.2f}" in text


def test_the_variance_table_gives_each_ratio_its_standard_error_and_shows_only_the_measured_regimes():
    from experiments.estimator_variance import ratio_stderr, render

    result = json.loads((REPORTS / "variance" / "results.json").read_text())
    fresh_only = {**result, "results": {"fresh_batch": result["results"]["fresh_batch"]},
                  "config": {**result["config"], "groups": 20}}
    text = render(fresh_only)
    assert "## Fresh batch" in text and "## Fixed batch" not in text
    assert "spread over 20 disjoint groups of draws / sqrt(20)" in text
    rows = result["results"]["fresh_batch"]
    base = next(r for r in rows if r["label"] == result["baseline"])
    for row in rows:
        ratio = result["ratios"]["fresh_batch"][row["label"]]["grad_var"]
        if row is not base:
            se = ratio_stderr(base, row)
            assert f"| {ratio:.2f} ± {se:.2f} |" in text
            # the delta method's first-order error: ratio times the root sum of squared relative errors
            rel = ((base["grad_var_stderr"] / base["grad_var"]) ** 2 + (row["grad_var_stderr"] / row["grad_var"]) ** 2)
            assert se == pytest.approx(ratio * rel ** 0.5)
    assert "spread over 5 disjoint groups" in render(result)  # results written before --groups
    # a closed form: 0.6 ± 0.03 (5%) over 0.3 ± 0.012 (4%) is 2 ± 2 * sqrt(0.05^2 + 0.04^2) = 2 ± 0.1281
    worked = ratio_stderr({"grad_var": 0.6, "grad_var_stderr": 0.03}, {"grad_var": 0.3, "grad_var_stderr": 0.012})
    assert worked == pytest.approx(0.128062, abs=1e-6)


def test_the_variance_run_refuses_unknown_regimes_and_too_few_draws_per_group(tmp_path):
    from experiments.estimator_variance import chosen_regimes, main

    assert chosen_regimes("fresh_batch") == ["fresh_batch"]
    assert chosen_regimes("fresh_batch,fixed_batch") == ["fixed_batch", "fresh_batch"]
    with pytest.raises(SystemExit, match="unknown.*'fresh'"):
        chosen_regimes("fresh")
    with pytest.raises(SystemExit, match="none given"):
        chosen_regimes(" ")
    with pytest.raises(SystemExit, match="--draws 10 --groups 8"):
        main(["--draws", "10", "--groups", "8", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_the_data_part_of_the_variance_and_the_ratio_it_allows_against_worked_numbers(tmp_path):
    """fresh_batch - batch_noise per estimator (law of total variance), and the baseline's fresh-batch variance over
    their mean: antithetic 0.160 - 0.120 = 0.040, default 0.0857 - 0.0450 = 0.0407; 0.160 / 0.04035 = 3.97x."""
    from experiments.estimator_variance import data_part, main, render

    def row(label, var, se=0.001):
        return {"label": label, "loss_mean": 1.0, "loss_mean_stderr": 0.01, "loss_var": 0.1, "loss_var_stderr": 0.01,
                "grad_var": var, "grad_var_stderr": se, "grad_norm2": 0.5}

    result = {"command": "python -m experiments.estimator_variance", "date": "d", "elapsed_s": 1.0, "torch": "t",
              "threads": 1, "params": 10, "train_loss_final": 2.0, "baseline": "antithetic",
              "config": {"preset": "cpu-tiny", "train_steps": 1, "batch_size": 16, "seq_len": 256, "draws": 600,
                         "groups": 10, "per_batch": 10},
              "results": {"fresh_batch": [row("antithetic", 0.160), row("mask_count inverse_sqrt", 0.0857)],
                          "batch_noise": [row("antithetic", 0.120), row("mask_count inverse_sqrt", 0.0450)]},
              "ratios": {regime: {"antithetic": {"loss_var": 1.0, "grad_var": 1.0},
                                  "mask_count inverse_sqrt": {"loss_var": 1.0, "grad_var": 2.0}}
                         for regime in ("fresh_batch", "batch_noise")}}
    text = data_part(result)
    assert "antithetic 4.00e-02 ± 1.4e-03" in text and "mask_count inverse_sqrt 4.07e-02" in text
    assert "1.60e-01 / 4.04e-02 = **3.97x**" in text
    table = render(result)
    assert text in table and "(batch_noise: 60 fresh batches, 10 draws each)" in table
    assert "Var_x E(g | x)" not in render({**result, "results": {"batch_noise": result["results"]["batch_noise"]}})
    with pytest.raises(SystemExit, match="--per-batch 7"):  # refused before the model is trained
        main(["--regimes", "batch_noise", "--draws", "600", "--per-batch", "7", "--out", str(tmp_path)])
    assert not any(tmp_path.iterdir())


def test_the_variance_run_measures_the_chosen_estimators_and_always_the_baseline():
    from experiments.estimator_variance import BASELINE, ESTIMATORS, chosen_estimators

    assert chosen_estimators("") == ESTIMATORS
    chosen = chosen_estimators("mask_count inverse_sqrt, mask_count")
    assert [e.label for e in chosen] == ["antithetic", "mask_count", "mask_count inverse_sqrt"]  # the table's order
    assert [e.label for e in chosen_estimators(BASELINE)] == [BASELINE]
    with pytest.raises(SystemExit, match="unknown.*'mask count'"):
        chosen_estimators("mask count")


def test_the_sweep_table_shows_every_candidate():
    from experiments.quickstart_sweep import table

    results = json.loads((REPORTS / "quickstart_sweep" / "results.json").read_text())
    text = table(results)
    assert text.startswith(f"Made by `{results['command']}`")
    for name, r in results["candidates"].items():
        m, a = r["methods"]["mdlm"], r["methods"]["ar"]
        assert f"| {name} | " in text
        assert f"| {m['valid_bits_per_character']:.4f} | {a['valid_bits_per_character']:.4f} | " in text
        assert f"{100 * r['relative_gap_bits']:+.1f}%" in text


def test_the_long_dna_table_shows_the_extrapolation_of_the_committed_summary():
    from experiments.dna_experiment import table

    summary = json.loads((REPORTS / "dna" / "long" / "summary.json").read_text())
    text = table(summary)
    assert summary["recipe"] == "long" and f"Validation tiles: {summary['valid_tiles']}" in text
    for method, r in summary["models"].items():
        ex = r["extrapolation"]
        assert f"| {method.upper()} | {ex['last_step']} | {ex['last_bits']:.4f} |" in text
        assert ex["target"] == min(summary["markov_valid"].values())


def test_the_rc_table_shows_every_model_of_the_committed_results():
    from experiments.rc_equivariance import table

    results = json.loads((REPORTS / "dna" / "rc" / "results.json").read_text())
    text = table(results)
    for name, r in results["models"].items():
        assert f"| {name} | {r['step']} | {r['parameters']:,} | {r['bits_per_base']:.4f} |" in text
        assert r["delta_vs_plain_bits"] == r["bits_per_base"] - results["models"]["plain"]["bits_per_base"]


def test_the_sweep_table_shows_dashes_for_a_method_a_candidate_did_not_train():
    """`--methods mdlm` (a method.* candidate): the AR cells and the gap are dashes, not a KeyError or a zero."""
    from experiments.quickstart_sweep import main, table

    mdlm = {"valid_bits_per_character": 2.61234, "train_seconds": 601.4, "parameters": 5_689_119}
    results = {"command": "python -m experiments.quickstart_sweep --methods mdlm", "torch_threads": 1,
               "load_average_at_start": 2.0, "candidates": {"time_auto": {"overrides": ["method.time_sampling=auto"],
                                                                          "methods": {"mdlm": mdlm}}}}
    text = table(results)
    assert "| time_auto | method.time_sampling=auto | 2.6123 | - | - | 601 | - | 5,689,119 |" in text
    with pytest.raises(SystemExit):
        main(["--methods", "sedd"])


def test_fsdp2_compile_graphs_table():
    from experiments.fsdp2_compile_graphs import table

    way = {"frames": 12, "frames_ok": 11, "graph_breaks": 1, "calls_captured": 63, "unique_graphs": 3,
           "break_reasons": ["Attempted to call function marked as skipped"]}
    results = {"command": "python -m experiments.fsdp2_compile_graphs", "date": "d", "torch": "t",
               "config": {"layers": 4, "batch": 4, "seq_len": 16, "steps": 3},
               "ways": {"sharded whole": way,
                        "sharded per block": dict(way, frames=1, frames_ok=1, graph_breaks=0, calls_captured=56,
                                                  unique_graphs=1, break_reasons=[])}}
    md = table(results)
    assert "| sharded whole | 12 (11) | 1 | 63 | 3 |" in md and "| sharded per block | 1 (1) | 0 | 56 | 1 |" in md
    assert "Graph breaks: sharded whole: Attempted to call function marked as skipped" in md


def test_experiment_reports_name_their_command_and_write_both_files(tmp_path, capsys):
    from experiments.report import command_line, write_results

    assert command_line("sampler_lazy", ["--out", "a b"]) == "python -m experiments.sampler_lazy --out 'a b'"
    out = write_results(tmp_path / "r", {"x": 1}, "| t |\n")
    assert json.loads((out / "results.json").read_text()) == {"x": 1}
    assert (out / "table.md").read_text() == "| t |\n" and "| t |" in capsys.readouterr().out


def test_the_last_block_timing_alternates_the_switch_and_reports_both_methods(tmp_path):
    """experiments.last_block_time at 2 pairs: every pair has a step of each setting, both methods are in the
    table under its command, and an unknown method is refused."""
    from experiments import last_block_time

    assert last_block_time.main(["--pairs", "2", "--methods", "mdlm,ar", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["method"] for r in results["methods"]] == ["mdlm", "ar"]
    assert all(len(r["off_s"]) == len(r["on_s"]) == 2 for r in results["methods"])
    table = (tmp_path / "README.md").read_text()
    assert results["command"] in table and "| mdlm |" in table and "| ar |" in table
    with pytest.raises(SystemExit):
        last_block_time.main(["--methods", "bert", "--out", str(tmp_path)])
