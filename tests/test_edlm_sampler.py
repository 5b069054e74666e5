"""EDLM importance sampling: batch independence, `given`, k = 1 equals MDLM in law, and the step's law
tends to the enumerated mu exp(-E) / Z as k grows."""

import pytest
import torch

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM
from seqdiff.samplers import EDLMImportanceSampler, SamplerError, build_sampler
from seqdiff.samplers.edlm_importance import effective_sample_size, row_generators
from tests.edlm_toys import MASK, TOK, CountEnergy, TableEnergy, index_of, states
from tests.oracles import JointOracle
from tests.test_mdlm import TinyNet


def _sampler(net, energy=None, k=3, window=0.6, steps=8):
    return EDLMImportanceSampler(MDLM(MethodConfig(), TOK), net, steps=steps, energy=energy or CountEnergy(),
                                 k=k, window=window)


def test_batch_equals_rows_one_at_a_time():
    sampler = _sampler(TinyNet(6))
    batch = sampler.generate(5, 6, torch.Generator().manual_seed(3)).tokens
    g = torch.Generator().manual_seed(3)
    rows = torch.cat([sampler.generate(1, 6, g).tokens for _ in range(5)])
    assert torch.equal(batch, rows)
    assert not (batch == MASK).any()
    assert len(sampler.ess) > 0 and all(1.0 <= e <= 3.0 + 1e-9 for _, e in sampler.ess)
    assert 1.0 <= sampler.stats()["mean_effective_sample_size"] <= 3.0
    again = sampler.generate(5, 6, torch.Generator().manual_seed(4)).tokens
    assert not torch.equal(batch, again)  # the seed matters


def test_given_tokens_are_kept_and_batch_independent():
    sampler = _sampler(TinyNet(6), window=1.0)
    given = torch.tensor([[1, -1, -1, 2, -1, -1], [-1, -1, 0, -1, -1, 1], [2, 2, -1, -1, -1, -1]])
    out = sampler.generate(3, 6, torch.Generator().manual_seed(0), given=given).tokens
    fixed = given >= 0
    assert torch.equal(out[fixed], given[fixed])
    g = torch.Generator().manual_seed(0)
    rows = torch.cat([sampler.generate(1, 6, g, given=given[r]).tokens for r in range(3)])
    assert torch.equal(out, rows)


def test_importance_step_tends_to_the_enumerated_edlm_step():
    """x0 resampled from k draws of mu by exp(-E): with k large its law is mu exp(-E) / Z (enumerated over the
    completions of x_t); with k = 1 it is mu itself, measurably different (so the test can fail)."""
    L, N = 3, 6000
    g = torch.Generator().manual_seed(0)
    joint = torch.rand(27, generator=g, dtype=torch.float64) + 0.1
    mu_net = JointOracle(joint / joint.sum(), L, 3, TOK.vocab_size, MASK)
    energy = TableEnergy(1.5 * torch.randn(27, generator=g, dtype=torch.float64))
    xt = torch.tensor([MASK, 1, MASK])
    probs = torch.softmax(mu_net(xt[None]).double(), -1).expand(N, L, -1)
    S = states(L)
    comp = S[((S == xt) | (xt == MASK)).all(-1)]  # (9, L) completions
    mu = probs[0, torch.arange(L), comp].where(xt == MASK, torch.ones(())).prod(-1)  # (9,)
    target = mu * torch.exp(-energy.table[index_of(comp)])
    target = target / target.sum()

    def law(k):
        sampler = _sampler(mu_net, energy=energy, k=k)
        x0, _ = sampler.importance_x0(probs, xt.expand(N, L), row_generators(N, torch.Generator().manual_seed(k),
                                                                             "cpu"))
        counts = torch.stack([(index_of(x0) == index_of(c)).sum() for c in comp]).double()
        assert counts.sum() == N  # every draw is a completion of x_t
        return counts / N

    tv_large = 0.5 * (law(48) - target).abs().sum()
    tv_one = 0.5 * (law(1) - target).abs().sum()
    tv_mu_target = 0.5 * (mu - target).abs().sum()
    assert tv_mu_target > 0.15
    assert tv_large < 0.04, (tv_large, law(48), target)
    assert abs(tv_one - tv_mu_target) < 0.04


def test_k_one_is_mdlm_in_law_and_a_larger_k_follows_the_energy():
    """k = 1 (or outside the window) takes MDLM steps: token frequencies match the cached MDLM sampler's; with
    k = 8 over the whole window an energy that penalizes the most frequent token makes it rarer."""
    net, N = TinyNet(4), 600
    method = MDLM(MethodConfig(), TOK)
    plain = build_sampler("cached", method, net, steps=6).generate(N, 4, torch.Generator().manual_seed(1)).tokens
    common = int(torch.mode(plain.flatten()).values)
    energy = CountEnergy(3.0, token=common)
    one = _sampler(net, energy=energy, k=1, window=1.0, steps=6).generate(N, 4, torch.Generator().manual_seed(0))
    eight = _sampler(net, energy=energy, k=8, window=1.0, steps=6).generate(N, 4, torch.Generator().manual_seed(0))
    freq = [float((x == common).double().mean()) for x in (plain, one.tokens, eight.tokens)]
    assert abs(freq[0] - freq[1]) < 0.05, freq
    assert freq[2] < freq[0] - 0.1, freq


def test_effective_sample_size_closed_form_and_errors():
    log_w = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, -1e9, -1e9, -1e9]], dtype=torch.float64)
    torch.testing.assert_close(effective_sample_size(log_w), torch.tensor([4.0, 1.0], dtype=torch.float64))
    method = MDLM(MethodConfig(), TOK)
    with pytest.raises(SamplerError, match="needs an energy"):
        build_sampler("edlm", method, TinyNet(4), steps=4)
    with pytest.raises(SamplerError, match="edlm-k"):
        build_sampler("edlm", method, TinyNet(4), steps=4, energy=CountEnergy(), k=0)
    with pytest.raises(SamplerError, match="edlm-window"):
        build_sampler("edlm", method, TinyNet(4), steps=4, energy=CountEnergy(), window=1.5)
