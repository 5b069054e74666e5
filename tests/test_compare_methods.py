"""Mechanics of experiments/compare_methods.py on a 2-step, 32-wide recipe: every method trains from one shared
recipe, is scored and timed, the reports are written, finished runs are reused and a foreign run is refused."""

import json
import math

import pytest

from experiments import compare_methods as cm

TEXT = "to be or not to be that is the question whether tis nobler in the mind to suffer\n\n" * 6


@pytest.fixture
def tiny(tmp_path):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text(TEXT)
    overrides = ["model.preset=test", "model.hidden_size=32", "model.n_layers=1", "model.max_seq_len=32",
                 "data.seq_len=32", "data.batch_size=4", "data.eval_batch_size=8", "train.max_steps=2",
                 "train.warmup_steps=1", "train.val_every=2", "train.val_batches=1", "train.checkpoint_every=2",
                 "train.log_every=1", "train.progress_bar=false", f"data.corpus={tmp_path}"]
    return tmp_path, overrides


def test_compare_trains_scores_times_and_reuses(tiny, capsys):
    root, overrides = tiny
    runs, out = root / "runs", root / "report"
    argv = ["--methods", "ar,mdlm,sedd_uniform", "--run-root", str(runs), "--out", str(out), "--name", "t",
            "--num-t-samples", "2", "--sample-num", "2", "--sample-steps", "4", "--speed-rounds", "1", *overrides]
    assert cm.main(argv) == 0
    results = json.loads((out / "t.json").read_text())
    assert set(results["methods"]) == {"ar", "mdlm", "sedd_uniform"}
    ar, sedd = results["methods"]["ar"], results["methods"]["sedd_uniform"]
    assert not ar["bound"] and sedd["bound"] and sedd["method_config"]["graph"] == "uniform"
    assert ar["relative_gap_vs_ar"] == 0 and ar["speed_vs_ar"] == 1
    for r in results["methods"].values():
        assert r["step"] == 2 and r["tokens_seen"] == 2 * 4 * 32 and r["samples_per_second"] > 0
        # the total NLL spread over the test file's characters (tokenizer-independent)
        assert r["test_characters"] == len(TEXT)
        total_bits = r["nll_nats_per_token"] * r["num_tokens"] / math.log(2)
        assert r["bits_per_character_of_text"] == pytest.approx(total_bits / len(TEXT), rel=1e-9)
    assert all((runs / m / cm.DONE_MARKER).is_file() for m in results["methods"])
    assert results["command"].startswith("python -m experiments.compare_methods --methods")
    md = (out / "t.md").read_text()
    assert results["command"] in md and "| sedd_uniform |" in md
    assert (out / "t_curves.png").stat().st_size > 1000
    assert set(json.loads((out / "summary.json").read_text())["t"]["methods"]) == set(results["methods"])
    capsys.readouterr()

    # a second call reuses the runs and the cached evaluations (train() would refuse an existing run dir)
    before = (runs / "ar" / "eval" / "compare.json").stat().st_mtime_ns
    assert cm.main(argv[:1] + ["ar"] + argv[2:]) == 0
    assert (runs / "ar" / "eval" / "compare.json").stat().st_mtime_ns == before
    assert "reusing" in capsys.readouterr().out


def test_compare_refuses_a_run_of_another_recipe(tiny, capsys):
    root, overrides = tiny
    argv = ["--methods", "ar", "--run-root", str(root / "runs"), "--until", "train", *overrides]
    assert cm.main(argv) == 0
    assert cm.main([*argv, "data.batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert "data.batch_size: run has 4, asked 2" in err and str(root / "runs" / "ar") in err


def test_unknown_method_is_named(tiny, capsys):
    root, overrides = tiny
    assert cm.main(["--methods", "ar,sedd", "--run-root", str(root / "runs"), "--until", "train", *overrides]) == 2
    assert "unknown method 'sedd'" in capsys.readouterr().err
    assert not (root / "runs" / "ar").exists()  # nothing trained before every name was checked


def test_compare_scores_fasta_recipes_on_test_tiles(tmp_path, capsys):
    """A FASTA recipe is scored on the test split's tiles (here the real chr20 slices' BED test interval),
    evenly thinned by --max-test-windows, and reported in bits per base."""
    fixtures = "tests/fixtures/grch37_chr20_slices"
    overrides = ["model.preset=test", "model.hidden_size=32", "model.n_layers=1", "model.max_seq_len=64",
                 "data.kind=fasta", "data.tokenizer=nucleotide", f"data.fasta={fixtures}.fa.gz",
                 "data.split_mode=bed", f"data.bed={fixtures}.bed", "data.seq_len=64", "data.batch_size=4",
                 "data.eval_batch_size=8", "train.max_steps=2", "train.warmup_steps=1", "train.val_every=2",
                 "train.val_batches=1", "train.checkpoint_every=2", "train.log_every=1", "train.progress_bar=false"]
    out = tmp_path / "report"
    argv = ["--methods", "ar,mdlm", "--run-root", str(tmp_path / "runs"), "--out", str(out), "--name", "dna",
            "--num-t-samples", "1", "--sample-num", "2", "--sample-steps", "4", "--speed-rounds", "1",
            "--max-test-windows", "5", *overrides]
    assert cm.main(argv) == 0
    results = json.loads((out / "dna.json").read_text())
    for r in results["methods"].values():
        # 5,000 test bases in tiles of 64: 79 tiles, 5 of them scored
        assert r["test_windows"] == {"used": 5, "total": 79}
        assert 0 < r["num_tokens"] <= 5 * 64
        assert r["bits_per_base"] == pytest.approx(r["nll_nats_per_token"] / math.log(2), rel=1e-9)
    md = (out / "dna.md").read_text()
    assert "| bits/base |" in md
    assert md.startswith("# dna: ar, mdlm on grch37_chr20_slices.fa.gz (nucleotide tokenizer)")  # not data.corpus
    assert json.loads((out / "summary.json").read_text())["dna"]["corpus"] == "grch37_chr20_slices.fa.gz"
    capsys.readouterr()
