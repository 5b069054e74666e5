"""SEDD: score entropy discrete diffusion (Lou, Meng & Ermon, ICML 2024, arXiv 2310.16834).

- Forward process: each token follows the CTMC dp_t/dt = sigma'(t) Q p_t of a transition graph (absorbing or
  uniform, seqdiff.methods.graphs), so p_{t|0} = exp(sigma(t) Q). sigma(t) = -log alpha(t) of the noise
  schedule; the default log-linear schedule is SEDD's "loglinear" noise, sigma(t) = -log(1 - (1 - eps) t).
- Score parameterization: the network's outputs are log-scores log s_theta(x_t, sigma)_y, estimates of
  log p_t(x_t with y at that position) / p_t(x_t); exp makes the ratios positive. The backbone is conditioned
  on the total noise sigma(t) (time conditioning is required: model.time_conditioning=true).
- Scale by sigma (absorbing graph, `method.scale_by_sigma`): log s = output - log((V - 1) expm1(sigma)). The true
  score at a MASK is p_0(y | unmasked) / expm1(sigma), so the output is then log p_0(y | .) + log(V - 1): zero at
  initialization means a uniform guess with the right total mass sum_y s_y = 1 / expm1(sigma).
- Loss: denoising score entropy weighted by sigma'(t) = -alpha'(t) / alpha(t), which is the diffusion part of
  the paper's likelihood bound (section 3):
      -log p_0(x_0) <= int_0^1 sigma'(t) E_{x_t ~ p_{t|0}} sum_l sum_{y != x_t^l} Q[x_t^l, y]
                         ( s_y - r_y log s_y + K(r_y) ) dt  +  KL(p_{1|0}(. | x_0) || p_base)
  with r_y = p_{t|0}(y | x_0^l) / p_{t|0}(x_t^l | x_0^l) and K(r) = r (log r - 1). Per-graph closed forms of the
  inner sum are in graphs.py. t is drawn as MDLM draws it (antithetic, in [t_min, 1]; the estimate is the
  integrand's average over [t_min, 1]), so the numbers are comparable with MDLM's NELBO.
- Prior term: uniform graph, the exact KL to the uniform base (tiny for sigma(1) ~ 7). Absorbing graph: the base
  is all MASK; as in MDLM the mass alpha(1) = eps that p_1 keeps on x_0 is treated as masked and no prior term
  is added.
- With exact scores on the absorbing graph the integrand is w(t) * (-log p_0(x_0 | unmasked)), w = -alpha'/(1 -
  alpha): the same as MDLM's SUBS NELBO.
- Reported as a per-token NLL upper bound in nats, accumulated in float64 (MethodOutput).
Samplers: seqdiff.samplers.sedd_euler and seqdiff.samplers.sedd_analytic.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seqdiff.config import ConfigError, MethodConfig
from seqdiff.methods.base import Batch, Method, MethodOutput
from seqdiff.methods.graphs import build_graph
from seqdiff.schedules import build_schedule, resolved_time_sampling, unit_times
from seqdiff.tokenizers.base import Tokenizer


class SEDD(Method):
    name = "sedd"
    causal = False
    exact_likelihood = False
    """A diffusion-weighted denoising score entropy bound (an upper bound on the NLL)."""
    default_sampler = "analytic"
    """The analytic (Tweedie) reverse step."""
    default_time_conditioning = True
    packable = True
    """Packed documents: the backbone keeps attention inside each; one t per row, as MDLM (unbiased per document)."""
    own_keys = ("graph", "scale_by_sigma")

    def __init__(self, config: MethodConfig, tokenizer: Tokenizer):
        super().__init__(config, tokenizer)
        if config.num_timesteps != 0:
            raise ConfigError(f"method.num_timesteps={config.num_timesteps}: sedd is continuous-time; set it to 0")
        self.schedule = build_schedule(config.schedule)
        self.graph = build_graph(config.graph, self.vocab_size, self.mask_id, self.pad_id)
        self.scale_by_sigma = config.scale_by_sigma and self.graph.name == "absorbing"

    # ------------------------------------------------------------------ noise
    def sample_times(self, batch_size: int, device, generator: torch.Generator | None) -> Tensor:
        """(B,) float64 times in [t_min, 1], drawn as MDLM draws them."""
        cfg = self.config
        u = unit_times(batch_size, resolved_time_sampling(cfg.time_sampling), generator, device)
        return (cfg.t_min + (1 - cfg.t_min) * u).double()

    def sigma(self, t: Tensor) -> Tensor:
        """Total noise sigma(t) = -log alpha(t), float64 (what the backbone sees as noise_level)."""
        return self.schedule.sigma(t.double())

    def dsigma(self, t: Tensor) -> Tensor:
        """sigma'(t) = -alpha'(t) / alpha(t), float64."""
        t = t.double()
        return -self.schedule.d_alpha(t) / self.schedule.alpha(t)

    def score_offset(self, sigma: Tensor) -> Tensor:
        """(B,) float64 added to the network output to give log-scores: -log((V - 1) expm1(sigma)) or 0."""
        sigma = sigma.double()
        if not self.scale_by_sigma:
            return torch.zeros_like(sigma)
        return -torch.log(torch.expm1(sigma)) - math.log(self.vocab_size - 1)

    def check_backbone(self, backbone: nn.Module) -> None:
        """SEDD's score depends on the noise level: the backbone must be time-conditioned."""
        config = getattr(backbone, "config", None)
        if config is not None and not getattr(config, "time_conditioning", True):
            raise ConfigError("method.name=sedd needs model.time_conditioning=true (the score depends on the noise "
                              "level); this backbone was built without it")

    # ------------------------------------------------------------------ objective
    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        self.check_backbone(backbone)
        batch = Batch.from_any(batch)
        x0 = batch.input_ids  # (B, L)
        scored = batch.scored(self.pad_id)  # (B, L)
        t = self.sample_times(x0.shape[0], x0.device, generator)  # (B,) float64
        sigma = self.sigma(t)
        xt = self.graph.sample_forward(x0, sigma, scored, generator)  # (B, L)
        logits = backbone(xt, noise_level=sigma.float(), attention_mask=batch.attention_mask,
                          **batch.packing())  # (B, L, V)
        se = self.graph.score_entropy(logits.float(), self.score_offset(sigma), xt, x0, sigma)  # (B, L) float64
        prior = self.graph.prior_kl(self.sigma(torch.ones(1, device=x0.device)))  # (1,)
        per_token = self.dsigma(t)[:, None] * se + prior  # (B, L)
        per_token = torch.where(scored, per_token, torch.zeros_like(per_token))
        num_tokens = scored.sum().to(torch.float64)
        loss = (per_token.sum() / num_tokens.clamp(min=1)).float()
        return MethodOutput(loss=loss, nll_sum=per_token.detach().sum(), num_tokens=num_tokens)

    # ------------------------------------------------------------------ reverse process
    @torch.no_grad()
    def log_score(self, backbone: nn.Module, xt: Tensor, t: Tensor) -> Tensor:
        """log s_theta(x_t, sigma(t)) as float64 (B, L, V); t (B,)."""
        sigma = self.sigma(t)
        logits = backbone(xt, noise_level=sigma.float())
        return logits.double() + self.score_offset(sigma)[:, None, None]
