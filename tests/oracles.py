"""Exact denoisers for tiny distributions, used as brute-force references in the tests."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch
from torch import Tensor, nn


class ProductOracle(nn.Module):
    """Data = independent categoricals per position; the exact SUBS denoiser is the marginal pi_l."""

    def __init__(self, marginals: Tensor, vocab_size: int):
        super().__init__()
        L, K = marginals.shape  # K regular symbols (ids 0..K-1)
        logits = torch.full((L, vocab_size), float("-inf"))
        logits[:, :K] = marginals.log()
        self.register_buffer("table", logits)
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=False, max_seq_len=L)

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None, kv_cache=None) -> Tensor:
        B, L = input_ids.shape
        return self.table[:L].expand(B, L, -1) + 0 * self.dummy


class JointOracle(nn.Module):
    """Data = an arbitrary joint over K^L sequences; the exact denoiser conditions on unmasked tokens."""

    def __init__(self, joint: Tensor, seq_len: int, num_symbols: int, vocab_size: int, mask_id: int):
        super().__init__()
        states = torch.tensor(list(itertools.product(range(num_symbols), repeat=seq_len)))  # (K^L, L)
        self.register_buffer("states", states)
        self.register_buffer("joint", joint.reshape(-1))
        self.K, self.V, self.mask_id = num_symbols, vocab_size, mask_id
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=False, max_seq_len=seq_len)

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None, kv_cache=None) -> Tensor:
        # consistent[b, s]: state s agrees with every unmasked token of row b
        known = input_ids != self.mask_id  # (B, L)
        agree = (self.states[None] == input_ids[:, None]) | ~known[:, None]  # (B, S, L)
        weight = self.joint[None] * agree.all(-1)  # (B, S)
        onehot = torch.nn.functional.one_hot(self.states, self.K).to(weight.dtype)  # (S, L, K)
        probs = torch.einsum("bs,slk->blk", weight, onehot)
        probs = probs / probs.sum(-1, keepdim=True)
        logits = torch.full((*input_ids.shape, self.V), float("-inf"))
        logits[..., : self.K] = probs.log()
        return logits + 0 * self.dummy


def _transition(method, noise_level: Tensor, batch: int) -> Tensor:
    """exp(sigma Q) per row, (B, V, V) float64, from the graph's dense rate matrix (not its closed forms)."""
    sigma = noise_level.double().reshape(-1).expand(batch) if noise_level.numel() == 1 else noise_level.double()
    Q = method.graph.rate_matrix()
    levels, which = torch.unique(sigma, return_inverse=True)  # samplers pass one level for the whole batch
    return torch.linalg.matrix_exp(levels[:, None, None] * Q)[which], sigma


class ProductScoreOracle(nn.Module):
    """Exact SEDD log-scores for independent positions: p_t^l = exp(sigma Q) pi_l, s_y = p_t^l(y) / p_t^l(x^l).

    Returns what the backbone of `method` must output: the log-score minus the method's scale-by-sigma offset.
    """

    def __init__(self, marginals: Tensor, method):
        super().__init__()
        L, K = marginals.shape
        pi = torch.zeros(L, method.vocab_size, dtype=torch.float64)
        pi[:, :K] = marginals.double() / marginals.double().sum(-1, keepdim=True)
        self.register_buffer("pi", pi)
        self.method = method
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=True, max_seq_len=L)

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None, kv_cache=None) -> Tensor:
        B, L = input_ids.shape
        P, sigma = _transition(self.method, noise_level, B)  # (B, V, V)
        p_t = torch.einsum("byk,lk->bly", P, self.pi[:L])  # (B, L, V) marginal law of x_t^l
        log_p = p_t.log()
        log_score = log_p - log_p.gather(-1, input_ids[..., None])
        return (log_score - self.method.score_offset(sigma)[:, None, None]).float() + 0 * self.dummy


class JointScoreOracle(nn.Module):
    """Exact SEDD log-scores for a joint law over K^L sequences, by enumeration of x_0:
    p_t(x) = sum_{x0} p(x0) prod_l P[x^l, x0^l], s(x)^l_y = p_t(x with y at l) / p_t(x)."""

    def __init__(self, joint: Tensor, seq_len: int, num_symbols: int, method):
        super().__init__()
        states = torch.tensor(list(itertools.product(range(num_symbols), repeat=seq_len)))  # (S, L)
        self.register_buffer("states", states)
        self.register_buffer("joint", joint.reshape(-1).double())
        self.method, self.K = method, num_symbols
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=True, max_seq_len=seq_len)

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None, kv_cache=None) -> Tensor:
        B, L = input_ids.shape
        P, sigma = _transition(self.method, noise_level, B)  # (B, V, V): [b, y, k] = p(y | k)
        K = self.K
        rows = P.gather(1, input_ids[..., None].expand(-1, -1, P.shape[-1]))  # (B, L, V): p(x^l | k)
        A = rows[:, torch.arange(L)[None, :], self.states]  # (B, S, L): p(x^l | states[s, l])
        except_l = torch.stack([A[..., [m for m in range(L) if m != pos]].prod(-1) for pos in range(L)], -1)
        onehot = torch.nn.functional.one_hot(self.states, K).double()  # (S, L, K)
        W = torch.einsum("s,bsl,slk->blk", self.joint, except_l, onehot)  # (B, L, K)
        num = torch.einsum("blk,byk->bly", W, P[:, :, :K])  # (B, L, V): p_t(x with y at l)
        log_num = num.log()
        log_score = log_num - log_num.gather(-1, input_ids[..., None])
        return (log_score - self.method.score_offset(sigma)[:, None, None]).float() + 0 * self.dummy
