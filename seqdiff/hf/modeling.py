"""seqdiff models as Hugging Face `transformers` models: a config class and two thin model wrappers.

    SeqDiffConfig          model_type "seqdiff": seqdiff's model / method configs, the tokenizer's special ids
    SeqDiffForMaskedLM     bidirectional (MDLM-family) models; AutoModelForMaskedLM
    SeqDiffForCausalLM     autoregressive models; AutoModelForCausalLM
    register_auto_classes  registers the three with AutoConfig / AutoModelForMaskedLM / AutoModelForCausalLM

Design choices
- The wrappers hold seqdiff's own DiT under `backbone`, so the weight names of an exported
  `model.safetensors` are `backbone.<name in the DiT>` and seqdiff reads them back without transformers.
- `SeqDiffForMaskedLM(...).logits` are the logits of the denoiser x_theta: with the SUBS
  parameterization (MDLM's default) the MASK logit is -inf, as seqdiff's sampler and likelihood see it;
  methods without SUBS (method.subs=false, D3PM, SEDD's scores) get the backbone's output unchanged. The
  DiT's raw logits are always `model.backbone(input_ids)`. A method with its own attention structure
  (bd3lm: `attention_structure`, block-causal) gets it: the logits of each block given the blocks before it.
  Time-conditioned models take the noise level as `noise_level` (shape (B,)).
- `SeqDiffForCausalLM(...).logits[:, i]` predict token i + 1 (the usual causal-LM convention; seqdiff's
  AR method feeds BOS first). The causal wrapper takes transformers' `generate()` (the whole prefix at every
  step, no KV cache); `seqdiff sample` keeps a KV cache and is the fast path. The masked-LM wrapper is a forward
  pass only: diffusion sampling goes through `seqdiff sample`.
- `labels` give the plain cross-entropy of the convention (masked LM: at positions whose label is not
  -100; causal LM: shifted by one), not the diffusion NELBO, which `seqdiff eval` computes.
- Config fields are set in `__init__` (the style that transformers' remote-code loading expects), so the
  class works both when seqdiff is imported and through `trust_remote_code` (see `seqdiff.hf.export`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    GenerationMixin,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import CausalLMOutputWithPast, MaskedLMOutput

from seqdiff.backbones import build_backbone
from seqdiff.backbones.dit import DiT, DiTBlock, TimestepEmbedding
from seqdiff.backbones.rotary import RotaryEmbedding
from seqdiff.config import ConfigError, MethodConfig, ModelConfig, from_dict
from seqdiff.methods import build_method, resolve_model_config

MODEL_TYPE = "seqdiff"
TOKENIZER_ID_KEYS = ("bos_id", "eos_id", "pad_id", "mask_id")


class SeqDiffConfig(PretrainedConfig):
    """seqdiff's configs as a `transformers` config (what `config.json` of an exported model holds).

    model: seqdiff ModelConfig as a dict. method: MethodConfig as a dict (its `name` picks the method).
    tokenizer: {"kind", "vocab_size", "bos_id", "eos_id", "pad_id", "mask_id"} (and the vocabulary's
    sha256 when it has one); the full tokenizer lives beside config.json in tokenizer_config.json.
    seq_len: the training block length. data: the DataConfig the model was trained on (informational).
    """

    model_type = MODEL_TYPE

    def __init__(self, model: dict[str, Any] | None = None, method: dict[str, Any] | None = None,
                 tokenizer: dict[str, Any] | None = None, seq_len: int = 256, data: dict[str, Any] | None = None,
                 step: int = 0, ema_weights: bool = False, **kwargs: Any) -> None:
        self.model = dict(model or {})
        self.method = dict(method or {})
        self.tokenizer = dict(tokenizer or {})
        self.seq_len = int(seq_len)
        self.data = dict(data) if data else None
        self.step = int(step)
        self.ema_weights = bool(ema_weights)
        model_config = from_dict(ModelConfig, self.model)
        # Mirrors of the usual transformers attribute names, for tools that read them.
        self.vocab_size = self.tokenizer.get("vocab_size")
        self.hidden_size = model_config.hidden_size
        self.num_hidden_layers = model_config.n_layers
        self.num_attention_heads = model_config.n_heads
        self.max_position_embeddings = model_config.max_seq_len
        for key in TOKENIZER_ID_KEYS:  # bos_id -> bos_token_id, ...
            kwargs.setdefault(key.replace("_id", "_token_id"), self.tokenizer.get(key))
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)

    # -------------------------------------------------------------------- seqdiff views
    def model_config(self) -> ModelConfig:
        return from_dict(ModelConfig, self.model)

    def method_config(self) -> MethodConfig:
        return from_dict(MethodConfig, self.method)


def _method_of(config: SeqDiffConfig):
    """Build the seqdiff Method named by the config (only its special ids are needed, not the vocabulary)."""
    missing = [k for k in ("vocab_size", *TOKENIZER_ID_KEYS) if not isinstance(config.tokenizer.get(k), int)]
    if missing:
        raise ConfigError(f"seqdiff config: tokenizer lacks {missing}")
    ids = SimpleNamespace(**{k: config.tokenizer[k] for k in ("vocab_size", *TOKENIZER_ID_KEYS)})
    return build_method(config.method_config(), ids)


class SeqDiffPreTrainedModel(PreTrainedModel):
    config_class = SeqDiffConfig
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    _no_split_modules = ["DiTBlock", "BertLayer"]
    _requires_causal: bool | None = None  # set by the subclasses

    def __init__(self, config: SeqDiffConfig) -> None:
        super().__init__(config)
        self.method = _method_of(config)
        if self.method.causal != self._requires_causal:
            kind, auto, cls = (("causal", "AutoModelForCausalLM", "SeqDiffForCausalLM") if self.method.causal
                               else ("bidirectional", "AutoModelForMaskedLM", "SeqDiffForMaskedLM"))
            raise ConfigError(f"method {self.method.name!r} is {kind}: load this model with {auto} (or {cls}), "
                              f"not {type(self).__name__}")
        model_config = resolve_model_config(config.model_config(), self.method)
        self.backbone: DiT = build_backbone(model_config, config.tokenizer["vocab_size"], causal=self.method.causal)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        # Non-persistent buffers are not in the weights file: recompute them (transformers builds the
        # model on the meta device and hands every module here that the file did not fill).
        if isinstance(module, RotaryEmbedding):
            with torch.no_grad():
                module.table.copy_(module._table(module.table.device))
        elif isinstance(module, TimestepEmbedding):
            fresh = TimestepEmbedding(module.mlp[0].out_features, freq_dim=2 * module.freqs.numel())
            with torch.no_grad():
                module.freqs.copy_(fresh.freqs)
        # Parameters: the DiT's own scheme (N(0, 0.02), zero biases, zero adaLN). transformers' guarded
        # init functions skip tensors already loaded from the file.
        elif isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm) and module.weight is not None:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        if isinstance(module, DiTBlock) and module.adaLN_modulation is not None:
            nn.init.zeros_(module.adaLN_modulation.weight)
            nn.init.zeros_(module.adaLN_modulation.bias)
        if isinstance(module, DiT) and module.final_modulation is not None:
            nn.init.zeros_(module.final_modulation.weight)
            nn.init.zeros_(module.final_modulation.bias)

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.embed

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.backbone.embed = value

    def get_output_embeddings(self) -> nn.Module:
        return self.backbone.output

    def _hidden(self, input_ids: Tensor, attention_mask: Tensor | None, noise_level: Tensor | None) -> Tensor:
        # a method with its own attention structure (bd3lm: block-causal) says so; others run the plain forward
        structure = getattr(self.method, "attention_structure", None)
        extra = {} if structure is None else {"attn_mask": structure(input_ids.shape[1], input_ids.device)}
        return self.backbone.hidden_states(input_ids, noise_level, attention_mask, **extra)  # (B, L, H)


class SeqDiffForMaskedLM(SeqDiffPreTrainedModel):
    """A bidirectional seqdiff model (MDLM): logits of the denoiser for every position."""

    _requires_causal = False

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, noise_level: Tensor | None = None,
                labels: Tensor | None = None, output_hidden_states: bool | None = None,
                return_dict: bool | None = None, **kwargs: Any) -> MaskedLMOutput | tuple:
        h = self._hidden(input_ids, attention_mask, noise_level)  # (B, L, H)
        logits = self.backbone.output(h).float()  # (B, L, V)
        if getattr(self.method, "subs", False):
            logits = self.method.subs_logits(logits)  # SUBS: MASK logit -inf
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        hidden = (h,) if output_hidden_states else None
        if return_dict is False:
            return tuple(v for v in (loss, logits, hidden) if v is not None)
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=hidden)


class SeqDiffForCausalLM(SeqDiffPreTrainedModel, GenerationMixin):
    """An autoregressive seqdiff model: logits[:, i] predict token i + 1. `generate()` works (greedy, sampling,
    beams: transformers' loop) by running the whole prefix at every step, without a KV cache; `seqdiff sample`
    keeps one and is the fast path."""

    _requires_causal = True

    def prepare_inputs_for_generation(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                                      **kwargs: Any) -> dict[str, Any]:
        """The whole prefix each step (no cache to continue from), with its padding mask."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                **kwargs: Any) -> CausalLMOutputWithPast | tuple:
        h = self._hidden(input_ids, attention_mask, None)  # (B, L, H)
        logits = self.backbone.output(h).float()  # (B, L, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        hidden = (h,) if output_hidden_states else None
        if return_dict is False:
            return tuple(v for v in (loss, logits, hidden) if v is not None)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=hidden)


ARCHITECTURES = {False: SeqDiffForMaskedLM, True: SeqDiffForCausalLM}
"""causal? -> the wrapper class of a method."""


def register_auto_classes() -> None:
    """Make AutoConfig / AutoModelForMaskedLM / AutoModelForCausalLM know model_type "seqdiff" (idempotent)."""
    AutoConfig.register(MODEL_TYPE, SeqDiffConfig, exist_ok=True)
    AutoModelForMaskedLM.register(SeqDiffConfig, SeqDiffForMaskedLM, exist_ok=True)
    AutoModelForCausalLM.register(SeqDiffConfig, SeqDiffForCausalLM, exist_ok=True)


__all__ = [
    "ARCHITECTURES",
    "MODEL_TYPE",
    "SeqDiffConfig",
    "SeqDiffForCausalLM",
    "SeqDiffForMaskedLM",
    "SeqDiffPreTrainedModel",
    "register_auto_classes",
]
