"""Autoregressive sampling with a KV cache: each new token costs one single-position forward pass.

Conditioning: a prefix prompt only, as `given` (B, L) or (L,) long with the prompt's token ids at the first
positions of a row and -1 after them (the convention of the diffusion samplers; rows may have prompts of
different lengths). Prompt tokens are fed through the cache one at a time and never changed; a `given` with
a fixed token after a free one (infilling) is refused, since a left-to-right model cannot condition on the
future.

MASK and PAD get no probability: an AR model never has them as targets (MASK is not in its data, PAD is never
scored), yet its softmax leaves them a little mass, and after a few thousand draws one lands in a sample (a `_`
in the middle of a word, a FASTA line with a character that is no base). A sample is drawn from the model
conditioned on neither appearing; BOS / EOS stay (document boundaries are in the data). The likelihood is the
model's own softmax, unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.categorical import probs_from_logits, sample_categorical
from seqdiff.samplers.base import SampleOutput, Sampler, SamplerError


class ARSampler(Sampler):
    name = "ar"
    methods = ("ar",)
    supports_top_p = True
    reads = frozenset()  # one denoiser call per token: `steps` sets nothing
    exact = True  # the chain rule of the AR model itself

    def __init__(self, method, backbone, steps: int = 1, temperature: float = 1.0, top_p: float = 1.0):
        super().__init__(method, backbone, steps=max(steps, 1), temperature=temperature, top_p=top_p)

    @torch.no_grad()
    def generate(self, batch_size: int, seq_len: int, generator: torch.Generator | None = None,
                 given: Tensor | None = None) -> SampleOutput:
        device, given = self.prepare(batch_size, seq_len, given)
        fixed = None
        if given is not None:
            fixed = given >= 0  # (B, L)
            # a prefix: once a position is free, every later one is free too
            if (fixed[:, 1:] & ~fixed[:, :-1]).any():
                raise SamplerError("the AR sampler accepts a prefix prompt only (given tokens at the start of "
                                   "each row); infilling needs a diffusion model (MDLM or SEDD)")
        cache = self.backbone.new_kv_cache(batch_size, seq_len, device=device)
        tokens = torch.full((batch_size, 1), self.method.bos_id, dtype=torch.long, device=device)  # (B, 1)
        out = torch.empty((batch_size, seq_len), dtype=torch.long, device=device)
        # MASK and PAD never; while `generate` asks (Method.sampling_without), also BOS / EOS where they have no
        # place (DNA, text streams, after a prompt): decoding would drop them and shorten the sample
        never = torch.tensor(sorted({self.method.mask_id, self.method.pad_id, *self.method.never_sampled}),
                             device=device)
        for i in range(seq_len):
            logits = self.backbone(tokens, kv_cache=cache)[:, -1]  # (B, V)
            logits = logits.index_fill(-1, never, float("-inf"))  # before temperature and the nucleus filter
            probs = probs_from_logits(logits, self.temperature, self.top_p)
            out[:, i] = sample_categorical(probs, generator)
            if fixed is not None:
                out[:, i] = torch.where(fixed[:, i], given[:, i], out[:, i])
            tokens = out[:, i : i + 1]
        return SampleOutput(tokens=out, num_denoiser_calls=seq_len)
