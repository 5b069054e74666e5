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
        probs_at = probs.reshape(N * L, -1).__getitem__  # flat positions -> (R, V)
        x0, _ = sampler.importance_x0(probs_at, xt.expand(N, L), row_generators(N, torch.Generator().manual_seed(k),
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


def _enumerated_generation_law(method, mu_net, energy, L, steps):
    """Exact law of the final sequence of EDLM generation with k -> infinity and w = 1: every step draws x0 from
    mu(x0 | x_t) exp(-E) / Z over the completions of x_t and reveals each masked position with the MDLM
    probability. Enumerated over reveal sets and x0; returns (K^L,) probabilities."""
    import itertools

    S = states(L)
    law = torch.zeros(len(S), dtype=torch.float64)
    grid = torch.linspace(1, 0, steps + 1, dtype=torch.float64)

    def walk(xt, i, p):
        if i == steps or not (xt == MASK).any():
            if (xt == MASK).any():  # noise removal: argmax of mu
                probs = torch.softmax(mu_net(xt[None]).double(), -1)[0]
                xt = torch.where(xt == MASK, probs.argmax(-1), xt)
            law[index_of(xt)] += p
            return
        t, s = grid[i : i + 1], grid[i + 1 : i + 2]
        a_t, a_s = method.schedule.alpha(t), method.schedule.alpha(s)
        r = float(((a_s - a_t) / method.schedule.one_minus_alpha(t)).clamp(0, 1))
        probs = torch.softmax(mu_net(xt[None]).double(), -1)[0]  # (L, V)
        comp = S[((S == xt) | (xt == MASK)).all(-1)]
        mu = probs[torch.arange(L), comp].where(xt == MASK, torch.ones(())).prod(-1)
        target = mu * torch.exp(-energy.table[index_of(comp)])
        target = target / target.sum()
        masked = (xt == MASK).nonzero().flatten().tolist()
        for size in range(len(masked) + 1):
            for reveal in itertools.combinations(masked, size):
                pr = r**size * (1 - r) ** (len(masked) - size)
                if pr == 0:
                    continue
                nxt = {}
                for c, q in zip(comp, target):
                    xs = xt.clone()
                    xs[list(reveal)] = c[list(reveal)]
                    key = tuple(xs.tolist())
                    nxt[key] = nxt.get(key, 0.0) + float(q)
                for key, q in nxt.items():
                    walk(torch.tensor(key), i + 1, p * pr * q)

    walk(torch.full((L,), MASK), 0, 1.0)
    return law


def test_whole_generation_follows_the_enumerated_edlm_law():
    """Revealed positions are drawn before the candidates (rows revealing nothing skip the importance step): the
    final sequences of a full run with large k must still follow the enumerated EDLM process, and with k = 1
    the MDLM process instead (a measurably different law, so the test can fail)."""
    L, N, steps = 2, 3000, 3
    g = torch.Generator().manual_seed(5)
    joint = torch.rand(9, generator=g, dtype=torch.float64) + 0.1
    mu_net = JointOracle(joint / joint.sum(), L, 3, TOK.vocab_size, MASK)
    energy = TableEnergy(1.5 * torch.randn(9, generator=g, dtype=torch.float64))
    method = MDLM(MethodConfig(), TOK)
    target = _enumerated_generation_law(method, mu_net, energy, L, steps)

    def freq(k):
        sampler = EDLMImportanceSampler(method, mu_net, steps=steps, energy=energy, k=k, window=1.0)
        x = sampler.generate(N, L, torch.Generator().manual_seed(k)).tokens
        return torch.bincount(index_of(x), minlength=9).double() / N

    tv_large = 0.5 * (freq(32) - target).abs().sum()
    tv_one = 0.5 * (freq(1) - target).abs().sum()
    assert tv_large < 0.04, tv_large
    assert tv_one > 0.1, tv_one


def test_steps_that_reveal_nothing_draw_no_candidates():
    """With many more steps than positions most steps reveal nothing: importance steps (energy evaluations)
    are bounded by the number of revealed positions, not by the number of steps."""
    B, L, steps = 2, 4, 64
    sampler = _sampler(TinyNet(L), k=3, window=1.0, steps=steps)
    out = sampler.generate(B, L, torch.Generator().manual_seed(0))
    assert not (out.tokens == MASK).any()
    assert 1 <= len(sampler.ess) <= B * L < steps
    assert out.num_denoiser_calls <= B * L + 1  # the first call, then one per step that changed a row
