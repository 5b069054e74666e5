"""NLL upper bounds for EDLM: a frozen MDLM mu reweighted by an energy, p(x0 | x_t) ∝ mu exp(-E).

Two forms, both on MDLM's draw of (t, x_t) and weight w(t) (continuous or discrete time):

- `marginal` (default; a valid bound). In continuous time a reverse step reveals one token at a time, so the
  NELBO of any denoiser is E_t [ w(t) sum_{l masked} -log p_l(x0^l | x_t) ] with p_l the *marginal* of the
  denoiser at position l (for MDLM, mu_l itself). For EDLM, with mu factorized,

      p_l(v | x_t) = mu_l(v | x_t) Z_l(x_t, v) / Z(x_t),  Z_l = E_{x0 ~ mu(. | x_t), x0^l = v} [exp(-E(x0, x_t))],

  so -log p_l = -log mu_l - log Z_l + log Z. log Z_l takes the plain estimate from n draws (biased low, so
  -log Z_l is biased high: safe), log Z the corrected Theorem-1 estimate (biased high: safe, seqdiff.edlm.
  partition). One masked position per row is drawn uniformly and its term scaled by the number of masked
  positions (unbiased for the sum, 2n energy calls per row instead of 2n per position). With an exact
  denoiser (the data's own conditionals) this bound equals the NLL in expectation; for EDLM-AR, whose step
  is the AR model restricted to completions of x_t, it equals the AR NLL up to the estimator bias.
- `sequence` (the form EDLM's paper writes): w(t) * -log p(x0 | x_t) of the whole sequence,
  -log p(x0 | x_t) = -log mu(x0 | x_t) + E(x0, x_t) + log Z(x_t). Exact for a factorized denoiser (MDLM: with
  E = 0 it equals MDLM's NELBO draw for draw, a test checks it) and, for the self-normalized coAR energy
  (log Z = 0), free of estimates: its expectation is (alpha(0) - alpha(1)) x the AR NLL. It is *not* an upper
  bound for a joint denoiser in general: the joint log-probability of the masked block replaces the sum of
  per-position marginal terms, and sum_l H(X^l | X^U) >= H(X^M | X^U), so it can fall below the true NLL
  (with the AR energy it tends to a pseudo-likelihood: the masked block given context on both sides).

`EDLMBound` has the Method interface (`loss`, `nll`), so seqdiff.evaluation.likelihood scores a corpus with
it unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import torch
from torch import Tensor, nn

from seqdiff.categorical import probs_from_logits
from seqdiff.edlm.base import Energy, EnergyError, candidates_log_mu, draw_candidates_at, masked_log_mu
from seqdiff.edlm.partition import log_mean_exp, log_partition_estimates
from seqdiff.methods.base import Batch, Method, MethodOutput
from seqdiff.methods.mdlm import MDLM

FORMS = ("marginal", "sequence")


class EDLMBound(Method):
    """NLL bound of EDLM = frozen MDLM `mdlm` + `energy`; n = `num_partition_samples` draws per estimate."""

    name = "edlm"
    causal = False
    exact_likelihood = False
    """An upper bound on the NLL (the MDLM NELBO with the energy's importance weights)."""
    default_sampler = "edlm"
    """Importance sampling with the energy (seqdiff.samplers.edlm_importance)."""

    def __init__(self, mdlm: MDLM, energy: Energy, num_partition_samples: int = 8,
                 form: Literal["marginal", "sequence"] = "marginal"):
        if not mdlm.subs:
            raise EnergyError("EDLM needs a SUBS MDLM (method.subs: true): mu must carry unmasked tokens over")
        if form not in FORMS:
            raise EnergyError(f"bound form {form!r} is unknown; choose one of {list(FORMS)}")
        needs_z = not energy.self_normalized
        if (needs_z and num_partition_samples < 2) or num_partition_samples < 1:
            raise EnergyError(f"num_partition_samples must be >= {2 if needs_z else 1} for the {energy.name!r} "
                             f"energy, got {num_partition_samples}")
        self.__dict__.update(mdlm.__dict__)  # vocabulary and special ids, schedule, config
        self.mdlm, self.energy, self.n, self.form = mdlm, energy, num_partition_samples, form
        self.name = f"edlm-{energy.name}"

    # ------------------------------------------------------------------ pieces
    def log_weights(self, probs: Tensor, xt: Tensor, draw_from: Tensor, generator) -> Tensor:
        """(B, n) log exp(-E(x0', x_t)) for n draws x0' ~ mu(. | draw_from) (draw_from: x_t, possibly with
        one more position fixed); E and log mu always relative to x_t itself."""
        B, L, V = probs.shape
        # one row and one draw at a time from the same generator: the candidates of one (B, n, L, V) draw of
        # uniforms (on CPU), without those uniforms or n copies of the probabilities in memory
        cands, _ = draw_candidates_at(probs.reshape(B * L, V).__getitem__, draw_from, self.mask_id, self.n,
                                      [generator] * B)  # (B, n, L)
        log_mu = candidates_log_mu(probs, cands, xt, self.mask_id).reshape(B * self.n)  # relative to x_t
        xt_rep = xt.repeat_interleave(self.n, 0)  # (B n, L)
        return -self.energy(cands.reshape(B * self.n, L), xt_rep, log_mu).view(B, self.n)

    def log_partition(self, probs: Tensor, xt: Tensor, generator) -> tuple[Tensor, Tensor]:
        """(plain, corrected) estimates of log Z(x_t), (B,) each; exactly 0 for self-normalized energies."""
        if self.energy.self_normalized:
            zero = torch.zeros(xt.shape[0], dtype=torch.float64, device=xt.device)
            return zero, zero
        return log_partition_estimates(self.log_weights(probs, xt, xt, generator))

    def marginal_nll(self, probs: Tensor, x0: Tensor, xt: Tensor, generator) -> dict[str, Tensor]:
        """Unbiased-for-the-sum estimate of sum_{l masked} -log p_l(x0^l | x_t) (one random masked l per
        row, scaled by their number), with -log Z_l biased high and log Z biased high. (B,) float64."""
        B, L = x0.shape
        masked = xt == self.mask_id  # (B, L)
        count = masked.sum(-1)  # (B,)
        u = torch.rand(B, generator=generator, device=x0.device, dtype=torch.float64)
        rank = torch.minimum((u * count).long(), (count - 1).clamp(min=0))  # which masked position, per row
        pos = ((masked.cumsum(-1) - 1 == rank[:, None]) & masked).long().argmax(-1)  # (B,)
        rows = torch.arange(B, device=x0.device)
        token = x0[rows, pos]
        neg_log_mu_l = -probs[rows, pos, token].log()  # (B,)
        fixed = xt.clone()
        fixed[rows, pos] = token  # draws keep x0^l at l, the rest of x_t's masked positions free
        log_z_l = log_mean_exp(self.log_weights(probs, xt, fixed, generator))  # plain: -log Z_l biased high
        log_z_plain, log_z = self.log_partition(probs, xt, generator)
        per_position = neg_log_mu_l - log_z_l + log_z
        nll = torch.where(count > 0, count.double() * per_position, torch.zeros_like(per_position))
        return {"nll": nll, "log_z": log_z, "log_z_plain": log_z_plain, "log_z_l": log_z_l}

    def sequence_nll(self, probs: Tensor, x0: Tensor, xt: Tensor, generator) -> dict[str, Tensor]:
        """-log p(x0 | x_t) = -log mu + E + log Z (corrected estimate), (B,) float64 (the paper's form)."""
        log_mu = masked_log_mu(probs, x0, xt, self.mask_id)  # (B,)
        energy = self.energy(x0, xt, log_mu)
        log_z_plain, log_z = self.log_partition(probs, xt, generator)
        return {"nll": -log_mu + energy + log_z, "log_z": log_z, "log_z_plain": log_z_plain, "energy": energy}

    # ------------------------------------------------------------------ one draw of (t, x_t) per row
    @torch.no_grad()
    def per_sequence(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None
                     ) -> dict[str, Tensor]:
        """(B,) float64 terms of one draw of (t, x_t) per row: the bound term w(t) * nll, MDLM's own bound
        term on the same draw, and the pieces (log Z estimates, t)."""
        mdlm = self.mdlm
        x0 = batch.input_ids  # (B, L)
        scored = batch.scored(self.pad_id)
        t = mdlm.sample_times(x0.shape[0], x0.device, generator)  # (B,)
        xt = mdlm.corrupt(x0, t, scored, generator)  # (B, L)
        logits = backbone(xt, noise_level=mdlm.noise_level(t), attention_mask=batch.attention_mask)
        probs = probs_from_logits(mdlm.subs_logits(logits))  # (B, L, V) float64
        terms = (self.marginal_nll if self.form == "marginal" else self.sequence_nll)(probs, x0, xt, generator)
        weight = mdlm.loss_weight(t).double()
        terms.update({"weight": weight, "t": t.double(), "bound": weight * terms["nll"],
                      "mdlm_bound": -weight * masked_log_mu(probs, x0, xt, self.mask_id)})
        return terms

    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        batch = Batch.from_any(batch)
        terms = self.per_sequence(backbone, batch, generator)
        num_tokens = batch.scored(self.pad_id).sum().to(torch.float64)
        total = terms["bound"].sum()
        return MethodOutput(loss=(total / num_tokens.clamp(min=1)).float(), nll_sum=total, num_tokens=num_tokens)


def edlm_model(mdlm_model, energy: Energy, num_partition_samples: int = 8, form: str = "marginal"):
    """The LoadedModel of an MDLM with its method swapped for the EDLM bound (for evaluate_tokens)."""
    return dataclasses.replace(mdlm_model, method=EDLMBound(mdlm_model.method, energy, num_partition_samples, form))
