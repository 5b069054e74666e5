"""experiments.quickstart_ladder: the rows it reads from each quickstart report, the training logs from each run,
reuse of finished step counts (no retraining) and of an earlier report's logs once the runs are gone."""

import json

import pytest

from experiments import quickstart_ladder as ladder


def _results(steps: int, mdlm: float, ar: float) -> dict:
    model = {"tokens_seen": steps * 4096, "known_word_share": 0.5, "train_seconds": 10.0}
    return {"models": {"mdlm": dict(model, bits_per_character=mdlm), "ar": dict(model, bits_per_character=ar)},
            "ngram": {"bits_per_character": 2.3, "order": 4, "valid_bits_per_character_by_order": {"3": 2.4, "4": 2.2}},
            "total_seconds": 30.0}


def _metrics(run_dir, val, train):
    (run_dir / "logs").mkdir(parents=True)
    lines = ["epoch,lr,step,train/bits_per_token,train/loss,val/bits_per_token,val/nll"]
    lines += [f"0,0.001,{step},{bits},1.0,," for step, bits in train]
    lines += [f"0,,{step - 1},,,{bits},1.0" for step, bits in val]
    (run_dir / "logs" / "metrics.csv").write_text("\n".join(lines) + "\n")


def test_parse_steps():
    assert ladder.parse_steps("2200,550, 1100,550") == [550, 1100, 2200]
    for bad in ("", "0,5", "a,5"):
        with pytest.raises(SystemExit):
            ladder.parse_steps(bad)


def test_row_and_gap():
    row = ladder.ladder_row(100, _results(100, 3.0, 2.5))
    assert row["gap"] == pytest.approx(0.2) and row["tokens"] == 409_600
    assert row["ar_minus_ngram"] == pytest.approx(0.2) and row["mdlm_minus_ngram"] == pytest.approx(0.7)
    assert row["ngram_order"] == 4 and row["ngram_valid_bits"] == 2.2


def test_training_log_reads_the_validation_curve_and_the_last_training_bits(tmp_path):
    _metrics(tmp_path, val=[(250, 2.9), (500, 2.7)], train=[(s, 3.0 + s / 1000) for s in range(9, 500, 10)])
    log = ladder.training_log(tmp_path)
    assert log["validation"] == [[250, 2.9], [500, 2.7]]
    assert log["train_bits_last_10_logs"] == pytest.approx(sum(3.0 + s / 1000 for s in range(409, 500, 10)) / 10)
    assert ladder.training_log(tmp_path / "gone") is None


def test_main_reuses_reports_and_keeps_logs_when_runs_are_gone(tmp_path, monkeypatch):
    out, runs = tmp_path / "out", tmp_path / "runs"
    trained = []

    def fake_quickstart(out_dir, run_root, max_steps):
        trained.append(max_steps)
        for method, bits in (("mdlm", 3.0), ("ar", 2.5)):
            _metrics(run_root / method, val=[(max_steps, bits)], train=[(max_steps - 1, bits - 0.1)])
        results = _results(max_steps, 3.0 - max_steps / 1000, 2.5)
        out_dir.mkdir(parents=True)
        (out_dir / "results.json").write_text(json.dumps(results))
        return results

    scored = []

    def fake_validation_bits(run_dir):
        scored.append(run_dir.parent.name + "/" + run_dir.name)
        return 2.0 + len(scored) / 100

    monkeypatch.setattr(ladder, "run_quickstart", fake_quickstart)
    monkeypatch.setattr(ladder, "validation_bits", fake_validation_bits)
    assert ladder.main(["--out", str(out), "--run-root", str(runs), "--steps", "20,10"]) == 0
    assert trained == [10, 20]
    first = json.loads((out / "results.json").read_text())
    assert [r["steps"] for r in first["rows"]] == [10, 20]
    assert first["rows"][1]["mdlm_log"]["validation"] == [[20, 3.0]]
    table = (out / "table.md").read_text()
    assert "| 20 | 0.1 M | 2.9800 | 2.5000 | 2.3000 | +19.2% |" in table
    assert scored == ["steps_10/mdlm", "steps_10/ar", "steps_20/mdlm", "steps_20/ar"]
    assert "scores 2.2000 bits per character on the validation play" in table
    assert "| 20 | AR | 2.4000 | 2.5000 | 2.5000 (20) | 2.0400 |" in table
    assert (out / "bits_vs_tokens.png").stat().st_size > 0 and (out / "validation_curves.png").stat().st_size > 0

    import shutil

    shutil.rmtree(runs)  # the runs removed: the reports and the earlier logs are what is left
    assert ladder.main(["--out", str(out), "--run-root", str(runs), "--steps", "10,20"]) == 0
    assert trained == [10, 20] and len(scored) == 4  # nothing retrained or scored again
    assert json.loads((out / "results.json").read_text())["rows"] == first["rows"]


def test_validation_bits_needs_the_run(tmp_path):
    assert ladder.validation_bits(tmp_path / "steps_10" / "mdlm") is None


def test_a_stopped_training_ends_the_ladder_with_its_status_and_writes_nothing(tmp_path, monkeypatch):
    import signal

    from seqdiff.training.guards import TrainingInterrupted

    def interrupted(out_dir, run_root, max_steps):
        raise TrainingInterrupted(signal.SIGINT, 30, run_root / "mdlm" / "checkpoints" / "last.ckpt", run_root)

    monkeypatch.setattr(ladder, "run_quickstart", interrupted)
    assert ladder.main(["--out", str(tmp_path / "out"), "--run-root", str(tmp_path / "runs"), "--steps", "10"]) == 130
    assert not (tmp_path / "out" / "results.json").exists()
