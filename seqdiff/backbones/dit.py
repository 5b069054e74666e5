"""DiT-style transformer backbone: tokens (+ an optional noise level) -> logits or hidden states.

The backbone knows nothing of diffusion. A method hands it token ids, optionally a per-sequence noise
level (MDLM passes sigma_t when time conditioning is on) and a padding mask; it returns float32 logits.

Design choices and the papers behind them
- Pre-norm transformer blocks (LayerNorm -> attention -> residual; LayerNorm -> MLP -> residual), GELU
  MLP of width mlp_ratio * hidden (tanh approximation by default, as MDLM; `model.activation: gelu` for the
  exact one), fused qkv projection, final LayerNorm and an
  untied output projection — the backbone of MDLM (Sahoo et al. 2024, "Simple and Effective Masked
  Diffusion Language Models", arXiv:2406.07524), itself the DiT of Peebles & Xie 2023 ("Scalable Diffusion
  Models with Transformers", arXiv:2212.09748) over token sequences.
- Positions enter only through rotary embeddings in attention (Su et al. 2021, RoFormer): no learned
  absolute table, so relative offsets are what attention sees (left padding does not shift anything).
- adaLN-Zero conditioning (DiT): when `time_conditioning` is on, a sinusoidal embedding of the noise level
  goes through an MLP to c (width cond_dim); every block maps SiLU(c) to shift / scale / gate for its
  attention and MLP branches with a zero-initialized Linear, so each residual branch starts gated to zero
  and the block starts as the identity. The final LayerNorm gets shift / scale the same way. LayerNorms
  that are modulated carry no affine parameters of their own (as in DiT). When time conditioning is off
  none of these parameters exist and the noise level is ignored.
- Attention is `torch.nn.functional.scaled_dot_product_attention` (through seqdiff.backbones.attention,
  which writes it out for bf16 on CPU at short lengths, where PyTorch's fused CPU kernel is slower). With
  no padding mask and no cache it is called with `is_causal` / no mask so it can take its fastest (flash /
  memory-efficient) kernel; a padding mask (True = real token) becomes an explicit boolean mask, combined
  with the causal triangle when the model is causal. A query may always attend to itself, so a padded row
  is never fully masked (a fully masked row would give NaN that leaks through the values into later layers).
- KV cache for causal decoding: preallocated per-layer key / value buffers; new tokens are rotated at
  their absolute positions, written at [len, len + L_new), and attend causally over the first
  len + L_new cached positions. Prefill and token-by-token decoding share the same code path.
- Explicit attention structure (block diffusion, seqdiff.methods.bd3lm): `attn_mask` (L, L) or (B, L, L),
  True = the query may attend to the key, replaces the model's own causal / bidirectional structure, and
  `positions` (L,) gives each token its rotary position (the x_t + x_0 concatenation of BD3-LM puts both
  halves at positions 0..L-1). The boolean mask is turned once per forward into an additive float mask
  (0 / -inf), which SDPA on CPU runs about 1.5x faster than a boolean one (measured, 512 tokens).
- Block-causal KV cache for bidirectional models (`new_kv_cache(..., blockwise=True)`): each call's tokens
  attend to every cached token and to each other, so feeding blocks one call at a time is block-causal
  attention. `update_cache=False` computes a call against the cache without keeping its keys (the cache
  length does not move and the next call overwrites them): a noisy block is denoised against the clean
  prefix this way, then written once when it is final.
- Packed documents (`segment_ids` (B, L), data.text.block_mode=packed): a token attends only to tokens of
  its own segment (block-diagonal; causal models: block-diagonal and causal), and `positions` (B, L) give
  rotary positions that restart at 0 in each segment, so a packed row computes what its documents would
  compute one by one (tested). The kernel is chosen by `packed_attention_kernel`: on CUDA, where
  `torch.nn.attention.flex_attention` imports, the compiled flex kernel with a block mask (it skips the
  128 x 128 tiles that cross documents, so the cost falls with the documents' length); otherwise SDPA
  with the explicit mask (the same additive float mask as `attn_mask`).
- Outputs at selected positions (`output_index`, MDLM's masked positions): the output head runs there only, and
  so does the last block after its attention (`last_block_at_outputs`): keys and values need every position, but
  nothing after the last attention mixes positions (except a convolution before the MLP, which is formed
  everywhere and selected after), so the output projection and MLP of the other positions would be discarded.
- Initialization: N(0, 0.02) for Linear and Embedding weights, zero biases, zero adaLN modulation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqdiff.backbones.activations import ACTIVATIONS
from seqdiff.backbones.attention import attention
from seqdiff.backbones.checkpointing import call_block
from seqdiff.backbones.kmer_embedding import KmerEmbedding
from seqdiff.backbones.linear_cross_entropy import linear_cross_entropy
from seqdiff.backbones.local_conv import LocalConv
from seqdiff.backbones.rotary import RotaryEmbedding, apply_rotary
from seqdiff.config import ModelConfig

try:  # torch >= 2.5; the packed fast path on CUDA, never an import-time requirement
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch
    BlockMask = create_block_mask = flex_attention = None

FLEX_AVAILABLE = flex_attention is not None
"""Whether this torch has `torch.nn.attention.flex_attention`."""


def packed_attention_kernel(device_type: str, flex_available: bool = FLEX_AVAILABLE) -> str:
    """The attention kernel for packed documents: "flex" (flex_attention with a block mask) on CUDA when torch
    has it, else "sdpa" (scaled_dot_product_attention with an explicit mask). Eager flex_attention off CUDA
    materializes the whole score matrix, which SDPA's CPU kernels do faster."""
    return "flex" if device_type == "cuda" and flex_available else "sdpa"


_COMPILED_FLEX = None


def _flex(q: Tensor, k: Tensor, v: Tensor, block_mask) -> Tensor:
    """flex_attention, compiled once on CUDA (the eager form is a slow reference there); eager elsewhere."""
    global _COMPILED_FLEX
    if q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=block_mask)
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=False)
    return _COMPILED_FLEX(q, k, v, block_mask=block_mask)


@dataclass
class KVCache:
    """Per-layer key / value buffers of a causal model, filled left to right.

    keys[i], values[i]: (B, n_heads, max_len, head_dim); key_mask: (B, max_len), True = real token;
    length: how many positions are filled. `padded` records that some attention mask was written, so the
    model must build explicit masks instead of taking the unmasked fast path. `blockwise`: a cache of a
    bidirectional model, where each call's tokens see the whole cache and each other (block-causal).
    conv_inputs[i * sites + s]: (B, max_len, hidden_size), layer i's inputs to its local convolution s (s = 0
    before attention, s = 1 before the MLP with model.local_conv_mlp); empty without model.local_conv.
    token_ids: (B, max_len), the symbols fed so far (id + 1, 0 at padding), which the k-mer embeddings of later
    tokens read (model.kmer_sizes); None without them.
    """

    keys: list[Tensor]
    values: list[Tensor]
    key_mask: Tensor
    length: int = 0
    padded: bool = False
    blockwise: bool = False
    conv_inputs: list[Tensor] = field(default_factory=list)
    token_ids: Tensor | None = None

    @property
    def max_len(self) -> int:
        return self.keys[0].shape[2]

    @property
    def batch_size(self) -> int:
        return self.keys[0].shape[0]

    def reset(self) -> None:
        """Forget the cached tokens (the buffers are reused)."""
        self.length = 0
        self.padded = False
        self.key_mask.fill_(True)

    def select_rows(self, rows: Tensor) -> KVCache:
        """A copy holding only batch rows `rows` (index or bool mask), for calls on a subset of the batch
        with update_cache=False (what such a call writes lands in the copy, not in this cache)."""
        return KVCache(keys=[k[rows] for k in self.keys], values=[v[rows] for v in self.values],
                       key_mask=self.key_mask[rows], length=self.length, padded=self.padded,
                       blockwise=self.blockwise, conv_inputs=[c[rows] for c in self.conv_inputs],
                       token_ids=None if self.token_ids is None else self.token_ids[rows])


def select_positions(h: Tensor, output_index: Tensor | None) -> Tensor:
    """(B, L, H) -> (N, H) at the flat positions `output_index` (N,), or h unchanged when it is None."""
    if output_index is None:
        return h
    return h.flatten(0, 1).index_select(0, output_index)  # (N, H)


def bias_excluding(bias: Tensor, exclude_id: int | None) -> Tensor:
    """The output bias with -inf at `exclude_id` (unchanged when None). A Linear writes its bias into every
    output row before the matmul anyway, so a -inf logit costs a copy of the (V,) bias, not a pass over the
    (N, V) logits as a fill after the head would (forward and backward); the -inf column's gradient is 0."""
    if exclude_id is None:
        return bias
    return bias.index_fill(0, torch.tensor([exclude_id], device=bias.device), float("-inf"))  # (V,)


def modulate(x: Tensor, shift: Tensor | None, scale: Tensor | None) -> Tensor:
    """adaLN: x * (1 + scale) + shift, with shift / scale (B, 1, H) broadcast over positions (or (N, H), one row
    per selected position: `at_rows`); x unchanged without conditioning (None)."""
    if shift is None:
        return x
    return torch.addcmul(shift, x, 1 + scale)


def gated_add(x: Tensor, gate: Tensor | None, h: Tensor) -> Tensor:
    """A residual branch: x + gate * h under adaLN-Zero, x + h without conditioning (gate None)."""
    if gate is None:
        return x + h
    return torch.addcmul(x, gate, h)


def at_rows(modulation: Tensor | None, output_index: Tensor | None, L: int) -> Tensor | None:
    """A per-row adaLN vector (B, 1, H) at the flat positions `output_index` (N,) of rows of length L: (N, H),
    the vector of each position's row. Unchanged when either is None."""
    if modulation is None or output_index is None:
        return modulation
    return modulation[:, 0].index_select(0, torch.div(output_index, L, rounding_mode="floor"))  # (N, H)


class TimestepEmbedding(nn.Module):
    """Noise level [B] -> sinusoidal features (freq_dim) -> MLP -> c (B, cond_dim), as in DiT."""

    def __init__(self, cond_dim: int, freq_dim: int = 256, max_period: float = 10_000.0) -> None:
        super().__init__()
        half = freq_dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)  # (freq_dim/2,)
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, noise_level: Tensor) -> Tensor:
        args = noise_level.float()[:, None] * self.freqs.float()[None]  # (B, freq_dim/2)
        emb = torch.cat((torch.cos(args), torch.sin(args)), dim=-1)  # (B, freq_dim), computed in float32
        return self.mlp(emb.to(self.mlp[0].weight.dtype))  # (B, cond_dim)


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused qkv projection, rotary positions and an optional KV cache."""

    def __init__(self, hidden_size: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = hidden_size // n_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        rotations: Tensor,
        attn_mask: Tensor | None,
        is_causal: bool,
        kv: tuple[Tensor, Tensor] | None = None,
        start: int = 0,
        output_index: Tensor | None = None,
    ) -> Tensor:
        """(B, L, H), or (N, H) at the flat positions `output_index` only: every position's key and value, and
        every query, are computed either way; the output projection runs only where the output is kept."""
        B, L, H = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim).unbind(2)  # (B, L, nH, Dh) views
        q = apply_rotary(q, rotations).transpose(1, 2)  # (B, nH, L, Dh), rotated at positions start + i
        k = apply_rotary(k, rotations).transpose(1, 2)
        v = v.transpose(1, 2)
        if kv is not None:
            k_buf, v_buf = kv  # (B, nH, max_len, Dh)
            end = start + L
            k_buf[:, :, start:end] = k
            v_buf[:, :, start:end] = v
            k = k_buf[:, :, :end].to(q.dtype)  # (B, nH, end, Dh)
            v = v_buf[:, :, :end].to(q.dtype)
        # (B, nH, L, Dh)
        if BlockMask is not None and isinstance(attn_mask, BlockMask):  # packed documents on the flex kernel
            y = _flex(q, k, v, attn_mask)
        else:
            y = attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)  # SDPA or, bf16 on CPU, explicit
        y = select_positions(y.transpose(1, 2).reshape(B, L, H), output_index)  # (B, L, H) or (N, H)
        return self.dropout(self.out(y))


class MLP(nn.Module):
    def __init__(self, hidden_size: int, mlp_ratio: int, dropout: float, activation: str = "gelu_tanh") -> None:
        super().__init__()
        self.fc = nn.Linear(hidden_size, mlp_ratio * hidden_size)
        self.proj = nn.Linear(mlp_ratio * hidden_size, hidden_size)
        self.dropout = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: Tensor) -> Tensor:
        h = self.activation(self.fc(x))  # (B, L, mlp_ratio * H)
        return self.dropout(self.proj(h))  # (B, L, H)


class DiTBlock(nn.Module):
    """Pre-norm transformer block; with a conditioning vector, adaLN-Zero modulates both branches. With
    model.local_conv, a depthwise convolution mixes neighbouring positions into the attention's input (and,
    with model.local_conv_mlp, a second one into the MLP's)."""

    def __init__(self, cfg: ModelConfig, causal: bool = False) -> None:
        super().__init__()
        H, cond = cfg.hidden_size, cfg.time_conditioning
        self.norm1 = nn.LayerNorm(H, elementwise_affine=not cond)
        self.local_conv = LocalConv(H, cfg.local_conv, causal) if cfg.local_conv else None
        self.local_conv_mlp = LocalConv(H, cfg.local_conv, causal) if cfg.local_conv_mlp else None
        self.attn = SelfAttention(H, cfg.n_heads, cfg.dropout)
        self.norm2 = nn.LayerNorm(H, elementwise_affine=not cond)
        self.mlp = MLP(H, cfg.mlp_ratio, cfg.dropout, cfg.activation)
        # SiLU(c) -> shift, scale, gate for attention and for the MLP; zero-initialized in DiT._init_weights.
        self.adaLN_modulation = nn.Linear(cfg.cond_dim, 6 * H) if cond else None

    def forward(
        self,
        x: Tensor,
        c: Tensor | None,
        rotations: Tensor,
        attn_mask: Tensor | None,
        is_causal: bool,
        kv: tuple[Tensor, Tensor] | None = None,
        start: int = 0,
        *,
        keep: Tensor | None = None,
        segment_ids: Tensor | None = None,
        conv_history: Sequence[Tensor] = (),
        output_index: Tensor | None = None,
    ) -> Tensor:
        """keep (B, L): False at padding; segment_ids: packed documents; conv_history: the cache's conv inputs
        of this layer, one per convolution. The three only matter to the local convolutions (attention gets
        them as attn_mask).

        output_index (N,): flat positions b * L + i; the block's output (N, H) there only. Keys and values
        need every position, so attention runs in full; what follows it per position (the output projection,
        the residual, the MLP) runs at those positions only, the MLP's convolution excepted (it reads
        neighbours, so with model.local_conv_mlp the branch input is formed everywhere and selected after)."""
        history = (*conv_history, None, None)
        if self.adaLN_modulation is None:
            shift1 = scale1 = gate1 = shift2 = scale2 = gate2 = None
        else:  # (B, 1, 6H) -> six (B, 1, H)
            shift1, scale1, gate1, shift2, scale2, gate2 = self.adaLN_modulation(c)[:, None].chunk(6, dim=-1)
        L = x.shape[1]
        h = self.mix(self.local_conv, modulate(self.norm1(x), shift1, scale1), keep, segment_ids, history[0], start)
        early = None if self.local_conv_mlp is not None else output_index  # where the attention output is cut
        h = self.attn(h, rotations, attn_mask, is_causal, kv, start, output_index=early)  # (B, L, H) or (N, H)
        x = gated_add(select_positions(x, early), at_rows(gate1, early, L), h)
        h = self.mix(self.local_conv_mlp, modulate(self.norm2(x), at_rows(shift2, early, L), at_rows(scale2, early, L)),
                     keep, segment_ids, history[1], start)
        late = output_index if early is None else None  # with the MLP's convolution: cut after it
        x, h = select_positions(x, late), select_positions(h, late)
        return gated_add(x, at_rows(gate2, output_index, L), self.mlp(h))

    @staticmethod
    def mix(conv: LocalConv | None, h: Tensor, keep: Tensor | None, segment_ids: Tensor | None,
            conv_history: Tensor | None, start: int) -> Tensor:
        """A branch's input with its neighbours mixed in by a local convolution (unchanged without one)."""
        if conv is None:
            return h
        if conv_history is not None:
            return conv.forward_cached(h, conv_history, start, keep)
        return conv(h, keep, segment_ids)

    @property
    def conv_sites(self) -> int:
        """How many local convolutions the block has (0, 1 or 2): the KV cache keeps inputs for each."""
        return (self.local_conv is not None) + (self.local_conv_mlp is not None)


def init_normal_002(module: nn.Module) -> None:
    """GPT-2 / BERT initialization: N(0, 0.02) weights of linear and embedding layers, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class DiT(nn.Module):
    """Token ids [B, L] (+ noise level [B]) -> logits [B, L, vocab_size] (float32)."""

    takes_segment_ids = True
    """Takes packed documents (`segment_ids`, per-row `positions`): data.text.block_mode=packed may use it."""
    selects_outputs = True
    """forward(output_index=..., exclude_id=...): the output head at those positions only, one id's logit -inf
    (MDLM's SUBS: the masked positions, MASK excluded)."""
    fuses_loss = True
    """forward(targets=..., token_weight=...): the head's cross-entropy without the logits (method.fused_loss)."""
    last_block_at_outputs = True
    """With output_index, the last block runs its output projection and MLP at those positions only (its
    attention in full: keys and values need every position). The same outputs to float rounding (tested);
    False runs the whole last block everywhere and selects after the final norm (`seqdiff bench
    --full-last-block` times the two)."""
    packed_attention = "auto"
    """Kernel for packed documents: "auto" (`packed_attention_kernel`), or "flex" / "sdpa" to force one."""
    activation_checkpointing = False
    """Recompute each block's activations in the backward pass (train.activation_checkpointing;
    seqdiff.backbones.checkpointing); never with a KV cache."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, causal: bool) -> None:
        super().__init__()
        self.config = cfg
        self.vocab_size = vocab_size
        self.causal = causal
        H = cfg.hidden_size
        self.embed = nn.Embedding(vocab_size, H)
        self.kmer_embed = (KmerEmbedding(vocab_size, H, cfg.kmer_sizes, cfg.kmer_buckets, cfg.kmer_dim, causal)
                           if cfg.kmer_sizes else None)
        self.rotary = RotaryEmbedding(H // cfg.n_heads, cfg.max_seq_len)
        if cfg.time_conditioning:
            self.time_embed = TimestepEmbedding(cfg.cond_dim)
        else:
            self.time_embed = None
        self.blocks = nn.ModuleList(DiTBlock(cfg, causal) for _ in range(cfg.n_layers))
        self.norm_final = nn.LayerNorm(H, elementwise_affine=not cfg.time_conditioning)
        self.final_modulation = nn.Linear(cfg.cond_dim, 2 * H) if cfg.time_conditioning else None
        self.output = nn.Linear(H, vocab_size)
        self.apply(self._init_weights)
        if self.kmer_embed is not None:
            self.kmer_embed.reset_projection()  # zero: the k-mers start unused
        for block in self.blocks:
            if block.adaLN_modulation is not None:
                nn.init.zeros_(block.adaLN_modulation.weight)
                nn.init.zeros_(block.adaLN_modulation.bias)
        if self.final_modulation is not None:
            nn.init.zeros_(self.final_modulation.weight)
            nn.init.zeros_(self.final_modulation.bias)

    _init_weights = staticmethod(init_normal_002)

    # ------------------------------------------------------------------------------------------------
    # Public API
    # ------------------------------------------------------------------------------------------------

    def forward(
        self,
        input_ids: Tensor,
        noise_level: Tensor | None = None,
        attention_mask: Tensor | None = None,
        kv_cache: KVCache | None = None,
        *,
        attn_mask: Tensor | None = None,
        positions: Tensor | None = None,
        update_cache: bool = True,
        segment_ids: Tensor | None = None,
        output_index: Tensor | None = None,
        exclude_id: int | None = None,
        targets: Tensor | None = None,
        token_weight: Tensor | None = None,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, L, vocab_size) in float32. See `hidden_states` for the arguments.

        output_index: LongTensor (N,) of flat positions b * L + i: the logits (N, V) of those positions only, so
        a loss that lives on a few positions (MDLM's masked ones) skips the output head everywhere else.
        exclude_id: this id's logit is -inf (SUBS's MASK), written into the output bias (`bias_excluding`).
        targets, token_weight: (N,) each, one per output position (the flat positions, or `output_index`'s):
        instead of logits, (sum_i token_weight_i * nll_i, nll (N,)) of the head's cross-entropy against
        `targets`, computed chunk by chunk without the (N, V) logits (`linear_cross_entropy`, method.fused_loss).
        Inside forward so that FSDP's and DDP's hooks see the head's weights used.
        """
        h = self.hidden_states(input_ids, noise_level, attention_mask, kv_cache=kv_cache, attn_mask=attn_mask,
                               positions=positions, update_cache=update_cache, segment_ids=segment_ids,
                               output_index=output_index)  # (B, L, H) or (N, H)
        bias = bias_excluding(self.output.bias, exclude_id)  # (V,)
        if targets is not None:
            return linear_cross_entropy(h, self.output.weight, bias, targets, token_weight)
        if exclude_id is None:
            return self.output(h).float()  # (..., V)
        return F.linear(h, self.output.weight, bias).float()  # (..., V)

    def head_parameters(self) -> list[nn.Parameter]:
        """The output head: what acts after the last block (final LayerNorm or its adaLN modulation, output Linear).

        `train.freeze_backbone_steps` trains only these at first; `train.backbone_lr_scale` spares them.
        """
        modules = [self.norm_final, self.final_modulation, self.output]
        return [p for m in modules if m is not None for p in m.parameters()]

    def hidden_states(
        self,
        input_ids: Tensor,
        noise_level: Tensor | None = None,
        attention_mask: Tensor | None = None,
        *,
        kv_cache: KVCache | None = None,
        layer: int | None = None,
        attn_mask: Tensor | None = None,
        positions: Tensor | None = None,
        update_cache: bool = True,
        segment_ids: Tensor | None = None,
        output_index: Tensor | None = None,
    ) -> Tensor:
        """Final-normed (and, with time conditioning, modulated) hidden states (B, L, hidden_size), or (N,
        hidden_size) at the flat positions output_index (N,) (b * L + i) only: the last block then computes its
        output at those positions only (`DiTBlock.forward`, `last_block_at_outputs`).

        layer: return instead the residual stream after that many blocks (0 = the token embeddings,
        n_layers = the last block's output before the final norm); probes read intermediate layers this way.

        input_ids: LongTensor (B, L). noise_level: (B,) or a scalar; required with time conditioning,
        ignored without. attention_mask: BoolTensor (B, L), True = real token; used as a key padding mask
        (with a cache it covers only the new tokens and is remembered for later calls). kv_cache: from
        `new_kv_cache` (causal models, or bidirectional ones with blockwise=True); the call appends the new
        tokens and advances its length (with update_cache=False it attends to the cache and leaves its
        length where it was). The cache is written in place: use it for inference (under
        `torch.no_grad()`), not for training.
        attn_mask: BoolTensor (L, start + L) or (B, L, start + L), True = the query may attend to the key; it
        replaces the causal / bidirectional structure (a padding mask still applies, and a query always sees
        itself). positions: LongTensor (L,) or per row (B, L), the rotary position of each token (default
        start..start+L-1); not with a kv_cache.
        segment_ids: LongTensor (B, L), packed documents: a token attends only to tokens with its segment id
        (and, causal models, not after itself); with `positions` restarting at 0 in each segment a packed
        row gives each document the logits it gets alone. Not with attn_mask or a kv_cache.
        """
        B, L = input_ids.shape
        start = 0 if kv_cache is None else kv_cache.length
        if positions is None:  # explicit positions are range-checked instead (2L tokens may share L positions)
            self._check_lengths(B, L, start, kv_cache)
        if attention_mask is not None:
            if attention_mask.shape != (B, L):
                raise ValueError(f"attention_mask must have shape {(B, L)}, got {tuple(attention_mask.shape)}")
            attention_mask = attention_mask.bool()  # also accept 0 / 1 integer masks

        c = self._condition(noise_level, B)  # SiLU(c) (B, cond_dim) or None
        if positions is not None and positions.ndim == 2 and positions.shape[0] != B:
            raise ValueError(f"positions per row must have shape ({B}, {L}), got {tuple(positions.shape)}")
        if positions is None:
            rotations = self.rotary(L, offset=start)  # (L, Dh/2, 2) cos, sin
        else:
            rotations = self._rotations_at(positions, L, kv_cache)  # (L, Dh/2, 2)
        explicit = attn_mask is not None  # the caller's own structure (block diffusion)
        if segment_ids is not None:
            if attn_mask is not None or kv_cache is not None:
                raise ValueError("segment_ids (packed documents) cannot be combined with attn_mask or a kv_cache")
            if segment_ids.shape != (B, L):
                raise ValueError(f"segment_ids must have shape {(B, L)}, got {tuple(segment_ids.shape)}")
            attn_mask, is_causal = self._segment_mask(segment_ids, attention_mask, B, L), False
        elif attn_mask is None:
            attn_mask, is_causal = self._attention_mask(attention_mask, B, L, start, kv_cache, input_ids.device)
        else:
            attn_mask, is_causal = self._explicit_mask(attn_mask, attention_mask, B, L, start, kv_cache), False

        if layer is not None and not 0 <= layer <= len(self.blocks):
            raise ValueError(f"layer must be in [0, {len(self.blocks)}] (n_layers), got {layer}")
        if layer is not None and kv_cache is not None:
            raise ValueError("layer= reads an intermediate layer for probes; it cannot fill a kv_cache")
        if layer is not None and output_index is not None:
            raise ValueError("layer= returns every position of an intermediate layer; it takes no output_index")
        conv, kmers = self.config.local_conv, self.config.kmer_sizes
        if (conv or kmers) and (explicit or (kv_cache is not None and kv_cache.blockwise)):
            what = f"model.local_conv={conv}" if conv else f"model.kmer_sizes={kmers}"
            raise ValueError(f"{what} cannot run under an explicit attn_mask or a blockwise cache "
                             "(block-causal attention): its window would read across blocks")
        x = self.embed(input_ids)  # (B, L, H)
        if self.kmer_embed is not None:
            if kv_cache is not None:
                x = x + self.kmer_embed.forward_cached(input_ids, kv_cache.token_ids, start, attention_mask)
            else:
                x = x + self.kmer_embed(input_ids, attention_mask, segment_ids)
        last = len(self.blocks) - 1 if layer is None and self.last_block_at_outputs else None
        for i, block in enumerate(self.blocks[:layer]):
            kv = None if kv_cache is None else (kv_cache.keys[i], kv_cache.values[i])
            sites = block.conv_sites
            history = kv_cache.conv_inputs[i * sites:(i + 1) * sites] if kv_cache is not None else ()
            x = call_block(block, self.activation_checkpointing and kv_cache is None, x, c, rotations, attn_mask,
                           is_causal, kv, start, keep=attention_mask, segment_ids=segment_ids, conv_history=history,
                           output_index=output_index if i == last else None)
        if layer is not None:
            return x
        if last is None or last < 0:  # the positions were not selected inside the last block
            x = select_positions(x, output_index)  # (N, H) or unchanged
        x = self.norm_final(x)
        if self.final_modulation is not None:
            shift, scale = self.final_modulation(c)[:, None].chunk(2, dim=-1)  # (B, 1, H) each
            x = modulate(x, at_rows(shift, output_index, L), at_rows(scale, output_index, L))
        if kv_cache is not None and update_cache:
            kv_cache.length = start + L
        return x

    def new_kv_cache(
        self,
        batch_size: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        blockwise: bool = False,
    ) -> KVCache:
        """Empty cache for `batch_size` sequences of up to `max_len` tokens.

        Causal models: token-by-token (or chunked) causal decoding. blockwise=True (bidirectional models
        only): each call's tokens attend to the whole cache and to each other (block-causal decoding, as
        block diffusion needs). device / dtype default to those of the model's parameters.
        """
        if blockwise and self.causal:
            raise ValueError("new_kv_cache(blockwise=True) is for bidirectional models; this DiT is causal")
        if not self.causal and not blockwise:
            raise ValueError("new_kv_cache needs a causal model; this DiT was built with causal=False (pass "
                             "blockwise=True for a block-causal cache)")
        if max_len > self.config.max_seq_len:
            raise ValueError(f"cache max_len={max_len} exceeds model.max_seq_len={self.config.max_seq_len}")
        ref = self.output.weight
        device = ref.device if device is None else device
        dtype = ref.dtype if dtype is None else dtype
        n_heads = self.config.n_heads
        shape = (batch_size, n_heads, max_len, self.config.hidden_size // n_heads)
        conv_shape = (batch_size, max_len, self.config.hidden_size)
        return KVCache(
            keys=[torch.zeros(shape, device=device, dtype=dtype) for _ in self.blocks],
            values=[torch.zeros(shape, device=device, dtype=dtype) for _ in self.blocks],
            key_mask=torch.ones(batch_size, max_len, device=device, dtype=torch.bool),
            blockwise=blockwise,
            conv_inputs=[torch.zeros(conv_shape, device=device, dtype=dtype)
                         for block in self.blocks for _ in range(block.conv_sites)],
            token_ids=(torch.zeros(batch_size, max_len, device=device, dtype=torch.long)
                       if self.kmer_embed is not None else None),
        )

    def num_parameters(self, exclude_embedding: bool = False) -> int:
        """Number of parameters; `exclude_embedding` leaves out the input embedding tables (tokens, k-mers)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self._lookup_parameters() if exclude_embedding else n

    def _lookup_parameters(self) -> int:
        """Parameters read by a table lookup, not multiplied at every token: the token and k-mer tables."""
        tables = [] if self.kmer_embed is None else list(self.kmer_embed.tables.parameters())
        return self.embed.weight.numel() + sum(p.numel() for p in tables)

    def flops_per_token(self, seq_len: int, head_share: float = 1.0) -> int:
        """Training FLOPs per token (forward + backward): 6 * N + 12 * n_layers * hidden_size * seq_len.

        head_share: the share of positions at which the output projection runs (MDLM's method.head_at_masked:
        the expected masked share, `MDLM.masked_share`); its weights count only that often, and so do those of
        the last block that run there only (`output_modules`).

        The convention of PaLM (Chowdhery et al. 2022, appendix B), also nanoGPT's MFU estimate: 2 FLOPs
        per multiply-accumulate, x3 for forward + backward. N counts the parameters applied at every token:
        all but the input embedding and k-mer tables (lookups) and the noise-level conditioning (timestep MLP and adaLN
        modulation Linears run once per sequence, not per token); the untied output projection counts.
        The attention term (QK^T and AV over seq_len keys) is for full attention; a causal model does
        about half of it, which this convention ignores.
        """
        per_sequence = {id(p) for m in self._conditioning_modules() for p in m.parameters()}
        n = sum(p.numel() for p in self.parameters() if id(p) not in per_sequence)
        n -= self._lookup_parameters()
        n -= (1 - head_share) * sum(p.numel() for m in self.output_modules() for p in m.parameters())
        cfg = self.config
        return round(6 * n + 12 * cfg.n_layers * cfg.hidden_size * seq_len)

    def output_modules(self) -> list[nn.Module]:
        """The Linears that run only at the selected positions of a forward with output_index: the output head
        and, with `last_block_at_outputs`, the last block's MLP and (no convolution before that MLP) its
        attention's output projection."""
        if not self.blocks or not self.last_block_at_outputs:
            return [self.output]
        last = self.blocks[-1]
        projection = [last.attn.out] if last.local_conv_mlp is None else []
        return [self.output, *projection, last.mlp.fc, last.mlp.proj]

    # ------------------------------------------------------------------------------------------------
    # Internals
    # ------------------------------------------------------------------------------------------------

    def _conditioning_modules(self) -> list[nn.Module]:
        mods = [self.time_embed, self.final_modulation] + [b.adaLN_modulation for b in self.blocks]
        return [m for m in mods if m is not None]

    def _check_lengths(self, B: int, L: int, start: int, kv_cache: KVCache | None) -> None:
        max_seq_len = self.config.max_seq_len
        if start + L > max_seq_len:
            raise ValueError(f"sequence of length {start + L} is longer than model.max_seq_len={max_seq_len}")
        if kv_cache is None:
            return
        if not self.causal and not kv_cache.blockwise:
            raise ValueError("kv_cache needs a causal model; this DiT was built with causal=False")
        if kv_cache.batch_size != B:
            raise ValueError(f"kv_cache holds batch size {kv_cache.batch_size}, input has {B}")
        if start + L > kv_cache.max_len:
            raise ValueError(
                f"kv_cache overflow: {start} cached + {L} new tokens exceed its max_len={kv_cache.max_len}"
            )

    def _condition(self, noise_level: Tensor | None, B: int) -> Tensor | None:
        """SiLU(c), c = MLP(sinusoid(noise_level)): (B, cond_dim); None without time conditioning."""
        if self.time_embed is None:
            return None
        if noise_level is None:
            raise ValueError("this DiT has time_conditioning=True: pass noise_level of shape (B,)")
        if noise_level.ndim == 0:
            noise_level = noise_level.expand(B)
        if noise_level.shape != (B,):
            raise ValueError(f"noise_level must have shape ({B},), got {tuple(noise_level.shape)}")
        return F.silu(self.time_embed(noise_level))

    def _rotations_at(self, positions: Tensor, L: int, kv_cache: KVCache | None) -> Tensor:
        """Rotary (cos, sin) rows for explicit token positions: (L, Dh/2, 2), or (B, L, Dh/2, 2) per row."""
        if kv_cache is not None:
            raise ValueError("positions= cannot be combined with a kv_cache (cached tokens sit at start..start+L-1)")
        if positions.shape[-1:] != (L,) or positions.ndim > 2:
            raise ValueError(f"positions must have shape ({L},) or (B, {L}), got {tuple(positions.shape)}")
        table = self.rotary(self.config.max_seq_len)  # (max_seq_len, Dh/2, 2)
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= table.shape[0]):
            raise ValueError(f"positions must lie in [0, model.max_seq_len={table.shape[0]})")
        return table[positions.to(table.device)]

    def _explicit_mask(self, attn_mask: Tensor, attention_mask: Tensor | None, B: int, L: int, start: int,
                       kv_cache: KVCache | None) -> Tensor:
        """A caller's boolean structure (L, end) or (B, L, end), with the padding mask and the diagonal,
        as the additive float mask SDPA takes: (1 or B, 1, L, end), 0 = attend, -inf = not."""
        end = start + L
        if attn_mask.dtype != torch.bool:
            raise ValueError(f"attn_mask must be boolean (True = may attend), got {attn_mask.dtype}")
        if attn_mask.shape not in ((L, end), (B, L, end)):
            raise ValueError(f"attn_mask must have shape {(L, end)} or {(B, L, end)}, got {tuple(attn_mask.shape)}")
        allowed = attn_mask if attn_mask.ndim == 3 else attn_mask[None]  # (1 or B, L, end)
        key_ok = self._key_mask(attention_mask, start, end, kv_cache)  # (B, end) or None
        if key_ok is not None:
            allowed = allowed & key_ok[:, None, :]  # (B, L, end)
        k_pos = torch.arange(end, device=allowed.device)[None, :]
        q_pos = torch.arange(start, end, device=allowed.device)[:, None]
        allowed = allowed | (k_pos == q_pos)  # a query always sees itself: no fully masked row
        device_type = allowed.device.type  # the mask's dtype must be the queries' (bf16 under autocast)
        autocast = torch.is_autocast_enabled(device_type)
        dtype = torch.get_autocast_dtype(device_type) if autocast else self.embed.weight.dtype
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
        return bias.masked_fill_(~allowed, float("-inf"))[:, None]  # (1 or B, 1, L, end)

    def _segment_mask(self, segment_ids: Tensor, attention_mask: Tensor | None, B: int, L: int):
        """Packed documents: attention only within a segment (and causal for a causal model), padding hidden
        as keys, a query always sees itself. A flex BlockMask or SDPA's mask (1 or B, 1, L, L)."""
        kernel = self.packed_attention
        if kernel == "auto":
            kernel = packed_attention_kernel(segment_ids.device.type)
        if kernel not in ("flex", "sdpa") or (kernel == "flex" and not FLEX_AVAILABLE):
            raise ValueError(f"packed_attention={kernel!r}: choose auto, sdpa, or flex (flex needs torch's "
                             "flex_attention)")
        if kernel == "flex":
            seg = segment_ids
            key_ok = attention_mask if attention_mask is not None else torch.ones_like(seg, dtype=torch.bool)
            causal = self.causal

            def mask_mod(b, h, q, kv):
                ok = (seg[b, q] == seg[b, kv]) & key_ok[b, kv]
                if causal:
                    ok = ok & (kv <= q)
                return ok | (q == kv)

            return create_block_mask(mask_mod, B, None, L, L, device=seg.device)
        allowed = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, L, L) block-diagonal
        if self.causal:
            allowed = allowed & torch.ones(L, L, dtype=torch.bool, device=allowed.device).tril()
        return self._explicit_mask(allowed, attention_mask, B, L, 0, None)  # + padding and the diagonal

    @staticmethod
    def _key_mask(attention_mask: Tensor | None, start: int, end: int, kv_cache: KVCache | None) -> Tensor | None:
        """(B, end) True for keys that are real tokens, or None when nothing is padded; a cache remembers them."""
        if kv_cache is None:
            return attention_mask
        if attention_mask is not None:
            kv_cache.key_mask[:, start:end] = attention_mask
            kv_cache.padded = True
        return kv_cache.key_mask[:, :end] if kv_cache.padded else None

    def _attention_mask(
        self,
        attention_mask: Tensor | None,
        B: int,
        L: int,
        start: int,
        kv_cache: KVCache | None,
        device: torch.device,
    ) -> tuple[Tensor | None, bool]:
        """(attn_mask for SDPA or None, is_causal). Boolean masks are True where attention is allowed."""
        end = start + L
        key_ok = self._key_mask(attention_mask, start, end, kv_cache)  # (B, end) or None
        if key_ok is None:  # fast paths: let SDPA choose its fused kernel
            if not self.causal or L == 1:
                return None, False  # bidirectional, or one new token that sees the whole cache
            if start == 0:
                return None, True
        elif not self.causal:
            # A sequence with no real token at all would leave its rows fully masked: let it see everything.
            key_ok = key_ok | ~key_ok.any(dim=-1, keepdim=True)
            return key_ok[:, None, None, :], False  # (B, 1, 1, L)
        q_pos = torch.arange(start, end, device=device)[:, None]  # (L, 1) absolute query positions
        k_pos = torch.arange(end, device=device)[None, :]  # (1, end)
        allowed = k_pos <= q_pos  # (L, end) causal triangle, offset by the cache length
        if key_ok is None:
            return allowed, False
        allowed = (allowed & key_ok[:, None, :]) | (k_pos == q_pos)  # (B, L, end); a query sees itself
        return allowed[:, None], False  # (B, 1, L, end)


__all__ = ["MLP", "DiT", "DiTBlock", "KVCache", "SelfAttention", "TimestepEmbedding", "modulate"]
