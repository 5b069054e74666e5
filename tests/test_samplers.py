
import pytest
import torch
from scipy.stats import chisquare

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM
from seqdiff.samplers import MDLMAncestralSampler, MDLMCachedSampler, SamplerError, build_sampler
from seqdiff.tokenizers import CharTokenizer
from tests.oracles import JointOracle, ProductOracle
from tests.test_mdlm import TinyNet

TOK = CharTokenizer(alphabet="abc", normalize="none")
V, MASK = TOK.vocab_size, TOK.mask_id


def _mdlm(**kw):
    return MDLM(MethodConfig(**kw), TOK)


@pytest.mark.parametrize("steps", [1, 3, 16])
def test_oracle_product_marginals_chi_square(steps):
    L, N = 5, 6000
    torch.manual_seed(steps)
    marginals = torch.distributions.Dirichlet(torch.ones(3)).sample((L,))
    sampler = MDLMAncestralSampler(_mdlm(), ProductOracle(marginals, V), steps=steps)
    x = sampler.generate(N, L, torch.Generator().manual_seed(steps)).tokens
    assert not (x == MASK).any()
    for pos in range(L):
        counts = torch.bincount(x[:, pos], minlength=V)[:3].double()
        assert counts.sum() == N
        expected = marginals[pos].double() / marginals[pos].double().sum() * N
        p = chisquare(counts.numpy(), expected.numpy()).pvalue
        assert p > 1e-3, (pos, counts, marginals[pos] * N)


def test_oracle_joint_distribution_with_many_steps():
    """With one reveal per step (many steps) the exact denoiser reproduces the whole joint distribution."""
    L, K, N = 3, 3, 5000
    torch.manual_seed(0)
    joint = torch.distributions.Dirichlet(torch.full((K**L,), 0.7)).sample(())
    oracle = JointOracle(joint, L, K, V, MASK)
    sampler = MDLMCachedSampler(_mdlm(), oracle, steps=600)
    x = sampler.generate(N, L, torch.Generator().manual_seed(0)).tokens
    index = (x * torch.tensor([K * K, K, 1])).sum(-1)
    counts = torch.bincount(index, minlength=K**L).double()
    expected = joint.double() * N
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


def test_product_of_marginals_does_not_fit_a_correlated_joint():
    """The joint test above can fail: a sampler that ignores context (one step) misses the correlations."""
    L, K, N = 3, 3, 8000
    joint = torch.zeros(K**L)
    for v in range(K):  # all three tokens equal
        joint[v * (K * K + K + 1)] = 1 / K
    oracle = JointOracle(joint, L, K, V, MASK)
    x = MDLMAncestralSampler(_mdlm(), oracle, steps=1).generate(N, L, torch.Generator().manual_seed(0)).tokens
    assert (x == x[:, :1]).all(-1).double().mean() < 0.5
    x = MDLMCachedSampler(_mdlm(), oracle, steps=600).generate(N // 4, L, torch.Generator().manual_seed(0)).tokens
    assert (x == x[:, :1]).all(-1).double().mean() > 0.98


@pytest.mark.parametrize("batch", [1, 5])
def test_cached_and_uncached_identical(batch):
    net = TinyNet(12).eval()
    for steps in (4, 12, 50):
        a = MDLMAncestralSampler(_mdlm(), net, steps=steps).generate(batch, 12, torch.Generator().manual_seed(9))
        b = MDLMCachedSampler(_mdlm(), net, steps=steps).generate(batch, 12, torch.Generator().manual_seed(9))
        assert torch.equal(a.tokens, b.tokens)
        assert b.num_denoiser_calls <= a.num_denoiser_calls
    assert a.num_denoiser_calls == 50 and b.num_denoiser_calls <= 12 * batch
    if batch == 1:  # at most one call per revealed token
        assert b.num_denoiser_calls <= 12


def test_same_seed_same_samples_and_different_seed_differs():
    net = TinyNet(12).eval()
    s = MDLMCachedSampler(_mdlm(), net, steps=12)
    a = s.generate(4, 12, torch.Generator().manual_seed(1)).tokens
    b = s.generate(4, 12, torch.Generator().manual_seed(1)).tokens
    c = s.generate(4, 12, torch.Generator().manual_seed(2)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_noise_removal_for_schedule_with_alpha0_below_one():
    net = TinyNet(8).eval()
    method = _mdlm(schedule="linear")  # alpha(0) = exp(-1e-4) < 1
    x = MDLMAncestralSampler(method, net, steps=4).generate(16, 8, torch.Generator().manual_seed(0)).tokens
    assert not (x == MASK).any()


def test_cached_sampler_refuses_time_conditioning():
    net = TinyNet(8)
    net.config.time_conditioning = True
    with pytest.raises(SamplerError, match="time conditioning"):
        MDLMCachedSampler(_mdlm(), net, steps=4)
    MDLMAncestralSampler(_mdlm(), net, steps=4)  # the uncached one is fine


def test_sampler_method_mismatch_and_unknown_name():
    net = TinyNet(8)
    with pytest.raises(SamplerError, match="cannot drive"):
        build_sampler("ar", _mdlm(), net, steps=4)
    with pytest.raises(SamplerError, match="unknown"):
        build_sampler("nope", _mdlm(), net, steps=4)
    with pytest.raises(SamplerError, match="max_seq_len"):
        MDLMAncestralSampler(_mdlm(), net, steps=4).generate(1, 9)


def test_temperature_zero_is_greedy():
    marginals = torch.tensor([[0.2, 0.5, 0.3]] * 4)
    x = MDLMAncestralSampler(_mdlm(), ProductOracle(marginals, V), steps=4, temperature=0.0).generate(
        32, 4, torch.Generator().manual_seed(0)).tokens
    assert torch.all(x == 1)
