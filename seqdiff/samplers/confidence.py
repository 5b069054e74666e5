"""Confidence-ordered parallel decoding for MDLM: MaskGIT-style top-k per step (Chang et al. 2022; LLaDA's
"low-confidence remasking", Nie et al. 2025) and Fast-dLLM's confidence threshold (Wu et al. 2025).

Both call the denoiser on x_t, draw a candidate token at every masked position from x_theta (float64, with
temperature / top-p), and commit only some of them; the others stay masked for a later step. Confidences are
x_theta's probabilities at temperature 1 (the tempered ones are all 1 when decoding greedily).

- `confidence` (top-k): the number of tokens still masked after the step to s follows the noise schedule,
  floor(n0 (1 - alpha_s) / (1 - alpha_1)) for a row that started with n0 masked tokens (n0 < L with `given`),
  and 0 after the last step -- so a step commits exactly the scheduled count (tested) and `steps` steps always
  finish. The committed positions are those whose drawn token has the highest probability (ties: the lower
  position). A step that commits nothing in any row (steps > L) makes no denoiser call.
- `threshold` (Fast-dLLM): every masked position whose largest probability exceeds tau in (0, 1] is committed,
  and at least one per step (the most confident one), until no MASK is left: the number of steps (and calls)
  adapts to the model's confidence, at most n0; `steps` is ignored. tau = 1 decodes one token per call.

Approximate (labelled so): which tokens are committed depends on the drawn values' probabilities, so even an
exact denoiser does not reproduce the data distribution (positions are chosen by confidence rather than
uniformly, and the joint of tokens committed together is a product of marginals). Deviations from the papers:
MaskGIT anneals Gumbel noise into the confidence ranking (here: none, the ranking is the drawn token's
probability); Fast-dLLM decodes greedily (temperature 0 here gives exactly that, and then the drawn token's
probability is the largest probability). Given (prompt / infill) positions are never touched. Time-conditioned
models see the time at which the schedule masks the row's current share of masked tokens.

Inside the blocks of BD3-LM (`reverse_process`, driven by seqdiff.samplers.bd3lm as `bd3lm_confidence` /
`bd3lm_threshold`) each block is decoded the same way over its own masked tokens (top-k: `steps` per block, the
schedule counted from the block's n0; threshold: until the block is full), its denoiser reading the block after the
clean prefix -- Fast-dLLM's and LLaDA's semi-autoregressive block decoding, with an exact KV cache of the prefix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.categorical import probs_from_logits, sample_categorical
from seqdiff.samplers.base import Denoiser, SampleOutput, SamplerError
from seqdiff.samplers.mdlm_ancestral import MDLMAncestralSampler
from seqdiff.samplers.mdlm_first_hitting import time_of_mask_probability


def top_k_by_confidence(conf: Tensor, masked: Tensor, k: Tensor) -> Tensor:
    """(B, L) bool: in each row the k[b] masked positions of highest confidence (ties: the lower position)."""
    score = torch.where(masked, conf, torch.full_like(conf, -1.0))  # unmasked positions rank last
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices  # (B, L)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(conf.shape[-1], device=conf.device)
                                            .expand_as(order).contiguous())
    return masked & (rank < k[:, None])


class ConfidenceSampler(MDLMAncestralSampler):
    name = "confidence"
    reads = frozenset({"steps"})
    block_methods = ("bd3lm",)
    exact = False  # positions chosen by confidence and committed jointly: not the model's reverse process

    def check_compatible(self) -> None:
        if not getattr(self.method, "subs", True):
            raise SamplerError(f"--sampler {self.name} needs a SUBS model (method.subs=true)")

    def candidates(self, x: Tensor, t: Tensor, denoise: Denoiser, generator: torch.Generator | None
                   ) -> tuple[Tensor, Tensor, Tensor]:
        """x_theta(x_t) once: a token (B, L) drawn at every masked position (with temperature / top-p), its
        probability under the model at temperature 1, and the largest such probability there (B, L) float64
        (0 at unmasked positions). Confidence is the untempered probability, so that greedy decoding (temperature
        0, whose tempered probabilities are all 1) still ranks positions."""
        logits = denoise(x, t, None)  # (B, L, V)
        masked = x == self.method.mask_id
        drawn = x.clone()
        p_drawn = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
        p_max = torch.zeros_like(p_drawn)
        if masked.any():
            sel = probs_from_logits(logits[masked])  # (n, V) float64 at temperature 1, at the masked positions only
            tokens = sample_categorical(probs_from_logits(sel.log(), self.temperature, self.top_p), generator)
            drawn[masked] = tokens
            p_drawn[masked] = sel.gather(-1, tokens[:, None])[:, 0]
            p_max[masked] = sel.max(-1).values
        return drawn, p_drawn, p_max

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        return self.reverse_from_masks(batch_size, seq_len, generator, given)

    @torch.no_grad()
    def reverse_process(self, x: Tensor, denoise: Denoiser, generator: torch.Generator | None) -> tuple[Tensor, int]:
        """`steps` top-k steps on x (B, n): the masked count follows the schedule from the row's n0 down to 0."""
        mask_id, sched = self.method.mask_id, self.method.schedule
        B = x.shape[0]
        n0 = (x == mask_id).sum(-1)  # (B,)
        grid = self.time_grid(x.device)
        share = sched.one_minus_alpha(grid) / sched.one_minus_alpha(grid[:1])  # (steps + 1,) 1 -> ~0
        calls = 0
        self.trace = []  # masked count per row after every step (tests)
        for i in range(self.steps):
            masked = x == mask_id
            target = (n0.double() * share[i + 1]).floor().long() if i < self.steps - 1 else torch.zeros_like(n0)
            k = (masked.sum(-1) - target).clamp(min=0)  # (B,) tokens this step commits
            if k.any():
                drawn, p_drawn, _ = self.candidates(x, grid[i].expand(B), denoise, generator)
                calls += 1
                x = torch.where(top_k_by_confidence(p_drawn, masked, k), drawn, x)
            self.trace.append((x == mask_id).sum(-1).clone())
        return x, calls


class ThresholdSampler(ConfidenceSampler):
    name = "threshold"
    reads = frozenset({"threshold"})  # calls the denoiser until no MASK is left: `steps` sets nothing
    exact = False

    def __init__(self, method, backbone, steps: int = 1, temperature: float = 1.0, top_p: float = 1.0,
                 threshold: float = 0.9):
        if not 0.0 < threshold <= 1.0:
            raise SamplerError(f"--threshold (sample.threshold)={threshold} must lie in (0, 1]")
        self.threshold = threshold
        super().__init__(method, backbone, steps=max(steps, 1), temperature=temperature, top_p=top_p)

    @classmethod
    def options_from_config(cls, cfg) -> dict:
        return {"threshold": cfg.threshold}

    @torch.no_grad()
    def reverse_process(self, x: Tensor, denoise: Denoiser, generator: torch.Generator | None) -> tuple[Tensor, int]:
        """Commit every masked position of x (B, n) above the threshold (at least one per row) until none is left."""
        mask_id, sched = self.method.mask_id, self.method.schedule
        n_pos = x.shape[1]
        calls = 0
        self.trace = []
        while (x == mask_id).any():
            masked = x == mask_id
            share = masked.sum(-1).double() / n_pos  # (B,) the time whose mask probability is that share
            t = time_of_mask_probability(sched, share * sched.one_minus_alpha(torch.ones((), dtype=torch.float64)))
            drawn, _, p_max = self.candidates(x, t, denoise, generator)
            calls += 1
            commit = masked & (p_max > self.threshold)
            best = top_k_by_confidence(p_max, masked, masked.any(-1).long())  # the most confident, per row
            x = torch.where(commit | best, drawn, x)
            self.trace.append((x == mask_id).sum(-1).clone())
        return x, calls

    def stats(self) -> dict:
        return {"threshold": self.threshold}
