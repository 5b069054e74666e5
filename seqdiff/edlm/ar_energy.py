"""EDLM-AR: the residual energy of a frozen autoregressive model, E(x0, x_t) = -log p_AR(x0) + log mu(x0 | x_t).

Then mu exp(-E) = p_AR(x0) on every x0 that agrees with x_t, so the EDLM step is the AR model restricted to
the completions of x_t; the importance weights p_AR / mu pull MDLM's parallel draws toward the AR model.
Its partition function Z(x_t) = p_AR(x0 agrees with x_t) is not known in closed form (it must be estimated
for the likelihood bound, seqdiff.edlm.partition).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.checkpoint import LoadedModel, load_checkpoint
from seqdiff.edlm.base import Energy, EnergyError, check_same_tokenizer


def ar_token_log_probs(ar: LoadedModel, x0: Tensor) -> Tensor:
    """(N, L) float64 log p_AR(x0^l | BOS, x0^{<l}): one causal forward pass per sequence."""
    logits = ar.backbone(ar.method.shift_right(x0))  # (N, L, V)
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    return log_probs.gather(-1, x0[..., None])[..., 0]  # (N, L)


def check_ar_model(ar: LoadedModel, vocab_size: int) -> None:
    if not ar.method.causal:
        raise EnergyError(f"{ar.path} is a {ar.method.name!r} model; the AR energies need an autoregressive one")
    if ar.tokenizer.vocab_size != vocab_size:
        raise EnergyError(f"the AR model {ar.path} has vocabulary size {ar.tokenizer.vocab_size}, the MDLM "
                          f"{vocab_size}: the two must share a tokenizer")


class AREnergy(Energy):
    name = "ar"

    def __init__(self, ar: LoadedModel, vocab_size: int, mask_id: int):
        check_ar_model(ar, vocab_size)
        self.ar, self.mask_id = ar, mask_id

    @classmethod
    def load(cls, path: str, mdlm: LoadedModel, device: str = "cpu") -> AREnergy:
        """The energy of the AR checkpoint / run directory at `path`, for the MDLM `mdlm`."""
        ar = load_checkpoint(path, device=device)
        if ar.method.causal:  # a model that is not AR: __init__ says so, the telling message
            check_same_tokenizer(f"the AR model {ar.path}", ar.tokenizer.identity(), ar.tokenizer.describe(), mdlm)
        return cls(ar, mdlm.tokenizer.vocab_size, mdlm.tokenizer.mask_id)

    def row_width(self) -> int:
        return self.ar.tokenizer.vocab_size  # (rows, L, V) logits and log-probabilities per forward

    def max_length(self) -> int:
        return self.ar.model_config.max_seq_len  # BOS + x0 minus its last token: L positions

    def energy(self, x0: Tensor, xt: Tensor, log_mu: Tensor) -> Tensor:
        return -ar_token_log_probs(self.ar, x0).sum(-1) + log_mu.double()
