"""BERT-style bidirectional backbone that loads an off-the-shelf Hugging Face BERT checkpoint.

Why: the MDLM paper (Sahoo et al. 2024, arXiv:2406.07524, Table 4) turns a pretrained BERT into a generative
model by fine-tuning it with the MDLM objective. This backbone has BERT's exact architecture (Devlin et al.
2019), so a BERT checkpoint's encoder weights load one to one, and the MDLM method drives it like the DiT.

Design choices
- Embeddings: word + learned absolute position + token-type, then LayerNorm and dropout. seqdiff feeds one
  segment, so only the token-type row 0 is kept (a learned vector added at every position).
- Post-norm blocks (BERT's, unlike the DiT's pre-norm): x = LN(x + attention(x)); x = LN(x + MLP(x)), with
  separate biases everywhere, LayerNorm eps 1e-12, and the MLP nonlinearity from `model.activation` (BERT's
  own is the exact GELU; `config_from_pretrained` reads it from the checkpoint's `hidden_act`).
- Attention: q / k / v fused into one Linear (BERT's three are concatenated on loading) and
  `torch.nn.functional.scaled_dot_product_attention`; a padding mask (True = real token) masks keys only.
- Output: BERT's masked-LM head, dense + GELU + LayerNorm, then a decoder whose weight is tied to the word
  embeddings (plus a bias). Why tied and not a fresh Linear: the checkpoint we fine-tune offline (a MiniLM
  sentence encoder) ships no MLM head, and tying keeps the decoder in the space of the pretrained input
  embeddings instead of adding V x H random weights; it is also BERT's own layout, so a checkpoint that has
  a head (`cls.predictions.*`) loads it whole. Without one the dense / LayerNorm transform starts fresh
  (N(0, 0.02) / identity) and the bias at zero, so the model needs fine-tuning before it generates.
- No time conditioning (MDLM's SUBS model is time-agnostic) and no causal mode: the constructor refuses both.
- Weight names are seqdiff's own (`layers.{i}.attn.qkv`, ...); `load_hf_bert` maps BERT's names onto them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seqdiff.backbones.activations import ACTIVATIONS
from seqdiff.backbones.attention import attention
from seqdiff.backbones.checkpointing import call_block
from seqdiff.backbones.dit import bias_excluding, init_normal_002, select_positions
from seqdiff.backbones.linear_cross_entropy import linear_cross_entropy
from seqdiff.config import ConfigError, ModelConfig

LAYER_NORM_EPS = 1e-12
"""BERT's LayerNorm epsilon (every published BERT uses it)."""
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
"""A BERT config's `hidden_act` -> seqdiff's `model.activation`."""


class BertPretrainedError(ConfigError):
    """A Hugging Face BERT directory that is missing, malformed, or does not fit the configured model."""


class BertEmbeddings(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab_size, hidden_size)
        self.position = nn.Embedding(max_positions, hidden_size)
        self.token_type = nn.Parameter(torch.zeros(hidden_size))  # row 0 of BERT's token-type table
        self.norm = nn.LayerNorm(hidden_size, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(dropout)

    def forward(self, input_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        L = input_ids.shape[1]
        if positions is None:
            positions = torch.arange(L, device=input_ids.device)[None]  # (1, L)
        x = self.word(input_ids) + self.position(positions) + self.token_type  # (B, L, H)
        return self.dropout(self.norm(x))


class BertAttention(nn.Module):
    def __init__(self, hidden_size: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = hidden_size // n_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)  # rows: [query; key; value]
        self.out = nn.Linear(hidden_size, hidden_size)
        self.dropout_p = dropout

    def forward(self, x: Tensor, attn_mask: Tensor | None) -> Tensor:
        B, L, H = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (B, nH, L, Dh)
        p = self.dropout_p if self.training else 0.0
        y = attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # (B, nH, L, Dh)
        return self.out(y.transpose(1, 2).reshape(B, L, H))  # (B, L, H)


class BertLayer(nn.Module):
    """Post-norm block: x = LN(x + attention(x)); x = LN(x + proj(act(fc(x))))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.attn = BertAttention(H, cfg.n_heads, cfg.dropout)
        self.attn_norm = nn.LayerNorm(H, eps=LAYER_NORM_EPS)
        self.fc = nn.Linear(H, cfg.mlp_ratio * H)
        self.proj = nn.Linear(cfg.mlp_ratio * H, H)
        self.mlp_norm = nn.LayerNorm(H, eps=LAYER_NORM_EPS)
        self.activation = ACTIVATIONS[cfg.activation]
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, attn_mask: Tensor | None) -> Tensor:
        x = self.attn_norm(x + self.dropout(self.attn(x, attn_mask)))
        h = self.proj(self.activation(self.fc(x)))  # (B, L, H)
        return self.mlp_norm(x + self.dropout(h))


class BertLMHead(nn.Module):
    """dense + activation + LayerNorm; the decoder weight is the word embedding (tied), its bias lives here."""

    def __init__(self, hidden_size: int, vocab_size: int, activation: str) -> None:
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm = nn.LayerNorm(hidden_size, eps=LAYER_NORM_EPS)
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        self.activation = ACTIVATIONS[activation]

    def transform(self, h: Tensor) -> Tensor:
        """What the decoder reads: LayerNorm(activation(dense(h))), (..., H)."""
        return self.norm(self.activation(self.dense(h)))

    def forward(self, h: Tensor, word_embeddings: Tensor, exclude_id: int | None = None) -> Tensor:
        return F.linear(self.transform(h), word_embeddings, bias_excluding(self.bias, exclude_id))  # (B, L, V)


class Bert(nn.Module):
    """Token ids [B, L] -> logits [B, L, vocab_size] (float32); bidirectional, no noise level."""

    takes_segment_ids = True
    """Takes packed documents (`segment_ids`, per-row `positions` into its position table)."""
    selects_outputs = True
    """forward(output_index=...) runs the masked-LM head at those positions only (as the DiT)."""
    fuses_loss = True
    """forward(targets=..., token_weight=...): the head's cross-entropy without the logits (as the DiT)."""
    activation_checkpointing = False
    """Recompute each layer's activations in the backward pass (train.activation_checkpointing)."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, causal: bool) -> None:
        super().__init__()
        if causal:
            raise ConfigError("model.backbone=bert is bidirectional; a causal method (ar) needs model.backbone=dit")
        if cfg.time_conditioning:
            raise ConfigError("model.backbone=bert has no time conditioning; set model.time_conditioning=false "
                              "(sedd needs it: use model.backbone=dit)")
        self.config = cfg
        self.vocab_size = vocab_size
        self.causal = False
        self.embeddings = BertEmbeddings(vocab_size, cfg.hidden_size, cfg.max_seq_len, cfg.dropout)
        self.layers = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.n_layers))
        self.head = BertLMHead(cfg.hidden_size, vocab_size, cfg.activation)
        self.apply(self._init_weights)

    _init_weights = staticmethod(init_normal_002)  # BERT's initialization (LayerNorms start as identity)

    def forward(self, input_ids: Tensor, noise_level: Tensor | None = None,
                attention_mask: Tensor | None = None, *, segment_ids: Tensor | None = None,
                positions: Tensor | None = None, output_index: Tensor | None = None,
                exclude_id: int | None = None, targets: Tensor | None = None,
                token_weight: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, L, vocab_size) in float32; `noise_level` is accepted and ignored (no time conditioning).
        output_index: (N,) flat positions b * L + i, the logits (N, V) of those only; exclude_id: that id's
        logit -inf; targets, token_weight: the fused loss instead of logits (all as DiT.forward). The decoder
        weight is the word embedding, so its gradient from the loss adds to the embedding's own."""
        h = self.hidden_states(input_ids, noise_level, attention_mask, segment_ids=segment_ids, positions=positions)
        h = select_positions(h, output_index)
        if targets is None:
            return self.output(h, exclude_id)
        return linear_cross_entropy(self.head.transform(h), self.embeddings.word.weight,
                                    bias_excluding(self.head.bias, exclude_id), targets, token_weight)

    def output(self, h: Tensor, exclude_id: int | None = None) -> Tensor:
        """Hidden states (B, L, H) -> logits (B, L, V) through the masked-LM head (`exclude_id`: -inf there)."""
        return self.head(h, self.embeddings.word.weight, exclude_id).float()

    def head_parameters(self) -> list[nn.Parameter]:
        """The output head's own parameters: the masked-LM transform (dense, LayerNorm) and the decoder bias.

        The decoder weight is the word embedding (tied), so it belongs to the encoder, not to this list. For a
        checkpoint without a masked-LM head (the MiniLM) these are exactly the weights `load_pretrained` leaves
        fresh; `train.freeze_backbone_steps` trains only them at first, `train.backbone_lr_scale` spares them.
        """
        return list(self.head.parameters())

    def hidden_states(self, input_ids: Tensor, noise_level: Tensor | None = None,
                      attention_mask: Tensor | None = None, *, segment_ids: Tensor | None = None,
                      positions: Tensor | None = None) -> Tensor:
        """The last block's output (B, L, hidden_size): BertModel's `last_hidden_state`.

        attention_mask: (B, L), True / 1 = real token; padded positions are hidden from every query as keys.
        segment_ids / positions: (B, L), packed documents: a token attends only within its segment, and
        `positions` (restarting at 0 in each) index the position table; as the DiT takes them.
        """
        B, L = input_ids.shape
        if L > self.config.max_seq_len:
            raise ValueError(f"sequence of length {L} is longer than model.max_seq_len={self.config.max_seq_len}")
        attn_mask = None
        if attention_mask is not None:
            if attention_mask.shape != (B, L):
                raise ValueError(f"attention_mask must have shape {(B, L)}, got {tuple(attention_mask.shape)}")
            key_ok = attention_mask.bool()
            key_ok = key_ok | ~key_ok.any(dim=-1, keepdim=True)  # an all-padding row sees everything (no NaN)
            attn_mask = key_ok[:, None, None, :]  # (B, 1, 1, L)
        if segment_ids is not None:
            if segment_ids.shape != (B, L):
                raise ValueError(f"segment_ids must have shape {(B, L)}, got {tuple(segment_ids.shape)}")
            allowed = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, L, L) block-diagonal
            if attention_mask is not None:
                allowed = allowed & attention_mask.bool()[:, None, :]
            allowed = allowed | torch.eye(L, dtype=torch.bool, device=allowed.device)  # a query sees itself
            attn_mask = allowed[:, None]  # (B, 1, L, L)
        x = self.embeddings(input_ids, positions)  # (B, L, H)
        for layer in self.layers:
            x = call_block(layer, self.activation_checkpointing, x, attn_mask)
        return x

    # ------------------------------------------------------------------------------ pretrained weights
    @staticmethod
    def config_from_pretrained(path: str | Path) -> dict:
        """ModelConfig fields (shape, activation) read from a Hugging Face BERT directory's config.json."""
        return bert_config_fields(path)

    def load_pretrained(self, path: str | Path) -> dict[str, list[str]]:
        """Copy a Hugging Face BERT checkpoint's weights in; returns {"loaded": [...], "fresh": [...]}."""
        return load_hf_bert(self, path)


# ---------------------------------------------------------------------------------------------- loading
def _read_config(path: Path) -> dict:
    file = path / "config.json"
    if not file.is_file():
        raise BertPretrainedError(f"model.init_from={str(path)!r}: {file} does not exist (expected a Hugging Face "
                                  f"BERT directory with config.json and model.safetensors)")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BertPretrainedError(f"{file} cannot be read as JSON: {e}") from e
    if not isinstance(data, dict) or data.get("model_type") != "bert":
        found = data.get("model_type") if isinstance(data, dict) else None
        raise BertPretrainedError(f"{file} has model_type {found!r}; model.backbone=bert loads 'bert' checkpoints")
    return data


def bert_config_fields(path: str | Path) -> dict:
    """hidden_size, n_layers, n_heads, mlp_ratio, activation from config.json, checked against what we model."""
    path = Path(path).expanduser()
    c = _read_config(path)
    file = path / "config.json"
    try:
        H, n_layers, n_heads, inter = (int(c[k]) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                           "intermediate_size"))
    except (KeyError, TypeError, ValueError) as e:
        raise BertPretrainedError(f"{file} lacks a valid {e} entry") from e
    if inter % H != 0:
        raise BertPretrainedError(f"{file}: intermediate_size {inter} is not a multiple of hidden_size {H}")
    act = c.get("hidden_act", "gelu")
    if act not in HF_ACTIVATIONS:
        raise BertPretrainedError(f"{file}: hidden_act={act!r} is not supported; allowed: {sorted(HF_ACTIVATIONS)}")
    eps = float(c.get("layer_norm_eps", LAYER_NORM_EPS))
    if abs(eps - LAYER_NORM_EPS) > 1e-15:
        raise BertPretrainedError(f"{file}: layer_norm_eps={eps:g}; this backbone uses BERT's {LAYER_NORM_EPS:g}")
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise BertPretrainedError(f"{file}: position_embedding_type={c['position_embedding_type']!r}; only "
                                  f"'absolute' is supported")
    return {"hidden_size": H, "n_layers": n_layers, "n_heads": n_heads, "mlp_ratio": inter // H,
            "activation": HF_ACTIVATIONS[act]}


def _read_weights(path: Path) -> dict[str, Tensor]:
    file = path / "model.safetensors"
    if not file.is_file():
        raise BertPretrainedError(f"model.init_from={str(path)!r}: {file} does not exist")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(file))
    except (OSError, SafetensorError) as e:
        raise BertPretrainedError(f"{file} cannot be read: {e}") from e


def hf_bert_state_dict(weights: dict[str, Tensor], n_layers: int, max_seq_len: int) -> dict[str, Tensor]:
    """BERT's names (BertModel, or BertForMaskedLM with its `bert.` prefix) -> this backbone's names.

    Position embeddings are cut to max_seq_len rows; q, k, v are concatenated; the MLM head is mapped when
    present (`cls.predictions.*`); the pooler and next-sentence head are not used.
    """
    hits = [k for k in weights if k.endswith("embeddings.word_embeddings.weight")]
    if len(hits) != 1:
        raise BertPretrainedError(f"expected one key ending in 'embeddings.word_embeddings.weight' (BERT's layout), "
                                  f"found {hits or 'none'}")
    p = hits[0][: -len("embeddings.word_embeddings.weight")]  # "" (BertModel) or "bert." (BertForMaskedLM)

    def get(name: str) -> Tensor:
        if p + name not in weights:
            raise BertPretrainedError(f"the checkpoint lacks {p + name}")
        return weights[p + name]

    positions = get("embeddings.position_embeddings.weight")
    if positions.shape[0] < max_seq_len:
        raise BertPretrainedError(f"model.max_seq_len={max_seq_len} exceeds the checkpoint's "
                                  f"{positions.shape[0]} position embeddings")
    out = {
        "embeddings.word.weight": get("embeddings.word_embeddings.weight"),
        "embeddings.position.weight": positions[:max_seq_len],
        "embeddings.token_type": get("embeddings.token_type_embeddings.weight")[0],
        "embeddings.norm.weight": get("embeddings.LayerNorm.weight"),
        "embeddings.norm.bias": get("embeddings.LayerNorm.bias"),
    }
    for i in range(n_layers):
        s, d = f"encoder.layer.{i}.", f"layers.{i}."
        for kind in ("weight", "bias"):
            out[d + f"attn.qkv.{kind}"] = torch.cat([get(s + f"attention.self.{n}.{kind}")
                                                     for n in ("query", "key", "value")])
            out[d + f"attn.out.{kind}"] = get(s + f"attention.output.dense.{kind}")
            out[d + f"attn_norm.{kind}"] = get(s + f"attention.output.LayerNorm.{kind}")
            out[d + f"fc.{kind}"] = get(s + f"intermediate.dense.{kind}")
            out[d + f"proj.{kind}"] = get(s + f"output.dense.{kind}")
            out[d + f"mlp_norm.{kind}"] = get(s + f"output.LayerNorm.{kind}")
    if f"encoder.layer.{n_layers}.attention.self.query.weight" in {k[len(p):] for k in weights}:
        raise BertPretrainedError(f"the checkpoint has more than model.n_layers={n_layers} layers")
    head = {"head.dense.weight": "cls.predictions.transform.dense.weight",
            "head.dense.bias": "cls.predictions.transform.dense.bias",
            "head.norm.weight": "cls.predictions.transform.LayerNorm.weight",
            "head.norm.bias": "cls.predictions.transform.LayerNorm.bias",
            "head.bias": "cls.predictions.bias"}
    out.update({ours: weights[theirs] for ours, theirs in head.items() if theirs in weights})
    return out


def load_hf_bert(model: Bert, path: str | Path) -> dict[str, list[str]]:
    """Load a Hugging Face BERT directory (config.json + model.safetensors) into `model`, checking shapes."""
    path = Path(path).expanduser()
    fields = bert_config_fields(path)
    cfg = model.config
    mine = {"hidden_size": cfg.hidden_size, "n_layers": cfg.n_layers, "n_heads": cfg.n_heads,
            "mlp_ratio": cfg.mlp_ratio, "activation": cfg.activation}
    differ = {k: (v, fields[k]) for k, v in mine.items() if fields[k] != v}
    if differ:
        raise BertPretrainedError(f"{path / 'config.json'} does not fit the model: " + ", ".join(
            f"model.{k}={a!r} but the checkpoint has {b!r}" for k, (a, b) in differ.items()))
    mapped = hf_bert_state_dict(_read_weights(path), cfg.n_layers, cfg.max_seq_len)
    V = mapped["embeddings.word.weight"].shape[0]
    if V != model.vocab_size:
        raise BertPretrainedError(f"{path}: the checkpoint has {V} word embeddings but the tokenizer has "
                                  f"{model.vocab_size} ids; use the checkpoint's own vocabulary (data.tokenizer=bert "
                                  f"with data.tokenizer_options.vocab_dir={str(path)!r})")
    own = model.state_dict()
    for name, tensor in mapped.items():
        if own[name].shape != tensor.shape:
            raise BertPretrainedError(f"{path}: {name} has shape {tuple(tensor.shape)}, the model expects "
                                      f"{tuple(own[name].shape)}")
    with torch.no_grad():
        for name, tensor in mapped.items():
            own[name].copy_(tensor.to(own[name].dtype))
    return {"loaded": sorted(mapped), "fresh": sorted(set(own) - set(mapped))}


__all__ = ["Bert", "BertPretrainedError", "bert_config_fields", "hf_bert_state_dict", "load_hf_bert"]
