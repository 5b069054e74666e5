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
        joint = []
        for c in range(3):
            t = text.copy()
            t[i] = c
            joint.append(np.log2(model._probs(t)).sum())
        joint = np.array(joint)
        expected = -(joint[text[i]] - np.log2(np.exp2(joint).sum()))
        assert abs(ngram_infill_bits(model, text, np.array([i])) - expected) < 1e-9
