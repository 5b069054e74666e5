"""Exact likelihood of an MDLM denoiser in a fixed decoding order (seqdiff.evaluation.ordered)."""

import itertools
import math

import pytest
import torch
from torch import nn

from seqdiff.config import ConfigError, MethodConfig, ModelConfig
from seqdiff.evaluation.ordered import (
    ORDERS,
    check_ordered,
    is_exact,
    ordered_log_likelihoods,
    ordered_nll,
    parse_orders,
    random_orders,
)
from seqdiff.methods import AR, MDLM, Batch
from tests.test_mdlm import TOK, TinyNet
from tests.test_time_sampling import _exact_mask_count_nelbo

METHOD = MDLM(MethodConfig(), TOK)


class NoPad(nn.Module):
    """TinyNet with no mass on PAD, so that every sequence over the other real tokens is scored in full."""

    def __init__(self, seq_len: int):
        super().__init__()
        self.net = TinyNet(seq_len).double()
        self.config = self.net.config

    def forward(self, input_ids, **kwargs):
        return self.net(input_ids, **kwargs).index_fill(-1, torch.tensor([TOK.pad_id]), float("-inf"))


def _brute_force(net, x0, order):
    """log p_sigma(x) of each row, one forward per step, written out without the library's batching."""
    out = torch.zeros(x0.shape[0], dtype=torch.float64)
    for b in range(x0.shape[0]):
        z = torch.full_like(x0[b], TOK.mask_id)
        for p in order.tolist():
            logits = net(z[None]).double()[0, p]
            logits[TOK.mask_id] = float("-inf")
            out[b] += torch.log_softmax(logits, -1)[x0[b, p]]
            z[p] = x0[b, p]
    return out


def test_every_order_is_a_normalized_model():
    L = 3
    net = NoPad(L)
    real = [i for i in range(TOK.vocab_size) if i not in (TOK.mask_id, TOK.pad_id)]
    xs = torch.tensor(list(itertools.product(real, repeat=L)))  # every sequence the model can put mass on
    for name, order in ORDERS.items():
        total = ordered_log_likelihoods(METHOD, net, Batch(xs), order(L)).exp().sum().item()
        assert total == pytest.approx(1.0, abs=1e-12), name


def test_matches_one_forward_per_step_and_batches_alike():
    L = 5
    net = TinyNet(L).double()  # float64 throughout: the identities hold to round-off
    x0 = torch.randint(0, 3, (4, L), generator=torch.Generator().manual_seed(1))
    order = torch.tensor([2, 0, 4, 1, 3])
    expected = _brute_force(net, x0, order)
    for rows in (1, 3, 512):
        got = ordered_log_likelihoods(METHOD, net, Batch(x0), order, rows_per_forward=rows)
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_the_nelbo_is_the_mean_over_every_order():
    """sum_k (1/k) E[masked CE | k masked] = mean over all n! orders of -log p_sigma: the MDLM bound averages these
    exact likelihoods (the identity `method.time_sampling=mask_count` estimates)."""
    L = 4
    net = TinyNet(L).double()  # float64 throughout: the identities hold to round-off
    x0 = torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(2))
    orders = list(itertools.permutations(range(L)))
    mean = -torch.stack([ordered_log_likelihoods(METHOD, net, Batch(x0), torch.tensor(o)) for o in orders]).mean(0)
    with torch.no_grad():
        torch.testing.assert_close(mean, _exact_mask_count_nelbo(net, x0), rtol=1e-9, atol=1e-9)
    # ... and the best single order of each row is below it: a fixed order can beat the bound
    best = -torch.stack([ordered_log_likelihoods(METHOD, net, Batch(x0), torch.tensor(o)) for o in orders]).max(0)[0]
    assert bool((best < mean).all())


def test_mixture_is_the_log_mean_exp_and_below_the_mean():
    L = 5
    net = TinyNet(L).double()  # float64 throughout: the identities hold to round-off
    x0 = torch.randint(0, 3, (6, L), generator=torch.Generator().manual_seed(3))
    batch = Batch(x0)
    a, b = (ordered_log_likelihoods(METHOD, net, batch, ORDERS[n](L)) for n in ("left_to_right", "right_to_left"))
    nll, count = ordered_nll(METHOD, net, batch, ("left_to_right", "right_to_left"))
    expected = -(torch.logaddexp(a, b) - math.log(2)).sum()
    assert nll.item() == pytest.approx(expected.item(), rel=1e-12) and count.item() == 6 * L
    assert nll.item() <= -(a + b).sum().item() / 2  # Jensen
    single, _ = ordered_nll(METHOD, net, batch, ("left_to_right",))
    assert single.item() == pytest.approx(-a.sum().item(), rel=1e-12)


def test_unscored_positions_stay_visible_and_cost_nothing():
    L = 5
    net = TinyNet(L).double()  # float64 throughout: the identities hold to round-off
    x0 = torch.tensor([[0, 1, 2, 1, 0], [2, 2, 0, TOK.pad_id, TOK.pad_id]])
    loss_mask = torch.tensor([[True, False, True, True, True], [True] * 5])
    got = ordered_log_likelihoods(METHOD, net, Batch(x0, loss_mask=loss_mask), ORDERS["left_to_right"](L))
    expected = torch.zeros(2, dtype=torch.float64)
    for b in range(2):
        scored = loss_mask[b] & (x0[b] != TOK.pad_id)
        z = torch.where(scored, TOK.mask_id, x0[b])
        for p in range(L):
            if scored[p]:
                logits = net(z[None]).double()[0, p]
                logits[TOK.mask_id] = float("-inf")
                expected[b] += torch.log_softmax(logits, -1)[x0[b, p]]
                z[p] = x0[b, p]
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    _, count = ordered_nll(METHOD, net, Batch(x0, loss_mask=loss_mask), ("left_to_right",))
    assert count.item() == 4 + 3


@pytest.mark.parametrize("conv", [0, 5], ids=["plain", "local_conv"])
def test_dit_sparse_head_equals_the_full_head(conv):
    from seqdiff.backbones.dit import DiT

    torch.manual_seed(0)
    net = DiT(ModelConfig(preset=None, hidden_size=32, n_layers=2, n_heads=2, max_seq_len=12, local_conv=conv,
                          time_conditioning=False), TOK.vocab_size, causal=False).eval()

    class Full(nn.Module):  # the same weights without the sparse head
        def __init__(self):
            super().__init__()
            self.net, self.config = net, net.config

        def forward(self, input_ids, **kwargs):
            return self.net(input_ids, **kwargs)

    x0 = torch.randint(0, 3, (3, 12), generator=torch.Generator().manual_seed(4))
    order = ORDERS["right_to_left"](12)
    sparse = ordered_log_likelihoods(METHOD, net, Batch(x0), order, rows_per_forward=7)
    full = ordered_log_likelihoods(METHOD, Full(), Batch(x0), order)
    torch.testing.assert_close(sparse, full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(full, _brute_force(net, x0, order), rtol=1e-5, atol=1e-5)


def test_one_order_per_row_is_each_rows_own_order():
    L = 5
    net = TinyNet(L).double()
    x0 = torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(6))
    orders = torch.stack([torch.randperm(L, generator=torch.Generator().manual_seed(i)) for i in range(3)])
    got = ordered_log_likelihoods(METHOD, net, Batch(x0), orders, rows_per_forward=4)
    expected = torch.cat([_brute_force(net, x0[i:i + 1], orders[i]) for i in range(3)])
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_the_mixture_of_every_order_is_the_law_of_the_continuous_time_sampler():
    """E_sigma p_sigma(x) over all n! orders equals the enumerated law of MDLM's continuous-time reverse process
    (reveal a uniformly chosen masked position), which the first-hitting sampler draws (tests/test_first_hitting)."""
    from tests.test_first_hitting import _continuous_time_law

    L = 3
    net = TinyNet(L, seed=3).eval()
    law = _continuous_time_law(net, L)  # (V^L,) over every sequence
    real = [i for i in range(TOK.vocab_size) if i not in (TOK.mask_id, TOK.pad_id)]  # PAD would be unscored
    xs = torch.tensor(list(itertools.product(real, repeat=L)))
    per_order = torch.stack([ordered_log_likelihoods(METHOD, net, Batch(xs), torch.tensor(o))
                             for o in itertools.permutations(range(L))])  # (6, N)
    mixture = per_order.exp().mean(0)
    index = (xs * torch.tensor([TOK.vocab_size**2, TOK.vocab_size, 1])).sum(-1)
    torch.testing.assert_close(mixture, law[index], rtol=1e-5, atol=1e-9)
    assert not torch.allclose(per_order[0].exp(), law[index], rtol=1e-2)  # one order alone is another model


def test_random_orders_give_an_importance_weighted_bound_that_tightens_with_k():
    """E[-log (1/K) sum_k p_sigma_k(x)] >= -log E_sigma p_sigma(x) at every K, decreasing in K, with the NELBO
    (the mean over orders) at K = 1: checked against the enumeration over all orders, many draws per row."""
    L = 4
    net = TinyNet(L).double()
    x0 = torch.randint(0, 3, (2, L), generator=torch.Generator().manual_seed(7))
    per_order = torch.stack([ordered_log_likelihoods(METHOD, net, Batch(x0), torch.tensor(o))
                             for o in itertools.permutations(range(L))])  # (24, 2)
    exact = -(torch.logsumexp(per_order, 0) - math.log(per_order.shape[0])).sum().item()
    nelbo = -per_order.mean(0).sum().item()
    reps = 3000
    batch = Batch(x0.repeat(reps, 1))
    bounds = {}
    for k in (1, 4, 16):
        nll, count = ordered_nll(METHOD, net, batch, (f"random:{k}",), torch.Generator().manual_seed(k))
        bounds[k] = nll.item() / reps
        assert count.item() == reps * 2 * L
    assert bounds[1] == pytest.approx(nelbo, rel=0.01)
    assert nelbo - exact > 0.1  # the orders disagree enough for K to matter
    assert bounds[1] > bounds[4] > bounds[16] > exact
    assert bounds[16] - exact < (nelbo - exact) / 3


def test_order_specs():
    assert random_orders("random:16") == 16 and random_orders("left_to_right") is None
    assert not is_exact("random:2") and is_exact("left_to_right+right_to_left")
    assert parse_orders("random:3") == ("random:3",)
    for bad in ("random:0", "random:x", "random:"):
        with pytest.raises(ConfigError, match="random:K"):
            parse_orders(bad)


def test_refusals():
    with pytest.raises(ConfigError, match="unknown order 'zigzag'"):
        parse_orders("left_to_right+zigzag")
    with pytest.raises(ConfigError, match="twice"):
        parse_orders("left_to_right+left_to_right")
    net = TinyNet(4)
    with pytest.raises(ConfigError, match="this checkpoint is ar"):
        check_ordered(AR(MethodConfig(name="ar"), TOK), net)
    with pytest.raises(ConfigError, match="without SUBS"):
        check_ordered(MDLM(MethodConfig(subs=False), TOK), net)
    net.config.time_conditioning = True
    with pytest.raises(ConfigError, match="time-conditioned"):
        check_ordered(METHOD, net)
