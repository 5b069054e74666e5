"""Scaled dot-product attention for the backbones: PyTorch's SDPA, except where an explicit form is faster.

On CPU under bf16 autocast, PyTorch's fused CPU kernel (`_scaled_dot_product_flash_attention_for_cpu`) is slow
at short sequences: its backward alone took 11 ms per layer at 32 x 128 tokens, 2 heads, ten times its forward,
and forward + backward ran 2-3x slower than softmax(q k^T) v written out (bf16 matmuls, float32 softmax); the
explicit form makes a quickstart-shape training step 1.26-1.36x and a DNA cpu-small step 1.33x faster
(reports/bench/cpu_bf16_speedup, reports/bench/README.md "Attention"). At 256 tokens the two are even and
from there the fused kernel wins (it never holds the L x L scores), and in float32 it wins at every length
measured, so the explicit form is used only for bf16 / float16 queries on CPU with at most EXPLICIT_MAX_LEN
keys, self-attention without a KV cache, and never under torch.compile (Inductor fuses attention itself).
Elsewhere, CUDA included, SDPA picks its kernel as before.

Masks follow SDPA: a boolean mask is True where a query may attend, a float mask is added to the scores, and
`is_causal` masks the upper triangle. A query row with every key masked gets zeros, as SDPA's math path gives.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

EXPLICIT_MAX_LEN = 128
"""Longest key length at which the explicit form runs (bf16 on CPU; measured, module docstring)."""

_CAUSAL: dict[tuple[int, str], Tensor] = {}


def causal_bias(length: int, device: torch.device) -> Tensor:
    """(L, L) float32, 0 on and below the diagonal and -inf above; cached, as every layer of every step asks for
    the same one. Added to the scores: one pass, and no row is fully masked, so no NaN to clean up."""
    key = (length, str(device))
    if key not in _CAUSAL:
        _CAUSAL[key] = torch.full((length, length), float("-inf"), device=device).triu(1)
    return _CAUSAL[key]


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                       is_causal: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d) + mask) v with the softmax in float32 at least; (B, nH, L, Dh) in, q's dtype out."""
    if is_causal and attn_mask is not None:  # as SDPA: one structure or the other, so both paths fail alike
        raise ValueError("attention: an explicit attn_mask cannot be combined with is_causal=True")
    wide = torch.promote_types(q.dtype, torch.float32)  # bf16 / float16 scores are normalized in float32
    scores = torch.matmul(q, k.transpose(-1, -2)).to(wide) * q.shape[-1] ** -0.5  # (B, nH, L, S)
    if is_causal:
        scores = scores + causal_bias(q.shape[-2], q.device).to(wide)
    elif attn_mask is not None and attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    elif attn_mask is not None:
        scores = scores + attn_mask.to(wide)
    probs = torch.softmax(scores, dim=-1)
    if attn_mask is not None:
        probs = probs.nan_to_num(0.0)  # rows with every key masked: zeros, not NaN
    return torch.matmul(probs.to(v.dtype), v)


def uses_explicit(q: Tensor, k: Tensor) -> bool:
    """Whether attention(q, k, ...) takes the explicit form (module docstring)."""
    return (q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[-2] == k.shape[-2] <= EXPLICIT_MAX_LEN and not torch.compiler.is_compiling())


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False,
              dropout_p: float = 0.0) -> Tensor:
    """Scaled dot-product attention, (B, nH, L, Dh) -> (B, nH, L, Dh), by the faster kernel for the case."""
    if dropout_p == 0.0 and uses_explicit(q, k):
        return explicit_attention(q, k, v, attn_mask, is_causal)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=dropout_p)
