"""Autoregressive baseline: next-token cross-entropy on the same backbone with causal attention.

The input is [BOS, x_1 .. x_{L-1}] and the targets are [x_1 .. x_L], so AR scores exactly the same L
tokens of each block as MDLM does and the two NLLs are comparable token for token. Its NLL is exact.

Packed documents (Batch.segment_ids): the shift is per document, so the first token of each document (its
BOS token in the data, as in the wrapped / padded rows) is predicted from the model's BOS input, never from
the previous document's last token, and attention is causal within each document: a packed row's NLL is
the sum of its documents' NLLs computed one by one (tested).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqdiff.methods.base import Batch, Method, MethodOutput


class AR(Method):
    name = "ar"
    causal = True
    exact_likelihood = True
    """The exact NLL: one causal pass, no random times."""
    default_sampler = "ar"
    """KV-cached left-to-right generation."""
    fusable_loss = True
    """Next-token cross-entropy of the head at every scored position (method.fused_loss)."""
    packable = True
    """Packed documents: shifted per document, attention causal within each (module docstring)."""
    noise_level_input = False
    """Nothing is noised: a time-conditioned backbone would have nothing to condition on."""

    def shift_right(self, x: Tensor, segment_ids: Tensor | None = None) -> Tensor:
        """(B, L) -> (B, L): BOS followed by all but the last token; with segment ids, BOS at the first token
        of every segment (nothing crosses from one document into the next)."""
        bos = torch.full_like(x[:, :1], self.bos_id)
        shifted = torch.cat([bos, x[:, :-1]], dim=1)
        if segment_ids is None:
            return shifted
        starts = torch.ones_like(segment_ids, dtype=torch.bool)
        starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]  # (B, L) first token of a document
        return shifted.masked_fill(starts, self.bos_id)

    def token_nll(self, backbone: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """(per-token NLL (B, L) in float32, zero where not scored; the scored mask (B, L)), one causal pass."""
        batch = Batch.from_any(batch)
        x = batch.input_ids  # (B, L)
        scored = batch.scored(self.pad_id)
        attention_mask = self.shifted_attention(batch)  # shift with the inputs
        # the shifted input at i stands in i's document: segment ids and positions are the targets'
        logits = backbone(self.shift_right(x, batch.segment_ids), attention_mask=attention_mask,
                          **batch.packing())  # (B, L, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), x.flatten(), reduction="none").view_as(x)
        return torch.where(scored, nll, torch.zeros_like(nll)), scored

    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        if self.uses_fused_loss(backbone):  # method.fused_loss: the summed NLL without the (B, L, V) logits
            total, scored = self.fused_nll_sum(backbone, Batch.from_any(batch))
        else:
            per_token, scored = self.token_nll(backbone, batch)
            total = per_token.sum()
        num_tokens = scored.sum().to(torch.float64)
        loss = total / num_tokens.clamp(min=1).to(total.dtype)
        return MethodOutput(loss=loss, nll_sum=total.detach().to(torch.float64), num_tokens=num_tokens)

    def fused_nll_sum(self, backbone: nn.Module, batch: Batch) -> tuple[Tensor, Tensor]:
        """(the NLL summed over scored tokens, differentiable; the scored mask (B, L)): `token_nll`'s sum, from
        the backbone's chunked head and cross-entropy (method.fused_loss)."""
        x, scored = batch.input_ids, batch.scored(self.pad_id)
        total, _ = backbone(self.shift_right(x, batch.segment_ids), attention_mask=self.shifted_attention(batch),
                            targets=x.flatten(), token_weight=scored.flatten().float(), **batch.packing())
        return total, scored

    @staticmethod
    def shifted_attention(batch: Batch) -> Tensor | None:
        """The attention mask of the shifted input (BOS is always real), or None."""
        if batch.attention_mask is None:
            return None
        return torch.cat([torch.ones_like(batch.attention_mask[:, :1]), batch.attention_mask[:, :-1]], dim=1)
