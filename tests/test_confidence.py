"""Confidence-ordered decoding: the top-k sampler commits exactly the scheduled count per step and the most
confident positions; the threshold sampler commits every position above tau and at least one per step; both
are deterministic given the generator and leave given positions alone."""

import pytest
import torch

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM
from seqdiff.samplers import SAMPLERS, ConfidenceSampler, SamplerError, ThresholdSampler, build_sampler
from seqdiff.samplers.confidence import top_k_by_confidence
from tests.oracles import ProductOracle
from tests.test_mdlm import TinyNet
from tests.test_samplers import MASK, TOK, V


def _mdlm(**kw):
    return MDLM(MethodConfig(**kw), TOK)


@pytest.mark.parametrize("schedule", ["loglinear", "cosine"])
def test_top_k_commits_exactly_the_scheduled_count(schedule):
    L, steps = 12, 5
    method = _mdlm(schedule=schedule)
    sampler = ConfidenceSampler(method, TinyNet(L), steps=steps)
    given = torch.full((3, L), -1)
    given[1, :4] = torch.tensor([0, 1, 2, 0])  # a prompt: this row starts with 8 masked tokens
    out = sampler.generate(3, L, torch.Generator().manual_seed(0), given=given)
    assert not (out.tokens == MASK).any() and torch.equal(out.tokens[1, :4], given[1, :4])
    sched = method.schedule
    grid = torch.linspace(1, 0, steps + 1, dtype=torch.float64)
    share = sched.one_minus_alpha(grid) / sched.one_minus_alpha(grid[:1])
    for row, n0 in ((0, L), (1, L - 4), (2, L)):
        counts = [int(c[row]) for c in sampler.trace]
        expected = [int(torch.floor(n0 * share[i + 1])) for i in range(steps - 1)] + [0]
        assert counts == expected, (row, counts, expected)
    before = [torch.tensor([L, L - 4, L])] + sampler.trace[:-1]
    assert out.num_denoiser_calls == sum(bool((b > a).any()) for b, a in zip(before, sampler.trace))
    many = ConfidenceSampler(method, TinyNet(L), steps=40).generate(2, L, torch.Generator().manual_seed(0))
    assert many.num_denoiser_calls <= L  # steps that commit nothing make no call


def test_top_k_picks_the_most_confident_positions():
    conf = torch.tensor([[0.2, 0.9, 0.5, 0.9, 0.1], [0.3, 0.3, 0.3, 0.8, 0.0]], dtype=torch.float64)
    masked = torch.tensor([[True, True, True, False, True], [True, True, True, True, True]])
    got = top_k_by_confidence(conf, masked, torch.tensor([2, 2]))
    assert got.tolist() == [[False, True, True, False, False], [True, False, False, True, False]]
    marginals = torch.tensor([[0.4, 0.3, 0.3], [0.98, 0.01, 0.01], [0.1, 0.1, 0.8], [0.34, 0.33, 0.33]])
    sampler = ConfidenceSampler(_mdlm(), ProductOracle(marginals, V), steps=4, temperature=0.0)
    x = sampler.generate(1, 4, torch.Generator().manual_seed(0))
    masks = [int(c[0]) for c in sampler.trace]
    assert masks == [3, 2, 1, 0]  # one per step (log-linear, L = 4, 4 steps): positions 1, 2, 0, 3 by confidence
    assert x.tokens[0].tolist() == [0, 0, 2, 0]


def test_threshold_commits_every_confident_position_and_at_least_one():
    marginals = torch.tensor([[0.95, 0.03, 0.02], [0.5, 0.3, 0.2], [0.01, 0.97, 0.02], [0.4, 0.35, 0.25]])
    sampler = ThresholdSampler(_mdlm(), ProductOracle(marginals, V), threshold=0.9, temperature=0.0)
    out = sampler.generate(2, 4, torch.Generator().manual_seed(0))
    assert [c.tolist() for c in sampler.trace] == [[2, 2], [1, 1], [0, 0]]  # {0, 2}, then 1, then 3
    assert out.num_denoiser_calls == 3 and out.tokens.tolist() == [[0, 0, 1, 0]] * 2
    one = ThresholdSampler(_mdlm(), TinyNet(6), threshold=1.0).generate(2, 6, torch.Generator().manual_seed(0))
    assert one.num_denoiser_calls == 6  # tau = 1: nothing exceeds it, one token per call
    low = ThresholdSampler(_mdlm(), ProductOracle(marginals, V), threshold=0.3)
    assert low.generate(2, 4, torch.Generator().manual_seed(0)).num_denoiser_calls == 1  # every max p > 0.3


@pytest.mark.parametrize("name", ["confidence", "threshold"])
def test_deterministic_given_the_generator_and_prompt_untouched(name):
    net = TinyNet(10)
    sampler = build_sampler(name, _mdlm(), net, steps=4)
    given = torch.tensor([2, 1, 0, -1, -1, -1, -1, -1, -1, 1])
    a = sampler.generate(4, 10, torch.Generator().manual_seed(3), given=given).tokens
    b = sampler.generate(4, 10, torch.Generator().manual_seed(3), given=given).tokens
    c = sampler.generate(4, 10, torch.Generator().manual_seed(4), given=given).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert (a[:, :3] == given[:3]).all() and (a[:, 9] == 1).all() and not (a == MASK).any()
    assert SAMPLERS[name].exact is False and SAMPLERS[name].kind() == "approximate"


def test_threshold_outside_its_range_is_refused():
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(SamplerError, match=r"--threshold \(sample.threshold\)=.*\(0, 1\]"):
            ThresholdSampler(_mdlm(), TinyNet(4), threshold=bad)
    with pytest.raises(SamplerError, match="SUBS"):
        ConfidenceSampler(_mdlm(subs=False), TinyNet(4))
