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
