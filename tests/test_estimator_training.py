"""experiments/estimator_training: every estimator trained from the same start on the same windows, scored alike."""

import json

import pytest

from experiments import estimator_training as X


def test_a_tiny_run_writes_every_arm_at_equal_cost_and_is_deterministic(tmp_path):
    args = ["--preset", "test", "--seq-len", "32", "--batch-size", "4", "--steps", "4", "--eval-every", "2",
            "--eval-windows", "8", "--eval-draws", "1", "--seeds", "2", "--threads", "1", "--out", str(tmp_path)]
    assert X.main(args) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    assert result["steps"] == [2, 4] and set(result["summary"]) == {a.label for a in X.ARMS}
    for label, s in result["summary"].items():
        assert s["windows_per_step"] == (2 if "complementary" in label else 4)
        assert all(lo <= m <= hi for m, lo, hi in zip(s["mean"], s["min"], s["max"]))
    assert len(result["runs"]) == 2 * len(X.ARMS)
    table = (tmp_path / "table.md").read_text()
    first = result["summary"]["antithetic"]
    assert table.startswith("Made by `python -m experiments.estimator_training") and f"{first['mean'][-1]:.4f}" in table
    # the same arm and seed trains to the same weights: the numbers depend on the estimator only
    again = tmp_path / "again"
    assert X.main([*args[:-1], str(again)]) == 0
    rerun = json.loads((again / "results.json").read_text())
    assert [r["curve"] for r in rerun["runs"]] == [r["curve"] for r in result["runs"]]


def test_an_odd_batch_is_refused():
    with pytest.raises(SystemExit, match="even"):
        X.main(["--batch-size", "3"])
