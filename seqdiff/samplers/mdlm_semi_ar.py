"""Semi-autoregressive generation of any length (the MDLM stride scheme, Sahoo et al. 2024, section 4.2).

The sequence is produced in blocks of at most `block_len` tokens (the model's context). The first block is
sampled from scratch; each later block starts `block_len - overlap` tokens after the previous one, and its
first `overlap` tokens are the trailing `overlap` tokens of the output so far, passed as `given`
conditioning, so the sampler (the cached MDLM sampler by default) only fills the new tokens. The last block
is shorter when the length is not a whole number of strides. User conditioning (`given` over the whole
length: a prompt or spans to infill) is honoured inside every block. Any sampler that accepts `given` works
(MDLM ancestral / cached, SEDD, and AR, for which the overlap is a prefix prompt).
"""

from __future__ import annotations

import torch
from torch import Tensor

from seqdiff.samplers.base import SampleOutput, Sampler, SamplerError


def block_starts(total_len: int, block_len: int, overlap: int) -> list[int]:
    """Start offsets of the blocks: 0, stride, 2 stride, ... while earlier blocks leave tokens to generate."""
    if block_len < 1 or total_len < 1:
        raise SamplerError(f"lengths must be >= 1, got total {total_len}, block {block_len}")
    if not 0 <= overlap < block_len:
        raise SamplerError(f"--overlap (sample.overlap)={overlap} must lie in [0, block length {block_len})")
    stride = block_len - overlap
    starts = [0]
    while starts[-1] + block_len < total_len:
        starts.append(starts[-1] + stride)
    return starts


@torch.no_grad()
def generate_semi_ar(sampler: Sampler, batch_size: int, total_len: int, block_len: int, overlap: int,
                     generator: torch.Generator | None = None, given: Tensor | None = None) -> SampleOutput:
    """A (batch_size, total_len) sample in overlapping blocks; `blocks` holds each block as sampled."""
    device = next(sampler.backbone.parameters()).device
    given = sampler.check_given(given, batch_size, total_len, sampler.method.vocab_size, device)
    out = torch.full((batch_size, total_len), -1, dtype=torch.long, device=device)  # (B, N); -1 = not yet
    if given is not None:
        out = given.clone()
    blocks, calls = [], 0
    for start in block_starts(total_len, block_len, overlap):
        end = min(start + block_len, total_len)
        cond = out[:, start:end]  # (B, l): the previous block's tail + user-given tokens, -1 elsewhere
        res = sampler.generate(batch_size, end - start, generator, given=cond if (cond >= 0).any() else None)
        out[:, start:end] = res.tokens
        blocks.append(res.tokens)
        calls += res.num_denoiser_calls
    return SampleOutput(tokens=out, num_denoiser_calls=calls, blocks=blocks)
