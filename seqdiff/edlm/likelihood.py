"""The EDLM NLL upper bound: MDLM's NELBO with the sequence-level EDLM denoiser in place of mu.

MDLM's bound is E_t [ w(t) * sum over masked l of -log mu_l(x0^l | x_t) ] = E_t [ w(t) * -log mu(x0 | x_t) ]
(mu factorizes over positions). EDLM keeps the sequence form (the paper's eq. for its ELBO) with

    -log p(x0 | x_t) = -log mu(x0 | x_t) + E(x0, x_t) + log Z(x_t),

w(t) and the draw of (t, x_t) being MDLM's own (continuous or discrete time, antithetic times). log Z is
  - 0 for a self-normalized energy (coAR: the bound is exact, nothing estimated),
  - otherwise the corrected estimate of seqdiff.edlm.partition from n draws of mu(. | x_t), biased upward, so
    the reported number stays an upper bound in expectation.
With E = 0 the estimate equals MDLM's NELBO draw for draw (a test checks it).

`EDLMBound` has the Method interface (`loss`, `nll`), so the existing likelihood evaluation
(seqdiff.evaluation.likelihood.evaluate_tokens) scores a corpus with it unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from seqdiff.categorical import probs_from_logits
from seqdiff.edlm.base import Energy, draw_candidates, masked_log_mu
from seqdiff.edlm.partition import log_partition_estimates
from seqdiff.methods.base import Batch, Method, MethodOutput
from seqdiff.methods.mdlm import MDLM


class EDLMBound(Method):
    """NLL bound of EDLM = frozen MDLM `mdlm` + `energy`; `num_partition_samples` draws n for log Z."""

    name = "edlm"
    causal = False

    def __init__(self, mdlm: MDLM, energy: Energy, num_partition_samples: int = 8):
        if not mdlm.subs:
            raise ValueError("EDLM needs a SUBS MDLM (method.subs: true): mu must carry unmasked tokens over")
        if not energy.self_normalized and num_partition_samples < 2:
            raise ValueError(f"num_partition_samples must be >= 2 for the {energy.name!r} energy, "
                             f"got {num_partition_samples}")
        self.__dict__.update(mdlm.__dict__)  # vocabulary and special ids, schedule, config
        self.mdlm, self.energy, self.n = mdlm, energy, num_partition_samples
        self.name = f"edlm-{energy.name}"

    @torch.no_grad()
    def per_sequence(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None
                     ) -> dict[str, Tensor]:
        """One draw of (t, x_t) per row; (B,) float64 terms: weight w(t), -log mu, E, log Z (plain and
        corrected), and the bound term w(t) * (-log mu + E + log Z_corrected)."""
        mdlm = self.mdlm
        x0 = batch.input_ids  # (B, L)
        scored = batch.scored(self.pad_id)
        t = mdlm.sample_times(x0.shape[0], x0.device, generator)  # (B,)
        xt = mdlm.corrupt(x0, t, scored, generator)  # (B, L)
        logits = backbone(xt, noise_level=mdlm.noise_level(t), attention_mask=batch.attention_mask)
        probs = probs_from_logits(mdlm.subs_logits(logits))  # (B, L, V) float64
        log_mu = masked_log_mu(probs, x0, xt, self.mask_id)  # (B,)
        energy = self.energy(x0, xt, log_mu)  # (B,)
        if self.energy.self_normalized:
            log_z = log_z_plain = torch.zeros_like(energy)
        else:
            B, L = x0.shape
            cands = draw_candidates(probs, xt, self.mask_id, self.n, generator)  # (B, n, L)
            xt_rep = xt[:, None].expand(B, self.n, L).reshape(B * self.n, L)
            cand_log_mu = masked_log_mu(probs.repeat_interleave(self.n, 0), cands.reshape(B * self.n, L),
                                        xt_rep, self.mask_id)
            cand_energy = self.energy(cands.reshape(B * self.n, L), xt_rep, cand_log_mu)
            log_z_plain, log_z = log_partition_estimates(-cand_energy.view(B, self.n))
        weight = mdlm.loss_weight(t).double()
        nll = -log_mu + energy + log_z
        return {"weight": weight, "neg_log_mu": -log_mu, "energy": energy, "log_z_plain": log_z_plain,
                "log_z": log_z, "bound": weight * nll, "mdlm_bound": -weight * log_mu, "t": t.double()}

    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        batch = Batch.from_any(batch)
        terms = self.per_sequence(backbone, batch, generator)
        num_tokens = batch.scored(self.pad_id).sum().to(torch.float64)
        total = terms["bound"].sum()
        return MethodOutput(loss=(total / num_tokens.clamp(min=1)).float(), nll_sum=total, num_tokens=num_tokens)


def edlm_model(mdlm_model, energy: Energy, num_partition_samples: int = 8):
    """The LoadedModel of an MDLM with its method swapped for the EDLM bound (for evaluate_tokens)."""
    return dataclasses.replace(mdlm_model, method=EDLMBound(mdlm_model.method, energy, num_partition_samples))
