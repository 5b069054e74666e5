"""experiments/ar_strand_mixture.py: an AR run, its strand mixture and the Markov chain on the same test tiles."""

import json

import pytest
from torch.utils.data import DataLoader, Subset

from experiments import ar_strand_mixture as S
from experiments import dna_experiment as X
from seqdiff.checkpoint import load_checkpoint
from seqdiff.config import load_run_config
from seqdiff.data import build_data_module
from seqdiff.evaluation.likelihood import evaluate_batches
from seqdiff.evaluation.markov import MarkovChain
from seqdiff.methods.strand_mixture import conjoin_strands
from tests.test_dna_experiment import overrides, slices  # noqa: F401  (fixture)


def test_plain_row_is_the_experiments_number_and_the_mixture_is_evals(slices, tmp_path):  # noqa: F811
    from seqdiff.training.run import train

    run = tmp_path / "ar"
    train(load_run_config(None, overrides(slices, **{"method.name": "ar"})), run)
    out = tmp_path / "strands"
    S.main(["--ar", str(run), "--out", str(out), "--max-test-windows", "20", "--order", "2", "--threads", "1"])
    r = json.loads((out / "strands.json").read_text())
    model = load_checkpoint(run)
    dm = build_data_module(model.data_config, model.tokenizer)
    index = X.evenly(len(dm.eval_dataset("test")), 20)
    loader = DataLoader(Subset(dm.eval_dataset("test"), index), batch_size=model.data_config.eval_batch_size)
    bits = r["bits_per_base"]
    assert bits["ar"] == pytest.approx(evaluate_batches(model, loader)["bits_per_base"], rel=1e-9)
    assert bits["mixture"] == pytest.approx(evaluate_batches(conjoin_strands(model), loader)["bits_per_base"],
                                            rel=1e-9)
    assert bits["mixture"] != bits["ar"] and bits["mixture"] <= bits["ar"] + 1 / r["seq_len"] + 1e-9
    chain = MarkovChain(2).fit(X.train_segments(dm))
    assert bits["chain"] == pytest.approx(chain.bits_per_base(X.tile_segments(dm, "test", index)))
    p = r["paired"]
    assert p["mixture_minus_plain"]["difference"] == pytest.approx(bits["mixture"] - bits["ar"])
    assert p["ar_minus_chain"]["difference"] == pytest.approx(bits["ar"] - bits["chain"])
    assert 0 < r["strand_gap"]["mean"] <= r["strand_gap"]["max"]  # a plain AR is not strand-symmetric
    assert (out / "strands.md").read_text().startswith("Made by `python -m experiments.ar_strand_mixture --ar")


def test_refusals(slices, tmp_path):  # noqa: F811
    from seqdiff.training.run import train

    run = tmp_path / "mdlm"
    train(load_run_config(None, overrides(slices, **{"method.name": "mdlm"})), run)
    with pytest.raises(SystemExit, match="is not an AR run"):
        S.main(["--ar", str(run), "--out", str(tmp_path / "refused")])
    with pytest.raises(SystemExit, match="does not exist"):
        S.main(["--ar", str(tmp_path / "no_run"), "--out", str(tmp_path / "refused")])
    with pytest.raises(SystemExit, match="--max-test-windows must be >= 1"):
        S.main(["--ar", str(run), "--out", str(tmp_path / "refused"), "--max-test-windows", "0"])
    assert not (tmp_path / "refused").exists()
