"""Tiny exact models for the EDLM tests: an AR model given by an explicit joint, and a table energy."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import torch
from torch import Tensor, nn

from seqdiff.config import MethodConfig
from seqdiff.edlm.base import Energy
from seqdiff.methods import AR
from seqdiff.tokenizers import CharTokenizer

TOK = CharTokenizer(alphabet="abc", normalize="none")
K = 3  # regular symbols, ids 0..2
V, MASK = TOK.vocab_size, TOK.mask_id


def states(L: int) -> Tensor:
    return torch.tensor(list(itertools.product(range(K), repeat=L)))  # (K^L, L)


def index_of(x: Tensor) -> Tensor:
    """(..., L) sequences over 0..K-1 -> (...,) row of `states(L)`."""
    L = x.shape[-1]
    return (x * K ** torch.arange(L - 1, -1, -1)).sum(-1)


class JointAR(nn.Module):
    """Causal 'backbone' whose next-token law is the exact conditional of a joint over K^L sequences.
    Input [BOS, x1 .. x_{L-1}] -> logits (N, L, V) of x_l given x_{<l}."""

    def __init__(self, joint: Tensor, L: int):
        super().__init__()
        self.register_buffer("states", states(L))
        self.register_buffer("joint", joint.reshape(-1).double())
        self.dummy = nn.Parameter(torch.zeros(()))
        self.config = SimpleNamespace(time_conditioning=False, max_seq_len=L)

    def forward(self, input_ids: Tensor, noise_level=None, attention_mask=None, kv_cache=None) -> Tensor:
        N, L = input_ids.shape
        logits = torch.full((N, L, V), float("-inf"), dtype=torch.float64)
        for pos in range(L):
            prefix = input_ids[:, 1 : pos + 1]  # (N, pos)
            agree = (self.states[None, :, :pos] == prefix[:, None]).all(-1)  # (N, S)
            w = self.joint[None] * agree
            probs = torch.stack([(w * (self.states[None, :, pos] == v)).sum(-1) for v in range(K)], -1)
            logits[:, pos, :K] = (probs / probs.sum(-1, keepdim=True)).log()
        return logits.float() + 0 * self.dummy


def ar_model(joint: Tensor, L: int) -> SimpleNamespace:
    """What the AR energies read from a LoadedModel."""
    return SimpleNamespace(backbone=JointAR(joint, L), method=AR(MethodConfig(name="ar"), TOK), tokenizer=TOK,
                           path="toy-ar")


def ar_log_prob(joint: Tensor, x: Tensor) -> Tensor:
    return joint.reshape(-1).double()[index_of(x)].log()


class TableEnergy(Energy):
    """E(x0) from a table over the K^L sequences (ignores x_t)."""

    name = "table"

    def __init__(self, table: Tensor):
        self.table = table.double()

    def energy(self, x0: Tensor, xt: Tensor, log_mu: Tensor) -> Tensor:
        return self.table[index_of(x0.clamp(max=K - 1))]


class CountEnergy(Energy):
    """E = scale * (number of `token`s): any vocabulary, a smooth preference the sampler can act on."""

    name = "count"

    def __init__(self, scale: float = 0.7, token: int = 0):
        self.scale, self.token = scale, token

    def energy(self, x0: Tensor, xt: Tensor, log_mu: Tensor) -> Tensor:
        return self.scale * (x0 == self.token).sum(-1).double()
