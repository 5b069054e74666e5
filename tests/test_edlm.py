"""EDLM: energies, the Theorem-1 log-partition estimator, the likelihood bound, NCE; against closed forms and
enumeration on tiny vocabularies."""

import itertools
import math

import pytest
import torch

from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.edlm import AREnergy, CarryOverAREnergy, EnergyError, load_energy, parse_energy_spec
from seqdiff.edlm.base import masked_log_mu
from seqdiff.edlm.likelihood import EDLMBound
from seqdiff.edlm.nce_energy import EnergyNet, NCEEnergy, load_energy_net, nce_loss, save_energy_net
from seqdiff.edlm.partition import leave_one_out_log_mean_exp, log_partition_estimates
from seqdiff.methods import MDLM, Batch, build_model
from tests.edlm_toys import MASK, TOK, CountEnergy, ar_log_prob, ar_model, states
from tests.oracles import JointOracle

L = 3
TINY_DIT = ModelConfig(hidden_size=32, n_layers=1, n_heads=2, cond_dim=32, max_seq_len=8)


def _mdlm(**kw):
    return MDLM(MethodConfig(**kw), TOK)


def _dirichlet(alpha, g):
    """A random joint over the 3^L sequences (positive weights, smaller alpha: more peaked)."""
    x = (-torch.log(torch.rand(3**L, generator=g, dtype=torch.float64))) ** (1 / alpha)
    return x / x.sum()


def _completions(xt):
    """Every x0 over 0..2 that agrees with x_t (L,) on its unmasked positions: (C, L)."""
    S = states(L)
    return S[((S == xt) | (xt == MASK)).all(-1)]


# ------------------------------------------------------------------------------------------ Theorem 1
def _toy_partition(seed=0, outcomes=20):
    g = torch.Generator().manual_seed(seed)
    mu = torch.rand(outcomes, generator=g, dtype=torch.float64) + 0.05
    mu = mu / mu.sum()
    energy = 0.8 * torch.randn(outcomes, generator=g, dtype=torch.float64)
    w = torch.exp(-energy)
    Z = float((mu * w).sum())
    var = float((mu * w**2).sum()) - Z**2
    return mu, energy, Z, var


def test_leave_one_out_matches_direct_computation():
    log_w = torch.randn(5, 6, dtype=torch.float64)
    loo = leave_one_out_log_mean_exp(log_w)
    for j in range(6):
        others = torch.cat([log_w[:, :j], log_w[:, j + 1 :]], -1)
        torch.testing.assert_close(loo[:, j], others.exp().mean(-1).log())
    with pytest.raises(ValueError, match="n >= 2"):
        log_partition_estimates(log_w[:, :1])


def test_log_partition_bias_signs_and_shrinkage():
    """Plain log Z_n is biased low, the corrected estimate high, both shrinking with n; the leading terms are
    -/+ Var(w) / (2 n Z^2). (The corrected bias is only asymptotically monotone: for this toy it grows from
    n = 2 to n = 4, where O(1/n^2) terms still matter; it is positive throughout.)"""
    mu, energy, Z, var = _toy_partition()
    g = torch.Generator().manual_seed(1)
    c = var / (2 * Z**2)
    biases = {}
    for n, repeats in [(4, 200_000), (8, 100_000), (16, 50_000), (32, 25_000)]:
        idx = torch.multinomial(mu, repeats * n, replacement=True, generator=g).view(repeats, n)
        plain, corrected = [], []
        for chunk in idx.split(5_000):
            p, q = log_partition_estimates(-energy[chunk])
            plain.append(p)
            corrected.append(q)
        plain, corrected = torch.cat(plain) - math.log(Z), torch.cat(corrected) - math.log(Z)
        se_p, se_c = plain.std() / repeats**0.5, corrected.std() / repeats**0.5
        bp, bc = float(plain.mean()), float(corrected.mean())
        assert bp < -4 * se_p, (n, bp, se_p)
        assert bc > 4 * se_c, (n, bc, se_c)
        biases[n] = (bp, bc)
        if n >= 16:  # leading-order theory
            assert abs(bp + c / n) < 0.25 * c / n + 4 * se_p, (n, bp, -c / n)
            assert abs(bc - c / n) < 0.25 * c / n + 4 * se_c, (n, bc, c / n)
    ns = sorted(biases)
    for a, b in zip(ns, ns[1:]):
        assert abs(biases[b][0]) < abs(biases[a][0]) and abs(biases[b][1]) < abs(biases[a][1]), biases


# ------------------------------------------------------------------------------------------ energies
def test_coar_step_is_normalized_and_ar_step_is_the_restricted_ar_model():
    """Sum over completions of x_t of mu exp(-E): exactly 1 for coAR, p_AR(agrees with x_t) for AR."""
    joint = _dirichlet(0.5, torch.Generator().manual_seed(3))
    ar = ar_model(joint, L)
    mu_net = JointOracle(_dirichlet(0.8, torch.Generator().manual_seed(4)), L, 3, TOK.vocab_size, MASK)
    for xt_list in ([MASK, MASK, MASK], [MASK, 1, MASK], [2, MASK, 0], [MASK, MASK, 1]):
        xt = torch.tensor(xt_list)
        x0 = _completions(xt)  # (C, L)
        xt_rep = xt.expand_as(x0)
        probs = torch.softmax(mu_net(xt_rep).double(), -1)
        log_mu = masked_log_mu(probs, x0, xt_rep, MASK)
        torch.testing.assert_close(log_mu.exp().sum(), torch.tensor(1.0, dtype=torch.float64))
        co = CarryOverAREnergy(ar, TOK.vocab_size, MASK)
        total = (log_mu - co(x0, xt_rep, log_mu)).exp().sum()
        torch.testing.assert_close(total, torch.tensor(1.0, dtype=torch.float64))
        full = AREnergy(ar, TOK.vocab_size, MASK)
        p = (log_mu - full(x0, xt_rep, log_mu)).exp()
        torch.testing.assert_close(p, ar_log_prob(joint, x0).exp())  # mu exp(-E) = p_AR on completions
        assert float(p.detach().sum()) < 1.0 or (xt == MASK).all()


def test_energy_spec_errors_name_the_problem():
    assert parse_energy_spec("coar:runs/ar") == ("coar", "runs/ar")
    with pytest.raises(EnergyError, match="KIND:PATH"):
        parse_energy_spec("runs/ar")
    with pytest.raises(EnergyError, match="'foo' is unknown"):
        parse_energy_spec("foo:runs/ar")
    mdlm = build_model(TINY_DIT, MethodConfig(), TOK)
    from types import SimpleNamespace

    loaded = SimpleNamespace(method=mdlm[0], tokenizer=TOK, path="m")
    with pytest.raises(EnergyError, match="does not exist"):
        load_energy("nce:/nonexistent/energy.pt", loaded)
    with pytest.raises(EnergyError, match="nonexistent"):
        load_energy("coar:/nonexistent/run", loaded)
    with pytest.raises(EnergyError, match="autoregressive"):
        AREnergy(SimpleNamespace(method=mdlm[0], tokenizer=TOK, path="m"), TOK.vocab_size, MASK)


# ------------------------------------------------------------------------------------------ likelihood
def _tiny_mdlm_net(seed=0):
    from tests.test_mdlm import TinyNet

    return TinyNet(L, seed=seed)


def test_zero_energy_bound_equals_mdlm_nelbo_draw_for_draw():
    method, net = _mdlm(time_sampling="antithetic"), _tiny_mdlm_net()  # the bound draws times
    x0 = torch.randint(0, 3, (16, L), generator=torch.Generator().manual_seed(0))
    bound = EDLMBound(method, CountEnergy(scale=0.0), num_partition_samples=4, form="sequence")
    a = bound.loss(net, Batch(x0), torch.Generator().manual_seed(5))
    b = method.loss(net, Batch(x0), torch.Generator().manual_seed(5))
    torch.testing.assert_close(a.nll_sum, b.nll_sum, rtol=1e-5, atol=1e-5)
    assert float(a.num_tokens) == float(b.num_tokens)


def _enumerated_coar_bound(method, joint, x0, T):
    """E over the T grid times and every mask pattern of w(t) * -log p_coAR(x0 | x_t), by enumeration."""
    token_lp = ar_model(joint, L).backbone(ar_model(joint, L).method.shift_right(x0[None]))
    token_lp = torch.log_softmax(token_lp.double(), -1)[0].gather(-1, x0[:, None])[:, 0]  # (L,)
    total = 0.0
    for i in range(1, T + 1):
        t = torch.tensor([i / T], dtype=torch.float64)
        p_mask = float(method.schedule.mask_probability(t))
        w = float(method.loss_weight(t))
        for pattern in itertools.product([0, 1], repeat=L):
            m = torch.tensor(pattern, dtype=torch.bool)
            prob = p_mask ** int(m.sum()) * (1 - p_mask) ** int((~m).sum())
            total += prob * w * float(-token_lp[m].sum().detach()) / T
    return total, float(-token_lp.sum().detach())


def test_coar_bound_equals_enumeration_and_tracks_ar():
    T = 4
    method, net = _mdlm(num_timesteps=T, time_sampling="uniform"), _tiny_mdlm_net()
    joint = _dirichlet(0.5, torch.Generator().manual_seed(7))
    x0 = torch.tensor([2, 0, 1])
    exact, ar_nll = _enumerated_coar_bound(method, joint, x0, T)
    eps = 1e-3  # log-linear: alpha(0) - alpha(1) = 1 - eps
    assert exact == pytest.approx((1 - eps) * ar_nll, rel=1e-9)
    bound = EDLMBound(method, CarryOverAREnergy(ar_model(joint, L), TOK.vocab_size, MASK), form="sequence")
    N = 20_000
    terms = bound.per_sequence(net, Batch(x0.expand(N, L)), torch.Generator().manual_seed(0))["bound"]
    se = float(terms.std()) / N**0.5
    assert abs(float(terms.mean()) - exact) < 4 * se, (float(terms.mean()), exact, se)
    # and the test can fail: the plain MDLM bound of this (untrained) mu is far from the AR number
    mdlm_terms = bound.per_sequence(net, Batch(x0.expand(N, L)), torch.Generator().manual_seed(0))["mdlm_bound"]
    assert abs(float(mdlm_terms.mean()) - exact) > 10 * se


def test_ar_energy_log_partition_estimate_approaches_enumeration():
    """For the AR energy, Z(x_t) = p_AR(x0 agrees with x_t); the corrected estimate with many draws is close
    and above the plain one on average."""
    method = _mdlm()
    net = JointOracle(_dirichlet(0.8, torch.Generator().manual_seed(2)), L, 3, TOK.vocab_size, MASK)
    joint = _dirichlet(0.7, torch.Generator().manual_seed(9))
    bound = EDLMBound(method, AREnergy(ar_model(joint, L), TOK.vocab_size, MASK), num_partition_samples=32,
                      form="sequence")
    N = 1000
    x0 = torch.tensor([[1, 2, 0]]).expand(N, L)
    terms = bound.per_sequence(net, Batch(x0), torch.Generator().manual_seed(1))
    # recompute x_t from the same draws: times then masks, as per_sequence does
    g = torch.Generator().manual_seed(1)
    t = method.sample_times(N, "cpu", g)
    xt = method.corrupt(x0, t, torch.ones_like(x0, dtype=torch.bool), g)
    exact = torch.stack([ar_log_prob(joint, _completions(row)).exp().sum().log() for row in xt])
    err_c = terms["log_z"] - exact
    err_p = terms["log_z_plain"] - exact
    assert float(err_c.mean()) > float(err_p.mean())
    assert abs(float(err_c.mean())) < 0.15, float(err_c.mean())


# ------------------------------------------------------------------------------------------ NCE
def _tiny_dit_mdlm():
    method, backbone, _ = build_model(TINY_DIT, MethodConfig(), TOK)
    return method, backbone


def test_nce_energy_starts_at_zero_reads_xt_and_round_trips(tmp_path):
    method, backbone = _tiny_dit_mdlm()
    net = EnergyNet.from_mdlm(backbone, TOK.vocab_size, MASK)
    x0 = torch.randint(0, 3, (4, 8), generator=torch.Generator().manual_seed(0))
    xt = x0.clone()
    xt[:, ::2] = MASK
    assert torch.all(net(x0, xt) == 0)  # zero head: EDLM-NCE starts as MDLM
    torch.testing.assert_close(nce_loss(net(x0, xt), net(x0, xt)), torch.tensor(2 * math.log(2)))
    torch.nn.init.normal_(net.head.weight)
    assert not torch.allclose(net(x0, xt), net(x0, x0))  # the mask set of x_t matters, not only x0
    torch.testing.assert_close(net.trunk.embed.weight[:TOK.vocab_size], backbone.embed.weight)
    path = save_energy_net(net, tmp_path / "e.pt")
    again = load_energy_net(path)
    torch.testing.assert_close(again(x0, xt), net(x0, xt))
    assert NCEEnergy(again)(x0, xt, torch.zeros(4)).dtype == torch.float64


def test_nce_loss_closed_form():
    e_pos, e_neg = torch.tensor([0.3, -1.0]), torch.tensor([2.0, 0.1])
    expected = (math.log1p(math.exp(0.3)) + math.log1p(math.exp(-1.0))) / 2 + \
        (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-0.1))) / 2
    assert float(nce_loss(e_pos, e_neg)) == pytest.approx(expected, rel=1e-6)


def test_nce_training_separates_data_from_mu(tmp_path):
    """Data = 'abcabc...', mu untrained: after a few steps the energy classifies data against mu's draws."""
    from types import SimpleNamespace

    import numpy as np

    from seqdiff.edlm.nce_train import NCEConfig, train_nce

    torch.manual_seed(0)
    method, backbone = _tiny_dit_mdlm()
    mdlm = SimpleNamespace(method=method, backbone=backbone, tokenizer=TOK, seq_len=8, path="tiny")
    tokens = np.tile(np.array([0, 1, 2]), 200)
    cfg = NCEConfig(steps=40, batch_size=16, lr=3e-3, warmup_steps=5, log_every=10)
    net, log = train_nce(mdlm, tokens, cfg, tmp_path / "nce.pt")
    assert log[-1]["loss"] < 2 * math.log(2) - 0.3, log
    assert log[-1]["accuracy"] > 0.8, log
    assert (tmp_path / "nce.pt").is_file()


# ------------------------------------------------------------------------------------------ marginal form
def _edlm_marginals(mu_probs, energy, xt):
    """Exact per-position marginals p_l(v | x_t) of mu exp(-E) / Z by enumerating the completions of x_t."""
    comp = _completions(xt)  # (C, L)
    xt_rep = xt.expand_as(comp)
    log_mu = masked_log_mu(mu_probs.expand(len(comp), -1, -1), comp, xt_rep, MASK)
    p = (log_mu - energy(comp, xt_rep, log_mu)).exp()
    p = p / p.sum()
    return torch.stack([torch.stack([p[comp[:, pos] == v].sum() for v in range(3)]) for pos in range(L)])  # (L, 3)


def test_marginal_form_estimates_the_enumerated_marginal_nll():
    """For a fixed x_t, the estimate of sum over masked l of -log p_l(x0^l | x_t) averages to the enumerated
    value, from above (the -log Z_l and log Z estimates are both biased high)."""
    method = _mdlm()
    mu_net = JointOracle(_dirichlet(0.8, torch.Generator().manual_seed(2)), L, 3, TOK.vocab_size, MASK)
    joint = _dirichlet(0.6, torch.Generator().manual_seed(5))
    energy = AREnergy(ar_model(joint, L), TOK.vocab_size, MASK)
    x0 = torch.tensor([2, 0, 1])
    for xt in (torch.tensor([MASK, 0, MASK]), torch.tensor([MASK, MASK, MASK])):
        probs = torch.softmax(mu_net(xt[None]).double(), -1)
        marg = _edlm_marginals(probs[0], energy, xt)
        exact = float(sum(-marg[pos, x0[pos]].log().detach() for pos in range(L) if xt[pos] == MASK))
        for n, N, tol in ((64, 1000, 0.08), (4, 2000, math.inf)):  # tol: room for the upward estimator bias
            bound = EDLMBound(method, energy, num_partition_samples=n)
            est = bound.marginal_nll(probs.expand(N, -1, -1), x0.expand(N, L), xt.expand(N, L),
                                     torch.Generator().manual_seed(n))["nll"]
            mean, se = float(est.mean()), float(est.std()) / N**0.5
            assert mean > exact - 4 * se, (n, mean, exact, se)
            assert mean < exact + tol + 4 * se, (n, mean, exact, se)


def test_marginal_form_of_the_exact_model_is_its_nll_and_the_sequence_form_undershoots():
    """With the AR energy, the EDLM step is the AR model restricted to completions of x_t; the continuous-time
    marginal bound, enumerated over mask sets (weight int_0^1 t^(m-1) (1-t)^(L-m) dt for m masked), is then
    exactly the AR NLL for every x0, while the paper's sequence form lies below it on average over the data
    (so it is no upper bound)."""
    joint = _dirichlet(0.4, torch.Generator().manual_seed(11))
    energy = AREnergy(ar_model(joint, L), TOK.vocab_size, MASK)
    uniform = torch.full((L, TOK.vocab_size), 1e-30, dtype=torch.float64)
    uniform[:, :3] = 1 / 3  # any mu with full support: the AR energy cancels it
    expected_sequence, entropy = 0.0, 0.0
    for x0 in states(L):
        marginal_bound = sequence_bound = 0.0
        for pattern in itertools.product([0, 1], repeat=L):
            m = torch.tensor(pattern, dtype=torch.bool)
            k = int(m.sum())
            if k == 0:
                continue
            beta = math.gamma(k) * math.gamma(L - k + 1) / math.gamma(L + 1)  # int t^(k-1) (1-t)^(L-k) dt
            xt = torch.where(m, MASK, x0)
            marg = _edlm_marginals(uniform, energy, xt)
            marginal_bound += beta * float(sum(-marg[pos, x0[pos]].log().detach() for pos in range(L) if m[pos]))
            comp = _completions(xt)
            p_block = ar_log_prob(joint, x0).exp() / ar_log_prob(joint, comp).exp().sum()
            sequence_bound += beta * float(-p_block.log().detach())
        nll = float(-ar_log_prob(joint, x0))
        assert marginal_bound == pytest.approx(nll, rel=1e-6)  # the toy AR runs in float32
        p = math.exp(-nll)
        expected_sequence += p * sequence_bound
        entropy += p * nll
    # on average over the data (pointwise it can go either way): subadditivity of entropy
    assert expected_sequence < entropy - 0.1, (expected_sequence, entropy)
