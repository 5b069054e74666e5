"""experiments/dna_paired_test.py: MDLM and the Markov chain paired on the same test tiles."""

import json
import math

import numpy as np
import pytest
from torch.utils.data import DataLoader, Subset

from experiments import dna_experiment as X
from experiments import dna_paired_test as P
from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import load_run_config
from seqdiff.data import build_data_module
from seqdiff.evaluation.likelihood import evaluate_batches
from seqdiff.evaluation.markov import MarkovChain
from tests.test_dna_experiment import overrides, slices  # noqa: F401  (fixture)


def test_paired_statistics_by_hand():
    mdlm = np.array([[10.0, 20.0, 30.0], [12.0, 18.0, 36.0]])  # bits per batch, 2 repeats
    chain = np.array([11.0, 19.0, 31.0])
    counts = np.array([5.0, 10.0, 15.0])
    r = P.paired(mdlm, chain, counts)
    per_repeat = [60 / 30, 66 / 30]
    assert r["mdlm_per_repeat"] == pytest.approx(per_repeat)
    assert r["mdlm_bits_per_base"] == pytest.approx(63 / 30)
    assert r["mdlm_mc_stderr"] == pytest.approx(np.std(per_repeat, ddof=1) / math.sqrt(2))
    assert r["chain_bits_per_base"] == pytest.approx(61 / 30)
    diff = np.array([0.0, 0.0, 2.0])  # mean over repeats minus chain, per batch
    assert r["difference"] == pytest.approx(2 / 30)
    d = 2 / 30
    se = math.sqrt(3 / 2 * sum((y - d * k) ** 2 for y, k in zip(diff, counts))) / 30
    assert r["difference_stderr_over_batches"] == pytest.approx(se)
    assert r["batches_where_mdlm_lower"] == 0 and r["batches"] == 3 and r["scored_bases"] == 30


def test_repeat_zero_is_the_experiments_number_and_the_chain_is_exact(slices, tmp_path):  # noqa: F811
    from seqdiff.training.run import train

    run = tmp_path / "mdlm"
    train(load_run_config(None, overrides(slices, **{"method.name": "mdlm"})), run)
    out = tmp_path / "paired"
    P.main(["--mdlm", str(run), "--out", str(out), "--max-test-windows", "20", "--repeats", "2",
            "--num-t-samples", "1", "--order", "2", "--threads", "1"])
    r = json.loads((out / "paired.json").read_text())
    model = load_checkpoint(run)
    dm = build_data_module(model.data_config, model.tokenizer)
    index = X.evenly(len(dm.eval_dataset("test")), 20)
    loader = DataLoader(Subset(dm.eval_dataset("test"), index), batch_size=model.data_config.eval_batch_size)
    ref = evaluate_batches(model, loader, num_t_samples=1, seed=0)
    p = r["paired"]
    assert p["mdlm_per_repeat"][0] == pytest.approx(ref["bits_per_base"], rel=1e-9)
    assert p["mdlm_per_repeat"][0] != p["mdlm_per_repeat"][1]  # independent draws
    assert p["scored_bases"] == ref["num_tokens"]
    chain = MarkovChain(2).fit(X.train_segments(dm))
    assert p["chain_bits_per_base"] == pytest.approx(chain.bits_per_base(X.tile_segments(dm, "test", index)))
    assert p["difference"] == pytest.approx(p["mdlm_bits_per_base"] - p["chain_bits_per_base"])
    assert (out / "paired.md").read_text().startswith("Made by `python -m experiments.dna_paired_test --mdlm")
    for flag in ("--repeats", "--max-test-windows", "--num-t-samples"):
        with pytest.raises(SystemExit, match=f"{flag} must be >= 1"):
            P.main(["--mdlm", str(run), "--out", str(tmp_path / "refused"), flag, "0"])
    with pytest.raises(SystemExit, match="does not exist"):
        P.main(["--mdlm", str(tmp_path / "no_run"), "--out", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()
