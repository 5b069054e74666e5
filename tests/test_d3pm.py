"""D3PM (absorbing, discrete T, with and without SUBS) and MDLM's no-SUBS ablation.

The reference bound is written with dense one-step and cumulative transition matrices (Austin et al. 2021,
eq. 3 for the posterior, eq. 4 for the x0-parameterized model), never with the closed forms under test.
"""

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import chisquare

from seqdiff.config import ConfigError, MethodConfig, load_run_config
from seqdiff.methods import D3PM, MDLM, Batch, build_method
from seqdiff.samplers import (
    D3PMAncestralSampler,
    MDLMAncestralSampler,
    MDLMCachedSampler,
    SamplerError,
    build_sampler,
)
from seqdiff.tokenizers import CharTokenizer
from tests.oracles import ProductOracle
from tests.test_mdlm import TinyNet

TOK = CharTokenizer(alphabet="abc", normalize="none")  # 3 symbols + BOS EOS PAD MASK -> V = 7
V, MASK = TOK.vocab_size, TOK.mask_id


class MaskyNet(TinyNet):
    """An imperfect denoiser that also puts real mass on MASK: pi_M between 0.2 and 0.45."""

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
        logits = super().forward(input_ids)
        rest = logits[..., :MASK].logsumexp(-1)
        p_mask = 0.325 + 0.125 * torch.tanh(logits[..., 0])
        return torch.cat([logits[..., :MASK], (rest + torch.log(p_mask / (1 - p_mask)))[..., None]], -1)


def d3pm(**kw):
    return D3PM(MethodConfig(name="d3pm", **kw), TOK)


def mdlm(**kw):
    """Time-based draws, as d3pm's (time_sampling=auto would draw mask counts for mdlm)."""
    return MDLM(MethodConfig(**{"time_sampling": "antithetic", **kw}), TOK)


def pinned_alpha(t):
    """D3PM's grid: the log-linear alpha with alpha(0) = 1 and alpha(1) = 0 (written out independently)."""
    return 1.0 if t <= 0 else 0.0 if t >= 1 else 1 - 0.999 * t


def loglinear_alpha(t):
    return 1 - 0.999 * t


def _model_probs(net, xt, mask_shift=0.0, subs=False):
    logits = net(xt).double()
    logits[..., MASK] = float("-inf") if subs else logits[..., MASK] + mask_shift
    return torch.softmax(logits, -1)  # (B, L, V)


def _all_patterns(x0):
    """Every masking pattern of every row: (P B0, L) masks, P = 2^L, pattern-major."""
    B0, L = x0.shape
    m = torch.tensor(list(itertools.product([0, 1], repeat=L)), dtype=torch.bool)  # (P, L)
    return m.repeat_interleave(B0, 0), x0.repeat(m.shape[0], 1)


@torch.no_grad()
def dense_bound(net, x0, T, alpha, subs=False, mask_shift=0.0):
    """Per-sequence sum_{i=1}^T E_{x_{t_i}} sum_l KL(q(x_{t_{i-1}} | x_{t_i}, x0) || p(x_{t_{i-1}} | x_{t_i})).

    The i = 1 term is -log p(x0 | x_{t_1}) (q is a point mass there). Dense matrices, [from, to] rows.
    """
    B0, L = x0.shape
    m, x0s = _all_patterns(x0)
    n_masked = m.sum(-1).double()  # (P B0,)
    xt = torch.where(m, MASK, x0s)
    pi = _model_probs(net, xt, mask_shift, subs)  # (P B0, L, V); the model does not see t
    total = torch.zeros(B0, dtype=torch.float64)
    eye = torch.eye(V, dtype=torch.float64)
    for i in range(1, T + 1):
        a_t, a_s = alpha(i / T), alpha((i - 1) / T)
        keep = a_t / a_s
        step = keep * eye  # one step s -> t: keep, else MASK; MASK stays
        step[:, MASK] += 1 - keep
        step[MASK] = eye[MASK]
        cum_s = a_s * eye  # 0 -> s
        cum_s[:, MASK] += 1 - a_s
        cum_s[MASK] = eye[MASK]
        prob = (1 - a_t) ** n_masked * a_t ** (L - n_masked)  # (P B0,)
        into_xt = step[:, xt].permute(1, 2, 0)  # (P B0, L, V): p(x_t | x_s = v)
        q = into_xt * cum_s[x0s]  # eq. 3, unnormalized over x_s
        q = q / q.sum(-1, keepdim=True)
        p = into_xt * (pi @ cum_s)  # eq. 4: sum_{x0~} q(x_t | x_s) q(x_s | x0~) pi(x0~)
        p = p / p.sum(-1, keepdim=True)
        kl = torch.where(q > 0, q * (q.log() - p.log()), torch.zeros_like(q)).sum(-1)  # (P B0, L)
        contrib = torch.where(prob > 0, prob * kl.sum(-1), 0.0)
        total += contrib.view(-1, B0).sum(0)
    return total


@torch.no_grad()
def library_bound(method, net, x0):
    """The method's own per-token terms at every grid time, enumerated over masking patterns."""
    T = method.config.num_timesteps
    B0, L = x0.shape
    m, x0s = _all_patterns(x0)
    n_masked = m.sum(-1).double()
    xt = torch.where(m, MASK, x0s)
    logits = net(xt)  # time-agnostic denoiser
    ce = F.cross_entropy(method.subs_logits(logits).flatten(0, 1), x0s.flatten(), reduction="none").view_as(x0s)
    total = torch.zeros(B0, dtype=torch.float64)
    for i in range(1, T + 1):
        t = torch.full((xt.shape[0],), i / T)
        a_t = method.grid_alpha(torch.tensor(i / T, dtype=torch.float64)).item()
        prob = (1 - a_t) ** n_masked * a_t ** (L - n_masked)
        if method.subs:
            per_token = torch.where(m, method.loss_weight(t)[:, None] * ce, 0.0)
        else:
            per_token = method.per_token_without_subs(logits, x0s, xt, t)
        contrib = torch.where(prob > 0, prob * per_token.double().sum(-1), 0.0) / T
        total += contrib.view(-1, B0).sum(0)
    return total


@torch.no_grad()
def exact_mdlm_nelbo(net, x0, n_quad=400, t_min=1e-3):
    """MDLM's continuous NELBO (average over [t_min, 1], log-linear weight 1/t) of a time-agnostic SUBS
    denoiser, by Gauss-Legendre quadrature and enumeration of masking patterns."""
    B0, L = x0.shape
    m, x0s = _all_patterns(x0)
    n_masked = m.sum(-1).double()
    xt = torch.where(m, MASK, x0s)
    logits = net(xt).double()
    logits[..., MASK] = float("-inf")
    ce = -torch.log_softmax(logits, -1).gather(-1, x0s[..., None])[..., 0]
    masked_ce = (ce * m).sum(-1)  # (P B0,)
    nodes, weights = np.polynomial.legendre.leggauss(n_quad)
    total = torch.zeros(B0, dtype=torch.float64)
    for x, w in zip(nodes, weights):
        t = t_min + (1 - t_min) * (x + 1) / 2
        a = 1 - 0.999 * t
        prob = (1 - a) ** n_masked * a ** (L - n_masked)
        total += (w / 2 / t * prob * masked_ce).view(-1, B0).sum(0)
    return total


def mc_estimate(method, net, x0, reps=4000, chunks=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    vals = []
    with torch.no_grad():
        for _ in range(chunks):
            out = method.loss(net, Batch(x0.repeat(reps, 1)), g)
            vals.append(out.nll_sum.item() / out.num_tokens.item())
    return float(np.mean(vals)), float(np.std(vals, ddof=1) / math.sqrt(chunks))


X0 = torch.tensor([[0, 2, 1], [1, 1, 0]])


# ---------------------------------------------------------------------------------------- the D3PM bound


def test_d3pm_bound_matches_dense_matrices():
    """Closed-form KL terms (incl. L_0) equal the dense eq. 3 / eq. 4 computation, without SUBS."""
    net = MaskyNet(3)
    method = d3pm(num_timesteps=5)
    assert not method.subs
    ours = library_bound(method, net, X0)
    ref = dense_bound(net, X0, 5, pinned_alpha)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    # the prior term is zero: x_T is all MASK under the pinned schedule
    assert method.grid_alpha(torch.tensor(1.0, dtype=torch.float64)) == 0
    assert method.grid_alpha(torch.tensor(0.0, dtype=torch.float64)) == 1


def test_d3pm_mc_loss_is_unbiased():
    net = MaskyNet(3)
    method = d3pm(num_timesteps=6)
    exact = dense_bound(net, X0, 6, pinned_alpha).mean().item() / 3
    est, stderr = mc_estimate(method, net, X0)
    assert stderr < 0.02 * exact
    assert abs(est - exact) < 4 * stderr, (est, exact, stderr)


def test_mask_probability_is_charged():
    """Without SUBS the model pays for MASK mass: the bound rises with the MASK logit and exceeds SUBS."""
    net = TinyNet(3)
    T = 8
    subs = dense_bound(net, X0, T, pinned_alpha, subs=True)
    plain = dense_bound(net, X0, T, pinned_alpha)
    leaky = dense_bound(net, X0, T, pinned_alpha, mask_shift=3.0)
    assert torch.all(subs < plain) and torch.all(plain < leaky)
    torch.testing.assert_close(library_bound(d3pm(num_timesteps=T, subs=True), net, X0), subs, rtol=1e-5, atol=1e-6)


def test_d3pm_with_subs_approaches_the_mdlm_nelbo():
    """SUBS imposed: the discrete bound converges to MDLM's continuous NELBO as T grows (exact enumeration)."""
    net = TinyNet(3)
    x0 = torch.randint(0, 3, (4, 3), generator=torch.Generator().manual_seed(5))
    cont = exact_mdlm_nelbo(net, x0).mean().item()
    gaps = []
    for T in (2, 8, 64, 512):
        method = d3pm(num_timesteps=T, subs=True)
        bound = library_bound(method, net, x0)
        if T <= 8:  # and the library agrees with the dense reference
            torch.testing.assert_close(bound, dense_bound(net, x0, T, pinned_alpha, subs=True), rtol=1e-5, atol=1e-6)
        gaps.append(bound.mean().item() - cont)
    assert all(g > 0 for g in gaps[:3]), gaps  # a coarser grid is a looser bound
    assert all(abs(b) < abs(a) for a, b in itertools.pairwise(gaps)), gaps
    assert abs(gaps[-1]) < 0.01 * cont, gaps


def test_defaults_and_config():
    m = d3pm()
    assert m.config.num_timesteps == 1000 and m.num_timesteps == 1000 and m.subs is False
    assert d3pm(subs=True).subs is True and mdlm().subs is True and mdlm(subs=False).subs is False
    assert isinstance(build_method(MethodConfig(name="d3pm"), TOK), D3PM)
    with pytest.raises(ConfigError, match="method.subs"):
        load_run_config(None, ["method.subs=maybe"])
    assert load_run_config(None, ["method.name=d3pm", "method.subs=true"]).method.subs is True


# ---------------------------------------------------------------------------------------- MDLM without SUBS


def test_mdlm_default_path_is_unchanged():
    net = TinyNet(6)
    x0 = torch.randint(0, 3, (32, 6), generator=torch.Generator().manual_seed(0))
    for T in (0, 10):
        a = mdlm(num_timesteps=T).loss(net, Batch(x0), torch.Generator().manual_seed(1))
        b = mdlm(num_timesteps=T, subs=True).loss(net, Batch(x0), torch.Generator().manual_seed(1))
        assert torch.equal(a.loss, b.loss) and torch.equal(a.nll_sum, b.nll_sum)


def test_mdlm_without_subs_reduces_to_subs_when_mask_has_no_mass():
    """With an oracle that gives MASK zero probability the two parameterizations give the same loss."""
    marginals = torch.tensor([[0.2, 0.5, 0.3]] * 5)
    oracle = ProductOracle(marginals, V)
    x0 = torch.multinomial(marginals, 512, replacement=True, generator=torch.Generator().manual_seed(0)).T
    for T in (0, 16):
        a = mdlm(num_timesteps=T).loss(oracle, Batch(x0), torch.Generator().manual_seed(2))
        b = mdlm(num_timesteps=T, subs=False).loss(oracle, Batch(x0), torch.Generator().manual_seed(2))
        torch.testing.assert_close(a.nll_sum, b.nll_sum, rtol=1e-5, atol=1e-5)


def test_mdlm_without_subs_discrete_matches_dense_matrices():
    net = MaskyNet(3)
    method = mdlm(num_timesteps=4, subs=False)
    torch.testing.assert_close(library_bound(method, net, X0), dense_bound(net, X0, 4, loglinear_alpha),
                               rtol=1e-5, atol=1e-6)
    exact = dense_bound(net, X0, 4, loglinear_alpha).mean().item() / 3
    est, stderr = mc_estimate(method, net, X0, seed=3)
    assert abs(est - exact) < 4 * stderr, (est, exact, stderr)


def test_mdlm_without_subs_continuous_is_the_limit_of_discrete():
    """The continuous-time no-SUBS integrand (a first-order expansion of the KL) is the T -> inf limit."""
    net = MaskyNet(3)
    L = 3
    cont_method = mdlm(subs=False)
    nodes, weights = np.polynomial.legendre.leggauss(200)
    t_min = cont_method.config.t_min
    m, x0s = _all_patterns(X0)
    xt = torch.where(m, MASK, x0s)
    cont = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        logits = net(xt)
        for x, w in zip(nodes, weights):
            t = t_min + (1 - t_min) * (x + 1) / 2
            a = loglinear_alpha(t)
            prob = (1 - a) ** m.sum(-1).double() * a ** (L - m.sum(-1).double())
            per_token = cont_method.per_token_without_subs(logits, x0s, xt, torch.full((xt.shape[0],), t))
            cont += (w / 2 * prob * per_token.double().sum(-1)).view(-1, 2).sum(0)
        fine = library_bound(mdlm(num_timesteps=512, subs=False), net, X0)
    # [t_min, 1] averaged vs the whole [0, 1]: they differ by O(t_min)
    torch.testing.assert_close(cont, fine, rtol=5e-3, atol=0)
    est, stderr = mc_estimate(cont_method, net, X0, seed=4)
    assert abs(est - cont.mean().item() / L) < 4 * stderr, (est, cont, stderr)


# ---------------------------------------------------------------------------------------- sampling


class LeakyOracle(ProductOracle):
    """The exact marginals, plus probability `leak` on MASK (what a no-SUBS model may do)."""

    def __init__(self, marginals, leak):
        super().__init__(marginals, V)
        self.table[:, MASK] = math.log(leak / (1 - leak))


def _check_marginals(x, marginals):
    assert not (x == MASK).any()
    N = x.shape[0]
    for pos in range(x.shape[1]):
        counts = torch.bincount(x[:, pos], minlength=V).double()
        assert counts[3:].sum() == 0
        expected = marginals[pos].double() / marginals[pos].double().sum() * N
        assert chisquare(counts[:3].numpy(), expected.numpy()).pvalue > 1e-3, (pos, counts)


@pytest.mark.parametrize("leak", [0.0, 0.4])
@pytest.mark.parametrize("steps", [5, 40])
def test_d3pm_ancestral_sampler_reproduces_marginals(leak, steps):
    L, N = 4, 4000
    marginals = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.34, 0.33, 0.33], [0.05, 0.15, 0.8]])
    oracle = LeakyOracle(marginals, leak) if leak else ProductOracle(marginals, V)
    sampler = D3PMAncestralSampler(d3pm(num_timesteps=40), oracle, steps=steps)
    _check_marginals(sampler.generate(N, L, torch.Generator().manual_seed(steps)).tokens, marginals)


def test_leaked_mask_slows_revealing():
    """Eq. 4: a MASK is revealed with probability (alpha_s - alpha_t)(1 - pi_M) / ((1 - alpha_t) + alpha_t pi_M)."""
    method = d3pm(num_timesteps=10)
    B, L = 4000, 8
    xt = torch.full((B, L), MASK)
    probs = torch.zeros(B, L, V, dtype=torch.float64)
    probs[..., 1], probs[..., MASK] = 0.7, 0.3
    t, s = torch.full((B,), 0.6, dtype=torch.float64), torch.full((B,), 0.5, dtype=torch.float64)
    xs = method.reverse_step(probs, xt, t, s, torch.Generator().manual_seed(0))
    a_t, a_s = pinned_alpha(0.6), pinned_alpha(0.5)
    expected = (a_s - a_t) * 0.7 / ((1 - a_t) + a_t * 0.3)
    revealed = (xs != MASK).double().mean().item()
    assert abs(revealed - expected) < 4 * math.sqrt(expected * (1 - expected) / (B * L))
    assert torch.all(xs[xs != MASK] == 1)


@pytest.mark.parametrize("sampler_cls", [MDLMAncestralSampler, MDLMCachedSampler])
def test_mdlm_without_subs_samplers(sampler_cls):
    L, N = 4, 3000
    marginals = torch.tensor([[0.2, 0.5, 0.3], [0.6, 0.1, 0.3], [0.34, 0.33, 0.33], [0.05, 0.15, 0.8]])
    sampler = sampler_cls(mdlm(subs=False), LeakyOracle(marginals, 0.3), steps=16)
    _check_marginals(sampler.generate(N, L, torch.Generator().manual_seed(0)).tokens, marginals)


def test_default_sampler_and_mismatch():
    net = TinyNet(4)
    assert isinstance(build_sampler(None, d3pm(), net, steps=4), D3PMAncestralSampler)
    with pytest.raises(SamplerError, match="cannot drive"):
        build_sampler("d3pm", mdlm(), net, steps=4)


# ---------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("overrides", [{"method.name": "d3pm"}, {"method.name": "mdlm", "method.subs": False}])
def test_three_training_steps_then_eval_and_sample(tmp_path, overrides):
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate
    from tests.test_sedd import train_run
    from tests.test_training import tiny_config

    cfg = tiny_config(**overrides, **{"train.max_steps": 3, "train.val_every": 3, "train.checkpoint_every": 3,
                                      "train.log_every": 1})
    result = train_run(cfg, tmp_path / "run")
    model = load_checkpoint(result.checkpoint)
    assert model.method.name == overrides["method.name"] and model.method.subs is False
    gen = generate(model, SampleConfig(steps=8, num_samples=2, batch_size=2, seq_len=16, seed=0))
    assert all(len(t) == 16 and not (t == model.tokenizer.mask_id).any() for t in gen.tokens)
