"""Training-time samplers (method.time_sampling) and the estimator-variance measurement."""

import math

import pytest
import torch
from torch import nn

from seqdiff.config import ConfigError, MethodConfig, from_dict
from seqdiff.evaluation.estimator_variance import Estimator, measure
from seqdiff.methods import MDLM, Batch
from seqdiff.schedules import TIME_SAMPLINGS, stratified_times, unit_times
from tests.test_mdlm import TOK, TinyNet, _exact_nelbo


def _ks_uniform(x: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance of samples in [0, 1) to U[0, 1)."""
    x = x.double().sort().values
    n = len(x)
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    return max((grid - x).abs().max().item(), (x - (grid - 1 / n)).abs().max().item())


def test_stratified_one_per_stratum_and_uniform_within():
    g = torch.Generator().manual_seed(0)
    B, n = 8, 4000
    draws = torch.stack([stratified_times(B, g) for _ in range(n)])  # (n, B)
    assert draws.min() >= 0 and draws.max() < 1
    assert torch.equal(torch.floor(draws * B).long(), torch.arange(B).expand(n, B)), "row i lies in stratum i"
    within = draws * B - torch.arange(B)  # (n, B) position inside the stratum
    for i in range(B):  # each row uniform on its stratum (KS 0.1% critical value ~ 1.95 / sqrt(n))
        assert _ks_uniform(within[:, i]) < 1.95 / math.sqrt(n), i
    # a row picked at random (the data order is random) is uniform on [0, 1)
    pick = torch.randint(0, B, (n,), generator=g)
    assert _ks_uniform(draws[torch.arange(n), pick]) < 1.95 / math.sqrt(n)
    # the strata's offsets are independent (the shared-offset form has correlation 1)
    corr = torch.corrcoef(within[:, :2].T.float())[0, 1].item()
    assert abs(corr) < 4 / math.sqrt(n), corr


@pytest.mark.parametrize("sampling", TIME_SAMPLINGS)
def test_every_sampler_has_uniform_marginal(sampling):
    g = torch.Generator().manual_seed(1)
    B, n = 5, 4000
    draws = torch.stack([unit_times(B, sampling, g) for _ in range(n)])
    pick = torch.randint(0, B, (n,), generator=g)
    assert _ks_uniform(draws[torch.arange(n), pick]) < 1.95 / math.sqrt(n)


@pytest.mark.parametrize("sampling, closed_form", [
    ("antithetic_jitter", lambda B: 1 / (12 * B**3)),  # sum over strata of (1/B^2)/12, over B^2
    ("antithetic", lambda B: 1 / (12 * B**2)),  # one offset: the mean is u/B + const mod a jump of 1/B
    ("uniform", lambda B: 1 / (12 * B)),
])
def test_batch_mean_variance_closed_form(sampling, closed_form):
    """Var of the batch mean of f(t) = t: the figures the issue compares (1.6e-4 vs 1.3e-3 at B = 8)."""
    g = torch.Generator().manual_seed(2)
    B, n = 8, 40_000
    means = torch.stack([unit_times(B, sampling, g).double().mean() for _ in range(n)])
    assert abs(means.mean().item() - 0.5) < 5 * math.sqrt(closed_form(B) / n)  # unbiased
    assert means.var().item() == pytest.approx(closed_form(B), rel=0.05)


def test_unknown_sampling_refused():
    with pytest.raises(ValueError, match="antithetic_jitter"):
        unit_times(4, "sobol")
    with pytest.raises(ConfigError, match="antithetic_jitter"):
        from_dict(MethodConfig, {"time_sampling": "sobol"})


@pytest.mark.parametrize("pairs", [False, True], ids=["", "complementary"])
@pytest.mark.parametrize("sampling", TIME_SAMPLINGS)
@pytest.mark.parametrize("T", [0, 4])
def test_mc_loss_unbiased_against_enumerated_nelbo(sampling, T, pairs):
    """Each sampler's Monte Carlo loss averages to the exactly integrated (or summed, T > 0) NELBO; so does the
    mean of a complementary pair (half the windows: the same rows per forward)."""
    L = 3
    net = TinyNet(L)
    x0 = torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(3))
    method = MDLM(MethodConfig(time_sampling=sampling, num_timesteps=T, complementary_masks=pairs), TOK)
    reps = 10_000 if pairs else 20_000
    with torch.no_grad():
        exact = _exact_nelbo(net, x0, method.schedule, T=T or None, n_quad=200).mean().item() / L
        out = method.loss(net, Batch(x0.repeat(reps, 1)), torch.Generator().manual_seed(0))
    est = out.nll_sum.item() / out.num_tokens.item()
    assert out.num_tokens.item() == 3 * reps * L  # each sequence counted once, not twice
    assert abs(est - exact) / exact < 0.02, (sampling, T, est, exact)


class _Linear(nn.Module):
    """logits = emb[x_t] W: small enough to enumerate gradients by hand."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = nn.Parameter(torch.randn(TOK.vocab_size, 4, generator=g))
        self.out = nn.Parameter(torch.randn(4, TOK.vocab_size, generator=g))

    def forward(self, input_ids, noise_level=None, attention_mask=None):
        return self.emb[input_ids] @ self.out


def _linear_setup():
    """(the _Linear net, batch_at(k, rows): 6 rows of 5 tokens rolled by k, an MDLM factory) for `measure`."""
    data = torch.randint(0, 3, (6, 5), generator=torch.Generator().manual_seed(4))

    def batch_at(k, rows):
        x = torch.roll(data, k, dims=0)
        return x if rows is None else x[:rows]

    def factory(sampling, **options):
        return MDLM(MethodConfig(time_sampling=sampling, **options), TOK)

    return _Linear(), batch_at, factory


def test_measure_matches_brute_force_statistics():
    """measure()'s running sums give the sample variance of the loss and the trace of the gradient covariance."""
    net, batch_at, factory = _linear_setup()

    draws = 10
    for regime in ("fixed_batch", "fresh_batch"):
        est = [Estimator("antithetic_jitter"), Estimator("mask_count", masks_per_sequence=2),
               Estimator("antithetic", complementary=True)]
        stats = measure(factory, net, batch_at, est, draws, regime=regime, seed=3, groups=2)
        for e_index, (e, s) in enumerate(zip(est, stats)):  # redo every draw by hand, keep every gradient
            from seqdiff.data.blocks import step_generator

            losses, grads = [], []
            k = e.masks_per_sequence
            d = 2 if e.complementary else k  # rows per window
            for r in range(draws):
                x = batch_at(0, None)[: 6 // d] if regime == "fixed_batch" else batch_at(1 + r, 6 // d)
                x = x.repeat(k, 1)[torch.randperm(6 // d * k, generator=step_generator(3 + 77, r))]
                method = factory(e.time_sampling, complementary_masks=e.complementary)
                assert s.complementary == e.complementary
                loss = method.loss(net, Batch(x), step_generator(3 * 1_000 + e_index, r)).loss
                gs = torch.autograd.grad(loss, list(net.parameters()))
                losses.append(loss.item())
                grads.append(torch.cat([g.reshape(-1) for g in gs]).double())
            G = torch.stack(grads)  # (R, P)
            assert s.loss_var == pytest.approx(torch.tensor(losses).double().var().item(), rel=1e-9)
            assert s.grad_var == pytest.approx(G.var(0).sum().item(), rel=1e-6)
            assert s.grad_norm2 == pytest.approx(G.mean(0).square().sum().item(), rel=1e-9)
            assert s.loss_mean == pytest.approx(sum(losses) / draws, rel=1e-12)


# ------------------------------------------------------------------------------ mask_count (MDLM)
def _exact_mask_count_nelbo(net, x0):
    """Per-sequence sum_k (1/k) E[sum over masked of -log x_theta | a uniformly random k-subset masked], by
    enumerating every subset: the untruncated continuous NELBO of a time-agnostic SUBS denoiser."""
    import itertools

    L = x0.shape[1]
    total = torch.zeros(x0.shape[0], dtype=torch.float64)
    for pattern in itertools.product([0, 1], repeat=L):
        m = torch.tensor(pattern, dtype=torch.bool)
        k = int(m.sum())
        if k == 0:
            continue
        logits = net(torch.where(m, TOK.mask_id, x0)).double()
        logits[..., TOK.mask_id] = float("-inf")
        nll = -torch.log_softmax(logits, -1).gather(-1, x0[..., None])[..., 0]  # (B, L)
        total += (nll * m).sum(-1) / k / math.comb(L, k)
    return total


def test_batch_noise_pools_the_variance_within_fresh_batches_by_brute_force():
    """batch_noise: draws / per_batch fresh batches, each drawn per_batch times; loss and gradient variances are the
    per-batch sample variances averaged (equal counts), i.e. E_x Var(g | x), the mean over every draw as usual."""
    from seqdiff.data.blocks import step_generator

    net, batch_at, factory = _linear_setup()

    est = [Estimator("antithetic"), Estimator("mask_count", masks_per_sequence=2)]
    draws, per_batch = 12, 3
    stats = measure(factory, net, batch_at, est, draws, regime="batch_noise", seed=3, groups=2, per_batch=per_batch)
    for e_index, (e, s) in enumerate(zip(est, stats)):
        k = e.masks_per_sequence
        losses, grads = [], []
        for r in range(draws):
            x = batch_at(1 + r // per_batch, 6 // k).repeat(k, 1)[torch.randperm(6, generator=step_generator(80, r))]
            loss = factory(e.time_sampling).loss(net, Batch(x), step_generator(3 * 1_000 + e_index, r)).loss
            gs = torch.autograd.grad(loss, list(net.parameters()))
            losses.append(loss.item())
            grads.append(torch.cat([g.reshape(-1) for g in gs]).double())
        G = torch.stack(grads).view(draws // per_batch, per_batch, -1)  # (batches, per_batch, P)
        L = torch.tensor(losses, dtype=torch.float64).view(draws // per_batch, per_batch)
        assert s.regime == "batch_noise" and s.draws == draws
        assert s.grad_var == pytest.approx(G.var(1).sum(-1).mean().item(), rel=1e-6)
        assert s.loss_var == pytest.approx(L.var(1).mean().item(), rel=1e-9)
        assert s.loss_mean == pytest.approx(L.mean().item(), rel=1e-12)
        assert s.grad_norm2 == pytest.approx(G.view(draws, -1).mean(0).square().sum().item(), rel=1e-9)
        assert s.grad_var_stderr > 0
    for draws_, per_batch_ in ((12, 5), (12, 1), (6, 3)):  # not dividing, one draw a batch, one batch a group
        with pytest.raises(ValueError, match="batch_noise"):
            measure(factory, net, batch_at, est, draws_, regime="batch_noise", groups=2, per_batch=per_batch_)


def test_mask_count_is_the_time_integral_without_truncation():
    """sum_k (1/k) E[.|k] equals the enumerated time integral up to its O(t_min + eps) truncation."""
    L = 3
    net = TinyNet(L)
    x0 = torch.randint(0, 3, (4, L), generator=torch.Generator().manual_seed(5))
    method = MDLM(MethodConfig(), TOK)
    with torch.no_grad():
        by_count = _exact_mask_count_nelbo(net, x0)
        by_time = _exact_nelbo(net, x0, method.schedule, n_quad=200)
    torch.testing.assert_close(by_count, by_time, rtol=5e-3, atol=0)
    assert not torch.allclose(by_count, by_time, rtol=1e-6, atol=0)  # the truncation is there, and small


@pytest.mark.parametrize("law", ["uniform", "inverse_sqrt"])
@pytest.mark.parametrize("pairs", [False, True], ids=["", "complementary"])
def test_mask_count_mc_loss_unbiased(pairs, law):
    L = 4
    net = TinyNet(L)
    x0 = torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(3))
    method = MDLM(MethodConfig(time_sampling="mask_count", complementary_masks=pairs, mask_count_law=law), TOK)
    with torch.no_grad():
        exact = _exact_mask_count_nelbo(net, x0).mean().item() / L
        out = method.loss(net, Batch(x0.repeat(10_000 if pairs else 20_000, 1)), torch.Generator().manual_seed(0))
    est = out.nll_sum.item() / out.num_tokens.item()
    assert abs(est - exact) / exact < 0.01, (est, exact)


def test_mask_count_draws_k_uniformly_among_scored_positions():
    """With padding: k is uniform on 1..n (n = scored tokens of the row), only scored positions are masked, and
    each scored position is masked with probability E[k] / n = (n + 1) / (2 n)."""
    method = MDLM(MethodConfig(time_sampling="mask_count"), TOK)
    x0 = torch.tensor([[0, 1, 2, 0, 1, 2], [2, 1, 0, TOK.pad_id, TOK.pad_id, TOK.pad_id]]).repeat(3000, 1)
    scored = Batch(x0).scored(TOK.pad_id)
    t, xt, weight = method.draw_noise(x0, scored, torch.Generator().manual_seed(0))
    masked = xt == TOK.mask_id
    assert not (masked & ~scored).any()
    for row, n in ((0, 6), (1, 3)):
        k = masked[row::2].sum(1)
        counts = torch.bincount(k, minlength=n + 1)
        assert counts[0] == 0 and counts[n + 1:].sum() == 0
        expected = len(k) / n
        assert ((counts[1:] - expected).abs() < 5 * math.sqrt(expected)).all(), counts
        torch.testing.assert_close(weight[row::2], (n / k).float())
        rate = masked[row::2, :n].double().mean(0)  # per position
        assert ((rate - (n + 1) / (2 * n)).abs() < 0.03).all(), rate


def test_mask_count_refusals():
    with pytest.raises(ConfigError, match="num_timesteps=0"):
        MDLM(MethodConfig(time_sampling="mask_count", num_timesteps=8), TOK)
    with pytest.raises(ConfigError, match="SUBS"):
        MDLM(MethodConfig(time_sampling="mask_count", subs=False), TOK)
    for name in ("sedd", "d3pm"):
        with pytest.raises(ConfigError, match="mask_count is mdlm's"):
            MethodConfig(name=name, time_sampling="mask_count")
    net = TinyNet(3)
    net.config.time_conditioning = True
    with pytest.raises(ConfigError, match="time_conditioning"):
        MDLM(MethodConfig(time_sampling="mask_count"), TOK).check_backbone(net)


# ------------------------------------------------------------------------------ complementary masks (MDLM)
def test_complementary_mask_count_partner_is_a_draw_of_its_own_sharing_one_position():
    """Partner k' = n + 1 - k is uniform on 1..n with weight n / k'; the pair covers every scored position and
    shares exactly one; padding is never masked."""
    method = MDLM(MethodConfig(time_sampling="mask_count"), TOK)
    x0 = torch.tensor([[0, 1, 2, 0, 1, 2], [2, 1, 0, TOK.pad_id, TOK.pad_id, TOK.pad_id]]).repeat(3000, 1)
    scored = Batch(x0).scored(TOK.pad_id)
    B = x0.shape[0]
    t, xt, weight = method.draw_noise(x0, scored, torch.Generator().manual_seed(0), complementary=True)
    assert xt.shape == (2 * B, 6) and t.shape == weight.shape == (2 * B,)
    first, partner = xt[:B] == TOK.mask_id, xt[B:] == TOK.mask_id
    assert not ((first | partner) & ~scored).any()
    assert torch.equal(first | partner, scored)
    assert ((first & partner).sum(1) == 1).all()
    for row, n in ((0, 6), (1, 3)):
        k2 = partner[row::2].sum(1)
        counts = torch.bincount(k2, minlength=n + 1)
        assert counts[0] == 0 and counts[n + 1:].sum() == 0
        expected = len(k2) / n
        assert ((counts[1:] - expected).abs() < 5 * math.sqrt(expected)).all(), counts
        torch.testing.assert_close(weight[B:][row::2], (n / k2).float())
        torch.testing.assert_close(k2, n + 1 - first[row::2].sum(1))


def test_complementary_time_partner_has_the_antithetic_time_and_the_complementary_mask():
    """Loglinear at the defaults: t' = 1 + t_min - t, and every scored position is masked in exactly one of the
    two draws but where u falls in a band of width 1 - (1 - eps)(1 + t_min) = 1e-6."""
    method = MDLM(MethodConfig(time_sampling="antithetic_jitter"), TOK)
    x0 = torch.randint(0, 3, (4000, 8), generator=torch.Generator().manual_seed(1))
    x0[::3, 5:] = TOK.pad_id
    scored = Batch(x0).scored(TOK.pad_id)
    B = x0.shape[0]
    t, xt, weight = method.draw_noise(x0, scored, torch.Generator().manual_seed(2), complementary=True)
    torch.testing.assert_close(t[B:], 1 + method.config.t_min - t[:B])
    torch.testing.assert_close(weight, method.loss_weight(t))
    first, partner = xt[:B] == TOK.mask_id, xt[B:] == TOK.mask_id
    assert not ((first | partner) & ~scored).any()
    exactly_one = (first ^ partner)[scored].double().mean().item()
    assert exactly_one > 1 - 1e-3, exactly_one
    # the partner's own law: each scored position masked with probability p(t') given t'
    p2 = method.schedule.mask_probability(t[B:])[:, None].expand_as(x0)[scored].double()
    n = p2.numel()
    observed = partner[scored].double().sum().item()
    assert abs(observed - p2.sum().item()) < 5 * math.sqrt((p2 * (1 - p2)).sum().item()), (observed, n)
    # and without pairs the draw is the one it always was (the same generator calls)
    t1, xt1, _ = method.draw_noise(x0, scored, torch.Generator().manual_seed(2))
    torch.testing.assert_close(t1, t[:B])
    assert torch.equal(xt1, xt[:B])


def test_complementary_masks_are_mdlms_only():
    for name in ("sedd", "d3pm", "bd3lm", "ar"):
        with pytest.raises(ConfigError, match="complementary_masks is mdlm's"):
            MethodConfig(name=name, complementary_masks=True)


def test_mean_gradient_agreement_is_about_one_for_unbiased_estimators_and_large_for_a_biased_one():
    import dataclasses

    from seqdiff.evaluation.estimator_variance import mean_gradient_agreement

    net = _Linear()
    data = torch.randint(0, 3, (8, 5), generator=torch.Generator().manual_seed(4))

    class Scaled(MDLM):  # a biased estimator: 1.3 x the NELBO
        def loss(self, *a, **kw):
            out = super().loss(*a, **kw)
            return dataclasses.replace(out, loss=1.3 * out.loss)

    def factory(sampling, **options):
        cls = Scaled if sampling == "uniform" else MDLM  # "uniform" stands in for the biased one here
        return cls(MethodConfig(time_sampling="antithetic" if sampling == "uniform" else sampling), TOK)

    est = [Estimator("antithetic"), Estimator("mask_count"), Estimator("uniform")]
    means: dict = {}
    stats = measure(factory, net, lambda k, rows: data if rows is None else data[:rows], est, 400, seed=1,
                    mean_gradients=means)
    assert set(means) == {"antithetic", "mask_count", "uniform"} and means["antithetic"].dtype == torch.float64
    agree = mean_gradient_agreement(means, stats, "antithetic")
    assert agree["mask_count"] < 4, agree  # chi-square-like with mean 1 over many coordinates
    assert agree["uniform"] > 20, agree


def test_mask_count_importance_gains_closed_forms():
    """experiments.mask_count_moments.gains: constant m2 gains nothing; m2 = c / k (and ||E g||^2 = 0) gains
    mean(1/k) / mean(k^-1/2)^2, and there q ∝ k^(-1/2) is the optimal proposal."""
    import numpy as np

    from experiments.mask_count_moments import gains

    n = 64
    flat = gains([1, n], [2.0, 2.0], 0.5, n)
    assert flat["optimal_variance_ratio"] == pytest.approx(1.0) and flat["root_k_variance_ratio"] > 0
    k = np.arange(1, n + 1)
    g = gains(list(k), list(3.0 / k), 0.0, n)
    expected = np.mean(1 / k) / np.mean(k ** -0.5) ** 2
    assert g["optimal_variance_ratio"] == pytest.approx(expected, rel=1e-9)
    assert g["root_k_variance_ratio"] == pytest.approx(expected, rel=1e-9)
    assert g["optimal_second_moment"] <= g["root_k_second_moment"] * (1 + 1e-12)



def test_mask_count_inverse_sqrt_law_draws_k_from_q_with_weight_z_over_sqrt_k():
    """mask_count_law=inverse_sqrt: k ~ q(k) = k^(-1/2) / Z_n on 1..n (n = the row's scored tokens), weight
    Z_n / sqrt(k) = (n / k) p(k) / q(k); padding never masked; complementary partners k' = n + 1 - k weigh
    Z_n sqrt(k) / k'."""
    method = MDLM(MethodConfig(time_sampling="mask_count", mask_count_law="inverse_sqrt"), TOK)
    x0 = torch.tensor([[0, 1, 2, 0, 1, 2], [2, 1, 0, TOK.pad_id, TOK.pad_id, TOK.pad_id]]).repeat(4000, 1)
    scored = Batch(x0).scored(TOK.pad_id)
    _, xt, weight = method.draw_noise(x0, scored, torch.Generator().manual_seed(0))
    masked = xt == TOK.mask_id
    assert not (masked & ~scored).any()
    for row, n in ((0, 6), (1, 3)):
        k = masked[row::2].sum(1)
        z = sum(j ** -0.5 for j in range(1, n + 1))
        counts = torch.bincount(k, minlength=n + 1)
        expected = torch.tensor([len(k) * j ** -0.5 / z for j in range(1, n + 1)])
        assert counts[0] == 0 and ((counts[1:].double() - expected).abs() < 5 * expected.sqrt()).all(), counts
        torch.testing.assert_close(weight[row::2], (z / k.double().sqrt()).float())
    _, xt2, w2 = method.draw_noise(x0, scored, torch.Generator().manual_seed(0), complementary=True)
    B = x0.shape[0]
    k1, k2 = (xt2[:B] == TOK.mask_id).sum(1), (xt2[B:] == TOK.mask_id).sum(1)
    n = scored.sum(1)
    assert torch.equal(k1 + k2, n + 1)
    z = torch.tensor([sum(j ** -0.5 for j in range(1, int(m) + 1)) for m in n], dtype=torch.float64)
    torch.testing.assert_close(w2[B:], (z * k1.double().sqrt() / k2).float())
    assert MDLM(MethodConfig(time_sampling="mask_count", mask_count_law="inverse_sqrt"), TOK).masked_share() == 1 / 3


def test_mask_count_law_refusals():
    with pytest.raises(ConfigError, match="law of mask_count's k"):
        MethodConfig(time_sampling="antithetic", mask_count_law="inverse_sqrt")
    with pytest.raises(ConfigError, match="not allowed"):
        MethodConfig(time_sampling="mask_count", mask_count_law="sqrt")


# ------------------------------------------------------------------------------ time_sampling=auto (the default)
def test_auto_is_mdlms_inverse_sqrt_mask_count_where_it_applies_and_antithetic_elsewhere():
    from seqdiff.methods import BD3LM, D3PM, SEDD

    assert MethodConfig().time_sampling == "auto"
    auto = MDLM(MethodConfig(), TOK)
    assert (auto.time_sampling, auto.mask_count_law) == ("mask_count", "inverse_sqrt")
    for method in (MDLM(MethodConfig(num_timesteps=8), TOK), MDLM(MethodConfig(subs=False), TOK),
                   D3PM(MethodConfig(name="d3pm"), TOK), BD3LM(MethodConfig(name="bd3lm", block_size=4), TOK)):
        assert method.time_sampling == "antithetic", method.name
    # explicit choices are kept, and auto may carry a law (auto chooses its own)
    assert MDLM(MethodConfig(time_sampling="mask_count"), TOK).mask_count_law == "uniform"
    assert MDLM(MethodConfig(time_sampling="uniform"), TOK).time_sampling == "uniform"
    MethodConfig(mask_count_law="inverse_sqrt")
    # a time-conditioned backbone: auto draws times instead of refusing (explicit mask_count is refused above)
    net = TinyNet(3)
    net.config.time_conditioning = True
    auto.check_backbone(net)
    assert auto.time_sampling == "antithetic"
    net.config.time_conditioning = False
    auto.check_backbone(net)
    assert (auto.time_sampling, auto.mask_count_law) == ("mask_count", "inverse_sqrt")
    # sedd draws antithetic times under auto: the same draws as asked for by name
    a = SEDD(MethodConfig(name="sedd"), TOK).sample_times(8, "cpu", torch.Generator().manual_seed(0))
    b = SEDD(MethodConfig(name="sedd", time_sampling="antithetic"), TOK).sample_times(8, "cpu",
                                                                                     torch.Generator().manual_seed(0))
    assert torch.equal(a, b)


def test_auto_draws_exactly_what_inverse_sqrt_mask_count_draws():
    """So the default is unbiased by test_mask_count_mc_loss_unbiased[inverse_sqrt]."""
    net, L = TinyNet(4), 4
    x0 = torch.randint(0, 3, (64, L), generator=torch.Generator().manual_seed(3))
    auto = MDLM(MethodConfig(), TOK).loss(net, Batch(x0), torch.Generator().manual_seed(7))
    named = MDLM(MethodConfig(time_sampling="mask_count", mask_count_law="inverse_sqrt"), TOK).loss(
        net, Batch(x0), torch.Generator().manual_seed(7))
    assert torch.equal(auto.nll_sum, named.nll_sum) and torch.equal(auto.loss, named.loss)
