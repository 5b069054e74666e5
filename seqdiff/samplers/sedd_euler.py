"""SEDD Euler sampling: first-order tau-leaping of the reverse CTMC (Lou et al. 2024, section 4).

The reverse rates are Q_bar_t(y, x_t) = sigma'(t) s_theta(x_t, sigma_t)_y Q[x_t, y]; a step of length dt
moves each position independently with probability dt * Q_bar_t(y, x_t) to each y != x_t (clipped so that the
probability of staying is >= 0). The grid, the final denoising step (the analytic step to t = 0, which leaves
no MASK on the absorbing graph) and the `given` conditioning are those of the analytic sampler.
"""

from __future__ import annotations

from torch import Tensor

from seqdiff.samplers.sedd_analytic import SEDDAnalyticSampler


class SEDDEulerSampler(SEDDAnalyticSampler):
    name = "euler"
    reads = frozenset({"steps"})
    exact = False  # first-order tau-leaping of the reverse CTMC

    def step_probs(self, log_score: Tensor, x: Tensor, t: Tensor, s: Tensor, final: bool) -> Tensor:
        if final:
            return super().step_probs(log_score, x, t, s, final=True)
        return self.method.graph.euler_probs(log_score, x, self.method.dsigma(t) * (t - s))
