"""The DNA experiment pipeline (experiments/dna_experiment.py) on the real chr20 slices in tests/fixtures."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import dna_experiment as X
from seqdiff.config import load_run_config
from seqdiff.data import build_data_module
from seqdiff.evaluation.metrics import kmer_spectrum
from seqdiff.tokenizers import NucleotideTokenizer

FIXTURES = Path(__file__).parent / "fixtures"
STEM = "grch37_chr20_slices"


@pytest.fixture
def slices(tmp_path):
    for suffix in (".fa.gz", ".fa.gz.fai", ".fa.gz.gzi", ".bed"):
        shutil.copy(FIXTURES / f"{STEM}{suffix}", tmp_path / f"{STEM}{suffix}")
    return tmp_path


def overrides(d: Path, **extra):
    base = {"model.preset": "test", "model.max_seq_len": 64, "data.seq_len": 64, "data.batch_size": 4,
            "data.eval_batch_size": 8, "data.kind": "fasta", "data.tokenizer": "nucleotide",
            "data.fasta": d / f"{STEM}.fa.gz", "data.split_mode": "bed", "data.bed": d / f"{STEM}.bed",
            "train.max_steps": 2, "train.val_every": 2, "train.val_batches": 1, "train.log_every": 1,
            "train.warmup_steps": 1, "train.progress_bar": "false"}
    return [f"{k}={v}" for k, v in {**base, **extra}.items()]


def test_evenly_and_shuffled():
    assert X.evenly(10, None) == list(range(10)) and X.evenly(3, 5) == [0, 1, 2]
    idx = X.evenly(1000, 4)
    assert idx == [0, 333, 666, 999]
    seqs = ["AACCGGTTAC", "GGGA"]
    mixed = X.shuffled(seqs, seed=1)
    assert [sorted(s) for s in mixed] == [sorted(s) for s in seqs] and mixed != seqs
    assert torch.equal(kmer_spectrum(mixed[0], 1), kmer_spectrum(seqs[0], 1))  # composition kept


def test_cpg_observed_expected():
    assert X.cpg_observed_expected(["ACGT"]) == 4.0  # 1 CG x 4 bases / (1 C x 1 G)
    assert X.cpg_observed_expected(["AC", "GT"]) == 0.0  # no dinucleotide spans two sequences
    rng = np.random.default_rng(0)
    iid = ["".join(rng.choice(list("ACGT"), size=5_000))]
    assert X.cpg_observed_expected(iid) == pytest.approx(1.0, abs=0.1)  # independent bases: about 1
    assert np.isnan(X.cpg_observed_expected(["AAAT"]))


def test_power_law_fit_recovers_a_known_curve_and_its_crossing():
    steps = np.array([500, 1000, 2000, 3000, 4000, 6000])
    true = {"c": 1.80, "a": 0.9, "b": 0.4}
    fit = X.fit_power_law(steps, X.power_law(true, steps))
    assert fit["b"] == pytest.approx(0.4, abs=1e-9) and fit["rmse"] < 1e-9
    assert fit["c"] == pytest.approx(1.80) and fit["a"] == pytest.approx(0.9)
    # the crossing solves c + a s^-b = target in closed form
    s = X.step_to_reach(fit, 1.83)
    assert s == pytest.approx((0.9 / 0.03) ** (1 / 0.4)) and X.power_law(fit, s) == pytest.approx(1.83)
    assert X.step_to_reach(fit, 1.79) is None  # asymptote above the target: never
    assert X.step_to_reach({**fit, "a": -0.1}, 1.83) is None  # a rising curve never comes down
    with pytest.raises(ValueError, match="at least 3 points"):
        X.fit_power_law([100, 200], [2.0, 1.9])
    assert fit["at_grid_edge"] is False
    # a curve that speeds up (an annealing learning rate) is no power law: the fit runs to the grid's edge
    speeding = [1.89, 1.888, 1.885, 1.88, 1.87, 1.85, 1.80]
    bad = X.fit_power_law(np.arange(1, 8) * 500, speeding)
    assert bad["at_grid_edge"] is True
    ex = X.extrapolate({"val_step": list(np.arange(1, 8) * 500), "val_bits_per_base": speeding}, 1.79, 0, 1)
    assert ex["crossing_step"] is None and ex["crossed"] is False


def test_extrapolation_skips_the_warmup_and_says_whether_the_target_is_crossed():
    true = {"c": 1.80, "a": 0.9, "b": 0.4}
    steps = [100, 500, 1000, 2000, 4000]
    bits = list(X.power_law(true, steps))
    bits[0] = 5.0  # a warm-up point far off the law: must not enter the fit
    curve = {"val_step": steps, "val_bits_per_base": bits}
    ex = X.extrapolate(curve, target=1.82, warmup_steps=200, bases_per_step=4096)
    assert ex["fit"]["points"] == 4 and ex["fit"]["rmse"] < 1e-9 and ex["crossed"] is False
    assert ex["crossing_bases"] == pytest.approx(ex["crossing_step"] * 4096) and ex["crossing_step"] > 4000
    assert X.extrapolate(curve, target=1.9, warmup_steps=200, bases_per_step=1)["crossed"] is True
    assert X.extrapolate({"val_step": [500, 1000], "val_bits_per_base": [2, 1.9]}, 1.8, 0, 1)["fit"] is None


def test_markov_yardstick_scores_a_second_set_with_the_same_fits():
    rng = np.random.default_rng(0)
    train, test, other = ([rng.integers(0, 4, size=n) for n in sizes] for sizes in ([500, 300], [200], [150, 50]))
    on_test, on_other = X.markov_yardstick(train, test, (0, 2), also=other)
    assert on_test == X.markov_yardstick(train, test, (0, 2))
    assert on_other == X.markov_yardstick(train, other, (0, 2))


def test_the_table_shows_the_numbers_of_the_committed_summary():
    summary = json.loads((Path(__file__).resolve().parents[1] / "reports" / "dna" / "summary.json").read_text())
    text = X.table(summary)
    for method, r in summary["models"].items():
        assert f"| {method.upper()} | {r['test']['bits_per_base']:.4f} | {r['test']['perplexity']:.4f} |" in text
    for order, bits in summary["markov"].items():
        assert f"| Markov chain, {order.replace('_', ' ')} | {bits:.4f} |" in text
    for name, m in summary["realism"]["sources"].items():
        assert f"| {name} | {m['gc_content']:.4f} |" in text
    assert f"{100 * summary['relative_gap']:+.2f}%" in text


def test_loader_throughput_counts_every_worker_setting(slices):
    cfg = load_run_config(None, overrides(slices))
    dm = build_data_module(cfg.data, NucleotideTokenizer())
    out = X.loader_throughput(dm, workers=(0, 2), batches=3, rounds=2)
    for w in ("0", "2"):
        rates = out["windows_per_second"][w]["rounds"]
        assert len(rates) == 2 and all(r > 0 for r in rates)
        assert out["first_batch_seconds"][w] > 0
    assert out["ratio_2_over_0"]["rounds"] == pytest.approx(
        [b / a for a, b in zip(out["windows_per_second"]["0"]["rounds"], out["windows_per_second"]["2"]["rounds"])])


@pytest.mark.slow
def test_pipeline_end_to_end_on_slices(slices, tmp_path, monkeypatch):
    from seqdiff.training.run import train

    runs = tmp_path / "runs"
    for method in X.METHODS:
        train(load_run_config(None, overrides(slices, **{"method.name": method})), runs / method)
    out = tmp_path / "report"
    monkeypatch.setattr(X, "MARKOV_ORDERS", (0, 2))
    X.main(["--runs", str(runs), "--out", str(out), "--max-test-windows", "20", "--num-samples", "4",
            "--sample-steps", "8", "--loader-batches", "2", "--loader-rounds", "1"])
    summary = json.loads((out / "summary.json").read_text())
    m, a = summary["models"]["mdlm"]["test"], summary["models"]["ar"]["test"]
    assert m["bound"] and not a["bound"] and m["num_tokens"] == a["num_tokens"] > 0
    assert summary["relative_gap"] == pytest.approx(m["bits_per_base"] / a["bits_per_base"] - 1)
    assert summary["test_windows"]["used"] <= 20
    assert set(summary["realism"]["sources"]) == {"MDLM", "AR", "real (valid)", "shuffled real (valid)"}
    real = summary["realism"]["sources"]["real (valid)"]
    shuf = summary["realism"]["sources"]["shuffled real (valid)"]
    assert real["kmer_tv_k1"] == pytest.approx(shuf["kmer_tv_k1"])  # same composition
    fa = (out / "samples_mdlm.fa").read_text()  # an untrained model may emit N or special tokens: ACGT-only check
    assert fa.startswith(">sample_0") and fa.count(">sample_") == 4
    assert 0 <= summary["models"]["mdlm"]["sampling"]["non_acgt_fraction"] <= 1
    text = (out / "table.md").read_text()
    assert text.startswith("Made by `python -m experiments.dna_experiment --runs") and not (out / "README.md").exists()
    assert f"| MDLM | {m['bits_per_base']:.4f} |" in text and f"{100 * summary['relative_gap']:+.2f}%" in text
    assert (out / "val_curves.png").is_file() and (out / "realism.png").is_file()
    assert np.isfinite(summary["markov"]["order_2"])
    assert summary["recipe"] == "short" and summary["valid_tiles"] == 8  # val_batches 1 x eval batch 8
    assert set(summary["markov_valid"]) == {"order_0", "order_2"}
    for r in summary["models"].values():  # 2 steps, 1 of warm-up: too few points for a fit
        assert r["extrapolation"]["target"] == min(summary["markov_valid"].values())
        assert r["extrapolation"]["fit"] is None
    assert (out / "extrapolation.png").is_file() and "Validation tiles: 8" in text
    # one model alone (--methods mdlm): its rows, no MDLM / AR gap, the same test tiles
    alone = tmp_path / "alone"
    X.main(["--runs", str(runs), "--out", str(alone), "--max-test-windows", "20", "--num-samples", "4",
            "--sample-steps", "8", "--loader-batches", "2", "--loader-rounds", "1", "--methods", "mdlm"])
    single = json.loads((alone / "summary.json").read_text())
    assert set(single["models"]) == {"mdlm"} and single["relative_gap"] is None
    assert single["models"]["mdlm"]["test"]["num_tokens"] == m["num_tokens"]
    assert set(single["realism"]["sources"]) == {"MDLM", "real (valid)", "shuffled real (valid)"}
    assert "Relative gap" not in (alone / "table.md").read_text()
    with pytest.raises(SystemExit):
        X.main(["--runs", str(runs), "--out", str(alone), "--methods", "sedd"])


def test_a_resumed_run_records_both_commands_and_trains_both_parts(tmp_path, monkeypatch):
    """--resumed ar=N: the recorded command is the recipe, then a --resume to train.max_steps=N; train_runs does
    exactly that, once each, keyed by its markers."""
    cmd = X.train_command("ar", Path("r/ar"), "long", resumed_to=10_000)
    first, _, second = cmd.partition("; then ")
    assert first == X.train_command("ar", Path("r/ar"), "long") and "train.max_steps=6000" in first
    assert second.endswith("train.max_steps=10000") and "--resume" in second and "max_steps=6000" not in second
    assert X.parse_resumed(["ar=10000"]) == {"ar": 10_000}
    for bad in (["gpt=5"], ["ar=ten"], ["ar"]):
        with pytest.raises(SystemExit, match="METHOD=STEPS"):
            X.parse_resumed(bad)
    calls = []
    monkeypatch.setattr(X, "train", lambda config, run_dir, resume: calls.append(
        (run_dir.name, config.train.max_steps, resume)) or (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
        or (run_dir / X.LAST_CHECKPOINT).touch())
    X.train_runs(tmp_path, "long", {"ar": 10_000})
    assert calls == [("mdlm", 6000, False), ("ar", 6000, False), ("ar", 10_000, True)]
    X.train_runs(tmp_path, "long", {"ar": 10_000})  # every marker there: nothing trains again
    assert len(calls) == 3


def test_a_resumed_curve_is_not_fitted_but_says_whether_it_crossed():
    curve = {"val_step": [100, 200, 300, 400, 500], "val_bits_per_base": [2.0, 1.9, 1.85, 1.95, 1.80]}
    ex = X.extrapolate(curve, 1.82, warmup_steps=50, bases_per_step=10, restart_step=300)
    assert ex["fit"] is None and ex["crossed"] is True and ex["restart_step"] == 300
    lines = X.extrapolation_lines({"markov_valid": {"order_8": 1.82}, "valid_tiles": 4,
                                   "models": {"ar": {"extrapolation": ex}}})
    assert "not fitted (resumed at step 300" in lines[-1] and "already below it" in lines[-1]
    assert X.extrapolate(curve, 1.82, 50, 10)["restart_step"] is None
