"""Import published MDLM weights: the reference DiT's state-dict layout -> seqdiff's DiT.

    convert_mdlm_state_dict(state_dict)   -> (ModelConfig, seqdiff DiT state dict)
    convert_mdlm_checkpoint(src, out_dir) -> a directory like `seqdiff export` writes (eval / sample / HF)
    python -m seqdiff.hf.convert_mdlm SRC OUT_DIR [--time-conditioning] [--no-ema] [--n-heads N]

SRC: a .safetensors file (the published mdlm-owt), a torch file with a state dict, or a Lightning .ckpt
of the reference code: its EMA weights by default (the reference evaluates and samples with them;
--no-ema for the raw ones), read without running the code its hyper_parameters pickle
(seqdiff.hf.tensors_only); config.json's ema_weights says which.

What the converter relies on (the MDLM reference implementation, `models/dit.py` of the MDLM repository,
and the `modeling_mdlm.py` published with the `kuleshov-group/mdlm-owt` model, which wraps the same
DiT as `backbone`; read, not copied). Names below omit the common prefix (`backbone.`), which is
detected from the key that ends in `vocab_embed.embedding`:

    vocab_embed.embedding                  (V, H)          a bare Parameter, used as embedding[x]
    sigma_map.mlp.0.weight / .bias         (C, 256) / (C)  sinusoidal features of sigma: [cos | sin],
    sigma_map.mlp.2.weight / .bias         (C, C) / (C)    max_period 10000; c = SiLU(MLP(features))
    rotary_emb.inv_freq                    (D/2,)          10000^(-2i/D), D = H / n_heads (persistent buffer)
    blocks.{i}.norm1.weight, .norm2.weight (H,)            LayerNorm with a weight and no bias, eps 1e-5
    blocks.{i}.attn_qkv.weight             (3H, H)         no bias; rows ordered (three, head, channel)
    blocks.{i}.attn_out.weight             (H, H)          no bias
    blocks.{i}.mlp.0.weight / .bias        (4H, H) / (4H)  GELU (tanh approximation) between
    blocks.{i}.mlp.2.weight / .bias        (H, 4H) / (H)
    blocks.{i}.adaLN_modulation.weight/.bias (6H, C)/(6H)  chunks: shift, scale, gate (attention), shift,
                                                           scale, gate (MLP); x + gate * branch(LN(x) * (1 +
                                                           scale) + shift)
    output_layer.norm_final.weight         (H,)
    output_layer.adaLN_modulation.weight/.bias (2H, C)/(2H) chunks: shift, scale
    output_layer.linear.weight / .bias     (V, H) / (V)

mdlm-owt itself: V = 50258 (GPT-2's 50257 tokens + MASK = 50257, appended last), H = 768, 12 blocks, 12
heads, C = 128, 1024 positions, time_conditioning false, in which case the reference zeroes sigma before
the backbone, so the adaLN modulation is a constant c0 = SiLU(MLP(features(0))).

How the differences are bridged (exactly, in float64, then stored in float32):
- Rotary pairing. The reference rotates "half" pairs (j, j + D/2) (GPT-NeoX style); seqdiff rotates
  interleaved pairs (2i, 2i + 1) with the same frequencies. Permuting the q and k output channels of each
  head (seqdiff channel 2i <- channel i, 2i + 1 <- i + D/2) gives identical attention scores (q.k is
  invariant under a common permutation); v is untouched.
- LayerNorm weights. seqdiff's adaLN LayerNorms have no affine parameters. With time conditioning the
  weight w is folded: LN(x) w (1 + scale) + shift = w * (LN(x) (1 + scale) + shift / w), so the columns of
  the next Linear (attn_qkv, mlp.0, output linear) are multiplied by w and the shift rows of the adaLN
  Linear divided by w; a w with entries near zero is refused (the fold would divide by ~0).
  Without time conditioning seqdiff's blocks have plain affine LayerNorms and no adaLN: the constant
  modulation c0 is folded into them (weight w (1 + scale), bias shift) and the gates into the output
  projections of each branch (attn_out, mlp.2).
- Biases. seqdiff's qkv and attention output Linears have biases; they are set to zero.
- Vocabulary. A target vocabulary larger than V (seqdiff's GPT-2 tokenizer has [PAD] = 50258 after
  [MASK] = 50257) gets zero embedding rows and output rows whose bias is `new_token_bias` (-1e4: never
  predicted). The tokenizer's MASK id must be the reference's mask index (V - 1 by default).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqdiff.checkpoint import CheckpointError
from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.errors import SeqdiffError
from seqdiff.hf.export import check_destination, write_export
from seqdiff.hf.tensors_only import load_tensors_only
from seqdiff.tokenizers import TokenizerError, build_tokenizer

FREQ_DIM = 256
"""Width of the sinusoidal sigma features of the reference (and of seqdiff's TimestepEmbedding)."""
ROTARY_BASE = 10_000.0
MIN_LAYERNORM_WEIGHT = 1e-4
"""|w| below this in a LayerNorm weight cannot be folded into seqdiff's affine-free adaLN LayerNorms."""


class MDLMConversionError(CheckpointError):
    """A state dict that does not have the MDLM reference DiT layout, or cannot be mapped exactly."""


def _find_prefix(state_dict: dict[str, Tensor]) -> str:
    hits = [k for k in state_dict if k.endswith("vocab_embed.embedding")]
    if len(hits) != 1:
        seqdiff_own = any(k.startswith("backbone.") for k in state_dict)
        hint = ("; it looks like a seqdiff checkpoint, which seqdiff eval / sample read as it is (seqdiff export "
                "writes the Hugging Face layout)") if seqdiff_own else ""
        raise MDLMConversionError(
            f"expected exactly one key ending in 'vocab_embed.embedding' (the MDLM DiT layout), found "
            f"{hits or 'none'}{hint}"
        )
    return hits[0][: -len("vocab_embed.embedding")]


def _expected_shapes(H: int, V: int, C: int, n_layers: int, mlp_hidden: int, head_dim: int) -> dict[str, tuple]:
    shapes: dict[str, tuple] = {
        "vocab_embed.embedding": (V, H),
        "sigma_map.mlp.0.weight": (C, FREQ_DIM), "sigma_map.mlp.0.bias": (C,),
        "sigma_map.mlp.2.weight": (C, C), "sigma_map.mlp.2.bias": (C,),
        "output_layer.norm_final.weight": (H,),
        "output_layer.adaLN_modulation.weight": (2 * H, C), "output_layer.adaLN_modulation.bias": (2 * H,),
        "output_layer.linear.weight": (V, H), "output_layer.linear.bias": (V,),
    }
    for i in range(n_layers):
        b = f"blocks.{i}."
        shapes.update({
            b + "norm1.weight": (H,), b + "norm2.weight": (H,),
            b + "attn_qkv.weight": (3 * H, H), b + "attn_out.weight": (H, H),
            b + "mlp.0.weight": (mlp_hidden, H), b + "mlp.0.bias": (mlp_hidden,),
            b + "mlp.2.weight": (H, mlp_hidden), b + "mlp.2.bias": (H,),
            b + "adaLN_modulation.weight": (6 * H, C), b + "adaLN_modulation.bias": (6 * H,),
        })
    return shapes


def _rotary_permutation(head_dim: int) -> Tensor:
    """Index p with seqdiff channel c = reference channel p[c]: (0, D/2, 1, D/2 + 1, ...)."""
    half = head_dim // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).flatten()


def _sigma_features(sigma: Tensor) -> Tensor:
    half = FREQ_DIM // 2
    freqs = torch.exp(-math.log(10_000.0) * torch.arange(half, dtype=torch.float64) / half)
    args = sigma.double()[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (B, 256)


def convert_mdlm_state_dict(state_dict: dict[str, Tensor], *, time_conditioning: bool = False,
                            n_heads: int | None = None, vocab_size: int | None = None, max_seq_len: int = 1024,
                            new_token_bias: float = -1e4) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Map an MDLM reference DiT state dict onto seqdiff's DiT; returns (ModelConfig, state dict).

    time_conditioning: whether the model was trained with it (mdlm-owt: no); n_heads: needed only when the
    state dict has no rotary_emb.inv_freq; vocab_size: seqdiff's vocabulary (default: the reference's V;
    larger adds rows); max_seq_len: positions the converted model accepts.
    """
    if max_seq_len <= 0:
        raise MDLMConversionError(f"max_seq_len must be a positive integer, got {max_seq_len}")
    prefix = _find_prefix(state_dict)
    sd = {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
    V, H = sd["vocab_embed.embedding"].shape
    block_ids = sorted({int(m.group(1)) for k in sd if (m := re.match(r"blocks\.(\d+)\.", k))})
    if not block_ids or block_ids != list(range(len(block_ids))):
        raise MDLMConversionError(f"blocks must be numbered 0..n-1, found {block_ids or 'no blocks'}")
    n_layers = len(block_ids)
    for key in ("sigma_map.mlp.0.weight", "blocks.0.mlp.0.weight"):
        if key not in sd:
            raise MDLMConversionError(f"missing {prefix}{key}")
    C, freq_dim = sd["sigma_map.mlp.0.weight"].shape
    if freq_dim != FREQ_DIM:
        raise MDLMConversionError(f"{prefix}sigma_map.mlp.0.weight has {freq_dim} input features; seqdiff's "
                                  f"noise-level embedding uses {FREQ_DIM}")
    mlp_hidden = sd["blocks.0.mlp.0.weight"].shape[0]
    if mlp_hidden % H != 0:
        raise MDLMConversionError(f"MLP width {mlp_hidden} is not a multiple of the hidden size {H}")

    inv_freq = sd.get("rotary_emb.inv_freq")
    if inv_freq is not None:
        head_dim = 2 * inv_freq.numel()
        if n_heads is not None and n_heads * head_dim != H:
            raise MDLMConversionError(f"n_heads={n_heads} disagrees with rotary_emb.inv_freq ({inv_freq.numel()} "
                                      f"frequencies: head_dim {head_dim}, hidden size {H})")
        expected = ROTARY_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        if not torch.allclose(inv_freq.double(), expected, rtol=1e-5, atol=1e-8):
            raise MDLMConversionError(f"{prefix}rotary_emb.inv_freq is not base {ROTARY_BASE:g}^(-2i/D); seqdiff's "
                                      f"rotary embedding cannot reproduce it")
    elif n_heads is None:
        raise MDLMConversionError(f"{prefix}rotary_emb.inv_freq is absent: pass n_heads (--n-heads)")
    else:
        head_dim = H // n_heads
    n_heads = H // head_dim
    if n_heads * head_dim != H:
        raise MDLMConversionError(f"head_dim {head_dim} does not divide the hidden size {H}")

    shapes = _expected_shapes(H, V, C, n_layers, mlp_hidden, head_dim)
    missing = [k for k in shapes if k not in sd]
    if missing:
        raise MDLMConversionError(f"missing {len(missing)} weights of the MDLM DiT layout, e.g. "
                                  f"{[prefix + k for k in missing[:4]]}")
    for key, shape in shapes.items():
        if tuple(sd[key].shape) != shape:
            raise MDLMConversionError(f"{prefix}{key} has shape {tuple(sd[key].shape)}, expected {shape}")
    unknown = sorted(set(sd) - set(shapes) - {"rotary_emb.inv_freq"})
    if unknown:
        raise MDLMConversionError(f"weights seqdiff's DiT has no place for: {[prefix + k for k in unknown[:6]]}")
    target_vocab = V if vocab_size is None else vocab_size
    if target_vocab < V:
        raise MDLMConversionError(f"vocab_size={target_vocab} is smaller than the checkpoint's {V} rows")

    w = {k: v.detach().to("cpu", torch.float64) for k, v in sd.items()}  # fold in float64
    perm = _rotary_permutation(head_dim)
    out: dict[str, Tensor] = {}

    def qkv_permuted(weight: Tensor) -> Tensor:  # (3H, H): rows (three, head, channel)
        rows = weight.view(3, n_heads, head_dim, H).clone()
        rows[:2] = rows[:2, :, perm]  # q and k; v keeps its order
        return rows.reshape(3 * H, H)

    def check_norm(key: str) -> Tensor:
        weight = w[key]
        if time_conditioning and weight.abs().min() < MIN_LAYERNORM_WEIGHT:
            raise MDLMConversionError(
                f"{prefix}{key} has entries near zero (min |w| = {weight.abs().min().item():.2e}): seqdiff's "
                f"time-conditioned LayerNorms have no weight, and folding this one into the next layer would "
                f"divide by ~0")
        return weight

    if time_conditioning:
        for layer in ("0", "2"):
            for kind in ("weight", "bias"):
                out[f"time_embed.mlp.{layer}.{kind}"] = w[f"sigma_map.mlp.{layer}.{kind}"]
    else:  # the constant conditioning vector the reference uses with sigma zeroed
        h = F.silu(_sigma_features(torch.zeros(1)) @ w["sigma_map.mlp.0.weight"].T + w["sigma_map.mlp.0.bias"])
        c0 = F.silu(h @ w["sigma_map.mlp.2.weight"].T + w["sigma_map.mlp.2.bias"])[0]  # (C,)

    for i in range(n_layers):
        src, dst = f"blocks.{i}.", f"blocks.{i}."
        w1, w2 = check_norm(src + "norm1.weight"), check_norm(src + "norm2.weight")
        qkv = qkv_permuted(w[src + "attn_qkv.weight"])
        ada_w, ada_b = w[src + "adaLN_modulation.weight"], w[src + "adaLN_modulation.bias"]
        out[dst + "attn.qkv.bias"] = torch.zeros(3 * H, dtype=torch.float64)
        out[dst + "attn.out.bias"] = torch.zeros(H, dtype=torch.float64)
        out[dst + "mlp.fc.bias"] = w[src + "mlp.0.bias"]
        if time_conditioning:
            ada_w, ada_b = ada_w.clone(), ada_b.clone()
            ada_w[0:H] /= w1[:, None]  # shift (attention)
            ada_b[0:H] /= w1
            ada_w[3 * H:4 * H] /= w2[:, None]  # shift (MLP)
            ada_b[3 * H:4 * H] /= w2
            out[dst + "adaLN_modulation.weight"], out[dst + "adaLN_modulation.bias"] = ada_w, ada_b
            out[dst + "attn.qkv.weight"] = qkv * w1[None, :]
            out[dst + "attn.out.weight"] = w[src + "attn_out.weight"]
            out[dst + "mlp.fc.weight"] = w[src + "mlp.0.weight"] * w2[None, :]
            out[dst + "mlp.proj.weight"] = w[src + "mlp.2.weight"]
            out[dst + "mlp.proj.bias"] = w[src + "mlp.2.bias"]
        else:
            shift1, scale1, gate1, shift2, scale2, gate2 = (ada_w @ c0 + ada_b).chunk(6)  # (H,) each
            out[dst + "norm1.weight"], out[dst + "norm1.bias"] = w1 * (1 + scale1), shift1
            out[dst + "norm2.weight"], out[dst + "norm2.bias"] = w2 * (1 + scale2), shift2
            out[dst + "attn.qkv.weight"] = qkv
            out[dst + "attn.out.weight"] = gate1[:, None] * w[src + "attn_out.weight"]
            out[dst + "mlp.fc.weight"] = w[src + "mlp.0.weight"]
            out[dst + "mlp.proj.weight"] = gate2[:, None] * w[src + "mlp.2.weight"]
            out[dst + "mlp.proj.bias"] = gate2 * w[src + "mlp.2.bias"]

    wf = check_norm("output_layer.norm_final.weight")
    fin_w, fin_b = w["output_layer.adaLN_modulation.weight"], w["output_layer.adaLN_modulation.bias"]
    linear_w, linear_b = w["output_layer.linear.weight"], w["output_layer.linear.bias"]
    if time_conditioning:
        fin_w, fin_b = fin_w.clone(), fin_b.clone()
        fin_w[0:H] /= wf[:, None]  # shift
        fin_b[0:H] /= wf
        out["final_modulation.weight"], out["final_modulation.bias"] = fin_w, fin_b
        linear_w = linear_w * wf[None, :]
    else:
        shift, scale = (fin_w @ c0 + fin_b).chunk(2)
        out["norm_final.weight"], out["norm_final.bias"] = wf * (1 + scale), shift

    embed = w["vocab_embed.embedding"]
    extra = target_vocab - V
    if extra:
        embed = torch.cat([embed, torch.zeros(extra, H, dtype=torch.float64)])
        linear_w = torch.cat([linear_w, torch.zeros(extra, H, dtype=torch.float64)])
        linear_b = torch.cat([linear_b, torch.full((extra,), float(new_token_bias), dtype=torch.float64)])
    out["embed.weight"], out["output.weight"], out["output.bias"] = embed, linear_w, linear_b

    config = ModelConfig(backbone="dit", hidden_size=H, n_layers=n_layers, n_heads=n_heads,
                         mlp_ratio=mlp_hidden // H, cond_dim=C, dropout=0.0, time_conditioning=time_conditioning,
                         max_seq_len=max_seq_len, activation="gelu_tanh")  # the reference's nn.GELU("tanh")
    return config, {k: v.to(torch.float32).contiguous() for k, v in out.items()}


REFERENCE_BUFFERS = ("rotary_emb.inv_freq",)
"""Entries of the reference DiT's state dict that are buffers, not parameters (the EMA does not hold them)."""


def load_state_dict_file(path: str | Path, use_ema: bool = True) -> tuple[dict[str, Tensor], str]:
    """The weights of a file -> (state dict, which weights: "ema", "raw" or "file").

    - `.safetensors`, or a torch file holding a bare state dict: its weights ("file").
    - A Lightning `.ckpt` (`state_dict` plus, when trained with EMA, the reference's `ema` entry
      {decay, num_updates, shadow_params}): the EMA weights by default ("ema"), as the reference evaluates
      and samples with them; `use_ema=False`, or a checkpoint without `ema`, gives the raw ones ("raw").
    A checkpoint whose `hyper_parameters` hold objects of other projects' classes (the reference pickles its
    OmegaConf config and tokenizer there) is read without running their code (`seqdiff.hf.tensors_only`).
    """
    path = Path(path)
    if not path.is_file():
        raise MDLMConversionError(_not_a_file(path))
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path)), "file"
        data = load_tensors_only(path)
    except Exception as e:  # many types for a foreign or truncated file
        raise MDLMConversionError(f"{path} cannot be read as a state dict (truncated, or not a torch / safetensors "
                                  f"file): {e}") from e
    kind = "file"
    if isinstance(data, dict) and isinstance(data.get("state_dict"), dict):
        ema = data.get("ema")
        data, kind = data["state_dict"], "raw"
        if use_ema and ema is not None:
            data, kind = _with_ema_weights(data, ema, path), "ema"
    if not isinstance(data, dict) or not all(isinstance(v, Tensor) for v in data.values()):
        raise MDLMConversionError(f"{path} does not hold a state dict (a mapping of names to tensors)")
    return data, kind


def _with_ema_weights(state_dict: dict[str, Tensor], ema: Any, path: Path) -> dict[str, Tensor]:
    """The state dict with the backbone's parameters replaced by the reference EMA's shadow parameters.

    The reference's EMA keeps a list, in the order of `chain(backbone.parameters(), noise.parameters())`;
    the backbone's parameters are its state-dict entries in order, minus the buffers (REFERENCE_BUFFERS).
    Every shadow tensor must have the shape of the parameter it replaces.
    """
    shadow = ema.get("shadow_params") if isinstance(ema, dict) else None
    if not isinstance(shadow, (list, tuple)) or not all(isinstance(t, Tensor) for t in shadow):
        raise MDLMConversionError(f"{path}: its 'ema' entry has no list of shadow_params tensors (the MDLM "
                                  f"reference's EMA layout); pass --no-ema to convert the raw weights")
    prefix = _find_prefix(state_dict)
    names = [k for k in state_dict if k.startswith(prefix) and k[len(prefix):] not in REFERENCE_BUFFERS]
    if len(shadow) < len(names):
        raise MDLMConversionError(f"{path}: the EMA holds {len(shadow)} tensors but the backbone has {len(names)} "
                                  f"parameters; pass --no-ema to convert the raw weights")
    out = dict(state_dict)
    for name, tensor in zip(names, shadow):
        if tensor.shape != state_dict[name].shape:
            raise MDLMConversionError(f"{path}: EMA tensor for {name} has shape {tuple(tensor.shape)}, the parameter "
                                      f"{tuple(state_dict[name].shape)}; pass --no-ema to convert the raw weights")
        out[name] = tensor
    return out


def convert_mdlm_checkpoint(src: str | Path | dict[str, Tensor], out_dir: str | Path, tokenizer=None,
                            time_conditioning: bool = False, max_seq_len: int = 1024, overwrite: bool = False,
                            mask_index: int | None = None, use_ema: bool = True,
                            n_heads: int | None = None) -> Path:
    """Convert MDLM weights (a file or a state dict) and write them as a seqdiff export directory.

    tokenizer: seqdiff's tokenizer for the model (default: GPT-2, read from the data directory; fetch it
    with `seqdiff data fetch gpt2-vocab`). Its MASK id must equal the reference's mask index (default: the
    last row of the reference's embedding). use_ema: from a Lightning checkpoint with an EMA, convert the
    EMA weights (config.json says `ema_weights: true`). n_heads: needed only without rotary_emb.inv_freq.
    """
    state_dict, kind = (src, "file") if isinstance(src, dict) else load_state_dict_file(src, use_ema=use_ema)
    tokenizer = tokenizer if tokenizer is not None else build_tokenizer("gpt2")
    prefix = _find_prefix(state_dict)
    V = state_dict[prefix + "vocab_embed.embedding"].shape[0]
    mask_index = V - 1 if mask_index is None else mask_index
    if tokenizer.mask_id != mask_index:
        raise MDLMConversionError(f"the tokenizer's MASK id is {tokenizer.mask_id} but the checkpoint's mask index "
                                  f"is {mask_index}: the vocabularies do not line up")
    model_config, weights = convert_mdlm_state_dict(state_dict, time_conditioning=time_conditioning,
                                                    n_heads=n_heads, vocab_size=tokenizer.vocab_size,
                                                    max_seq_len=max_seq_len)
    return write_export(out_dir, weights, model_config, MethodConfig(name="mdlm"), tokenizer, seq_len=max_seq_len,
                        overwrite=overwrite, ema=kind == "ema", source=None if isinstance(src, dict) else Path(src))


def _not_a_file(src: Path) -> str:
    """Why `src` cannot be converted, for a path that is not a file (missing, or a folder)."""
    if not src.is_dir():
        return f"{src} does not exist"
    inside = sorted(p.name for p in src.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())
    hint = f" (it holds {', '.join(inside[:4])})" if inside else ""
    return (f"{src} is a directory; pass the weights file inside it: model.safetensors, pytorch_model.bin or a "
            f"Lightning .ckpt{hint}")


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m seqdiff.hf.convert_mdlm",
                                     description="Convert MDLM reference DiT weights into a seqdiff model directory.")
    parser.add_argument("src", help="model.safetensors / pytorch_model.bin / a .ckpt holding a state dict")
    parser.add_argument("out_dir", help="output directory (as written by `seqdiff export`)")
    parser.add_argument("--time-conditioning", action="store_true", help="the model was trained with it")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="positions the converted model accepts")
    parser.add_argument("--tokenizer", default="gpt2", help="seqdiff tokenizer kind (default gpt2)")
    parser.add_argument("--vocab-dir", help="tokenizer files (default: the data directory)")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--no-ema", action="store_true",
                        help="from a Lightning checkpoint with an EMA, convert the raw weights (default: the EMA ones, "
                             "which the reference evaluates and samples with)")
    parser.add_argument("--n-heads", type=int, default=None,
                        help="attention heads; needed only when the weights lack rotary_emb.inv_freq")
    args = parser.parse_args(argv)
    if args.n_heads is not None and args.n_heads <= 0:
        parser.error(f"--n-heads must be a positive integer, got {args.n_heads}")
    if args.max_seq_len <= 0:
        parser.error(f"--max-seq-len must be a positive integer, got {args.max_seq_len}")
    src = Path(args.src)
    if not src.is_file():  # before the tokenizer, whose own refusal would hide this one
        print(f"convert_mdlm: error: {_not_a_file(src)}", file=sys.stderr)
        return 2
    try:
        # the output first: a bad OUT_DIR is said before minutes of reading and folding weights
        check_destination(Path(args.out_dir), args.overwrite, src)
        options = {"vocab_dir": args.vocab_dir} if args.vocab_dir else {}
        try:
            tokenizer = build_tokenizer(args.tokenizer, **options)
        except TokenizerError as e:  # its hint names the training key; here the option is --vocab-dir
            raise TokenizerError(str(e).replace("set data.tokenizer_options.vocab_dir", "pass --vocab-dir")
                                 .replace("data.tokenizer_options.vocab_dir", "--vocab-dir")
                                 .replace("data.tokenizer=", "--tokenizer ")) from e
        out = convert_mdlm_checkpoint(src, args.out_dir, tokenizer=tokenizer,
                                      time_conditioning=args.time_conditioning, max_seq_len=args.max_seq_len,
                                      overwrite=args.overwrite, use_ema=not args.no_ema, n_heads=args.n_heads)
    except SeqdiffError as e:  # a bad file or option, an OUT_DIR that cannot be written: one line
        print(f"convert_mdlm: error: {e}", file=sys.stderr)
        return 2
    ema = json.loads((out / "config.json").read_text(encoding="utf-8")).get("ema_weights")
    print(f"written: {out} ({'EMA' if ema else 'the file'}'s weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["MDLMConversionError", "convert_mdlm_checkpoint", "convert_mdlm_state_dict", "load_state_dict_file"]
