"""Autoregressive baseline: next-token cross-entropy on the same backbone with causal attention.

The input is [BOS, x_1 .. x_{L-1}] and the targets are [x_1 .. x_L], so AR scores exactly the same L
tokens of each block as MDLM does and the two NLLs are comparable token for token. Its NLL is exact.
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

    def shift_right(self, x: Tensor) -> Tensor:
        """(B, L) -> (B, L): BOS followed by all but the last token."""
        bos = torch.full_like(x[:, :1], self.bos_id)
        return torch.cat([bos, x[:, :-1]], dim=1)

    def loss(self, backbone: nn.Module, batch: Batch, generator: torch.Generator | None = None) -> MethodOutput:
        batch = Batch.from_any(batch)
        x = batch.input_ids  # (B, L)
        scored = batch.scored(self.pad_id)
        attention_mask = None
        if batch.attention_mask is not None:  # shift with the inputs; BOS is always real
            attention_mask = torch.cat([torch.ones_like(batch.attention_mask[:, :1]),
                                        batch.attention_mask[:, :-1]], dim=1)
        logits = backbone(self.shift_right(x), attention_mask=attention_mask)  # (B, L, V)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), x.flatten(), reduction="none").view_as(x)
        per_token = torch.where(scored, nll, torch.zeros_like(nll))
        num_tokens = scored.sum().to(torch.float64)
        loss = per_token.sum() / num_tokens.clamp(min=1).to(per_token.dtype)
        return MethodOutput(loss=loss, nll_sum=per_token.detach().to(torch.float64).sum(), num_tokens=num_tokens)
