"""SEDD: transition graphs, score entropy, the ELBO, and the Euler / analytic samplers.

Brute-force references are written with dense matrices (Q and torch.linalg.matrix_exp), never with the closed
forms under test.
"""

import itertools
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from torch import nn

from seqdiff.config import ConfigError, MethodConfig, load_run_config
from seqdiff.methods import SEDD, Batch
from seqdiff.methods.graphs import entropy_constant
from seqdiff.samplers import SamplerError, SEDDAnalyticSampler, SEDDEulerSampler, build_sampler
from seqdiff.tokenizers import CharTokenizer
from tests.oracles import JointScoreOracle, ProductScoreOracle
from tests.test_mdlm import TinyNet

TOK = CharTokenizer(alphabet="abc", normalize="none")  # 3 symbols + BOS EOS PAD MASK -> V = 7
V, MASK, PAD = TOK.vocab_size, TOK.mask_id, TOK.pad_id
GRAPHS = ["absorbing", "uniform"]


def sedd(graph="absorbing", **kw):
    return SEDD(MethodConfig(name="sedd", graph=graph, **kw), TOK)


def dirichlet(concentration, shape, seed):
    """Seeded Dirichlet draws that leave the global RNG alone."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.distributions.Dirichlet(concentration).sample(shape)


class TimedNet(nn.Module):
    """A deterministic, noise-level-dependent function of x_t: an imperfect score model."""

    def __init__(self, seq_len: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Parameter(torch.randn(V, 8, generator=g))
        self.pos = nn.Parameter(torch.randn(seq_len, 8, generator=g))
        self.time = nn.Parameter(torch.randn(8, generator=g))
        self.mix = nn.Parameter(torch.randn(8, 8, generator=g))
        self.out = nn.Parameter(torch.randn(8, V, generator=g) * 0.5)
        self.config = SimpleNamespace(time_conditioning=True, max_seq_len=seq_len)

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
        h = self.emb[input_ids] + self.pos[: input_ids.shape[1]]  # (B, L, 8)
        h = h + torch.tanh(noise_level.float())[:, None, None] * self.time
        h = h + torch.tanh(h.mean(1, keepdim=True) @ self.mix)
        return h @ self.out  # (B, L, V)


# ---------------------------------------------------------------------------------------- dense references


def dense_score_entropy(method, log_score, xt, x0, sigma):
    """sum_{y != x_t} Q[x_t, y] (s_y - r_y log s_y + K(r_y)), r_y = P[y, x0] / P[x_t, x0], P = matrix_exp."""
    Q = method.graph.rate_matrix()
    levels, which = torch.unique(sigma.double(), return_inverse=True)
    P = torch.linalg.matrix_exp(levels[:, None, None] * Q)[which]  # (B, V, V)
    B, L = xt.shape
    rate = Q[xt]  # (B, L, V): Q[x_t, y]
    rate = rate.scatter(-1, xt[..., None], 0.0)
    Pt = P.transpose(1, 2)  # [b, k, y] = P[b, y, k]
    col = Pt[torch.arange(B)[:, None], x0]  # (B, L, V): P[y, x0]
    r = col / col.gather(-1, xt[..., None])
    terms = log_score.exp() - torch.where(r > 0, r * log_score, 0.0) + entropy_constant(r)
    return torch.where(rate > 0, rate * terms, torch.zeros_like(terms)).sum(-1)


def leggauss_average(n, t_min):
    nodes, weights = np.polynomial.legendre.leggauss(n)
    t = t_min + (1 - t_min) * (torch.from_numpy(nodes) + 1) / 2
    return t, torch.from_numpy(weights) / 2  # weights of the average over [t_min, 1]


@torch.no_grad()
def exact_bound(method, model, x0, n_quad=300):
    """Per-sequence bound by quadrature over t and enumeration of every x_t in V^L (dense matrices only;
    the log-linear schedule written out)."""
    B0, L = x0.shape
    combos = torch.tensor(list(itertools.product(range(V), repeat=L)))  # (C, L)
    C = combos.shape[0]
    Q = method.graph.rate_matrix()
    total = torch.zeros(B0, dtype=torch.float64)
    t_nodes, w = leggauss_average(n_quad, method.config.t_min)
    xt = combos.repeat(B0, 1)  # (B0 C, L)
    x0_rep = x0.repeat_interleave(C, 0)
    for t, wi in zip(t_nodes, w):
        t = t.reshape(1)
        sigma = -torch.log(1 - 0.999 * t)  # log-linear noise, written out: sigma' = 0.999 / (1 - 0.999 t)
        P = torch.linalg.matrix_exp(sigma * Q)
        prob = P[xt, x0_rep].prod(-1)  # (B0 C,) q(x_t | x_0)
        keep = prob > 0
        sig = sigma.expand(int(keep.sum()))
        log_score = model(xt[keep], noise_level=sig.float()).double() + method.score_offset(sig)[:, None, None]
        se = dense_score_entropy(method, log_score, xt[keep], x0_rep[keep], sig).sum(-1)
        contrib = torch.zeros(B0 * C, dtype=torch.float64)
        contrib[keep] = prob[keep] * se
        total += wi * 0.999 / (1 - 0.999 * t) * contrib.view(B0, C).sum(-1)
    return total + L * method.graph.prior_kl(-torch.log(torch.tensor([1e-3], dtype=torch.float64)))


def mc_estimate(method, model, x0, reps, chunks, seed=0):
    """Mean per-token loss over `chunks` independent draws, and its standard error."""
    g = torch.Generator().manual_seed(seed)
    vals = []
    with torch.no_grad():
        for _ in range(chunks):
            out = method.loss(model, Batch(x0.repeat(reps, 1)), g)
            vals.append(out.nll_sum.item() / out.num_tokens.item())
    vals = torch.tensor(vals, dtype=torch.float64)
    return vals.mean().item(), vals.std().item() / math.sqrt(chunks)


# ---------------------------------------------------------------------------------------- graphs


@pytest.mark.parametrize("graph", GRAPHS)
def test_rate_matrices_are_proper_and_transitions_are_matrix_exponentials(graph):
    g = sedd(graph).graph
    Q = g.rate_matrix()
    torch.testing.assert_close(Q.sum(0), torch.zeros(V, dtype=torch.float64), atol=1e-12, rtol=0)
    off = Q - torch.diag(torch.diag(Q))
    assert (off >= 0).all() and (torch.diag(Q) <= 0).all()
    assert (off > 0).any()
    for sigma in (1e-3, 0.3, 1.0, 4.0, 12.0):
        P = g.transition_matrix(sigma)
        torch.testing.assert_close(P, torch.linalg.matrix_exp(sigma * Q), atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(P.sum(0), torch.ones(V, dtype=torch.float64), atol=1e-12, rtol=0)
    for sigma in (0.05, 0.5, 2.0):  # the prior term: KL(exp(sigma Q)[:, x0] || base)
        col = torch.linalg.matrix_exp(sigma * Q)[:, 1]
        if graph == "uniform":
            ref = (col * (col * g.num_states).log()).nansum()
            torch.testing.assert_close(g.prior_kl(torch.tensor([sigma], dtype=torch.float64)), ref.reshape(1))
        else:  # convention (as MDLM): the mass alpha(1) left on x0 counts as masked
            assert g.prior_kl(torch.tensor([sigma], dtype=torch.float64)).item() == 0
    P = g.transition_matrix(1.0)
    if graph == "absorbing":  # everything flows into MASK, MASK stays
        assert P[MASK, MASK] == 1 and torch.allclose(P[MASK, :MASK], torch.full((MASK,), 1 - math.exp(-1.0),
                                                                              dtype=torch.float64))
    else:  # MASK and PAD are inert; the 5 other ids mix uniformly
        for inert in (MASK, PAD):
            assert P[inert, inert] == 1 and P[:, inert].sum() == 1 and P[inert].sum() == 1
        assert g.num_states == 5


@pytest.mark.parametrize("graph", GRAPHS)
def test_forward_samples_follow_the_transition_matrix(graph):
    method = sedd(graph)
    x0 = torch.full((60000, 1), 1)
    sigma = torch.full((60000,), 0.7, dtype=torch.float64)
    xt = method.graph.sample_forward(x0, sigma, torch.ones_like(x0, dtype=torch.bool), torch.Generator().manual_seed(0))
    counts = torch.bincount(xt[:, 0], minlength=V).double()
    expected = method.graph.transition_matrix(0.7)[:, 1] * 60000
    keep = expected > 0
    assert counts[~keep].sum() == 0
    assert chisquare(counts[keep].numpy(), expected[keep].numpy()).pvalue > 1e-3
    # positions that are not noisable (padding) keep their token
    xt = method.graph.sample_forward(x0, sigma, torch.zeros_like(x0, dtype=torch.bool), torch.Generator())
    assert torch.equal(xt, x0)


# ---------------------------------------------------------------------------------------- score entropy


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("scale", [True, False])
def test_score_entropy_closed_form_matches_dense_and_is_nonnegative(graph, scale):
    method = sedd(graph, scale_by_sigma=scale)
    g = torch.Generator().manual_seed(1)
    B, L = 64, 6
    x0 = torch.randint(0, 5, (B, L), generator=g)  # data ids, BOS / EOS included
    sigma = torch.exp(torch.empty(B, dtype=torch.float64).uniform_(-6, 2.5, generator=g))
    xt = method.graph.sample_forward(x0, sigma, torch.ones_like(x0, dtype=torch.bool), g)
    logits = 2 * torch.randn(B, L, V, generator=g)
    offset = method.score_offset(sigma)
    se = method.graph.score_entropy(logits, offset, xt, x0, sigma)
    ref = dense_score_entropy(method, logits.double() + offset[:, None, None], xt, x0, sigma)
    torch.testing.assert_close(se, ref, rtol=1e-5, atol=1e-6)
    assert (se >= 0).all() and (se > 0).any()
    if graph == "absorbing":
        assert torch.all(se[xt != MASK] == 0)


@pytest.mark.parametrize("graph", GRAPHS)
def test_score_entropy_is_zero_at_the_true_ratios(graph):
    method = sedd(graph)
    B, L = 32, 5
    g = torch.Generator().manual_seed(2)
    x0 = torch.randint(0, 3, (B, L), generator=g)
    sigma = torch.exp(torch.empty(B, dtype=torch.float64).uniform_(-5, 2, generator=g))
    xt = method.graph.sample_forward(x0, sigma, torch.ones_like(x0, dtype=torch.bool), g)
    P = torch.linalg.matrix_exp(sigma[:, None, None] * method.graph.rate_matrix())
    col = P.transpose(1, 2)[torch.arange(B)[:, None], x0]  # (B, L, V) P[y, x0]
    log_ratio = (col / col.gather(-1, xt[..., None])).log()  # -inf where P[y, x0] = 0
    offset = method.score_offset(sigma)
    logits = (log_ratio - offset[:, None, None]).clamp(min=-60).float()
    se = method.graph.score_entropy(logits, offset, xt, x0, sigma)
    assert se.abs().max() < 1e-4, se.abs().max()
    # any change to a rated entry costs
    noisy = logits + 0.3 * torch.randn(logits.shape, generator=g)
    assert (method.graph.score_entropy(noisy, offset, xt, x0, sigma).sum() > 1e-2)


@pytest.mark.parametrize("graph", GRAPHS)
def test_expected_score_entropy_is_minimized_by_the_marginal_score(graph):
    """E_{x0 | x_t} of the denoising score entropy has zero gradient at s = p_t(y) / p_t(x_t) (one position)."""
    method = sedd(graph)
    pi = torch.tensor([[0.5, 0.3, 0.2]])
    oracle = ProductScoreOracle(pi, method)
    sigma = torch.tensor([0.8], dtype=torch.float64)
    P = method.graph.transition_matrix(0.8)
    states = [MASK] if graph == "absorbing" else list(range(5))
    for x in states:
        xt = torch.tensor([[x]])
        post = P[x, :3] * pi[0].double()
        post = post / post.sum()  # p(x0 | x_t)
        logits = oracle(xt, noise_level=sigma.float()).detach().clamp(min=-60).requires_grad_(True)
        loss = sum(post[k] * method.graph.score_entropy(logits, method.score_offset(sigma), xt,
                                                         torch.tensor([[k]]), sigma).sum() for k in range(3))
        (grad,) = torch.autograd.grad(loss, logits)
        assert grad.abs().max() < 1e-5, (x, grad)
        moved = logits.detach() + 0.2 * torch.randn(1, 1, V, generator=torch.Generator().manual_seed(x))
        worse = sum(post[k] * method.graph.score_entropy(moved, method.score_offset(sigma), xt, torch.tensor([[k]]),
                                                          sigma).sum() for k in range(3))
        assert worse > loss


@pytest.mark.parametrize("graph", GRAPHS)
def test_reverse_step_closed_forms_match_dense_matrices(graph):
    """Tweedie: clip(exp(-d Q) s, 0) * exp(d Q)[x_t, :]; Euler: 1[y = x_t] + c s_y Q[x_t, y], diagonal clipped."""
    method = sedd(graph)
    g = torch.Generator().manual_seed(3)
    B, L = 6, 5
    xt = torch.randint(0, V, (B, L), generator=g)
    xt[:, 0] = MASK if graph == "absorbing" else 0
    if graph == "uniform":
        xt[xt == MASK] = 1  # MASK is no state of the uniform graph (PAD is kept: it must stay put)
    log_score = torch.randn(B, L, V, generator=g, dtype=torch.float64) - 3.0  # small: MASK keeps some mass
    Q = method.graph.rate_matrix()
    sigma_t = torch.full((B,), 1.3, dtype=torch.float64)
    sigma_s = torch.full((B,), 0.4, dtype=torch.float64)
    d = 0.9
    back, fwd = torch.linalg.matrix_exp(-d * Q), torch.linalg.matrix_exp(d * Q)
    s = log_score.exp().scatter(-1, xt[..., None], 1.0)  # s_{x_t} = 1
    tweedie = (s @ back.T).clamp(min=0) * fwd[xt]  # [exp(-dQ) s]_y * exp(dQ)[x_t, y]
    rate = Q[xt].scatter(-1, xt[..., None], 0.0)
    euler = 0.05 * s * rate
    euler = euler.scatter(-1, xt[..., None], (1 - euler.sum(-1, keepdim=True)).clamp(min=0))
    for ours, ref in ((method.graph.tweedie_probs(log_score, xt, sigma_t, sigma_s), tweedie),
                      (method.graph.euler_probs(log_score, xt, torch.full((B,), 0.05, dtype=torch.float64)), euler)):
        torch.testing.assert_close(ours / ours.sum(-1, keepdim=True), ref / ref.sum(-1, keepdim=True))
    final = method.graph.tweedie_probs(log_score, xt, sigma_t, sigma_s, final=True)
    if graph == "absorbing":  # the last step leaves no MASK
        assert torch.all(final[..., 0, MASK] == 0) and torch.all(final[..., 0, :MASK] > 0)
    else:
        torch.testing.assert_close(final, method.graph.tweedie_probs(log_score, xt, sigma_t, sigma_s))


# ---------------------------------------------------------------------------------------- the loss / ELBO


@pytest.mark.parametrize("graph, scale", [("absorbing", True), ("absorbing", False), ("uniform", False)])
def test_mc_loss_matches_brute_force_expectation(graph, scale):
    L = 3
    method = sedd(graph, scale_by_sigma=scale)
    net = TimedNet(L)
    x0 = torch.tensor([[0, 2, 1], [1, 1, 0]])
    exact = exact_bound(method, net, x0).mean().item() / L
    est, stderr = mc_estimate(method, net, x0, reps=2000, chunks=16)
    assert stderr < 0.02 * exact
    assert abs(est - exact) < 4 * stderr, (est, exact, stderr)


@pytest.mark.parametrize("graph", GRAPHS)
def test_oracle_elbo_on_product_data_equals_the_entropy(graph):
    L, N = 4, 32768
    g = torch.Generator().manual_seed(0)
    marginals = dirichlet(torch.ones(3), (L,), seed=L)
    method = sedd(graph)
    oracle = ProductScoreOracle(marginals, method)
    H = -(marginals * marginals.log()).sum().item() / L  # nats per token
    # exact bound of the oracle, one position at a time (positions are independent), x0 ~ pi_l
    exact = 0.0
    for pos in range(L):
        one = ProductScoreOracle(marginals[pos : pos + 1], method)
        x0 = torch.arange(3)[:, None]
        exact += (exact_bound(method, one, x0, n_quad=200) * marginals[pos].double()).sum().item() / L
    x0 = torch.multinomial(marginals, N, replacement=True, generator=g).T  # (N, L)
    vals = []
    with torch.no_grad():
        for chunk in x0.split(2048):
            out = method.loss(oracle, Batch(chunk), g)
            vals.append(out.nll_sum.item() / out.num_tokens.item())
    est, stderr = float(np.mean(vals)), float(np.std(vals, ddof=1) / math.sqrt(len(vals)))
    assert stderr < 0.02 * H
    assert abs(est - exact) < 4 * stderr + 1e-4, (est, exact, stderr)
    # exact scores: the bound is the entropy up to the t_min / alpha(1) = 1e-3 truncations
    assert abs(exact - H) < 0.005 * H, (exact, H)
    if graph == "absorbing":  # the same closed form as MDLM's NELBO with the exact denoiser
        s = method.schedule
        closed = H * (s.alpha(torch.tensor(1e-3)) - s.alpha(torch.tensor(1.0))).item() / (1 - 1e-3)
        assert abs(exact - closed) < 1e-6 * H


def test_scale_by_sigma_starts_at_the_right_total_rate():
    """Zero outputs give sum_{y != MASK} s_y = 1 / expm1(sigma), the true total at a MASK (absorbing graph)."""
    method = sedd("absorbing")
    sigma = torch.tensor([0.01, 0.5, 3.0, 9.0], dtype=torch.float64)
    total = (method.score_offset(sigma) + math.log(V - 1)).exp()  # V - 1 equal scores
    torch.testing.assert_close(total, 1 / torch.expm1(sigma))
    assert torch.all(sedd("absorbing", scale_by_sigma=False).score_offset(sigma) == 0)
    assert sedd("uniform").scale_by_sigma is False  # absorbing only


def test_wrong_scores_raise_the_bound():
    L = 4
    marginals = dirichlet(torch.ones(3), (L,), seed=L)
    method = sedd("absorbing")
    x0 = torch.multinomial(marginals, 4096, replacement=True, generator=torch.Generator().manual_seed(0)).T
    good = method.loss(ProductScoreOracle(marginals, method), Batch(x0), torch.Generator().manual_seed(1))
    bad = method.loss(ProductScoreOracle(marginals.flip(-1), method), Batch(x0), torch.Generator().manual_seed(1))
    assert bad.nll_sum > 1.1 * good.nll_sum


def test_padding_is_neither_noised_nor_scored_and_gradients_flow():
    method = sedd("uniform")
    net = TimedNet(8)
    x0 = torch.randint(0, 3, (16, 8))
    x0[:, 6:] = PAD
    out = method.loss(net, Batch(x0), torch.Generator().manual_seed(0))
    assert out.num_tokens.item() == 16 * 6 and out.nll_sum.dtype == torch.float64
    assert torch.isfinite(out.loss) and out.loss.dtype == torch.float32
    out.loss.backward()
    assert net.out.grad is not None and torch.isfinite(net.out.grad).all() and net.out.grad.abs().sum() > 0


def test_time_conditioning_and_config_are_checked():
    net = TinyNet(8)  # time_conditioning=False
    with pytest.raises(ConfigError, match="time_conditioning"):
        sedd().loss(net, Batch(torch.zeros(2, 8, dtype=torch.long)))
    with pytest.raises(SamplerError, match="time_conditioning"):
        SEDDAnalyticSampler(sedd(), net, steps=4)
    with pytest.raises(ConfigError, match="num_timesteps"):
        sedd(num_timesteps=10)
    with pytest.raises(ConfigError, match="method.graph"):
        load_run_config(None, ["method.graph=ring"])
    with pytest.raises(ConfigError, match="method.graph"):
        MethodConfig(graph="ring")
    with pytest.raises(SamplerError, match="temperature"):
        SEDDEulerSampler(sedd(), TimedNet(8), steps=4, temperature=0.5)
    with pytest.raises(SamplerError, match="cannot drive"):
        build_sampler("cached", sedd(), TimedNet(8), steps=4)


# ---------------------------------------------------------------------------------------- samplers


def _chi_square_marginals(x, marginals):
    N = x.shape[0]
    assert (x < 3).all(), "only data symbols may come out"
    for pos in range(x.shape[1]):
        counts = torch.bincount(x[:, pos], minlength=3)[:3].double()
        expected = marginals[pos].double() / marginals[pos].double().sum() * N
        p = chisquare(counts.numpy(), expected.numpy()).pvalue
        if p <= 1e-3:
            return False
    return True


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("steps", [1, 8])
def test_analytic_sampler_with_oracle_scores_reproduces_marginals(graph, steps):
    L, N = 4, 4000
    marginals = dirichlet(torch.ones(3), (L,), seed=L)
    method = sedd(graph)
    sampler = SEDDAnalyticSampler(method, ProductScoreOracle(marginals, method), steps=steps)
    out = sampler.generate(N, L, torch.Generator().manual_seed(steps))
    assert out.num_denoiser_calls == steps
    assert _chi_square_marginals(out.tokens, marginals)


@pytest.mark.parametrize("graph", GRAPHS)
def test_euler_sampler_with_oracle_scores_reproduces_marginals(graph):
    L, N = 4, 3000
    marginals = dirichlet(torch.ones(3), (L,), seed=L)
    method = sedd(graph)
    sampler = SEDDEulerSampler(method, ProductScoreOracle(marginals, method), steps=16)
    assert _chi_square_marginals(sampler.generate(N, L, torch.Generator().manual_seed(0)).tokens, marginals)


def test_marginal_check_can_fail():
    """The chi-square checks above have power: scores of other marginals are detected."""
    L, N = 4, 4000
    marginals = torch.tensor([[0.6, 0.3, 0.1]] * L)
    method = sedd("absorbing")
    sampler = SEDDAnalyticSampler(method, ProductScoreOracle(marginals.flip(-1), method), steps=4)
    assert not _chi_square_marginals(sampler.generate(N, L, torch.Generator().manual_seed(0)).tokens, marginals)


def _all_equal_joint(K=3, L=3):
    joint = torch.zeros(K**L)
    for v in range(K):
        joint[v * (K * K + K + 1)] = 1 / K
    return joint


@pytest.mark.parametrize("sampler_cls", [SEDDAnalyticSampler, SEDDEulerSampler])
def test_many_steps_reproduce_a_correlated_joint(sampler_cls):
    """With one reveal per step the exact score gives the joint; a single step cannot (the check can fail)."""
    L, K, N = 3, 3, 600
    method = sedd("absorbing")
    oracle = JointScoreOracle(_all_equal_joint(K, L), L, K, method)
    x = sampler_cls(method, oracle, steps=96).generate(N, L, torch.Generator().manual_seed(0)).tokens
    assert (x == x[:, :1]).all(-1).double().mean() > 0.97
    x = sampler_cls(method, oracle, steps=1).generate(N, L, torch.Generator().manual_seed(0)).tokens
    assert (x == x[:, :1]).all(-1).double().mean() < 0.5


def test_analytic_sampler_reproduces_a_random_joint():
    L, K, N = 3, 3, 2000
    joint = dirichlet(torch.full((K**L,), 0.7), (), seed=0)
    method = sedd("absorbing")
    x = SEDDAnalyticSampler(method, JointScoreOracle(joint, L, K, method), steps=48).generate(
        N, L, torch.Generator().manual_seed(0)).tokens
    counts = torch.bincount((x * torch.tensor([K * K, K, 1])).sum(-1), minlength=K**L).double()
    expected = joint.double() * N
    keep = expected > 5
    expected = expected[keep] * counts[keep].sum() / expected[keep].sum()
    assert chisquare(counts[keep].numpy(), expected.numpy()).pvalue > 1e-3


@pytest.mark.parametrize("graph", GRAPHS)
@pytest.mark.parametrize("sampler_cls", [SEDDAnalyticSampler, SEDDEulerSampler])
def test_given_tokens_are_never_changed(graph, sampler_cls):
    B, L = 8, 12
    method = sedd(graph)
    given = torch.full((B, L), -1)
    given[:, :3] = torch.randint(0, 3, (B, 3))  # a prefix
    given[:, 7] = 2  # and arbitrary positions
    given[::2, 10] = 1
    given[1, 11] = PAD  # even an id outside the uniform graph's states
    sampler = sampler_cls(method, TimedNet(L), steps=6)
    x = sampler.generate(B, L, torch.Generator().manual_seed(0), given=given).tokens
    fixed = given >= 0
    assert torch.equal(x[fixed], given[fixed])
    assert not (x == MASK).any()
    # a (L,) prefix broadcasts over the batch; bad shapes and ids are refused
    x = sampler.generate(B, L, torch.Generator().manual_seed(1), given=given[0]).tokens
    assert torch.equal(x[:, fixed[0]], given[0, fixed[0]].expand(B, -1))
    with pytest.raises(SamplerError, match="shape"):
        sampler.generate(B, L, given=given[:, :5])
    with pytest.raises(SamplerError, match="outside"):
        sampler.generate(B, L, given=torch.full((L,), V))


def test_conditioning_is_seen_by_the_score_model():
    """Infilling with the exact score of "all tokens equal": a given token determines all the others."""
    L, K, N = 3, 3, 300
    method = sedd("absorbing")
    oracle = JointScoreOracle(_all_equal_joint(K, L), L, K, method)
    for pos, tok in ((0, 2), (2, 1)):
        given = torch.full((L,), -1)
        given[pos] = tok
        x = SEDDAnalyticSampler(method, oracle, steps=8).generate(N, L, torch.Generator().manual_seed(0),
                                                                  given=given).tokens
        assert (x == tok).all()


def test_same_seed_same_samples():
    method = sedd("uniform")
    s = SEDDAnalyticSampler(method, TimedNet(10), steps=5)
    a = s.generate(4, 10, torch.Generator().manual_seed(3)).tokens
    b = s.generate(4, 10, torch.Generator().manual_seed(3)).tokens
    c = s.generate(4, 10, torch.Generator().manual_seed(4)).tokens
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_default_sampler_is_analytic():
    assert isinstance(build_sampler(None, sedd(), TimedNet(4), steps=2), SEDDAnalyticSampler)


@pytest.mark.parametrize("sampler", ["analytic", "euler"])
@pytest.mark.parametrize("graph", GRAPHS)
def test_samples_hold_no_special_token_they_have_no_place_for(graph, sampler):
    """As for MDLM (tests/test_generation.py): a score model that favours BOS / EOS / PAD never lands on PAD,
    nor inside an infill on BOS / EOS, and the restriction ends with the generation."""
    from seqdiff.checkpoint import LoadedModel
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate, given_from_infill

    class SpecialNet(TimedNet):
        def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
            logits = super().forward(input_ids, noise_level)
            specials = torch.tensor([TOK.bos_id, TOK.eos_id, TOK.pad_id])
            return logits.index_add(-1, specials, torch.full((*logits.shape[:-1], 3), 3.0))

    method, L = sedd(graph), 12
    model = LoadedModel(backbone=SpecialNet(L), method=method, tokenizer=TOK, model_config=None, method_config=None,
                        data_config=None, seq_len=L, step=0, path=None, ema=False)
    cfg = SampleConfig(sampler=sampler, steps=8, num_samples=8, batch_size=8, seed=0)
    assert not (torch.stack(generate(model, cfg).tokens) == PAD).any()
    template = "ab___cab__ca"
    out = generate(model, cfg, given=given_from_infill(TOK, template))
    held = torch.stack(out.tokens)
    assert not torch.isin(held, torch.tensor([TOK.bos_id, TOK.eos_id, PAD, MASK])).any()
    assert all(len(t) == L for t in out.texts) and method.never_sampled == ()


# ---------------------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("graph", GRAPHS)
def test_three_training_steps_then_eval_and_sample(tmp_path, graph):
    from seqdiff.checkpoint import load_checkpoint
    from seqdiff.config import SampleConfig
    from seqdiff.evaluation.generate import generate
    from tests.test_training import tiny_config

    cfg = tiny_config(**{"method.name": "sedd", "method.graph": graph, "model.time_conditioning": True,
                         "train.max_steps": 3, "train.val_every": 3, "train.checkpoint_every": 3,
                         "train.log_every": 1})
    result = train_run(cfg, tmp_path / "run")
    model = load_checkpoint(result.checkpoint)
    assert model.method.name == "sedd" and model.method.graph.name == graph
    gen = generate(model, SampleConfig(steps=4, num_samples=2, batch_size=2, seq_len=16, seed=0))
    assert gen.sampler == "analytic" and len(gen.texts) == 2 and all(len(t) == 16 for t in gen.tokens)
    assert not any((t == model.tokenizer.mask_id).any() for t in gen.tokens)


def train_run(cfg, run_dir):
    import pandas as pd

    from seqdiff.training.run import train

    result = train(cfg, run_dir)
    assert result.trainer.global_step == 3
    df = pd.read_csv(run_dir / "logs" / "metrics.csv")
    assert np.isfinite(df["train/loss"].dropna()).all() and df["val/nll"].notna().any()
    return result
