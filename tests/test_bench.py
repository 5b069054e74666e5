"""`seqdiff bench` at a tiny shape: it runs end to end and writes the documented report (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from seqdiff.bench import main
from seqdiff.bench.models import (
    FULL_HEAD_MODEL,
    FULL_LAST_BLOCK_MODEL,
    TRAIN_MODELS,
    UNFUSED_MODELS,
    expected_cached_speedup,
    vocab_stub,
)
from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM

TINY = ["--preset", "test", "--seq-len", "16", "--batch-size", "2", "--repeats", "2", "--steps-per-repeat", "1",
        "--warmup", "1", "--sample-batches", "1,2", "--sample-repeats", "1", "--matmul-size", "64",
        "--threads", "1"]


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_bench_writes_json_and_markdown(tmp_path, keep_threads, capsys):
    argv = [*TINY, "--out", str(tmp_path)]
    assert main(argv) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["command"] == "seqdiff bench " + " ".join(argv)

    assert set(data["train_tokens_per_s"]) == set(TRAIN_MODELS)
    assert {"seqdiff_bidirectional", "hf_bert", "seqdiff_causal", "hf_gpt2"} <= set(data["train_tokens_per_s"])
    assert all(v > 0 for v in data["train_tokens_per_s"].values())
    for name, spread in data["train_tokens_per_s_spread"].items():
        assert spread["n"] == 2 and spread["min"] <= spread["median"] <= spread["max"], name
    assert set(data["ratio_vs_hf"]) == {"bidirectional", "causal"}
    assert set(data["ratio_vs_hf_same_activation"]) == {"bidirectional", "causal"}
    assert set(data["ratio_vs_hf_best_of_rounds"]) == {"bidirectional", "causal"}
    assert all(v > 0 for v in data["ratio_vs_hf"].values())

    assert data["matmul_flops_per_s"] > 0
    assert set(data["matmul_fraction"]) == {"seqdiff_bidirectional", "seqdiff_causal"}
    assert all(v > 0 for v in data["matmul_fraction"].values())
    assert set(data["flops_per_token"]) == {"seqdiff_bidirectional", "seqdiff_causal"}
    # The ceiling is the measured ratio over the matmul fraction, round by round (an identity of the definitions).
    assert set(data["ratio_vs_hf_ceiling"]) == {"bidirectional", "causal"}
    for pair, (ours, _) in {"bidirectional": ("seqdiff_bidirectional", "hf_bert"),
                            "causal": ("seqdiff_causal", "hf_gpt2")}.items():
        rounds = zip(data["ratio_vs_hf_ceiling_spread"][pair]["values"], data["ratio_vs_hf_spread"][pair]["values"],
                     data["matmul_fraction_spread"][ours]["values"], strict=True)
        for ceiling, ratio, fraction in rounds:
            assert ceiling == pytest.approx(ratio / fraction, rel=1e-3), pair  # values kept to 6 decimals
    assert set(data["params"]) == set(TRAIN_MODELS)
    # Untied GPT-2 and the causal DiT have (nearly) the same number of parameters.
    assert abs(data["params"]["hf_gpt2"] / data["params"]["seqdiff_causal"] - 1) < 0.1
    assert set(data["profile"]) == set(TRAIN_MODELS)
    assert all(p["ms"]["matmul"] > 0 for p in data["profile"].values())

    assert set(data["sample_tokens_per_s"]) == {"mdlm_uncached", "mdlm_cached", "ar_kv"}
    for sampler, per_batch in data["sample_tokens_per_s"].items():
        assert set(per_batch) == {"1", "2"}, sampler
        assert all(v > 0 for v in per_batch.values())
    assert data["sample_denoiser_calls"]["mdlm_uncached"] == {"1": 16, "2": 16}
    assert data["sample_denoiser_calls"]["mdlm_cached"]["1"] <= 16
    assert set(data["cached_speedup"]) == {"1", "2"}
    assert set(data["cached_speedup_target_met"]) == {"1", "2"}

    assert set(data["peak_memory_mb"]) == set(TRAIN_MODELS)
    assert all(v >= 0 for v in data["peak_memory_mb"].values())
    assert isinstance(data["peak_memory_method"], str) and data["peak_memory_method"]
    for key in ("torch", "transformers", "device", "threads", "date", "config", "load_average", "elapsed_s"):
        assert key in data, key
    assert data["threads"] == 1
    assert data["config"]["seq_len"] == 16 and data["config"]["preset"] == "test"

    md = (tmp_path / "bench.md").read_text()
    assert md.startswith("# seqdiff bench") and data["command"] in md
    assert "| seqdiff_bidirectional |" in md and "**Matmul fraction**" in md
    assert "**Ceiling of the ratio on this device**" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md"]  # no temporary files left
    assert "| hf_gpt2 |" in capsys.readouterr().out


def test_bench_help_and_bad_arguments(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "--sample-batches" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        main(["--sample-batches", "1,x"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["--vocab-size", "4"])
    assert e.value.code == 2


def test_expected_cached_speedup_matches_simulated_reveals():
    """The bound quoted in bench.md: rows recomputed by the cached sampler, from MDLM's own reverse steps."""
    T = L = 8
    rows = 4000
    vocab = type("V", (), {"vocab_size": 6, "bos_id": 2, "eos_id": 3, "pad_id": 4, "mask_id": 5})()
    mdlm = MDLM(MethodConfig(name="mdlm"), vocab)
    gen = torch.Generator().manual_seed(0)
    probs = torch.full((rows, L, 6), 0.25, dtype=torch.float64)
    probs[..., 4:] = 0
    x = torch.full((rows, L), vocab.mask_id)
    grid = torch.linspace(1.0, 0.0, T + 1, dtype=torch.float64)
    computed = torch.ones(rows)  # the first step always runs the denoiser
    for i in range(T):
        xs = mdlm.reverse_step(probs, x, grid[i].expand(rows), grid[i + 1].expand(rows), gen)
        if i + 1 < T:
            computed += (xs != x).any(dim=-1).double()
        x = xs
    assert (x != vocab.mask_id).all()
    simulated = T / computed.mean().item()
    assert simulated == pytest.approx(expected_cached_speedup(T, L), rel=0.03)
    assert expected_cached_speedup(1024, 1024) == pytest.approx(1 / (1 - torch.e**-1), rel=0.01)


def test_activation_option_picks_the_same_activation_contenders():
    """`--activation gelu`: the DiT uses the exact GELU and is compared with plain BERT and an exact-GELU GPT-2."""
    import math

    from seqdiff.bench.models import Shape, build_model, same_activation_pairs, train_models

    assert train_models("gelu_tanh") == TRAIN_MODELS
    assert same_activation_pairs("gelu_tanh")["bidirectional"][1] == "hf_bert_gelu_new"
    assert same_activation_pairs("gelu") == {"bidirectional": ("seqdiff_bidirectional", "hf_bert"),
                                             "causal": ("seqdiff_causal", "hf_gpt2_gelu")}
    shape = Shape(hidden_size=16, n_layers=1, n_heads=2, seq_len=8, batch_size=1, vocab_size=11, activation="gelu")
    assert set(train_models("gelu")) == set(TRAIN_MODELS) | {"hf_gpt2_gelu"}
    x = torch.tensor([-1.5, 0.3, 2.0])
    exact = 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    dit = build_model("seqdiff_bidirectional", shape)
    torch.testing.assert_close(dit.blocks[0].mlp.activation(x), exact)
    assert build_model("hf_gpt2_gelu", shape).config.activation_function == "gelu"
    assert build_model("hf_gpt2", shape).config.activation_function == "gelu_new"
    with pytest.raises(SystemExit):
        main(["--activation", "relu"])


@pytest.mark.slow
def test_bench_with_exact_gelu_the_full_head_and_bf16_runs_end_to_end(tmp_path, keep_threads):
    assert main([*TINY, "--activation", "gelu", "--full-head", "--full-last-block", "--precision", "bf16",
                 "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["precision"] == "bf16 autocast"  # on the CPU too: train.precision=bf16-mixed
    assert "bf16 matmul 64²" in (tmp_path / "bench.md").read_text()
    assert data["config"]["activation"] == "gelu" and "hf_gpt2_gelu" in data["train_tokens_per_s"]
    md = (tmp_path / "bench.md").read_text()
    assert "exact GELU in the seqdiff models" in md and "--activation gelu" in md
    # --full-head: the MDLM with its head at every position, timed beside the default
    full = FULL_HEAD_MODEL
    assert data["config"]["full_head"] and full in data["train_tokens_per_s"] and full in data["peak_memory_mb"]
    head = data["ratio_head_at_masked_vs_full_head"]
    assert head["n"] == 2 and head["median"] > 0
    share = data["head_share"]["seqdiff_bidirectional"]
    assert share == pytest.approx(MDLM(MethodConfig(), _vocab(data)).masked_share())
    assert data["flops_per_token"][full] > data["flops_per_token"]["seqdiff_bidirectional"]  # the whole head counts
    assert f"| {full} |" in md and "**Output head at the masked positions**" in md
    # --full-last-block: the same sparse-head MDLM with its whole last block at every position
    whole = FULL_LAST_BLOCK_MODEL
    assert data["config"]["full_last_block"] and whole in data["train_tokens_per_s"] and whole in data["peak_memory_mb"]
    last_block = data["ratio_last_block_at_outputs_vs_full_last_block"]
    assert last_block["n"] == 2 and last_block["median"] > 0
    flops = data["flops_per_token"]
    assert flops[full] > flops[whole] > flops["seqdiff_bidirectional"]  # the last block's MLP counts everywhere
    assert f"| {whole} |" in md and "**Last block at the masked positions**" in md


@pytest.mark.parametrize("bf16, dtype", [(None, torch.float32), (False, torch.float32), (True, torch.bfloat16)])
@pytest.mark.parametrize("name", ["seqdiff_bidirectional", "hf_gpt2"])
def test_a_train_step_runs_in_the_asked_precision_on_cpu(name, bf16, dtype):
    from seqdiff.bench.models import Shape, build_model, make_train_step

    shape = Shape(hidden_size=32, n_layers=1, n_heads=2, seq_len=8, batch_size=2, vocab_size=11)
    model = build_model(name, shape)
    seen = []
    linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    make_train_step(name, model, shape, torch.device("cpu"), 0, bf16)()
    assert seen == [dtype]


def _vocab(data):
    return vocab_stub(data["config"]["vocab_size"])


def test_the_cpu_bf16_experiment_times_float32_bf16_and_the_fused_kernel(tmp_path, monkeypatch):
    """One round at the quickstart's shape: every contender timed, both ratios written, and the `bf16 fused`
    contender really runs with the explicit attention switched off (and restores it)."""
    from experiments import cpu_bf16
    from seqdiff.backbones import attention as attention_module

    seen = []
    real = attention_module.uses_explicit
    monkeypatch.setattr(attention_module, "uses_explicit",
                        lambda q, k: seen.append(attention_module.EXPLICIT_MAX_LEN) or real(q, k))
    monkeypatch.setattr(cpu_bf16, "SHAPES", {"tiny": cpu_bf16.Shape(64, 2, 2, seq_len=64, batch_size=4, vocab_size=31)})
    assert cpu_bf16.main(["--out", str(tmp_path), "--rounds", "1", "--steps", "1", "--warmup", "0",
                          "--shapes", "0", "--matmul-size", "256"]) == 0
    results = json.loads((tmp_path / "results.json").read_text())
    (shape,) = results["shapes"].values()
    assert set(shape["tokens_per_s"]) == {f"{m} {v}" for m in cpu_bf16.MODELS for v in cpu_bf16.VARIANTS}
    assert set(shape["bf16_over_bf16_fused"]) == set(cpu_bf16.MODELS)
    assert 0 in seen and attention_module.EXPLICIT_MAX_LEN in seen and attention_module.EXPLICIT_MAX_LEN > 0
    assert "bf16 / bf16 fused" in (tmp_path / "table.md").read_text()


def test_bench_unfused_times_the_plain_loss_beside_the_fused_one(tmp_path, keep_threads):
    """--unfused at a vocabulary where method.fused_loss=null fuses: both seqdiff models twice, and the ratio."""
    assert main([*TINY, "--vocab-size", "4096", "--unfused", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["config"]["unfused"]
    for unfused, default in UNFUSED_MODELS.items():
        assert unfused in data["train_tokens_per_s"] and unfused in data["peak_memory_mb"]
        assert data["fused_loss"][default] and not data["fused_loss"][unfused]
        assert data["ratio_fused_loss_vs_unfused"][default]["median"] > 0
    assert "**Fused head and loss**" in (tmp_path / "bench.md").read_text()


def test_the_bd3lm_head_experiment_times_three_heads(tmp_path, keep_threads):
    """experiments.bd3lm_head: the full, sparse and sparse fused heads, one round each (vocabulary 4,096, where
    the default fuses), and the ratios it reports."""
    from experiments import bd3lm_head

    torch.set_num_threads(1)
    assert bd3lm_head.main(["--rounds", "1", "--warmup", "0", "--vocab-size", "4096", "--seq-len", "64",
                            "--batch-size", "2", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["tokens_per_s"]) == {"full", "sparse", "sparse fused"}
    assert set(data["ratio_over_full"]) == {"sparse", "sparse fused"}
    assert data["masked_share"] == pytest.approx(0.5, abs=1e-3)  # (1 - eps)(1 + t_min) / 2
    assert "| sparse fused |" in (tmp_path / "table.md").read_text()


def test_ratio_ceiling_is_the_matmul_rate_over_the_contenders_flop_rate():
    from seqdiff.bench.measure import ratio_ceiling

    # 100 GFLOP/s, 20 MFLOP a token: at most 5,000 tokens/s; against a contender at 4,000 tokens/s, 1.25x.
    assert ratio_ceiling(100e9, 20e6, 4_000) == pytest.approx(1.25)
    assert ratio_ceiling(200e9, 20e6, 4_000) == pytest.approx(2.5)  # twice the rate, twice the room

