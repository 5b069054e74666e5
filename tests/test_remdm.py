"""ReMDM: eta = 0 is the ancestral sampler draw for draw; one step keeps the forward marginals (exact denoiser);
the loop phase holds the number of masks at L (1 - alpha_on); the confidence schedule's closed form; refusals."""

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM
from seqdiff.samplers import SAMPLERS, MDLMAncestralSampler, ReMDMSampler, SamplerError, build_sampler
from seqdiff.samplers.remdm import loop_alpha, sigma_max
from tests.oracles import ProductOracle
from tests.test_mdlm import TinyNet
from tests.test_samplers import MASK, TOK, V


def _mdlm(**kw):
    return MDLM(MethodConfig(**kw), TOK)


@pytest.mark.parametrize("schedule", ["cap", "rescale", "conf"])
def test_eta_zero_is_the_ancestral_sampler(schedule):
    net = TinyNet(10).eval()
    given = torch.tensor([[-1, 1, -1, -1, -1, -1, -1, 2, -1, -1]] * 3)
    for steps in (1, 4, 25):
        for g in (None, given):
            a = MDLMAncestralSampler(_mdlm(), net, steps=steps).generate(3, 10, torch.Generator().manual_seed(5),
                                                                          given=g)
            b = ReMDMSampler(_mdlm(), net, steps=steps, schedule=schedule, eta=0.0).generate(
                3, 10, torch.Generator().manual_seed(5), given=g)
            assert torch.equal(a.tokens, b.tokens)
    remasking = ReMDMSampler(_mdlm(), net, steps=25, schedule="rescale", eta=1.0).generate(
        3, 10, torch.Generator().manual_seed(5))
    assert not torch.equal(a.tokens, remasking.tokens) and SAMPLERS["remdm"].exact is False


@pytest.mark.parametrize("schedule,eta,t,s", [("cap", 0.3, 0.7, 0.5), ("rescale", 1.0, 0.6, 0.3),
                                             ("rescale", 0.5, 0.2, 0.0), ("loop", 0.1, 0.4, 0.3)])
def test_one_step_keeps_the_forward_marginals(schedule, eta, t, s):
    """x_t drawn from the forward process of product data; after one ReMDM step with the exact denoiser, each
    position is MASK with probability 1 - alpha_s and token v with probability alpha_s pi(v)."""
    L, N = 3, 20000
    torch.manual_seed(0)
    marginals = torch.distributions.Dirichlet(torch.ones(3)).sample((L,)).double()
    oracle = ProductOracle(marginals.float(), V)
    sampler = ReMDMSampler(_mdlm(), oracle, steps=10, schedule=schedule, eta=eta)
    g = torch.Generator().manual_seed(1)
    x0 = torch.stack([torch.multinomial(marginals[pos], N, replacement=True, generator=g) for pos in range(L)], -1)
    tt, ss = torch.full((N,), t, dtype=torch.float64), torch.full((N,), s, dtype=torch.float64)
    a_t, _, _ = sampler.alphas(tt)
    a_s, _, _ = sampler.alphas(ss)
    xt = torch.where(torch.rand((N, L), generator=g, dtype=torch.float64) < 1 - a_t[:, None], MASK, x0)
    probs = sampler.denoise_fresh(xt, tt)
    xs = sampler.step(lambda positions: probs.flatten(0, 1)[positions], xt, torch.zeros_like(xt, dtype=torch.bool),
                      torch.zeros(N, L, dtype=torch.float64), tt, ss, g)
    a_s = float(a_s[0])
    remasked = int(((xt != MASK) & (xs == MASK)).sum())
    assert remasked > 100 or schedule == "rescale" and s == 0.0  # remasking happened (none at s = 0)
    for pos in range(L):
        counts = torch.stack([(xs[:, pos] == v).sum() for v in range(3)] + [(xs[:, pos] == MASK).sum()]).double()
        expected = torch.cat([a_s * marginals[pos], torch.tensor([1 - a_s], dtype=torch.float64)]) * N
        keep = expected > 0
        expected = expected * counts[keep].sum() / expected[keep].sum()  # (float rounding of the marginals)
        assert chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue > 1e-3, (pos, counts, expected)


def test_the_marginal_identity_in_closed_form():
    g = torch.Generator().manual_seed(0)
    a_t = torch.rand(1000, generator=g, dtype=torch.float64)
    a_s = a_t + (1 - a_t) * torch.rand(1000, generator=g, dtype=torch.float64)
    sig = sigma_max(a_t, a_s) * torch.rand(1000, generator=g, dtype=torch.float64)
    reveal = (a_s - (1 - sig) * a_t) / (1 - a_t)
    assert ((reveal >= -1e-12) & (reveal <= 1 + 1e-12)).all()  # a probability for every sigma <= sigma_max
    torch.testing.assert_close(a_t * sig + (1 - a_t) * (1 - reveal), 1 - a_s)


def test_loop_phase_holds_the_number_of_masks():
    L, N, alpha_on = 16, 1500, 0.8
    oracle = ProductOracle(torch.full((L, 3), 1 / 3), V)
    sampler = ReMDMSampler(_mdlm(), oracle, steps=40, schedule="loop", eta=0.2, t_on=0.6, t_off=0.1,
                           alpha_on=alpha_on)
    out = sampler.generate(N, L, torch.Generator().manual_seed(0))
    assert not (out.tokens == MASK).any() and out.num_denoiser_calls == 40
    band = [frac for time, frac in sampler.trace if 0.1 - 1e-9 <= time <= 0.6 + 1e-9]
    assert len(band) >= 15
    se = (alpha_on * (1 - alpha_on) / (N * L)) ** 0.5
    for frac in band:
        assert abs(frac - (1 - alpha_on)) < 6 * se, (frac, band)
    early = [frac for time, frac in sampler.trace if time >= 0.8]
    assert all(f > 1 - alpha_on + 0.05 for f in early)  # (the check above is not vacuous)
    plain = ReMDMSampler(_mdlm(), oracle, steps=40, schedule="loop", eta=0.0, t_on=0.6, t_off=0.1,
                         alpha_on=alpha_on).generate(N, L, torch.Generator().manual_seed(0))
    assert not torch.equal(plain.tokens, out.tokens)  # the band remasked and redrew tokens
    torch.testing.assert_close(loop_alpha(torch.tensor([1.0, 0.6, 0.3, 0.1, 0.0]), 0.6, 0.1, alpha_on),
                               torch.tensor([0.0, alpha_on, alpha_on, alpha_on, 1.0], dtype=torch.float64))


def test_confidence_schedule_and_given_positions():
    sampler = ReMDMSampler(_mdlm(), TinyNet(4), steps=4, schedule="conf", eta=0.5)
    decoded = torch.tensor([[True, True, False, False]])
    conf = torch.tensor([[0.9, 0.1, 0.0, 0.0]], dtype=torch.float64)
    a_t, a_s = torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.6], dtype=torch.float64)
    t = s = torch.tensor([0.5], dtype=torch.float64)
    sig_d, sig_m = sampler.sigmas(t, s, a_t, a_s, decoded, conf)
    share = torch.softmax(torch.tensor([-0.9, -0.1], dtype=torch.float64), 0)
    torch.testing.assert_close(sig_d[0, :2], 0.5 * 0.8 * share)  # sigma_max = 0.4 / 0.5
    assert (sig_d[0, 2:] == 0).all() and (sig_m == 0).all() and sig_d[0, 1] > sig_d[0, 0]  # low confidence first
    given = torch.tensor([0, -1, -1, 2])
    x = ReMDMSampler(_mdlm(), TinyNet(4), steps=30, schedule="rescale", eta=1.0).generate(
        64, 4, torch.Generator().manual_seed(0), given=given).tokens
    assert (x[:, 0] == 0).all() and (x[:, 3] == 2).all() and not (x == MASK).any()


def test_refusals_name_the_flag_and_the_range():
    net = TinyNet(4)
    with pytest.raises(SamplerError, match=r"--remdm-eta.*\[0, 1\]"):
        ReMDMSampler(_mdlm(), net, eta=1.5)
    with pytest.raises(SamplerError, match="--remdm-schedule.*'cap'"):
        ReMDMSampler(_mdlm(), net, schedule="nope")
    with pytest.raises(SamplerError, match=r"--remdm-eta.*alpha_on=0.9.*\[0, 0.1111\]"):
        ReMDMSampler(_mdlm(), net, schedule="loop", eta=0.5, alpha_on=0.9)
    with pytest.raises(SamplerError, match="t_off < t_on"):
        ReMDMSampler(_mdlm(), net, schedule="loop", t_on=0.2, t_off=0.3)
    with pytest.raises(SamplerError, match="--remdm-alpha-on"):
        ReMDMSampler(_mdlm(), net, schedule="loop", alpha_on=1.0)
    with pytest.raises(SamplerError, match=r"--steps.*=3 .*needs --steps >= 4"):  # grid 1, 2/3, 1/3, 0
        ReMDMSampler(_mdlm(), net, steps=3, schedule="loop")
    ReMDMSampler(_mdlm(), net, steps=4, schedule="loop")  # the bound it names is enough: [0.5, 0.25]
    with pytest.raises(SamplerError, match="--sampler remdm.*cannot drive"):
        build_sampler("remdm", SimpleNamespace(name="ar"), net, steps=4)
    with pytest.raises(SamplerError, match="SUBS"):
        ReMDMSampler(_mdlm(subs=False), net)
