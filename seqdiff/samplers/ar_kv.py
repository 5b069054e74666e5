"""Autoregressive sampling with a KV cache: each new token costs one single-position forward pass."""

from __future__ import annotations

import torch

from seqdiff.categorical import probs_from_logits, sample_categorical
from seqdiff.samplers.base import SampleOutput, Sampler


class ARSampler(Sampler):
    name = "ar"
    methods = ("ar",)

    def __init__(self, method, backbone, steps: int = 1, temperature: float = 1.0):
        super().__init__(method, backbone, steps=max(steps, 1), temperature=temperature)

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None) -> SampleOutput:
        self.check_length(seq_len)
        device = next(self.backbone.parameters()).device
        cache = self.backbone.new_kv_cache(batch_size, seq_len, device=device)
        tokens = torch.full((batch_size, 1), self.method.bos_id, dtype=torch.long, device=device)  # (B, 1)
        out = torch.empty((batch_size, seq_len), dtype=torch.long, device=device)
        for i in range(seq_len):
            logits = self.backbone(tokens, kv_cache=cache)[:, -1]  # (B, V)
            out[:, i] = sample_categorical(probs_from_logits(logits, self.temperature), generator)
            tokens = out[:, i : i + 1]
        return SampleOutput(tokens=out, num_denoiser_calls=seq_len)
