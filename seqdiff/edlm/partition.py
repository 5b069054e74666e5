"""Estimating log Z(x_t) = log E_{x0 ~ mu}[exp(-E(x0, x_t))] from n draws (EDLM, Theorem 1).

With weights w_i = exp(-E_i) of n draws from mu, Z_n = mean(w) is unbiased for Z, so by Jensen log Z_n
underestimates log Z: its bias is -Var(w) / (2 n Z^2) + O(1/n^2). Plugged into an NLL bound that would break
the bound. The corrected estimate

    (2n - 1) log Z_n - 2 (n - 1) log Z_{n-1}

cancels the 1/n term of the bias and leaves +Var(w) / (2 n Z^2) + O(1/n^2): biased upward, so the NLL
estimate stays an upper bound (in expectation, for n large enough that the O(1/n^2) term is small).
log Z_{n-1} is the mean over the n leave-one-out subsets of log(mean of the other n - 1 weights): the same
expectation as one subset, with less variance. Everything in log space (logsumexp), float64.
A single finite weight among n makes a leave-one-out term log 0 and the corrected estimate +inf: an
infinite (still valid) upper bound.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from seqdiff.errors import SeqdiffError


def log_mean_exp(log_w: Tensor, dim: int = -1) -> Tensor:
    return torch.logsumexp(log_w, dim=dim) - math.log(log_w.shape[dim])


def leave_one_out_log_mean_exp(log_w: Tensor) -> Tensor:
    """(..., n) -> (..., n): entry j is log(mean of exp(log_w) over the other n - 1 entries)."""
    n = log_w.shape[-1]
    eye = torch.eye(n, dtype=torch.bool, device=log_w.device)
    others = log_w[..., None, :].expand(*log_w.shape[:-1], n, n).masked_fill(eye, float("-inf"))  # (..., n, n)
    return torch.logsumexp(others, dim=-1) - math.log(n - 1)


def log_partition_estimates(log_w: Tensor) -> tuple[Tensor, Tensor]:
    """(plain log Z_n, corrected (2n-1) log Z_n - 2(n-1) mean_j log Z_{n-1}^(-j)) from log-weights (..., n)."""
    n = log_w.shape[-1]
    if n < 2:
        raise SeqdiffError(f"the corrected log-partition estimate needs n >= 2 draws, got {n}")
    log_w = log_w.double()
    plain = log_mean_exp(log_w)
    loo = leave_one_out_log_mean_exp(log_w).mean(-1)
    corrected = (2 * n - 1) * plain - 2 * (n - 1) * loo
    # every weight zero: both estimates are log 0 (the formula alone would give -inf + inf = nan)
    return plain, torch.where(torch.isneginf(plain), plain, corrected)
