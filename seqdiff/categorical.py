"""Categorical sampling in float64 through an explicit generator.

Gumbel-max in float64: with float32 (or bf16) Gumbel noise the largest logits win too often, which lowers
sample entropy and flatters generative perplexity (Zheng et al. 2024, "Masked diffusion models are secretly
time-agnostic masked models and exploit inaccurate categorical sampling").

Nucleus (top-p) sampling (Holtzman et al. 2020) keeps the smallest set of tokens whose mass reaches p and
renormalizes; ties in probability are broken toward the lower token id, so the set is deterministic.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.errors import SeqdiffError


def sample_categorical(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Draw one index per row of `probs` (..., V), which need not be normalized. Returns (...) long."""
    probs = probs.to(torch.float64)
    u = torch.rand(probs.shape, generator=generator, device=probs.device, dtype=torch.float64)
    # argmax_v p_v / E_v with E_v ~ Exp(1) is the Gumbel-max trick written without logs of p.
    exp_noise = -torch.log1p(-u)  # Exp(1); log1p(-u) avoids log(0) since u < 1
    return (probs / exp_noise).argmax(dim=-1)


def top_p_filter(probs: Tensor, top_p: float = 1.0) -> Tensor:
    """Nucleus filter on float64 probabilities (..., V): the smallest set of tokens whose mass reaches
    `top_p`, renormalized; everything else gets zero. Rows need not be normalized (mass is relative to the
    row sum). Ties are broken toward the lower token id. top_p = 1 returns `probs` unchanged."""
    if not 0.0 < top_p <= 1.0:
        raise SeqdiffError(f"top_p must be in (0, 1], got {top_p}")
    probs = probs.to(torch.float64)
    if top_p == 1.0:
        return probs
    probs = probs / probs.sum(-1, keepdim=True)
    # stable descending sort: equal probabilities keep index order, so the lower id comes first
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # (..., V)
    cum = sorted_p.cumsum(-1)
    mass_before = torch.cat([torch.zeros_like(cum[..., :1]), cum[..., :-1]], dim=-1)  # mass ranked above
    keep_sorted = mass_before < top_p  # a token is needed while the mass so far is below p
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    kept = torch.where(keep, probs, torch.zeros_like(probs))
    return kept / kept.sum(-1, keepdim=True)


def probs_from_logits(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """Softmax in float64 with temperature (temperature 0 is greedy: a one-hot on the argmax), then the
    nucleus filter when top_p < 1."""
    logits = logits.to(torch.float64)
    if temperature < 0:
        raise SeqdiffError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)  # no int64 one_hot copy
    return top_p_filter(torch.softmax(logits / temperature, dim=-1), top_p)
