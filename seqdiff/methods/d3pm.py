"""D3PM with the absorbing kernel and discrete time (Austin et al., NeurIPS 2021, "Structured Denoising
Diffusion Models in Discrete State-Spaces", arXiv 2107.03006).

- Forward chain on the grid t_i = i/T, i = 0..T: q(x_{t_i} | x_0) keeps each token with probability alpha_i
  and masks it otherwise. alpha_i comes from the noise schedule, except that the endpoints are pinned as in
  D3PM's absorbing schedule (beta_t = 1/(T - t + 1)): alpha_0 = 1 (t = 0 is the data) and alpha_T = 0 (x_T
  is all MASK), so the prior term KL(q(x_T | x_0) || p(x_T) = all MASK) is exactly zero.
- x0-parameterization (eq. 4): a softmax pi over the whole vocabulary, MASK included, and
  p(x_{s} | x_t) ∝ sum_{x0~} q(x_s, x_t | x0~) pi(x0~). No SUBS: nothing forces pi_MASK = 0, the model must
  learn it; a MASK kept at the end is charged in full by the reconstruction term.
- The full variational bound L_vb (section 2), per token:
      L = KL(q(x_T | x_0) || p(x_T))                                          (prior, 0 here)
        + sum_{i=2}^T E_q KL(q(x_{t_{i-1}} | x_{t_i}, x_0) || p(x_{t_{i-1}} | x_{t_i}))
        + E_q [-log p(x_0 | x_{t_1})]                                          (reconstruction L_0)
  The closed forms are in seqdiff.methods.graphs.absorbing_posterior_kl (the i = 1 term is the same
  formula with alpha_s = 1). Training draws one i per sequence (antithetic strata) and multiplies by T, an
  unbiased estimate of the sum; only masked positions have nonzero terms.
- `method.subs: true` imposes SUBS (pi_MASK = 0 and carry-over): every term becomes
  (alpha_{i-1} - alpha_i)/(1 - alpha_i) * (-log pi_x0), MDLM's discrete NELBO, which approaches the
  continuous MDLM NELBO as T grows.
- T = method.num_timesteps (0 means 1000, D3PM's choice). Time conditioning is optional: the backbone sees
  sigma(t) of the schedule. Reverse sampling: seqdiff.samplers.d3pm_ancestral.

This is MDLM's machinery with D3PM's defaults; the shared pieces live in MDLM (its no-SUBS ablation).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from seqdiff.config import MethodConfig
from seqdiff.methods.graphs import absorbing_reverse_step
from seqdiff.methods.mdlm import MDLM
from seqdiff.tokenizers.base import Tokenizer

DEFAULT_NUM_TIMESTEPS = 1000


class D3PM(MDLM):
    name = "d3pm"
    causal = False
    exact_likelihood = False
    """The discrete-time variational bound (an upper bound on the NLL)."""
    default_sampler = "d3pm"
    """Ancestral sampling with the discrete-time posterior."""

    def __init__(self, config: MethodConfig, tokenizer: Tokenizer):
        config = dataclasses.replace(
            config,
            num_timesteps=config.num_timesteps or DEFAULT_NUM_TIMESTEPS,
            subs=False if config.subs is None else config.subs,
        )
        super().__init__(config, tokenizer)
        self.num_timesteps = config.num_timesteps

    def grid_alpha(self, t: Tensor) -> Tensor:
        """alpha(t) with the endpoints pinned: 1 at t <= 0, 0 at t >= 1."""
        a = self.schedule.alpha(t)
        a = torch.where(t >= 1, torch.zeros_like(a), a)
        return torch.where(t <= 0, torch.ones_like(a), a)

    def corrupt(self, x0: Tensor, t: Tensor, maskable: Tensor, generator: torch.Generator | None) -> Tensor:
        """x_t ~ q(x_t | x_0) on the grid: mask with probability 1 - alpha_i (everything at t = 1)."""
        p_mask = (1 - self.grid_alpha(t.double()))[:, None]  # (B, 1)
        u = torch.rand(x0.shape, generator=generator, device=x0.device, dtype=torch.float64)
        return torch.where((u < p_mask) & maskable, self.mask_id, x0)

    def loss_weight(self, t: Tensor) -> Tensor:
        """SUBS imposed: T (alpha_{i-1} - alpha_i) / (1 - alpha_i) on the pinned grid, (B,) float32."""
        T = self.num_timesteps
        step = torch.round(t.double() * T)
        a_t, a_s = self.grid_alpha(step / T), self.grid_alpha((step - 1) / T)
        return (T * (a_s - a_t) / (1 - a_t)).float()

    reveals_by_position = False  # its reverse step is the pinned-grid posterior below, not MDLM's reveal step

    def reverse_step(self, x0_probs: Tensor, xt: Tensor, t: Tensor, s: Tensor,
                     generator: torch.Generator | None = None) -> Tensor:
        """Draw x_s ~ p(x_s | x_t) (eq. 4) on the pinned grid; with SUBS x0_probs has no MASK mass."""
        return absorbing_reverse_step(x0_probs, xt, self.grid_alpha(s.double()), self.grid_alpha(t.double()),
                                      self.mask_id, generator)
