"""experiments.mdlm_by_mask_rate: the any-order identity its reading rests on. For the log-linear schedule,
integrating the binomial number of masked tokens over t gives NELBO per token = (1/L) sum_{k=1..L} CE_k, where
CE_k is the mean cross-entropy of a uniformly random k-subset of masked tokens (k C(L,k) B(k, L-k+1) = 1)."""

from __future__ import annotations

import math

import torch

from experiments.mdlm_by_mask_rate import grid_counts, masked_cross_entropy
from seqdiff.backbones import build_backbone
from seqdiff.checkpoint import LoadedModel
from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.evaluation.likelihood import evaluate_tokens
from seqdiff.methods import build_method
from seqdiff.tokenizers import CharTokenizer

TOK = CharTokenizer()
L = 6


def test_every_count_on_a_full_grid_and_midpoints_on_a_coarse_one():
    assert grid_counts(L, L) == list(range(1, L + 1))
    assert grid_counts(128, 16) == [4 + 8 * j for j in range(16)]


def test_the_mean_over_mask_counts_is_the_nelbo_bound():
    """A tiny MDLM trained for a moment on rows of one repeated letter (of 4): a masked letter is known from
    any visible neighbour, so CE_k rises from about 0 to log 4 as k goes to L, and the identity is tested on a
    curve that is far from flat."""
    torch.manual_seed(0)
    cfg = ModelConfig(hidden_size=32, n_layers=1, n_heads=2, max_seq_len=8, time_conditioning=False)
    backbone = build_backbone(cfg, TOK.vocab_size, causal=False)
    method = build_method(MethodConfig(), TOK)
    g = torch.Generator().manual_seed(1)
    letters = lambda n: torch.randint(0, 4, (n, 1), generator=g).expand(n, L).contiguous()  # noqa: E731
    opt = torch.optim.AdamW(backbone.parameters(), lr=1e-2)
    for _ in range(150):
        opt.zero_grad()
        method.loss(backbone, {"input_ids": letters(64)}, g).loss.backward()
        opt.step()
    backbone.eval()
    model = LoadedModel(backbone=backbone, method=method, tokenizer=TOK, model_config=cfg,
                        method_config=MethodConfig(), data_config=None, seq_len=L, step=0, path=None, ema=False)
    blocks = letters(64)
    curve = [masked_cross_entropy(model, blocks, k, draws=40, seed=k) for k in range(1, L + 1)]
    nats = evaluate_tokens(model, blocks.flatten().numpy(), batch_size=64, num_t_samples=400,
                           seed=0)["nll_nats_per_token"]
    assert curve[0] < 0.2 and abs(curve[-1] - math.log(4)) < 0.2  # a neighbour tells; all masked: 1 of 4
    assert abs(sum(curve) / L - nats) < 0.03 * nats
    # the check can fail: weighting the counts by k / L (masked tokens' share) instead of 1 / L misses it
    assert abs(sum(k / L * c for k, c in zip(range(1, L + 1), curve)) / (L + 1) * 2 - nats) > 0.1 * nats


def whole_sequence_bits(log2_joint, seq, i: int, vocab: int) -> float:
    """Brute force: -log2 P(x_i | the rest), normalizing the joint of the whole sequence over x_i."""
    import numpy as np

    joint = []
    for c in range(vocab):
        t = seq.copy()
        t[i] = c
        joint.append(log2_joint(t))
    joint = np.array(joint)
    return float(-(joint[seq[i]] - np.log2(np.exp2(joint).sum())))


def test_the_ngram_infill_is_the_conditional_of_the_whole_text():
    """Scoring the window around i is the same as normalizing the joint of the whole text over x_i."""
    import numpy as np

    from experiments.mdlm_by_mask_rate import ngram_infill_bits
    from seqdiff.evaluation.ngram import WittenBellNGram

    rng = np.random.default_rng(0)
    train = rng.integers(0, 3, 400)
    train[::3] = 0  # some structure, so that the right-hand context matters
    model = WittenBellNGram(2, 3).fit([train])
    text = rng.integers(0, 3, 14)
    for i in (0, 1, 6, 12, 13):
        expected = whole_sequence_bits(lambda t: np.log2(model._probs(t)).sum(), text, i, 3)
        assert abs(ngram_infill_bits(model, text, np.array([i])) - expected) < 1e-9


def test_the_markov_infill_is_the_conditional_of_the_whole_segment():
    import numpy as np

    from experiments.mdlm_by_mask_rate import markov_infill_bits
    from seqdiff.evaluation.markov import MarkovChain

    rng = np.random.default_rng(0)
    train = rng.integers(0, 4, 2000)
    train[::4] = 2  # structure on both sides of a base
    chain = MarkovChain(3).fit([train])
    seg = rng.integers(0, 4, 20)
    for i in (0, 2, 9, 18, 19):
        expected = whole_sequence_bits(lambda t: -chain.score([t])[0], seg, i, 4)
        assert abs(markov_infill_bits(chain, [seg], [(0, i)]) - expected) < 1e-9


def test_end_to_end_on_text_and_on_fasta_tiles(tmp_path):
    """Both data kinds: the curve, the bound beside it, the counting references; AR optional."""
    import json

    from experiments.mdlm_by_mask_rate import main
    from seqdiff.config import load_run_config
    from seqdiff.training.run import train
    from tests.test_ddp import RECIPE
    from tests.test_dna_experiment import FIXTURES, STEM, overrides

    for method in ("mdlm", "ar"):
        train(load_run_config(None, [*RECIPE, f"method.name={method}"]), tmp_path / method)
    assert main(["--mdlm", str(tmp_path / "mdlm"), "--ar", str(tmp_path / "ar"), "--out", str(tmp_path / "text"),
                 "--grid", "4", "--draws", "1", "--num-t-samples", "1", "--infill-positions", "10"]) == 0
    text = json.loads((tmp_path / "text" / "results.json").read_text())
    assert len(text["curve"]) == 4 and text["ar_bits"] > 0 and text["ngram_infill_positions"] == 10
    assert text["ngram_label"].endswith("one stream)") and text["mdlm_ordered_bits"] == {}
    assert main(["--mdlm", str(tmp_path / "mdlm"), "--ar", str(tmp_path / "ar"), "--out", str(tmp_path / "few"),
                 "--grid", "2", "--draws", "1", "--num-t-samples", "1", "--infill-positions", "10",
                 "--max-blocks", "3", "--orders", "random:2"]) == 0
    few = json.loads((tmp_path / "few" / "results.json").read_text())
    assert few["blocks"] == 3 and few["ngram_label"].endswith("block by block)") and few["ngram_bits"] > 0
    assert 0 < few["mdlm_ordered_bits"]["random:2"] < 10
    assert "| AR: exact NLL |" in (tmp_path / "text" / "table.md").read_text()

    for suffix in (".fa.gz", ".fa.gz.fai", ".fa.gz.gzi", ".bed"):
        (tmp_path / f"{STEM}{suffix}").write_bytes((FIXTURES / f"{STEM}{suffix}").read_bytes())
    train(load_run_config(None, overrides(tmp_path, **{"method.name": "mdlm"})), tmp_path / "dna")
    assert main(["--mdlm", str(tmp_path / "dna"), "--out", str(tmp_path / "dna_report"), "--grid", "4",
                 "--draws", "1", "--num-t-samples", "1", "--infill-positions", "10", "--max-blocks", "6",
                 "--markov-order", "2", "--orders", "left_to_right", "left_to_right+right_to_left"]) == 0
    dna = json.loads((tmp_path / "dna_report" / "results.json").read_text())
    assert dna["ar_bits"] is None and 0 < dna["blocks"] <= 6 and dna["seq_len"] == 64
    ordered = dna["mdlm_ordered_bits"]
    assert set(ordered) == {"left_to_right", "left_to_right+right_to_left"} and 0 < ordered["left_to_right"] < 4
    assert "decoded in the order left_to_right+right_to_left" in (tmp_path / "dna_report" / "table.md").read_text()
    assert dna["ngram_label"].startswith("Markov chain, order 2") and 0 < dna["ngram_infill_bits"] < 4
    assert "AR: exact NLL" not in (tmp_path / "dna_report" / "table.md").read_text()
