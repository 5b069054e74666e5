"""`seqdiff edlm`, `frontier`, `bench` and `config` mistakes found by a user audit: each is one line and exit 2,
said before the work (and before anything is written), and nothing written earlier is replaced."""

import json
from pathlib import Path

import pytest

import seqdiff.bench.harness as harness
import seqdiff.evaluation.frontier as frontier
from seqdiff.cli import main

FIXTURE = Path("tests/fixtures/shakespeare_tiny.txt").resolve()
RECIPE = ["model.preset=test", "data.batch_size=2", f"data.train_file={FIXTURE}", f"data.valid_file={FIXTURE}",
          f"data.test_file={FIXTURE}", "train.val_batches=1", "train.progress_bar=false", "train.warmup_steps=0",
          "train.val_every=100", "train.max_steps=1"]
BENCH = ["--preset", "test", "--seq-len", "8", "--batch-size", "1", "--repeats", "1", "--warmup", "0",
         "--sample-batches", "1", "--sample-repeats", "1", "--sample-budget-s", "1", "--matmul-size", "8"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An MDLM of 32-token blocks, an AR model that reads 64 tokens and one that reads only 16."""
    root = tmp_path_factory.mktemp("edlm_audit")
    for name, method, seq_len, context in (("mdlm", "mdlm", 32, 64), ("ar", "ar", 32, 64), ("short_ar", "ar", 16, 16)):
        assert main(["train", "--run-dir", str(root / name), *RECIPE, f"method.name={method}",
                     f"data.seq_len={seq_len}", f"model.max_seq_len={context}"]) == 0
    return root


@pytest.fixture
def no_work(monkeypatch):
    """Any benchmark phase or frontier sampling that starts fails the test: the refusal must come first."""
    def never(*args, **kwargs):
        raise AssertionError("the work started before the mistake was said")

    monkeypatch.setattr(harness, "bench_training", never)
    monkeypatch.setattr(frontier, "build_arms", never)


# ------------------------------------------------------------------ edlm
def test_a_negative_nce_learning_rate_is_one_line(runs, capsys, refused):
    line = refused(["edlm", "train-nce", str(runs / "mdlm"), "--lr", "-1", "--out", str(runs / "e.pt")])
    assert "--lr must be >= 0, got -1.0" in line


@pytest.mark.parametrize("command", [["edlm", "eval", "RUN", "--energy", "coar:RUN"],
                                     ["edlm", "train-nce", "RUN", "--out", "OUT/e.pt"]])
@pytest.mark.parametrize("device", ["banana", "mps"])
def test_a_device_that_is_not_here_is_one_line(runs, capsys, command, device, refused):
    argv = [a.replace("RUN", str(runs / "mdlm")).replace("OUT", str(runs)) for a in command]
    assert f"--device {device}" in refused([*argv, "--device", device]).replace("'", "")


def test_an_ar_energy_that_reads_fewer_tokens_than_the_blocks_is_named(runs, capsys, refused):
    line = refused(["edlm", "eval", str(runs / "mdlm"), "--energy", f"coar:{runs / 'short_ar'}",
                           "--out", str(runs / "o.json")])
    assert "reads at most 16 tokens" in line and "32-token blocks" in line
    assert not (runs / "o.json").exists()


def test_partition_samples_beyond_memory_are_refused_before_scoring(runs, capsys, refused):
    line = refused(["edlm", "eval", str(runs / "mdlm"), "--energy", f"ar:{runs / 'ar'}",
                           "--num-partition-samples", str(10**9), "--out", str(runs / "o.json")])
    assert "--num-partition-samples 1000000000" in line and "GiB" in line


def test_default_results_stay_in_the_export_or_run_and_one_energy_never_replaces_another(runs, tmp_path, capsys):
    export = tmp_path / "exported" / "mdlm"
    assert main(["export", str(runs / "mdlm"), str(export)]) == 0
    text = tmp_path / "held_out.txt"
    text.write_text("to be or not to be, that is the question\n" * 2)
    data = ["--data", str(text), "--num-partition-samples", "1"]
    assert main(["edlm", "eval", str(export), "--energy", f"coar:{runs / 'ar'}", *data]) == 0
    assert [p.parent for p in tmp_path.rglob("edlm-*.json")] == [export / "eval"]  # not beside the export
    step = runs / "mdlm" / "checkpoints" / "step1.ckpt"
    for energy in (f"coar:{runs / 'ar'}", f"coar:{runs / 'ar' / 'checkpoints' / 'last.ckpt'}"):
        assert main(["edlm", "eval", str(step), "--energy", energy, *data]) == 0
    written = sorted(p.name for p in (runs / "mdlm" / "eval").glob("*.json"))
    assert len(written) == 2 and all(name.startswith("step1-edlm-coar-") for name in written), written
    capsys.readouterr()


def test_interrupted_edlm_commands_say_nothing_was_written(runs, monkeypatch, capsys):
    import seqdiff.edlm.nce_train as nce_train

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(nce_train, "train_nce", interrupted)
    assert main(["edlm", "train-nce", str(runs / "mdlm"), "--out", str(runs / "e.pt")]) == 130
    assert "nothing was written" in capsys.readouterr().err
    assert not (runs / "e.pt").exists()


# ------------------------------------------------------------------ bench
def test_a_bench_out_that_cannot_hold_the_report_is_refused_before_the_benchmark(tmp_path, capsys, no_work, refused):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    for out in (notes, notes / "sub"):
        assert "notes.txt is a file" in refused(["bench", *BENCH, "--out", str(out)])
    assert notes.read_text() == "mine"


@pytest.mark.parametrize("device", ["banana", "mps"])
def test_a_bench_device_that_is_not_here_is_one_line(tmp_path, capsys, no_work, device, refused):
    assert f"--device {device}" in refused(["bench", *BENCH, "--device", device,
                                                   "--out", str(tmp_path)]).replace("'", "")
    assert harness.main([*BENCH, "--device", device, "--out", str(tmp_path)]) == 2  # python -m seqdiff.bench.harness
    assert "Traceback" not in capsys.readouterr().err


def test_a_negative_sampling_budget_is_refused(tmp_path, capsys, no_work):
    with pytest.raises(SystemExit) as e:
        main(["bench", *BENCH, "--sample-budget-s", "-1", "--out", str(tmp_path)])
    assert e.value.code == 2 and "--sample-budget-s must be >= 0" in capsys.readouterr().err


def test_interrupted_bench_says_nothing_was_written(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(harness, "bench_training", interrupted)
    assert main(["bench", *BENCH, "--out", str(tmp_path)]) == 130
    assert "nothing was written" in capsys.readouterr().err and not any(tmp_path.iterdir())


# ------------------------------------------------------------------ frontier
def test_frontier_never_replaces_a_readme_it_did_not_write(tmp_path, capsys, no_work, refused):
    (tmp_path / "README.md").write_text("# hand-written\n")
    line = refused(["frontier", "--checkpoint", "RUN", "--oracle", "AR", "--out", str(tmp_path)])
    assert "README.md that no `seqdiff frontier` wrote" in line
    assert (tmp_path / "README.md").read_text() == "# hand-written\n"


@pytest.mark.parametrize("flags, said", [(["--length", "0"], "--length must be >= 1, got 0"),
                                         (["--length", "-3"], "--length must be >= 1, got -3"),
                                         (["--device", "banana"], "--device 'banana' is not a device name")])
def test_frontier_nonsense_is_refused_before_loading(tmp_path, capsys, no_work, flags, said, refused):
    assert said in refused(["frontier", "--checkpoint", "RUN", "--oracle", "AR", "--steps", "2",
                                   "--num-samples", "1", *flags, "--out", str(tmp_path / "report")])


def test_a_sampler_refused_at_the_fewest_steps_is_skipped_not_fatal(runs, tmp_path, capsys):
    """ReMDM's loop band holds no step at 1 step: that row is skipped with a note (the warm-up used to run every
    sampler at the fewest steps and failed there)."""
    out = tmp_path / "report"
    assert main(["frontier", "--checkpoint", str(runs / "mdlm"), "--oracle", str(runs / "ar"), "--steps", "1,4",
                 "--num-samples", "1", "--length", "8", "--remdm-schedule", "loop", "--out", str(out)]) == 0
    rows = json.loads((out / "frontier.json").read_text())["rows"]
    assert [r["steps"] for r in rows if r["sampler"] == "remdm"] == [4]
    assert "ReMDM-loop (eta 0.02) at 1 steps skipped" in capsys.readouterr().err


# ------------------------------------------------------------------ config
@pytest.mark.parametrize("extra", [["--config", "configs/quickstart.yaml"], ["model.n_layers=3"]])
def test_config_keys_with_a_recipe_or_overrides_is_refused(capsys, extra, refused):
    assert "--keys lists every key and reads no recipe" in refused(["config", "--keys", *extra])
