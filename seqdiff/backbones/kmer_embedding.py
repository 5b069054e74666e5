"""Learned embeddings of the k-mers around each token, added to its input embedding.

Why: at the sizes a CPU trains, counting models are hard to beat on characters and bases: an order-8 Markov
chain on chr20 memorizes the next-base counts of 4^8 contexts from 53.7 M bases, and the DiT has to learn the
same table through a few layers of attention (reports/dna: at 3% masked, with 128 bases visible on both sides,
MDLM predicts a base worse than the chain does from its 8 neighbours). A k-mer embedding hands that table to the
network directly: each position looks up one learned vector per k, indexed by the k tokens around it (the
tokens of the model's input, MASK included, so a masked position's k-mer says which neighbours are masked).
This is the hashed n-gram embedding of byte-level models (Bojanowski et al. 2017, fastText; Pagnoni et al. 2024,
"Byte Latent Transformer"), here over centred windows for bidirectional models.

Form: x_i = embed(t_i) + W sum_k E_k[id_k(i)], E_k of shape (rows_k, dim), W (dim -> hidden_size) zero at
initialization, so a new model computes what it computes without k-mers and learns how much to use them.
id_k(i) reads the k tokens at offsets -left .. k - 1 - left (left = k // 2 centred, k - 1 causal: an AR model
never reads a later token), each as its id + 1, with 0 for a position outside the sequence, at padding or in
another packed document; the ids are the base-(V + 1) number they spell, exact when (V + 1)^k <= buckets and
otherwise hashed into `buckets` rows (a multiplicative hash of that number modulo a prime), where colliding
k-mers share a row.

The structures the DiT supports keep their meaning: padding contributes nothing to a neighbour's k-mer, a
packed row computes what its documents compute alone, and causal KV-cache decoding keeps the token ids it has
seen (`KVCache.token_ids`) so a token fed alone reads the same k - 1 predecessors. Block-causal structures
(block diffusion) are refused by the DiT, as for the local convolution: a centred window reads the next block.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

PRIME = 2_147_483_647  # 2^31 - 1: every product below stays inside int64
MULTIPLIER = 48_271  # a primitive root modulo PRIME (the MINSTD multiplier), spreading ids over the buckets


def table_rows(vocab_size: int, k: int, buckets: int) -> int:
    """Rows of the k-mer table: every k-mer its own row when (V + 1)^k <= buckets, else `buckets` (hashed)."""
    exact = (vocab_size + 1) ** k
    return exact if exact <= buckets else buckets


class KmerEmbedding(nn.Module):
    """ids (B, L) -> (B, L, hidden_size): the projected sum of one learned embedding per k-mer size."""

    def __init__(self, vocab_size: int, hidden_size: int, sizes: Sequence[int], buckets: int, dim: int,
                 causal: bool) -> None:
        super().__init__()
        self.vocab_size, self.sizes, self.buckets, self.causal = vocab_size, tuple(sizes), buckets, causal
        self.tables = nn.ModuleList(nn.Embedding(table_rows(vocab_size, k, buckets), dim) for k in self.sizes)
        self.proj = nn.Linear(dim, hidden_size, bias=False)
        self.reset_projection()

    def reset_projection(self) -> None:
        """Zero the projection: the model starts as the same model without k-mers (call after a generic init)."""
        nn.init.zeros_(self.proj.weight)

    def left(self, k: int) -> int:
        """How many positions before a token its k-mer reads (k - 1 causal, k // 2 centred)."""
        return k - 1 if self.causal else k // 2

    @property
    def history(self) -> int:
        """How many earlier tokens the longest causal k-mer reads (what a KV cache must keep)."""
        return max(self.sizes) - 1

    def forward(self, ids: Tensor, keep: Tensor | None = None, segment_ids: Tensor | None = None) -> Tensor:
        """ids (B, L); keep (B, L): False at padding; segment_ids (B, L): packed documents. -> (B, L, hidden)."""
        return self.lookup(self.symbols(ids, keep), segment_ids)

    def lookup(self, symbols: Tensor, segment_ids: Tensor | None = None, first: int = 0) -> Tensor:
        """The projected sum of every size's rows for positions first.. of `symbols`: (B, L - first, hidden)."""
        out = 0
        for k, table in zip(self.sizes, self.tables):
            out = out + table(self.kmer_ids(symbols, k, segment_ids)[:, first:])  # (B, L - first, dim)
        return self.proj(out)

    def symbols(self, ids: Tensor, keep: Tensor | None) -> Tensor:
        """id + 1 per position, 0 at padding (0 is also what positions outside the sequence read)."""
        symbols = ids.long() + 1
        return symbols if keep is None else symbols * keep.long()

    def kmer_ids(self, symbols: Tensor, k: int, segment_ids: Tensor | None = None) -> Tensor:
        """(B, L) row of each position's k-mer in table k."""
        left = self.left(k)
        base, exact = self.vocab_size + 1, (self.vocab_size + 1) ** k <= self.buckets
        L = symbols.shape[1]
        number = torch.zeros_like(symbols)
        for j in range(k):
            offset = j - left  # the j-th token of the window is at position i + offset
            lo, hi = max(0, -offset), min(L, L - offset)  # positions i whose neighbour exists
            digit = torch.zeros_like(symbols)
            if lo < hi:
                neighbour = symbols[:, lo + offset:hi + offset]
                if segment_ids is not None:  # another document's token reads as outside
                    neighbour = neighbour * (segment_ids[:, lo:hi] == segment_ids[:, lo + offset:hi + offset])
                digit[:, lo:hi] = neighbour
            number = number * base + digit
            if not exact:
                number = number % PRIME
        return number if exact else number * MULTIPLIER % PRIME % self.buckets

    def forward_cached(self, ids: Tensor, token_history: Tensor, start: int, keep: Tensor | None = None) -> Tensor:
        """Causal decoding: ids (B, L) the new tokens at positions start..start+L-1; token_history (B, max_len)
        the symbols fed so far, written here at [start, start + L)."""
        if not self.causal:
            raise ValueError("a KV cache with model.kmer_sizes needs a causal model (a centred k-mer reads the "
                             "next block)")
        end = start + ids.shape[1]
        token_history[:, start:end] = self.symbols(ids, keep)
        first = max(0, start - self.history)
        # the new tokens' k-mers lie inside the window: it reaches back `history` >= k - 1 tokens, or to 0
        return self.lookup(token_history[:, first:end], first=start - first)


__all__ = ["KmerEmbedding", "table_rows"]
