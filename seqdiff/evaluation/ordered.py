"""Exact likelihood of an MDLM denoiser decoded in a fixed order (`seqdiff eval --order`).

A time-agnostic SUBS denoiser x_theta defines, for every order sigma of a sequence's n scored positions, an
autoregressive model over that order:

    p_sigma(x) = prod_i x_theta(z_i)[x_sigma(i)],   z_i = x with positions sigma(i), ..., sigma(n) masked.

Each factor is a distribution over the real tokens (SUBS gives MASK zero mass), so p_sigma is a normalized
model of x and -log p_sigma(x) is an exact NLL, not a bound. The untruncated continuous-time NELBO that MDLM
reports (`method.time_sampling: mask_count`: sum_k (1/k) E[masked cross-entropy | k masked]) is the mean of
-log p_sigma(x) over uniformly random orders (Ou et al. 2024, arXiv 2406.03736; tested here by enumerating
every order): the bound averages the orders, and one fixed order can score below it. A uniform mixture of
orders is a model too, p(x) = mean_sigma p_sigma(x), with -log p(x) <= mean_sigma -log p_sigma(x) (Jensen).

Sampling from p_sigma is MDLM's own reverse process with a fixed unmasking order and one token per step, so
this is the exact likelihood of that sampler. MDLM's continuous-time reverse process (the first-hitting sampler,
`seqdiff.samplers.mdlm_first_hitting`) reveals the masked positions in a uniformly random order, one at a time,
so its exact likelihood is p(x) = E_sigma p_sigma(x) over uniform orders: the NELBO is Jensen's bound on it with
the orders as latent variables. `random:K` draws K uniform orders per sequence and reports the importance-weighted
bound -log (1/K) sum_k p_sigma_k(x) (Burda et al. 2016, with the uniform order as proposal): an upper bound on
that exact NLL at every K, no looser in expectation as K grows, and the NELBO's expectation at K = 1.

Costs n forwards per sequence and order (the target position's head only, with the sparse head); not a training
objective.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from seqdiff.config import ConfigError
from seqdiff.methods import Batch

ORDERS: dict[str, Callable[[int], Tensor]] = {
    "left_to_right": lambda n: torch.arange(n),
    "right_to_left": lambda n: torch.arange(n - 1, -1, -1),
}
"""Decoding orders by name: the permutation of positions 0..n-1 (the first one revealed first)."""


RANDOM = "random:"
"""`random:K`: K uniformly random orders per sequence, combined into the importance-weighted bound."""


def random_orders(spec: str) -> int | None:
    """K of 'random:K' (checked), None for fixed orders."""
    if not spec.startswith(RANDOM):
        return None
    k = spec[len(RANDOM):]
    if not k.isdigit() or int(k) < 1:
        raise ConfigError(f"eval.order={spec!r}: random orders are written random:K with K >= 1 orders per sequence")
    return int(k)


def is_exact(spec: str) -> bool:
    """Fixed orders (and their mixtures) give exact likelihoods; random:K an upper bound."""
    return random_orders(spec) is None


def parse_orders(spec: str) -> tuple[str, ...]:
    """'left_to_right', a uniform mixture 'left_to_right+right_to_left', or 'random:K' -> the parts, checked."""
    if random_orders(spec) is not None:
        return (spec,)
    names = tuple(spec.split("+"))
    for name in names:
        if name not in ORDERS:
            raise ConfigError(f"eval.order: unknown order {name!r}; choose from {', '.join(sorted(ORDERS))}, a "
                              f"mixture joined by '+', or random:K")
    if len(set(names)) != len(names):
        raise ConfigError(f"eval.order={spec!r} names an order twice")
    return names


def check_ordered(method, backbone: nn.Module) -> None:
    """The decomposition needs MDLM's SUBS denoiser without a time input (which t would step i get?)."""
    if method.name != "mdlm" or not getattr(method, "subs", False):
        raise ConfigError(f"eval.order scores an MDLM (SUBS) denoiser in a fixed order; this checkpoint is "
                          f"{method.name}{'' if getattr(method, 'subs', True) else ' without SUBS'}")
    if getattr(getattr(backbone, "config", None), "time_conditioning", False):
        raise ConfigError("eval.order needs a time-agnostic denoiser; this backbone is time-conditioned")


@torch.no_grad()
def ordered_log_likelihoods(method, backbone: nn.Module, batch: Batch, order: Tensor,
                            rows_per_forward: int = 512) -> Tensor:
    """(B,) float64 log p_sigma(x) of each row over its scored positions, revealed in `order`: a permutation of
    0..L-1, (L,) for every row or (B, L) one per row. Unscored positions stay visible throughout, as the NELBO
    never masks them."""
    batch = Batch.from_any(batch)
    x0 = batch.input_ids  # (B, L)
    B, L = x0.shape
    scored = batch.scored(method.pad_id)  # (B, L)
    order = order.to(x0.device).expand(B, L)  # (B, L)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(L, device=x0.device).expand(B, L))  # (B, L)
    row, step = scored.gather(1, order).nonzero(as_tuple=True)  # (N,) every (row, step) whose position is scored
    target = order[row, step]  # (N,) the position each step predicts
    total = torch.zeros(B, dtype=torch.float64, device=x0.device)
    sparse = getattr(backbone, "selects_outputs", False)
    for start in range(0, row.numel(), rows_per_forward):
        r, s, p = (v[start:start + rows_per_forward] for v in (row, step, target))  # (n,)
        hidden = (rank[r] >= s[:, None]) & scored[r]  # (n, L) not yet revealed at step s
        zt = method.mask_where(x0[r], hidden)
        t = hidden.sum(-1).double() / scored[r].sum(-1).double()  # (n,) the share masked (unused: time-agnostic)
        kwargs = {"noise_level": method.noise_level(t)}
        if batch.attention_mask is not None:
            kwargs["attention_mask"] = batch.attention_mask[r]
        kwargs.update({k: v[r] for k, v in batch.packing().items()})
        flat = torch.arange(r.numel(), device=x0.device) * L + p  # (n,) flat positions of the targets
        if sparse:
            logits = backbone(zt, output_index=flat, exclude_id=method.mask_id, **kwargs)  # (n, V)
        else:
            logits = method.subs_logits(backbone(zt, **kwargs)).flatten(0, 1)[flat]  # (n, V)
        log_p = torch.log_softmax(logits.double(), -1).gather(-1, x0[r, p][:, None])[:, 0]  # (n,)
        total.index_add_(0, r, log_p)
    return total


@torch.no_grad()
def ordered_nll(method, backbone: nn.Module, batch: Batch, orders: tuple[str, ...],
                generator: torch.Generator | None = None, rows_per_forward: int = 512) -> tuple[Tensor, Tensor]:
    """(float64 sum over rows of -log p(x) under the uniform mixture of `orders`, number of scored tokens): the
    pair `Method.nll` returns, exact for fixed orders; for ('random:K',) the importance-weighted bound over K
    orders drawn per row from `generator`."""
    batch = Batch.from_any(batch)
    B, L = batch.input_ids.shape
    k = random_orders(orders[0])
    if k is not None:
        device = batch.input_ids.device
        perms = [torch.rand(B, L, generator=generator, device=device).argsort(1) for _ in range(k)]  # K x (B, L)
    else:
        perms = [ORDERS[name](L) for name in orders]
    per_order = torch.stack([ordered_log_likelihoods(method, backbone, batch, perm, rows_per_forward)
                             for perm in perms])  # (K, B)
    log_mix = torch.logsumexp(per_order, 0) - torch.log(torch.tensor(float(len(perms)), dtype=torch.float64))
    return -log_mix.sum().cpu(), batch.scored(method.pad_id).sum().to(torch.float64).cpu()
