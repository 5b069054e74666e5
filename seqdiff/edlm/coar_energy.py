"""EDLM-coAR (carry-over AR): only the masked positions of x_t enter the AR score, unmasked tokens are
carried over as context:

    E(x0, x_t) = -sum_{l masked in x_t} log p_AR(x0^l | x0^{<l}) + log mu(x0 | x_t).

The step p(x0 | x_t) = prod_{l masked} p_AR(x0^l | x0^{<l}) is normalized by construction: summing out the
masked positions from the last one backwards, each conditional sums to one, and the carried-over tokens
after it contribute no factor. So Z(x_t) = 1 exactly and the bound needs no partition-function estimate.
With the data x0 in the AR context, E_t[w(t) * sum over masked l of -log p_AR] = (alpha(0) - alpha(1)) times
the AR NLL for any schedule, i.e. (1 - eps) x AR NLL for the log-linear one: the coAR bound tracks AR.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.edlm.ar_energy import AREnergy, ar_token_log_probs


class CarryOverAREnergy(AREnergy):
    """AREnergy's model and loading; only the masked positions' AR terms enter (carried-over tokens are given)."""

    name = "coar"
    self_normalized = True

    def energy(self, x0: Tensor, xt: Tensor, log_mu: Tensor) -> Tensor:
        token_lp = ar_token_log_probs(self.ar, x0)  # (N, L)
        masked = xt == self.mask_id
        return -torch.where(masked, token_lp, torch.zeros_like(token_lp)).sum(-1) + log_mu.double()
