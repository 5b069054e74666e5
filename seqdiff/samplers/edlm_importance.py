"""EDLM importance sampling (Xu et al. 2025, Alg. 1): early reverse steps draw x0 from the sequence-level
denoiser p(x0 | x_t) ∝ mu(x0 | x_t) exp(-E(x0, x_t)) approximately, by self-normalized importance sampling.

For a step from t to s with t >= 1 - w (the window; w = 1: every step):
  1. k candidates x0 ~ mu(. | x_t) in parallel (unmasked tokens carried over),
  2. weights exp(-E(x0, x_t)) (computed in log space), normalized within each row,
  3. one candidate per row resampled by those weights,
  4. x_s ~ q(x_s | x_t, x0): each masked token is revealed, to the chosen candidate's token, with probability
     (alpha_s - alpha_t) / (1 - alpha_t) -- the MDLM reverse step with a one-hot x0.
Outside the window, plain cached MDLM steps (late steps reveal few tokens, where mu's factorization costs
least). Which positions a step reveals does not depend on x0, so it is drawn first: a row that reveals nothing
this step keeps x_t and needs no candidates (same law, and with steps >= length most steps cost nothing, as in
the cached MDLM sampler). With k = 1 or a constant energy, every step is an MDLM step in law. As k grows the
step tends to the exact EDLM step (brute-force tests check one step and a whole run).

Batch independence: every random draw of row r comes from its own generator, seeded from the caller's
generator once per row in row order, so a batch of B rows gives the same tokens as B calls of one row
with the same generator (another test checks it). One denoiser call per step, the B x k candidates' energies
in one forward pass of the energy model, the resampling and the reveal draws batched; the candidates are
drawn one row and one candidate at a time, from that row's probabilities at its masked positions (the
denoiser's output is kept as logits at the masked positions, as in the MDLM samplers), so memory stays
O(L V) per candidate instead of (B, k, L, V) float64 uniforms. Before, the candidates, the resampling and
the MDLM steps ran row after row; the tokens are the same for the same generator (tests/test_edlm_batched.py
keeps the row-by-row version, on dense probabilities, as the reference).

`given` (prefix / infilling) is honoured as in the MDLM samplers: given tokens start unmasked and are
carried over into every candidate, so the energy scores them as context.
The effective sample size (sum w)^2 / sum w^2 in [1, k] of every importance step is kept in `ess`
(one (t, mean ESS over rows) pair per step, over all `generate` calls of this sampler); `stats()` sums it
up for the sample command and the reports.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from seqdiff.edlm.base import categorical_from_uniforms, draw_candidates_at, row_uniforms
from seqdiff.samplers.base import SampleOutput, SamplerError
from seqdiff.samplers.mdlm_ancestral import MaskedX0
from seqdiff.samplers.mdlm_cached import MDLMCachedSampler


def row_generators(batch_size: int, generator: torch.Generator | None, device) -> list[torch.Generator]:
    """One generator per row, seeded by draws from `generator` one row at a time (so the seeds of a batch are
    those of successive one-row calls)."""
    seeds = [int(torch.randint(0, 2**62, (1,), generator=generator)) for _ in range(batch_size)]
    return [torch.Generator(device).manual_seed(s) for s in seeds]


def rows_probs_at(probs_at: Callable[[Tensor], Tensor], rows: Tensor, L: int) -> Callable[[Tensor], Tensor]:
    """`probs_at` of a batch -> the same for the sub-batch of `rows` (b,): flat positions of the sub-batch are
    mapped to the batch's."""
    return lambda positions: probs_at(rows[positions // L] * L + positions % L)


def effective_sample_size(log_w: Tensor) -> Tensor:
    """(..., k) log-weights -> (...,) ESS = (sum w)^2 / sum w^2, computed stably."""
    return torch.exp(2 * torch.logsumexp(log_w, -1) - torch.logsumexp(2 * log_w, -1))


class EDLMImportanceSampler(MDLMCachedSampler):
    name = "edlm"
    reads = frozenset({"steps", "energy", "edlm_k", "edlm_window"})  # the energy loaded by the command
    exact = False  # self-normalized importance sampling with finite k tends to the EDLM step only as k grows

    def __init__(self, method, backbone, steps: int = 128, temperature: float = 1.0, top_p: float = 1.0,
                 energy=None, k: int = 2, window: float = 0.2):
        if energy is None:
            raise SamplerError("sampler 'edlm' needs an energy (--energy KIND:PATH, e.g. coar:runs/ar)")
        if k < 1:
            raise SamplerError(f"--edlm-k must be >= 1, got {k}")
        if not 0.0 <= window <= 1.0:
            raise SamplerError(f"--edlm-window must be in [0, 1], got {window}")
        self.energy, self.k, self.window = energy, k, window
        self.ess: list[tuple[float, float]] = []
        super().__init__(method, backbone, steps=steps, temperature=temperature, top_p=top_p)

    def check_compatible(self) -> None:
        if not getattr(self.method, "subs", True):
            raise SamplerError("sampler 'edlm' needs a SUBS MDLM (mu must carry unmasked tokens over)")

    def masked_x0(self, xt: Tensor, t: Tensor, cache: dict) -> tuple[MaskedX0, int]:
        if getattr(self.backbone.config, "time_conditioning", False):  # no caching: output depends on t
            return MaskedX0(*self.method.denoise_masked(self.backbone, xt, t.float())), 1
        return super().masked_x0(xt, t, cache)

    def in_window(self, t: float) -> bool:
        return self.k > 1 and t >= 1.0 - self.window - 1e-12

    def candidates(self, probs_at: Callable[[Tensor], Tensor], xt: Tensor,
                   gens: list[torch.Generator]) -> tuple[Tensor, Tensor]:
        """k draws x0 ~ mu(. | x_t) per row (B, k, L), unmasked tokens carried over, and their log mu (B, k)."""
        return draw_candidates_at(probs_at, xt, self.method.mask_id, self.k, gens)

    def importance_x0(self, probs_at: Callable[[Tensor], Tensor], xt: Tensor,
                      gens: list[torch.Generator]) -> tuple[Tensor, Tensor]:
        """One x0 per row resampled from k draws of mu by weights exp(-E): (B, L), and the (B,) ESS. mu is asked
        as `probs_at` (flat positions of xt -> (R, V) float64), once per row at its masked positions."""
        B, L = xt.shape
        k = self.k
        cands, log_mu = self.candidates(probs_at, xt, gens)  # (B, k, L), (B, k)
        flat = cands.reshape(B * k, L)
        xt_rep = xt.repeat_interleave(k, 0)  # (B k, L)
        # (B, k), one energy forward where it fits (Energy.chunk_elements caps rows x length x vocabulary)
        log_w = -self.energy(flat, xt_rep, log_mu.reshape(B * k), chunk=max(256, B * k)).view(B, k)
        weights = torch.softmax(log_w, dim=-1)  # self-normalized within each row
        pick = categorical_from_uniforms(weights, row_uniforms(gens, (k,), xt.device))  # (B,)
        return cands[torch.arange(B, device=xt.device), pick], effective_sample_size(log_w)

    def reveal_rows(self, x: Tensor, t: Tensor, s: Tensor, gens: list[torch.Generator]) -> Tensor:
        """`method.reveal_mask` for every row with its own generator, batched: (B, L) bool."""
        sched = self.method.schedule
        a_t = sched.alpha(t.double())[:, None]  # (B, 1)
        a_s = sched.alpha(s.double())[:, None]
        reveal_p = ((a_s - a_t) / sched.one_minus_alpha(t.double())[:, None]).clamp(0, 1)
        u = row_uniforms(gens, (x.shape[1],), x.device)  # (B, L)
        return (x == self.method.mask_id) & (u < reveal_p)

    def mdlm_step_rows(self, probs_at: Callable[[Tensor], Tensor], x: Tensor, t: Tensor, s: Tensor,
                       gens: list[torch.Generator]) -> Tensor:
        """`method.reveal_step` (SUBS) row by row in law and in draws, batched: which positions reveal, then a
        token for each revealed one from that row's generator, mu asked only where a token is revealed."""
        reveal = self.reveal_rows(x, t, s, gens)
        xs = x.clone(memory_format=torch.contiguous_format)  # row-major, so positions index xs.view(-1)
        counts = reveal.sum(-1).tolist()
        if sum(counts):
            positions = reveal.flatten().nonzero()[:, 0]  # (R,) row-major, the order of the rows' uniforms
            probs = probs_at(positions)  # (R, V)
            u = torch.cat([torch.rand((n, probs.shape[-1]), generator=g, device=x.device, dtype=torch.float64)
                           for n, g in zip(counts, gens) if n])
            xs.view(-1)[positions] = categorical_from_uniforms(probs, u)
        return xs

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        device, given = self.prepare(batch_size, seq_len, given)
        method = self.method
        gens = row_generators(batch_size, generator, device)
        x = self.masked_start(batch_size, seq_len, given, device)  # (B, L); given tokens stay revealed
        grid = self.time_grid(device)
        calls, cache = 0, {}
        for i in range(self.steps):
            t = grid[i].expand(batch_size)  # (B,)
            s = grid[i + 1].expand(batch_size)
            x0, n = self.masked_x0(x, t, cache)  # logits at the masked positions only
            calls += n
            probs_at = self.probs_at(x0)
            if not self.in_window(float(grid[i])):
                x = self.mdlm_step_rows(probs_at, x, t, s, gens)
                continue
            reveal = self.reveal_rows(x, t, s, gens)  # (B, L)
            rows = reveal.any(-1).nonzero()[:, 0]  # rows that reveal a token need an x0
            if len(rows):
                x0s, ess = self.importance_x0(rows_probs_at(probs_at, rows, x.shape[1]), x[rows],
                                              [gens[r] for r in rows.tolist()])
                self.ess.append((float(grid[i]), float(ess.mean())))
                x = x.clone()  # a new tensor: the denoiser cache keeps the old x_t to detect changes
                x[rows] = torch.where(reveal[rows], x0s, x[rows])
        if (x == method.mask_id).any():  # noise removal for schedules with alpha(0) < 1
            x0, n = self.masked_x0(x, grid[-1].expand(batch_size), cache)
            calls += n
            x = method.fill_remaining_at(self.probs_at(x0), x)
        return SampleOutput(tokens=x, num_denoiser_calls=calls)

    def stats(self) -> dict[str, float]:
        """Mean effective sample size over the importance steps so far (nan if none), k and the window."""
        mean = sum(e for _, e in self.ess) / len(self.ess) if self.ess else float("nan")
        return {"edlm_k": self.k, "edlm_window": self.window, "importance_steps": len(self.ess),
                "mean_effective_sample_size": mean}
