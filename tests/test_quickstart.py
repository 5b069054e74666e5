import json
from dataclasses import replace

from seqdiff.cli import main


def test_quickstart_end_to_end_and_reuse(tmp_path, capsys, monkeypatch):
    import seqdiff.quickstart as qs

    monkeypatch.setattr(qs, "NUM_T_SAMPLES", 1)  # the full test play is still scored, once
    recipe = qs.QUICKSTART  # and, to save time, one validation batch and 16 sampling steps
    monkeypatch.setattr(qs, "QUICKSTART", replace(recipe, train=replace(recipe.train, val_batches=1),
                                                  sample=replace(recipe.sample, steps=16)))
    out, runs = tmp_path / "report", tmp_path / "runs"
    args = ["quickstart", "--max-steps", "2", "--out", str(out), "--run-dir", str(runs)]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    for method in ("mdlm", "ar"):
        r = results["models"][method]
        assert r["steps"] == 2 and r["bits_per_character"] > 0 and len(r["samples"]) == qs.QUICKSTART.sample.num_samples
        assert r["train_seconds"] > 0
    assert results["models"]["mdlm"]["bound"] and not results["models"]["ar"]["bound"]
    assert results["models"]["mdlm"]["sampler"] == "cached"
    ngram = results["ngram"]  # computed by the command on the same splits, the order chosen on validation
    assert ngram["order"] in qs.NGRAM_ORDERS and ngram["valid_bits_per_character_by_order"][str(ngram["order"])] == min(
        ngram["valid_bits_per_character_by_order"].values())
    assert 1.0 < ngram["bits_per_character"] < 4.76  # below a uniform guess over 27 characters
    for r in results["models"].values():
        assert 0 <= r["known_word_share"] <= 1 and r["words_counted"] > 0
    summary = (out / "summary.md").read_text()
    assert "(model.kmer_sizes, hashed into at most 65,536 rows per size)" in summary
    assert "romeo_and_juliet" in summary and "| MDLM |" in summary and "| AR |" in summary
    assert "nucleus sampling at top_p 0.9" in summary  # the samples' setting is stated
    shown = results["models"]["ar"]["samples"]
    assert f"    {shown[qs.SHOWN - 1]}\n" in summary and f"    {shown[qs.SHOWN]}\n" not in summary
    assert f"| n-gram (Witten-Bell, order {ngram['order']}) | {ngram['bits_per_character']:.4f} |" in summary
    assert (out / "loss_curves.png").stat().st_size > 1000
    assert "| MDLM |" in capsys.readouterr().out
    # another seed (or step count) is another recipe: its runs are not the finished ones in the same folder
    assert main([*args, "--seed", "1"]) == 2
    err = capsys.readouterr().err
    assert "holds a finished run of another recipe (train.seed: 0 -> 1)" in err and "--overwrite" in err
    assert json.loads((out / "results.json").read_text())["command"] == "seqdiff quickstart --max-steps 2"
    # a later call reuses finished runs instead of training again
    assert qs._run_state(runs / "mdlm", 2) == "done" and qs._run_state(runs / "mdlm", 3) == "partial"
    assert qs._run_state(tmp_path / "nothing", 2) == "new"


def test_sweep_candidates_are_valid_recipes_and_bad_names_are_refused(capsys):
    import pytest

    from experiments import quickstart_sweep as sweep

    for name, overrides in sweep.CANDIDATES.items():
        for method in ("mdlm", "ar"):
            config = sweep.candidate_config(name, sweep.method_overrides(overrides, method), method)
            assert config.method.name == method and config.train.val_every <= config.train.max_steps
    # a method.* candidate changes MDLM only; its AR run is the first identical AR recipe's (the baseline's)
    assert sweep.candidate_config("m", ["method.time_sampling=mask_count"], "mdlm").method.time_sampling == "mask_count"
    assert sweep.run_name("mask_count", sweep.CANDIDATES["mask_count"], "ar", sweep.CANDIDATES) == "baseline"
    assert sweep.run_name("mask_count", sweep.CANDIDATES["mask_count"], "mdlm", sweep.CANDIDATES) == "mask_count"
    assert sweep.run_name("lr4e-3", sweep.CANDIDATES["lr4e-3"], "ar", sweep.CANDIDATES) == "lr4e-3"
    name = "mask_count-complementary-16"
    assert sweep.run_name(name, sweep.CANDIDATES[name], "ar", sweep.CANDIDATES) == "complementary-16"
    assert sweep.candidate_config(name, sweep.CANDIDATES[name], "mdlm").method.complementary_masks
    # time conditioning is MDLM's too: AR has no noise level and refuses it
    assert sweep.method_overrides(["model.time_conditioning=true", "train.lr=1e-3"], "ar") == ["train.lr=1e-3"]
    assert sweep.candidate_config("tc", ["model.time_conditioning=true"], "mdlm").model.time_conditioning
    wide = sweep.candidate_config("w", ["model.hidden_size=192", "model.n_layers=3", "model.n_heads=3"], "ar")
    assert (wide.model.hidden_size, wide.model.n_layers) == (192, 3)  # the preset does not win over the sweep
    with pytest.raises(SystemExit):
        sweep.main(["--candidate", "nope"])
    assert "unknown" in capsys.readouterr().err
