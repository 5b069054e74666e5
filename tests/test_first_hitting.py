"""First-hitting sampler: the enumerated joint law with an exact denoiser, the enumerated law of the continuous-
time process with an imperfect one (the ancestral sampler's limit as steps grow), the reveal times' closed-form
law, conditioning and decoding controls."""

import itertools
import math

import pytest
import torch
from scipy.stats import chisquare, kstest

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM
from seqdiff.samplers import SAMPLERS, MDLMCachedSampler, MDLMFirstHittingSampler, SamplerError, build_sampler
from seqdiff.samplers.mdlm_first_hitting import time_of_mask_probability
from seqdiff.schedules import build_schedule
from tests.oracles import JointOracle, ProductOracle
from tests.test_mdlm import TinyNet
from tests.test_samplers import MASK, TOK, V


def _mdlm(**kw):
    return MDLM(MethodConfig(**kw), TOK)


def _index(x, base):
    return (x * torch.tensor([base**2, base, 1])).sum(-1)


def _chi2_p(counts, probs, n):
    expected = probs * n
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    return chisquare(counts[keep].numpy(), expected.numpy()).pvalue


def test_registered_exact_and_one_call_per_token():
    assert SAMPLERS["first_hitting"] is MDLMFirstHittingSampler and MDLMFirstHittingSampler.exact
    out = build_sampler("first_hitting", _mdlm(), TinyNet(8), steps=3).generate(4, 8, torch.Generator().manual_seed(0))
    assert not (out.tokens == MASK).any() and out.num_denoiser_calls == 8  # whatever `steps` says


def test_exact_denoiser_reproduces_the_enumerated_joint():
    L, K, N = 3, 3, 5000
    torch.manual_seed(0)
    joint = torch.distributions.Dirichlet(torch.full((K**L,), 0.7)).sample(())
    oracle = JointOracle(joint, L, K, V, MASK)
    x = MDLMFirstHittingSampler(_mdlm(), oracle).generate(N, L, torch.Generator().manual_seed(1)).tokens
    counts = torch.bincount(_index(x, K), minlength=K**L).double()
    assert _chi2_p(counts, joint.double(), N) > 1e-3


def _continuous_time_law(net, L):
    """Exact law of the time-agnostic continuous-time reverse process for denoiser `net`: reveal a uniformly
    chosen masked position, its token from x_theta(x). Enumerated over orders and tokens: (V^L,) float64."""
    law = torch.zeros(V**L, dtype=torch.float64)

    def walk(x, p):
        masked = (x == MASK).nonzero().flatten().tolist()
        if not masked:
            law[int(_index(x, V))] += p
            return
        probs = _mdlm().denoise(net, x[None], torch.ones(1))[0]  # (L, V)
        for pos in masked:
            for v in range(V):
                if probs[pos, v] > 0:
                    y = x.clone()
                    y[pos] = v
                    walk(y, p * probs[pos, v] / len(masked))

    walk(torch.full((L,), MASK), 1.0)
    return law


def test_law_is_the_ancestral_limit_for_an_imperfect_denoiser():
    """An imperfect (inconsistent) denoiser: the first-hitting law is the enumerated continuous-time law, which
    the ancestral sampler approaches with many steps; one ancestral step (a product of marginals) is refuted."""
    L, N = 3, 6000
    net = TinyNet(L, seed=3).eval()
    law = _continuous_time_law(net, L)
    assert abs(float(law.sum()) - 1) < 1e-9
    one_step = torch.ones(V**L, dtype=torch.float64)
    marg = _mdlm().denoise(net, torch.full((1, L), MASK), torch.ones(1))[0]
    for idx, xs in enumerate(itertools.product(range(V), repeat=L)):
        one_step[idx] = math.prod(float(marg[pos, v]) for pos, v in enumerate(xs))
    assert 0.5 * float((law - one_step).abs().sum()) > 0.05  # the test can tell the two apart

    fh = MDLMFirstHittingSampler(_mdlm(), net).generate(N, L, torch.Generator().manual_seed(2)).tokens
    fh_counts = torch.bincount(_index(fh, V), minlength=V**L).double()
    assert _chi2_p(fh_counts, law, N) > 1e-3
    anc = MDLMCachedSampler(_mdlm(), net, steps=1000).generate(N, L, torch.Generator().manual_seed(3)).tokens
    anc_counts = torch.bincount(_index(anc, V), minlength=V**L).double()
    assert _chi2_p(anc_counts, law, N) > 1e-3
    coarse = MDLMCachedSampler(_mdlm(), net, steps=1).generate(N, L, torch.Generator().manual_seed(4)).tokens
    coarse_counts = torch.bincount(_index(coarse, V), minlength=V**L).double()
    assert _chi2_p(coarse_counts, law, N) < 1e-6


class _TimeRecorder(ProductOracle):
    """A time-conditioned product oracle that records the noise level of every call."""

    def __init__(self, L):
        super().__init__(torch.full((L, 3), 1 / 3), V)
        self.config.time_conditioning = True
        self.levels = []

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
        self.levels.append(noise_level.double().clone())
        return super().forward(input_ids)


@pytest.mark.parametrize("schedule", ["loglinear", "cosine"])
def test_first_reveal_time_has_the_closed_form_law(schedule):
    """With n = L masked tokens at t = 1, P(first reveal <= s) = ((1 - alpha_s) / (1 - alpha_1))^L; the second
    reveal is, given the first at t1, distributed as ((1 - alpha_s) / (1 - alpha_t1))^(L - 1)."""
    L, N = 4, 3000
    method = _mdlm(schedule=schedule)
    net = _TimeRecorder(L)
    MDLMFirstHittingSampler(method, net).generate(N, L, torch.Generator().manual_seed(0))
    sched = method.schedule
    first = time_of_mask_probability(sched, 1 - torch.exp(-net.levels[0]))  # sigma -> t
    second = time_of_mask_probability(sched, 1 - torch.exp(-net.levels[1]))
    assert (second < first).all() and len(net.levels) == L
    one = sched.one_minus_alpha(torch.ones((), dtype=torch.float64))
    u1 = (sched.one_minus_alpha(first) / one) ** L  # U(0, 1) under the claimed law
    u2 = (sched.one_minus_alpha(second) / sched.one_minus_alpha(first)) ** (L - 1)
    assert kstest(u1.numpy(), "uniform").pvalue > 1e-3
    assert kstest(u2.numpy(), "uniform").pvalue > 1e-3
    assert kstest((first.numpy()), "uniform").pvalue < 1e-6  # not merely uniform times (the test can fail)


def test_schedule_inverse_by_bisection():
    for name in ("loglinear", "linear", "geometric", "cosine", "cosine2"):
        sched = build_schedule(name)
        t = torch.linspace(0.01, 1, 50, dtype=torch.float64)
        p = sched.one_minus_alpha(t)
        back = time_of_mask_probability(sched, p)
        torch.testing.assert_close(sched.one_minus_alpha(back), p, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(back[:40], t[:40], atol=1e-9, rtol=0)  # (near t = 1 sigma schedules saturate)


def test_given_positions_are_kept_and_the_rest_follow_the_conditional():
    L, K, N = 3, 3, 4000
    torch.manual_seed(5)
    joint = torch.distributions.Dirichlet(torch.full((K**L,), 0.7)).sample(())
    oracle = JointOracle(joint, L, K, V, MASK)
    given = torch.tensor([-1, 2, -1])
    out = MDLMFirstHittingSampler(_mdlm(), oracle).generate(N, L, torch.Generator().manual_seed(0), given=given)
    assert (out.tokens[:, 1] == 2).all() and out.num_denoiser_calls == 2
    cond = joint.reshape(K, K, K)[:, 2, :].reshape(-1).double()
    counts = torch.bincount(out.tokens[:, 0] * K + out.tokens[:, 2], minlength=K * K).double()
    assert _chi2_p(counts, cond / cond.sum(), N) > 1e-3
    # rows with different numbers of free positions advance together and each keeps its own given tokens
    rows = torch.tensor([[0, -1, -1], [1, 1, -1]])
    x = MDLMFirstHittingSampler(_mdlm(), oracle).generate(2, L, torch.Generator().manual_seed(0), given=rows).tokens
    assert x[0, 0] == 0 and (x[1, :2] == 1).all() and not (x == MASK).any()


def test_decoding_controls_and_refusals():
    marginals = torch.tensor([[0.2, 0.5, 0.3]] * 4)
    greedy = MDLMFirstHittingSampler(_mdlm(), ProductOracle(marginals, V), temperature=0.0)
    assert (greedy.generate(16, 4, torch.Generator().manual_seed(0)).tokens == 1).all()
    nucleus = MDLMFirstHittingSampler(_mdlm(), ProductOracle(marginals, V), top_p=0.5)  # keeps {1} only
    assert (nucleus.generate(16, 4, torch.Generator().manual_seed(0)).tokens == 1).all()
    x = MDLMFirstHittingSampler(_mdlm(schedule="linear"), TinyNet(6)).generate(8, 6, torch.Generator().manual_seed(0))
    assert not (x.tokens == MASK).any()  # alpha(0) < 1: noise removal at the end
    a = MDLMFirstHittingSampler(_mdlm(), TinyNet(6)).generate(3, 6, torch.Generator().manual_seed(7)).tokens
    b = MDLMFirstHittingSampler(_mdlm(), TinyNet(6)).generate(3, 6, torch.Generator().manual_seed(7)).tokens
    assert torch.equal(a, b)
    with pytest.raises(SamplerError, match="SUBS"):
        MDLMFirstHittingSampler(_mdlm(subs=False), TinyNet(6))
