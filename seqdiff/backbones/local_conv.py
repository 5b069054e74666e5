"""A depthwise convolution over neighbouring positions, added to each DiT block's attention input.

Why: at the sizes a CPU trains in minutes (two layers, two heads), attention spends its few heads finding the
adjacent tokens, which is where most of the information of characters and bases lies (an order-4 n-gram or an
order-8 Markov chain is a strong baseline there). A depthwise convolution hands every position its K nearest
neighbours' features for K * hidden_size weights per layer, so the heads are free for longer-range structure.
This is the "token shift" of RWKV (Peng et al. 2023) and the Canon layers of Allen-Zhu (2025, "Physics of
Language Models: Part 4.1"), widened to K positions. Measured on the quickstart's validation play
(reports/quickstart_sweep/local_conv): see there for what it buys MDLM and AR.

Form: h -> h + conv(h), conv depthwise with kernel (hidden_size, K) and no bias (the attention's qkv bias
already absorbs a constant). A bidirectional model sees K // 2 positions on each side, a causal one the K - 1
positions before it and itself, so an AR model never reads a later token.

Every attention structure the DiT supports keeps its meaning:
- padding (attention_mask False): a padded position's features enter no neighbour (they are zeroed first), so
  a padded row computes what the unpadded sequence computes;
- packed documents (segment_ids): a neighbour from another document contributes nothing, so a packed row
  computes what its documents compute one by one;
- causal KV-cache decoding: the cache keeps each layer's conv inputs (`KVCache.conv_inputs`), so a token fed
  alone sees the same K - 1 predecessors as in a full forward.
Block-causal structures (block diffusion's attn_mask, the blockwise cache) are refused: a centred kernel at
the end of a block would read the next block, which block diffusion must not see.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class LocalConv(nn.Module):
    """h (B, L, H) -> h + depthwise_conv(h): each position plus a learned per-channel mix of its neighbours."""

    def __init__(self, hidden_size: int, kernel_size: int, causal: bool) -> None:
        super().__init__()
        self.kernel_size, self.causal = kernel_size, causal
        self.weight = nn.Parameter(torch.empty(hidden_size, kernel_size))  # (H, K): tap j reads offset j - left
        bound = 1 / math.sqrt(kernel_size)  # nn.Conv1d's default for a depthwise kernel (fan_in = K)
        nn.init.uniform_(self.weight, -bound, bound)

    @property
    def left(self) -> int:
        """How many positions before a token its kernel reads (K - 1 causal, K // 2 centred)."""
        return self.kernel_size - 1 if self.causal else self.kernel_size // 2

    def forward(self, h: Tensor, keep: Tensor | None = None, segment_ids: Tensor | None = None) -> Tensor:
        """keep (B, L): False at padding (contributes nothing). segment_ids (B, L): packed documents, no mixing
        across them."""
        x = h if keep is None else h * keep[..., None].to(h.dtype)
        if segment_ids is None:
            return h + self.convolve(x, self.left, self.kernel_size - 1 - self.left)
        return h + self.within_segments(x, segment_ids)

    def convolve(self, x: Tensor, left: int, right: int) -> Tensor:
        """(B, L, H) zero-padded by left / right positions -> (B, L + left + right - K + 1, H).

        Written as a 2-D convolution of height 1: on CPU, oneDNN's depthwise 2-D kernels run forward and
        backward 3.3-3.7x faster than its 1-D path at the quickstart's shape (32 x 128 x 128, K = 9, centred and
        causal, 1 and 2 threads: reports/bench/local_conv), with the same sums."""
        y = F.pad(x.transpose(1, 2)[:, :, None, :], (left, right))  # (B, H, 1, L + left + right)
        kernel = self.weight[:, None, None, :].to(y.dtype)  # (H, 1, 1, K)
        return F.conv2d(y, kernel, groups=self.weight.shape[0]).squeeze(2).transpose(1, 2)

    def within_segments(self, x: Tensor, segment_ids: Tensor) -> Tensor:
        """The same sum written tap by tap, with the neighbours of another segment left out: (B, L, H)."""
        L = x.shape[1]
        out = torch.zeros_like(x)
        for j in range(self.kernel_size):
            offset = j - self.left  # tap j reads position i + offset
            lo, hi = max(0, -offset), min(L, L - offset)  # positions i whose neighbour exists
            if lo >= hi:
                continue
            same = (segment_ids[:, lo:hi] == segment_ids[:, lo + offset:hi + offset])[..., None]  # (B, n, 1)
            tap = self.weight[:, j].to(x.dtype)  # (H,)
            out[:, lo:hi] += torch.where(same, x[:, lo + offset:hi + offset] * tap, 0)
        return out

    def forward_cached(self, h: Tensor, history: Tensor, start: int, keep: Tensor | None = None) -> Tensor:
        """Causal decoding: h (B, L, H) the new tokens at positions start..start+L-1; history (B, max_len, H) this
        layer's conv inputs so far, written here at [start, start + L)."""
        if not self.causal:
            raise ValueError("a KV cache with model.local_conv needs a causal model (a centred kernel reads the "
                             "next block)")
        x = h if keep is None else h * keep[..., None].to(h.dtype)
        end = start + h.shape[1]
        history[:, start:end] = x
        first = max(0, start - self.left)
        window = history[:, first:end].to(x.dtype)  # (B, end - first, H)
        return h + self.convolve(window, self.left - (start - first), 0)[:, -h.shape[1]:]


__all__ = ["LocalConv"]
