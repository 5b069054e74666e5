"""experiments.throughput_ceiling: the ceiling of a seqdiff / HF throughput ratio read from bench.json files."""

from __future__ import annotations

import json

import pytest

from experiments.throughput_ceiling import main


def bench_json(rate: float = 100e9) -> dict:
    """The fields a bench run records that the ceiling reads: tokens/s, model FLOPs per token, matmul rate."""
    return {"device": "cpu", "precision": "float32", "config": {"vocab_size": 31, "compile": False},
            "matmul_flops_per_s": rate,
            "flops_per_token": {"seqdiff_bidirectional": 20e6, "seqdiff_causal": 25e6},
            "train_tokens_per_s": {"seqdiff_bidirectional": 2_000.0, "hf_bert": 2_500.0,
                                   "seqdiff_causal": 2_200.0, "hf_gpt2": 2_000.0},
            "ratio_vs_hf": {"bidirectional": 0.8, "causal": 1.1},
            "matmul_fraction": {"seqdiff_bidirectional": 0.4, "seqdiff_causal": 0.55},
            "profile": {"seqdiff_bidirectional": {"matmul_kernel_flops_per_s": 90e9}}}


def test_ceiling_and_the_fraction_a_target_needs(tmp_path):
    src = tmp_path / "run" / "bench.json"
    src.parent.mkdir()
    src.write_text(json.dumps(bench_json()))
    assert main([str(src), "--out", str(tmp_path / "out"), "--target", "1.3"]) == 0
    rows = {r["pair"]: r for r in json.loads((tmp_path / "out" / "ceiling.json").read_text())["rows"]}
    # 100 GFLOP/s over 20 MFLOP a token: 5,000 tokens/s at most, against BERT's 2,500: 2x; 1.3x needs 1.3 / 2.
    assert rows["bidirectional"]["ceiling"] == pytest.approx(2.0)
    assert rows["bidirectional"]["fraction_needed"] == pytest.approx(0.65)
    assert rows["bidirectional"]["kernel_rate_over_reference"] == pytest.approx(0.9)
    # 100 GFLOP/s over 25 MFLOP: 4,000 tokens/s, against GPT-2's 2,000: 2x as well; no profile, no kernel rate.
    assert rows["causal"]["ceiling"] == pytest.approx(2.0)
    assert rows["causal"]["kernel_rate_over_reference"] is None
    # The ceiling is the measured ratio over the matmul fraction when both come from the same medians.
    assert rows["bidirectional"]["ceiling"] == pytest.approx(0.8 / 0.4)
    md = (tmp_path / "out" / "README.md").read_text()
    assert "python -m experiments.throughput_ceiling" in md and "| 2.00 | 0.65 | 0.90 |" in md


def test_a_file_that_is_not_a_bench_json_is_named(tmp_path, capsys):
    bad = tmp_path / "bench.json"
    bad.write_text(json.dumps({"device": "cpu"}))
    with pytest.raises(SystemExit):
        main([str(bad), "--out", str(tmp_path / "out")])
    assert f"{bad}: not a seqdiff bench.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_missing_file_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(tmp_path / "none.json"), "--out", str(tmp_path / "out")])
    assert f"{tmp_path / 'none.json'}: cannot be read (No such file or directory)" in capsys.readouterr().err
