"""What an EDLM energy is: a scalar E(x0, x_t) per sequence that reweights the frozen MDLM denoiser mu.

EDLM (Xu et al., ICLR 2025, arXiv 2410.21357) replaces MDLM's factorized denoiser by a residual energy-based
model at the level of the whole sequence:

    p(x0 | x_t) = mu(x0 | x_t) exp(-E(x0, x_t)) / Z(x_t),    Z(x_t) = E_{x0 ~ mu(.|x_t)} [exp(-E(x0, x_t))].

mu is a trained MDLM (SUBS: unmasked tokens of x_t are carried over, so every x0 considered agrees with x_t
there). An energy sees candidate sequences x0 (N, L), the noisy x_t they were drawn from (N, L), and
log mu(x0 | x_t) (N,) -- the caller always has mu's output already, so energies that need it (the AR ones)
do not run the MDLM again. Energies return float64 (N,).

`self_normalized` energies have Z(x_t) = 1 exactly (the carry-over AR energy): their likelihood bound needs no
partition-function estimate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import Tensor

from seqdiff.categorical import sample_categorical
from seqdiff.errors import SeqdiffError


class EnergyError(SeqdiffError):
    """An energy that cannot be built or used with this model (unknown kind, unreadable file, vocab mismatch)."""


class Energy(ABC):
    name: ClassVar[str]
    self_normalized: ClassVar[bool] = False
    """Whether Z(x_t) = 1 exactly, so that log p(x0 | x_t) = log mu - E needs no estimate."""

    @classmethod
    def load(cls, path: str, mdlm, device: str = "cpu") -> Energy:
        """The energy stored at `path` (an AR run, an NCE energy file), for the loaded MDLM `mdlm`."""
        raise EnergyError(f"the {cls.name!r} energy cannot be loaded from a file")

    @abstractmethod
    def energy(self, x0: Tensor, xt: Tensor, log_mu: Tensor) -> Tensor:
        """(N,) float64 energies of candidates x0 (N, L) given x_t (N, L); log_mu (N,) = log mu(x0 | x_t)."""

    chunk_elements: ClassVar[int] = 2**27
    """Cap on rows x length x `row_width` per forward pass: an AR energy holds (rows, L, V) logits and float64
    log-probabilities at once, 1.6 GB per row at 1,024 tokens and GPT-2's vocabulary."""

    def row_width(self) -> int:
        """Per-token width of the largest tensor `energy` makes (default 1; the AR energies: the vocabulary)."""
        return 1

    def max_length(self) -> int | None:
        """The longest x0 the energy reads (its network's model.max_seq_len); None: any length."""
        return None

    def __call__(self, x0: Tensor, xt: Tensor, log_mu: Tensor, chunk: int = 256) -> Tensor:
        """`energy` in chunks of `chunk` rows (the sampler scores batch x k candidates at once), fewer where
        `chunk_elements` caps them (long rows, large vocabularies)."""
        chunk = max(1, min(chunk, self.chunk_elements // max(1, x0.shape[-1] * self.row_width())))
        with torch.no_grad():
            return torch.cat([self.energy(x0[i : i + chunk], xt[i : i + chunk], log_mu[i : i + chunk]).double()
                              for i in range(0, x0.shape[0], chunk)])


def check_same_tokenizer(what: str, identity: str, description: str, mdlm) -> None:
    """Refuse an energy whose tokenizer is not the MDLM's (`identity`: its `Tokenizer.identity()`), in one line that
    names `what` (the energy's file or run) and both tokenizers. Equal vocabulary sizes are not enough: a character
    tokenizer over another alphabet of the same size reads the same ids as other characters."""
    if identity == mdlm.tokenizer.identity():
        return
    ours = mdlm.tokenizer.describe()
    same = " (the same size: other symbols or options)" if description == ours else ""
    raise EnergyError(f"{what} reads tokens of another tokenizer ({description}) than the MDLM {mdlm.path} "
                      f"({ours}){same}: an energy must share the MDLM's tokenizer")


def check_energy_length(energy: Energy, given_as: str, length: int, what: str) -> None:
    """Refuse, in one line and before any work, an energy that cannot read sequences of `length` tokens (its
    network's context is shorter). `given_as`: the option as the user gave it (`--energy ar:RUN`); `what`: the
    sequences, after `the {length}-token` (`blocks RUN scores`)."""
    limit = energy.max_length()
    if limit is not None and limit < length:
        raise EnergyError(f"{given_as}: it reads at most {limit} tokens (its model.max_seq_len), fewer than the "
                          f"{length}-token {what}")


def masked_log_mu(probs: Tensor, x0: Tensor, xt: Tensor, mask_id: int) -> Tensor:
    """log mu(x0 | x_t) = sum over masked positions of log mu_l(x0^l | x_t) (SUBS: the carried-over unmasked
    positions contribute log 1 = 0). probs (N, L, V) float64, x0 and xt (N, L) -> (N,) float64."""
    token_p = probs.gather(-1, x0[..., None])[..., 0].double()  # (N, L)
    return torch.where(xt == mask_id, token_p.log(), torch.zeros_like(token_p)).sum(-1)


def candidates_log_mu(probs: Tensor, cands: Tensor, xt: Tensor, mask_id: int) -> Tensor:
    """`masked_log_mu` of k candidates per row without k copies of the probabilities: probs (B, L, V), cands
    (B, k, L), xt (B, L) -> (B, k) float64; the values of masked_log_mu(probs.repeat_interleave(k, 0), ...)."""
    token_p = probs.gather(-1, cands.transpose(1, 2)).transpose(1, 2).double()  # (B, k, L)
    return torch.where(xt[:, None] == mask_id, token_p.log(), torch.zeros_like(token_p)).sum(-1)


def draw_candidates(probs: Tensor, xt: Tensor, mask_id: int, k: int, generator: torch.Generator | None) -> Tensor:
    """k draws x0 ~ mu(. | x_t) per row: (B, L, V) probs, (B, L) x_t -> (B, k, L); unmasked tokens carried over."""
    B, L, V = probs.shape
    draws = sample_categorical(probs[:, None].expand(B, k, L, V), generator)  # (B, k, L)
    return torch.where(xt[:, None] == mask_id, draws, xt[:, None])


def row_uniforms(gens: list[torch.Generator], shape: tuple[int, ...], device) -> Tensor:
    """(len(gens), *shape) float64 uniforms, row r drawn from gens[r] alone -- the draws a one-row call with that
    generator makes, so batching rows changes no row's random stream."""
    return torch.cat([torch.rand((1, *shape), generator=g, device=device, dtype=torch.float64) for g in gens])


def categorical_from_uniforms(probs: Tensor, u: Tensor) -> Tensor:
    """seqdiff.categorical.sample_categorical with its uniforms given: (..., V) probs and u -> (...) long."""
    return (probs.to(torch.float64) / -torch.log1p(-u)).argmax(dim=-1)


def draw_candidates_rows(probs: Tensor, xt: Tensor, mask_id: int, k: int, gens: list[torch.Generator]) -> Tensor:
    """`draw_candidates` for B rows with one generator each, in one batched computation: (B, L, V) probs, (B, L)
    x_t -> (B, k, L); equal, row for row, to `draw_candidates(probs[r:r+1], xt[r:r+1], mask_id, k, gens[r])`."""
    B, L, V = probs.shape
    u = row_uniforms(gens, (k, L, V), probs.device)  # (B, k, L, V)
    draws = categorical_from_uniforms(probs[:, None].expand(B, k, L, V), u)  # (B, k, L)
    return torch.where(xt[:, None] == mask_id, draws, xt[:, None])


def draw_candidates_at(probs_at: Callable[[Tensor], Tensor], xt: Tensor, mask_id: int, k: int,
                       gens: list[torch.Generator]) -> tuple[Tensor, Tensor]:
    """`draw_candidates_rows` and `candidates_log_mu` with mu given as in the MDLM samplers' `reveal_step`: flat
    positions (R,) of `xt` -> float64 probabilities there (R, V), asked once per row for its masked positions.

    The same candidates and log mu as the dense pair on CPU: each row still walks its generator over k (L, V)
    uniforms in the order `draw_candidates_rows` draws them (k draws of (L, V) are one draw of (k, L, V) on the
    CPU generator), and keeps those at the masked positions. Memory is O(L V) for one candidate at a time
    instead of O(B k L V) uniforms next to (B, L, V) probabilities (26 GB at 16 rows of 1,024 tokens, k = 4 and
    GPT-2's vocabulary). One generator may serve several rows (the likelihood bound passes one for all): the
    rows then walk it in turn, as one (B, k, L, V) draw would. xt (B, L) -> candidates (B, k, L) with unmasked
    tokens carried over, log mu (B, k) relative to xt."""
    B, L = xt.shape
    cands = xt[:, None].repeat(1, k, 1)  # (B, k, L)
    token_p = torch.ones((B, k, L), dtype=torch.float64, device=xt.device)  # carried-over tokens: mu = 1
    for r, g in enumerate(gens):
        pos = (xt[r] == mask_id).nonzero()[:, 0]  # (m,) this row's masked positions
        p = probs_at(r * L + pos)  # (m, V) float64
        for j in range(k):
            u = torch.rand((L, p.shape[-1]), generator=g, device=xt.device, dtype=torch.float64)[pos]
            draw = categorical_from_uniforms(p, u)  # (m,)
            cands[r, j, pos] = draw
            token_p[r, j, pos] = p.gather(-1, draw[:, None])[:, 0].double()
    log_mu = torch.where(xt[:, None] == mask_id, token_p.log(), torch.zeros_like(token_p)).sum(-1)
    return cands, log_mu
