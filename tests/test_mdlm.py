import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from seqdiff.config import MethodConfig
from seqdiff.methods import MDLM, Batch
from seqdiff.tokenizers import CharTokenizer
from tests.oracles import ProductOracle

TOK = CharTokenizer(alphabet="abc", normalize="none")  # 3 symbols + BOS EOS PAD MASK -> V = 7
V, MASK = TOK.vocab_size, TOK.mask_id


class TinyNet(nn.Module):
    """A deterministic function of x_t (position-aware), to act as an imperfect denoiser."""

    def __init__(self, seq_len: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Parameter(torch.randn(V, 8, generator=g))
        self.pos = nn.Parameter(torch.randn(seq_len, 8, generator=g))
        self.mix = nn.Parameter(torch.randn(8, 8, generator=g))
        self.out = nn.Parameter(torch.randn(8, V, generator=g))
        self.config = SimpleNamespace(time_conditioning=False, max_seq_len=seq_len)

    def forward(self, input_ids, noise_level=None, attention_mask=None, kv_cache=None):
        h = self.emb[input_ids] + self.pos[: input_ids.shape[1]]  # (B, L, 8)
        h = h + torch.tanh(h.mean(1, keepdim=True) @ self.mix)  # every position sees the others
        return h @ self.out  # (B, L, V)


def mdlm(**kw):
    """Time-based draws (antithetic) unless asked: these tests check the bound in t; time_sampling=auto's mask
    counts are tested in test_time_sampling.py."""
    return MDLM(MethodConfig(**{"time_sampling": "antithetic", **kw}), TOK)


def test_subs_zero_mask_probability_and_carry_over():
    method = mdlm()
    net = TinyNet(6)
    xt = torch.tensor([[0, MASK, 2, MASK, 1, 0]])
    logp = method.subs_log_probs(net(xt), xt)
    assert torch.all(logp[..., MASK] == float("-inf"))
    probs = logp.exp()
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 6))
    unmasked = xt != MASK
    assert torch.equal(probs[unmasked].argmax(-1), xt[unmasked]) and torch.all(probs[unmasked].max(-1).values == 1)


def test_exactly_zero_loss_at_unmasked_positions():
    method = mdlm()
    net = TinyNet(16)
    x0 = torch.randint(0, 3, (32, 16), generator=torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    # recompute the same corruption the loss draws, to locate unmasked positions
    t = method.sample_times(32, "cpu", torch.Generator().manual_seed(2))
    out = method.loss(net, Batch(x0), g)
    g2 = torch.Generator().manual_seed(2)
    t2 = method.sample_times(32, "cpu", g2)
    xt = method.corrupt(x0, t2, torch.ones_like(x0, dtype=torch.bool), g2)
    assert torch.equal(t, t2)
    # per-token loss through a hook: rebuild it and check unmasked entries are exactly zero
    logits = method.subs_logits(net(xt))
    nll = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x0.flatten(), reduction="none").view_as(x0)
    per_token = torch.where(xt == MASK, method.loss_weight(t2)[:, None] * nll, torch.zeros_like(nll))
    assert torch.all(per_token[xt != MASK] == 0)
    torch.testing.assert_close(out.nll_sum, per_token.double().sum(), rtol=1e-6, atol=1e-6)
    # and gradients reach the denoiser only through masked positions
    out.loss.backward()
    assert net.out.grad is not None and torch.isfinite(net.out.grad).all()


def test_padding_is_never_masked_nor_scored():
    method = mdlm()
    net = TinyNet(8)
    x0 = torch.randint(0, 3, (64, 8))
    x0[:, 5:] = TOK.pad_id
    out = method.loss(net, Batch(x0), torch.Generator().manual_seed(0))
    assert out.num_tokens.item() == 64 * 5
    xt = method.corrupt(x0, torch.ones(64), x0 != TOK.pad_id, torch.Generator().manual_seed(0))
    assert torch.all(xt[:, 5:] == TOK.pad_id) and (xt[:, :5] == MASK).float().mean() > 0.98


@pytest.mark.parametrize("schedule", ["loglinear", "cosine", "linear"])
def test_nelbo_equals_entropy_for_product_data(schedule):
    """With the exact denoiser (the marginals), the NELBO is (alpha(0) - alpha(1)) * H, H the true entropy."""
    g = torch.Generator().manual_seed(0)
    L = 8
    torch.manual_seed(0)
    marginals = torch.distributions.Dirichlet(torch.ones(3)).sample((L,))
    oracle = ProductOracle(marginals, V)
    x0 = torch.multinomial(marginals, 4096 * 4, replacement=True, generator=g).T.reshape(4096 * 4, L)
    H = -(marginals * marginals.log()).sum().item() / L  # nats per token
    method = mdlm(schedule=schedule)
    total, count, sq = 0.0, 0, []
    for chunk in x0.split(1024):
        out = method.loss(oracle, Batch(chunk), g)
        total += out.nll_sum.item()
        count += out.num_tokens.item()
        sq.append(out.nll_sum.item() / out.num_tokens.item())
    estimate = total / count
    stderr = torch.tensor(sq).std().item() / math.sqrt(len(sq))
    sched = method.schedule
    scale = (sched.alpha(torch.tensor(0.0)) - sched.alpha(torch.tensor(1.0))).item()
    # the t_min truncation rescales the integral by 1/(1-t_min) of [t_min, 1]; for these data it is exact
    # up to alpha(t_min) instead of alpha(0)
    expected = H * (sched.alpha(torch.tensor(1e-3)) - sched.alpha(torch.tensor(1.0))).item() / (1 - 1e-3)
    assert abs(estimate - expected) < 4 * stderr + 1e-3, (estimate, expected, H, scale, stderr)
    # The part of the bound left out below t_min is 1 - alpha(t_min): negligible for the default schedule,
    # about 2% for the fast-rising linear-sigma one (documented on MethodConfig.t_min).
    truncated = 1 - sched.alpha(torch.tensor(1e-3)).item()
    assert abs(estimate - H) < 4 * stderr + 1e-3 + truncated * H


def _exact_masked_ce(net, x0, p_mask):
    """E over masking patterns (mask prob p_mask) of sum_l 1[masked] -log x_theta(x_t)[x0_l], brute force."""
    L = x0.shape[1]
    total = torch.zeros(x0.shape[0], dtype=torch.float64)
    for pattern in itertools.product([0, 1], repeat=L):
        m = torch.tensor(pattern, dtype=torch.bool)
        if not m.any():
            continue
        prob = p_mask ** m.sum().item() * (1 - p_mask) ** (L - m.sum().item())
        xt = torch.where(m, MASK, x0)
        logits = net(xt).double()
        logits[..., MASK] = float("-inf")
        nll = -torch.log_softmax(logits, -1).gather(-1, x0[..., None])[..., 0]  # (B, L)
        total += prob * (nll * m).sum(-1)
    return total


def _exact_nelbo(net, x0, schedule, T=None, n_quad=400):
    """Per-sequence NELBO by enumeration; continuous (Gauss-Legendre on [t_min,1], normalized) or discrete T."""
    if T is None:
        nodes, weights = torch.from_numpy(__import__("numpy").polynomial.legendre.leggauss(n_quad)[0]), \
            torch.from_numpy(__import__("numpy").polynomial.legendre.leggauss(n_quad)[1])
        t_min = 1e-3
        t = t_min + (1 - t_min) * (nodes + 1) / 2
        w = weights / 2  # average over [t_min, 1]
        vals = [schedule.nelbo_weight(ti) * _exact_masked_ce(net, x0, schedule.one_minus_alpha(ti)) for ti in t]
        return sum(wi * v for wi, v in zip(w, vals))
    total = 0
    for i in range(1, T + 1):
        t, s = torch.tensor(i / T, dtype=torch.float64), torch.tensor((i - 1) / T, dtype=torch.float64)
        a_t, a_s = 1 - 0.999 * t, 1 - 0.999 * s  # log-linear, written out independently of the library
        weight = T * (a_s - a_t) / (1 - a_t)
        total = total + weight * _exact_masked_ce(net, x0, 1 - a_t) / T
    return total


def test_mc_loss_matches_brute_force_nelbo():
    """The Monte Carlo loss averages to the exactly integrated NELBO for an arbitrary (imperfect) denoiser."""
    torch.manual_seed(0)
    L = 4
    net = TinyNet(L).double()
    net.float()
    x0 = torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(3))
    method = mdlm()
    with torch.no_grad():
        exact = _exact_nelbo(net, x0, method.schedule).mean().item() / L
        g = torch.Generator().manual_seed(0)
        reps = x0.repeat(20000, 1)
        out = method.loss(net, Batch(reps), g)
        est = out.nll_sum.item() / out.num_tokens.item()
    assert abs(est - exact) / exact < 0.02, (est, exact)


def test_discrete_nelbo_approaches_continuous():
    L = 3
    net = TinyNet(L)
    x0 = torch.randint(0, 3, (4, L), generator=torch.Generator().manual_seed(5))
    method = mdlm()
    with torch.no_grad():
        cont = _exact_nelbo(net, x0, method.schedule).mean().item()
        gaps = [(_exact_nelbo(net, x0, method.schedule, T=T).mean().item() - cont) for T in (2, 8, 64, 512)]
    assert all(abs(b) < abs(a) for a, b in itertools.pairwise(gaps)), gaps
    assert abs(gaps[-1]) < 0.01 * cont, gaps


def test_discrete_mc_matches_enumeration():
    """The discrete-T training loss is an unbiased estimate of the discrete-T NELBO."""
    L, T = 3, 4
    net = TinyNet(L)
    x0 = torch.randint(0, 3, (2, L), generator=torch.Generator().manual_seed(7))
    method = mdlm(num_timesteps=T)
    with torch.no_grad():
        exact = _exact_nelbo(net, x0, method.schedule, T=T).mean().item() / L
        out = method.loss(net, Batch(x0.repeat(30000, 1)), torch.Generator().manual_seed(1))
    est = out.nll_sum.item() / out.num_tokens.item()
    assert abs(est - exact) / exact < 0.02, (est, exact)


def test_reverse_step_reveal_rate_and_carry_over():
    method = mdlm()
    B, L = 4000, 16
    xt = torch.full((B, L), MASK)
    xt[:, :4] = 1  # already revealed tokens must never change
    probs = torch.zeros(B, L, V, dtype=torch.float64)
    probs[..., 2] = 1.0
    t, s = torch.full((B,), 0.6), torch.full((B,), 0.45)
    xs = method.reverse_step(probs, xt, t, s, torch.Generator().manual_seed(0))
    assert torch.all(xs[:, :4] == 1)
    revealed = (xs[:, 4:] != MASK).double().mean().item()
    expected = ((1 - 0.999 * 0.45) - (1 - 0.999 * 0.6)) / (0.999 * 0.6)
    assert abs(revealed - expected) < 4 * math.sqrt(expected * (1 - expected) / (B * 12))
    assert torch.all(xs[:, 4:][xs[:, 4:] != MASK] == 2)
