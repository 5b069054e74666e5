"""Transition graphs of discrete diffusion: rates Q, transition probabilities exp(sigma Q), and the
closed forms that SEDD (score entropy) and the absorbing-kernel x0-parameterization (D3PM, MDLM without
SUBS) need.

Conventions (Lou et al., ICML 2024, "Discrete Diffusion Modeling by Estimating the Ratios of the Data
Distribution", section 2; Campbell et al. 2022)
- One token is a state of a continuous-time Markov chain dp_t/dt = sigma'(t) Q p_t. Q[y, x] is the rate
  from x to y (y != x) and is >= 0; Q[x, x] = -sum_{y != x} Q[y, x], so columns sum to zero.
- sigma(t) = int_0^t sigma'(s) ds is the total noise; p_{t|0}(y | x) = exp(sigma(t) Q)[y, x].
- The score of a sequence x at one position is the vector of ratios s(x)_y = p_t(x with y there) / p_t(x);
  its diagonal entry s(x)_{x} is 1.

Graphs
- absorbing: every non-MASK id jumps to MASK at rate 1, MASK stays. exp(sigma Q) keeps x with probability
  e^{-sigma} and sends it to MASK otherwise. Base distribution: all MASK.
- uniform: Q = (1/N) 1 1^T - I on a set S of N states (every id but MASK and PAD: noise never produces a
  padding or mask token), zero elsewhere. This normalization makes sigma mean what it means for the absorbing
  graph: exp(sigma Q) = e^{-sigma} I + (1 - e^{-sigma}) (1/N) 1 1^T, i.e. a token is resampled uniformly with
  probability 1 - e^{-sigma}. Base distribution: uniform over S.

Every closed form here is checked against dense matrices (torch.linalg.matrix_exp) in tests/test_sedd.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from seqdiff.categorical import sample_categorical
from seqdiff.config import ConfigError

NEG_INF = float("-inf")


def entropy_constant(r: Tensor) -> Tensor:
    """K(r) = r (log r - 1), the constant that makes score entropy zero at s = r (K(0) = 0)."""
    return torch.special.xlogy(r, r) - r


class Graph(ABC):
    """Transition rates over a vocabulary of `vocab_size` ids; stateless apart from its id sets."""

    name: ClassVar[str]

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    # ------------------------------------------------------------------ dense forms (small V; tests, docs)
    @abstractmethod
    def rate_matrix(self) -> Tensor:
        """Q (V, V) float64: Q[y, x] = rate from x to y; columns sum to zero."""

    @abstractmethod
    def transition_matrix(self, sigma: float) -> Tensor:
        """exp(sigma Q) (V, V) float64 in closed form: [y, x] = p(x_t = y | x_0 = x)."""

    # ------------------------------------------------------------------ forward process
    @abstractmethod
    def sample_forward(self, x0: Tensor, sigma: Tensor, noisable: Tensor, generator: torch.Generator | None) -> Tensor:
        """x_t ~ exp(sigma Q)[:, x0] at positions `noisable` (B, L); sigma (B,). Other positions keep x0."""

    @abstractmethod
    def sample_limit(self, shape: tuple[int, ...], generator: torch.Generator | None, device) -> Tensor:
        """Draws from the base distribution (sigma -> infinity)."""

    def prior_kl(self, sigma: Tensor) -> Tensor:
        """KL(p_{sigma|0}(. | x0) || base) per token, (B,) float64; the same for every data token x0."""
        return torch.zeros_like(sigma, dtype=torch.float64)

    # ------------------------------------------------------------------ score entropy
    @abstractmethod
    def score_entropy(self, logits: Tensor, offset: Tensor, xt: Tensor, x0: Tensor, sigma: Tensor) -> Tensor:
        """Denoising score entropy per position, (B, L) float64 (Lou et al. 2024, section 3: the integrand
        of the likelihood bound without its sigma'(t) factor):

            sum_{y != x_t} Q[x_t, y] ( s_y - r_y log s_y + K(r_y) ),   r_y = p_{sigma|0}(y | x0) / p_{sigma|0}(x_t | x0)

        with log s = logits + offset (offset (B,) float64, e.g. the scale-by-sigma shift). It is >= 0 and zero
        iff s_y = r_y wherever Q[x_t, y] > 0.
        """

    # ------------------------------------------------------------------ reverse steps (float64)
    @abstractmethod
    def euler_probs(self, log_score: Tensor, xt: Tensor, rate_dt: Tensor) -> Tensor:
        """Euler (tau-leaping) step: p(y) = 1[y = x_t] + rate_dt * s_y Q[x_t, y] (y != x_t), clipped at 0 on the
        diagonal. log_score (B, L, V) float64, rate_dt (B,) = sigma'(t) dt. Returns unnormalized (B, L, V)."""

    @abstractmethod
    def tweedie_probs(self, log_score: Tensor, xt: Tensor, sigma_t: Tensor, sigma_s: Tensor,
                      final: bool = False) -> Tensor:
        """Analytic (Tweedie) step from total noise sigma_t to sigma_s < sigma_t (Lou et al. 2024, section 4):

            p(x_s = y | x_t) ∝ [exp(-(sigma_t - sigma_s) Q) s]_y * exp((sigma_t - sigma_s) Q)[x_t, y]

        with s_{x_t} = 1; negative entries of the first factor (possible for inexact scores) are clipped to 0.
        `final`: the last step to the data, where no noise state may remain. Returns unnormalized (B, L, V)."""


class AbsorbingGraph(Graph):
    """Every id but MASK jumps to MASK at rate 1 (PAD, BOS, EOS included, as in MDLM's softmax)."""

    name = "absorbing"

    def __init__(self, vocab_size: int, mask_id: int, pad_id: int | None = None):
        super().__init__(vocab_size)
        self.mask_id = mask_id

    def rate_matrix(self) -> Tensor:
        V, M = self.vocab_size, self.mask_id
        Q = -torch.eye(V, dtype=torch.float64)
        Q[M] = 1.0
        Q[M, M] = 0.0
        return Q

    def transition_matrix(self, sigma: float) -> Tensor:
        V, M = self.vocab_size, self.mask_id
        stay = torch.exp(torch.tensor(-float(sigma), dtype=torch.float64))
        P = stay * torch.eye(V, dtype=torch.float64)
        P[M] = 1 - stay
        P[M, M] = 1.0
        return P

    def sample_forward(self, x0, sigma, noisable, generator):
        p_move = -torch.expm1(-sigma.double())[:, None]  # (B, 1) = 1 - e^{-sigma}
        u = torch.rand(x0.shape, generator=generator, device=x0.device, dtype=torch.float64)
        return torch.where((u < p_move) & noisable, self.mask_id, x0)

    def sample_limit(self, shape, generator, device):
        return torch.full(shape, self.mask_id, dtype=torch.long, device=device)

    def score_entropy(self, logits, offset, xt, x0, sigma):
        # Only x_t = MASK has incoming rates (Q[MASK, y] = 1 for y != MASK), and r_y = 1[y = x0] / expm1(sigma).
        # Written as r (e^{lse - log r} - (l_x0 - log r) - 1), so large terms never cancel (with scale by sigma,
        # log s - log r is the raw logit minus log(V - 1)); the (B, L) algebra runs in float64.
        M = self.mask_id
        lse = logits.index_fill(-1, torch.tensor([M], device=logits.device), NEG_INF).logsumexp(-1)  # (B, L)
        l_x0 = logits.gather(-1, x0[..., None])[..., 0]  # (B, L)
        log_r = -torch.log(torch.expm1(sigma.double()))[:, None]  # (B, 1)
        shift = offset.double()[:, None] - log_r
        se = log_r.exp() * (torch.exp(lse.double() + shift) - (l_x0.double() + shift) - 1)
        return torch.where(xt == M, se, torch.zeros_like(se))

    def _reveal_probs(self, log_score: Tensor, xt: Tensor, log_c: Tensor, final: bool) -> Tensor:
        """At MASK: p(y) = c s_y (y != MASK), p(MASK) = max(0, 1 - c sum_y s_y) (0 when final); else stay."""
        M = self.mask_id
        masked = xt == M  # (B, L)
        probs = torch.exp(log_score.double() + log_c.double()[:, None, None])  # (B, L, V) c s_y
        probs[..., M] = 0.0
        stay = torch.zeros_like(probs[..., 0]) if final else (1 - probs.sum(-1)).clamp(min=0)  # (B, L)
        probs.masked_fill_(~masked[..., None], 0.0)  # unmasked positions: a point mass on x_t
        return probs.scatter_(-1, xt[..., None], torch.where(masked, stay, 1.0)[..., None])

    def euler_probs(self, log_score, xt, rate_dt):
        return self._reveal_probs(log_score, xt, torch.log(rate_dt.double()), final=False)

    def tweedie_probs(self, log_score, xt, sigma_t, sigma_s, final=False):
        # [exp(-dQ) s]_y = e^d s_y (y != MASK), 1 - expm1(d) sum s (y = MASK); exp(dQ)[MASK, y] = 1 - e^{-d}, 1.
        # Their product is expm1(d) s_y and 1 - expm1(d) sum s: the Euler form with c = expm1(d).
        d = sigma_t.double() - sigma_s.double()
        return self._reveal_probs(log_score, xt, torch.log(torch.expm1(d)), final)


class UniformGraph(Graph):
    """Q = (1/N) 1 1^T - I on the states S (N ids); ids outside S (MASK, PAD) are inert."""

    name = "uniform"

    def __init__(self, vocab_size: int, mask_id: int, pad_id: int | None = None):
        super().__init__(vocab_size)
        states = torch.ones(vocab_size, dtype=torch.bool)
        states[[i for i in (mask_id, pad_id) if i is not None]] = False
        self.states = states  # (V,) bool
        self.state_ids = torch.nonzero(states)[:, 0]  # (N,)
        self.num_states = int(states.sum())

    def _on(self, device) -> Tensor:
        return self.states.to(device)

    def rate_matrix(self) -> Tensor:
        S, N = self.states, self.num_states
        on = (S[:, None] & S[None, :]).double()
        return on / N - torch.diag(S.double())

    def transition_matrix(self, sigma: float) -> Tensor:
        S, N = self.states, self.num_states
        stay = torch.exp(torch.tensor(-float(sigma), dtype=torch.float64))
        on = (S[:, None] & S[None, :]).double()
        return (1 - stay) / N * on + torch.diag(torch.where(S, stay, 1.0).double())

    def sample_forward(self, x0, sigma, noisable, generator):
        p_move = -torch.expm1(-sigma.double())[:, None]  # (B, 1): resample with probability 1 - e^{-sigma}
        u = torch.rand(x0.shape, generator=generator, device=x0.device, dtype=torch.float64)
        draw = self.sample_limit(x0.shape, generator, x0.device)
        return torch.where((u < p_move) & noisable, draw, x0)

    def sample_limit(self, shape, generator, device):
        idx = torch.randint(self.num_states, shape, generator=generator, device=device)
        return self.state_ids.to(device)[idx]

    def prior_kl(self, sigma):
        # p(x0) = e^{-s} + (1 - e^{-s}) / N, p(y != x0) = (1 - e^{-s}) / N; KL to uniform = sum p log(N p).
        N = self.num_states
        stay = torch.exp(-sigma.double())
        move = -torch.expm1(-sigma.double())
        return (stay + move / N) * torch.log1p((N - 1) * stay) + (N - 1) * (move / N) * torch.log(move)

    def score_entropy(self, logits, offset, xt, x0, sigma):
        # Q[x_t, y] = 1/N for y in S, y != x_t. With e = expm1(sigma), rho = e / (N + e):
        #   x_t == x0: r_y = rho for every y != x_t;
        #   x_t != x0: r_{x0} = 1 / rho = 1 + N / e, r_y = 1 for the other y (K(1) = -1).
        # With A = sum_{y in S, y != x_t} log s_y:
        #   same: sum s - rho A + (N - 1) K(rho);  different: sum s - A - (N / e) log s_{x0} + K(1 / rho) - (N - 2).
        N = self.num_states
        on = self._on(xt.device)  # (V,)
        off = offset.double()[:, None]  # (B, 1)
        rated = logits.masked_fill(~on, NEG_INF).scatter_(-1, xt[..., None], NEG_INF)  # (B, L, V) Q[x_t, y] > 0
        sum_s = torch.exp(rated.logsumexp(-1).double() + off)  # (B, L)
        l_xt = logits.gather(-1, xt[..., None])[..., 0]
        in_states = on[xt]  # (B, L)
        A = logits.masked_fill(~on, 0.0).sum(-1) - torch.where(in_states, l_xt, torch.zeros_like(l_xt))
        A = A.double() + (N - 1) * off
        l_x0 = logits.gather(-1, x0[..., None])[..., 0].double() + off
        e = torch.expm1(sigma.double())[:, None]  # (B, 1)
        rho = e / (N + e)
        same = sum_s - rho * A + (N - 1) * entropy_constant(rho)
        diff = sum_s - A - (N / e) * l_x0 + entropy_constant(1 / rho) - (N - 2)
        return torch.where(xt == x0, same, diff) / N

    def _score(self, log_score: Tensor, xt: Tensor) -> Tensor:
        """s (B, L, V) float64 with s_{x_t} = 1 and 0 outside S."""
        s = torch.exp(log_score.double()).masked_fill_(~self._on(xt.device), 0.0)
        return s.scatter_(-1, xt[..., None], 1.0)

    def _stay_outside(self, probs: Tensor, xt: Tensor) -> Tensor:
        """Ids outside S (given tokens such as PAD) never move: a point mass on x_t there."""
        outside = ~self._on(xt.device)[xt]  # (B, L)
        if outside.any():
            probs[outside] = torch.nn.functional.one_hot(xt[outside], self.vocab_size).to(probs.dtype)
        return probs

    def euler_probs(self, log_score, xt, rate_dt):
        probs = self._score(log_score, xt).mul_(rate_dt.double()[:, None, None] / self.num_states)  # c s_y / N
        probs.scatter_(-1, xt[..., None], 0.0)
        stay = (1 - probs.sum(-1, keepdim=True)).clamp(min=0)  # (B, L, 1)
        return self._stay_outside(probs.scatter_(-1, xt[..., None], stay), xt)

    def tweedie_probs(self, log_score, xt, sigma_t, sigma_s, final=False):
        # exp(-dQ) = e^d I - expm1(d) (1/N) 1 1^T and exp(dQ) = e^{-d} I - expm1(-d) (1/N) 1 1^T on S, so
        # p(y) ∝ max(0, e^d s_y - expm1(d) sum(s) / N) * (-expm1(-d) / N + e^{-d} 1[y = x_t]) on S.
        N = self.num_states
        d = (sigma_t.double() - sigma_s.double())[:, None, None]  # (B, 1, 1)
        s = self._score(log_score, xt)
        total = s.sum(-1, keepdim=True)
        first = s.mul_(torch.exp(d)).sub_(torch.expm1(d) * total / N).clamp_(min=0)
        first.masked_fill_(~self._on(xt.device), 0.0)
        at_xt = first.gather(-1, xt[..., None])  # (B, L, 1)
        probs = first.mul_(-torch.expm1(-d) / N)
        probs.scatter_add_(-1, xt[..., None], at_xt * torch.exp(-d))
        return self._stay_outside(probs, xt)


GRAPHS: dict[str, type[Graph]] = {AbsorbingGraph.name: AbsorbingGraph, UniformGraph.name: UniformGraph}


def build_graph(name: str, vocab_size: int, mask_id: int, pad_id: int) -> Graph:
    if name not in GRAPHS:
        raise ConfigError(f"method.graph={name!r} is unknown; choose one of {sorted(GRAPHS)}")
    return GRAPHS[name](vocab_size, mask_id, pad_id)


# ----------------------------------------------------------------------------------------------------
# The absorbing kernel in alpha form (alpha = e^{-sigma}) with an x0-parameterized model (D3PM).
# ----------------------------------------------------------------------------------------------------
#
# Forward: q(x_t | x0) keeps x0 with probability alpha_t, else MASK; q(x_t | x_s) keeps with alpha_t / alpha_s.
# True posterior at x_t = MASK (x0 a data token): q(x_s = x0) = (alpha_s - alpha_t) / (1 - alpha_t),
# q(x_s = MASK) = (1 - alpha_s) / (1 - alpha_t). An unmasked x_t stays (for the model too: see below).
# Model (Austin et al. 2021, eq. 4): p(x_s | x_t) ∝ sum_{x0~} q(x_s, x_t | x0~) pi(x0~), where pi is a softmax
# over the whole vocabulary, MASK included (x0~ = MASK stays MASK). At x_t = MASK:
#   p(x_s = v) = (alpha_s - alpha_t) pi_v / Z,  p(x_s = MASK) = ((1 - alpha_s) + alpha_s pi_M) / Z,
#   Z = (1 - alpha_t) + alpha_t pi_M;
# at x_t = v != MASK only x0~ = v contributes, so p(x_s = v | x_t = v) = 1: carry-over is implicit.
# With pi_M = 0 (SUBS zero-masking) this is MDLM's q(x_s | x_t, x_theta) (Sahoo et al. 2024, eq. 7).


def absorbing_posterior_kl(log_p_x0: Tensor, p_mask: Tensor, alpha_s: Tensor, alpha_t: Tensor) -> Tensor:
    """KL(q(x_s | x_t = MASK, x0) || p(x_s | x_t = MASK)) for the model above, elementwise:

        log(Z / (1 - alpha_t)) - q_x0 log pi_x0 - q_M log(1 + alpha_s pi_M / (1 - alpha_s))

    log_p_x0 = log pi_{x0}, p_mask = pi_M. With alpha_s = 1 (s = 0) it is -log p(x0 | x_t), the
    reconstruction term L_0 of the bound. With pi_M = 0 it is q_x0 * (-log pi_x0), MDLM's discrete term.
    """
    one_minus_t = 1 - alpha_t
    one_minus_s = 1 - alpha_s
    q_x0 = (alpha_s - alpha_t) / one_minus_t
    q_mask = one_minus_s / one_minus_t
    leak_t = torch.log1p(alpha_t * p_mask / one_minus_t)
    leak_s = torch.log1p(alpha_s * p_mask / one_minus_s.clamp(min=1e-30))  # multiplied by q_mask = 0 at s = 0
    return leak_t - q_x0 * log_p_x0 - q_mask * leak_s


def absorbing_posterior_kl_rate(log_p_x0: Tensor, p_mask: Tensor, alpha_t: Tensor) -> Tensor:
    """The continuous-time limit of absorbing_posterior_kl / (-alpha'(t) dt / (1 - alpha_t)) as s -> t:

        -log pi_x0 + log(1 + alpha pi_M / (1 - alpha)) - pi_M / (1 - alpha + alpha pi_M)

    (expand the KL to first order in dt: the q_x0 terms give -log pi_x0 + log(1 + y), y = alpha pi_M / (1 - alpha),
    and log(1 + y_t) - log(1 + y_s) = y' dt / (1 + y) gives the last term). Multiplied by the MDLM weight
    -alpha' / (1 - alpha) it is the NELBO integrand without SUBS; with pi_M = 0 it is the masked cross-entropy.
    """
    one_minus = 1 - alpha_t
    return -log_p_x0 + torch.log1p(alpha_t * p_mask / one_minus) - p_mask / (one_minus + alpha_t * p_mask)


def absorbing_reverse_step(x0_probs: Tensor, xt: Tensor, alpha_s: Tensor, alpha_t: Tensor, mask_id: int,
                           generator: torch.Generator | None = None) -> Tensor:
    """Draw x_s ~ p(x_s | x_t) of the model above; x0_probs (B, L, V) may hold MASK mass (float64).

    A MASK is revealed with probability (alpha_s - alpha_t)(1 - pi_M) / Z, into a token drawn from pi with its
    MASK entry removed; unmasked tokens never change. alpha_s, alpha_t: (B,). At the data (alpha_s = 1) the
    model keeps a MASK with probability pi_M / Z, which the bound charges (L_0) but data never holds: there
    every MASK is revealed, i.e. x_0 is drawn from the model conditioned on being data, pi without MASK.
    """
    probs = x0_probs.double()
    p_mask = probs[..., mask_id] / probs.sum(-1)  # (B, L)
    a_s, a_t = alpha_s.double()[:, None], alpha_t.double()[:, None]  # (B, 1)
    reveal_p = ((a_s - a_t) * (1 - p_mask) / ((1 - a_t) + a_t * p_mask)).clamp(0, 1)
    reveal_p = torch.where(a_s >= 1, torch.ones_like(reveal_p), reveal_p)
    u = torch.rand(xt.shape, generator=generator, device=xt.device, dtype=torch.float64)
    reveal = (xt == mask_id) & (u < reveal_p)  # (B, L)
    xs = xt.clone()
    if reveal.any():
        rows = probs[reveal].index_fill(-1, torch.tensor([mask_id], device=xt.device), 0.0)
        xs[reveal] = sample_categorical(rows, generator)
    return xs


__all__ = [
    "GRAPHS",
    "AbsorbingGraph",
    "Graph",
    "UniformGraph",
    "absorbing_posterior_kl",
    "absorbing_posterior_kl_rate",
    "absorbing_reverse_step",
    "build_graph",
    "entropy_constant",
]
