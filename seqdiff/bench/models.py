"""What `seqdiff bench` compares: the contenders (seqdiff's DiT and Hugging Face BERT / GPT-2 of the same shape),
one training step of each, and the cached sampler's expected saving.

The contenders and the pairs of a ratio are named once here (TRAIN_MODELS, PAIRS, ...); harness.py times them,
report.py renders the tables.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from seqdiff.backbones import build_backbone
from seqdiff.config import MethodConfig, ModelConfig
from seqdiff.methods import AR, MDLM, Batch
from seqdiff.optim import adamw_implementation

TRAIN_MODELS = ("seqdiff_bidirectional", "hf_bert", "hf_bert_gelu_new", "seqdiff_causal", "hf_gpt2")
SEQDIFF_MODELS = ("seqdiff_bidirectional", "seqdiff_causal")
PAIRS = {"bidirectional": ("seqdiff_bidirectional", "hf_bert"), "causal": ("seqdiff_causal", "hf_gpt2")}
SAME_ACTIVATION_PAIRS = {"bidirectional": ("seqdiff_bidirectional", "hf_bert_gelu_new"),
                         "causal": ("seqdiff_causal", "hf_gpt2")}  # GPT-2's default is already tanh GELU
EXACT_GELU_PAIRS = {"bidirectional": ("seqdiff_bidirectional", "hf_bert"),
                    "causal": ("seqdiff_causal", "hf_gpt2_gelu")}  # with --activation gelu
FULL_HEAD_MODEL = "seqdiff_bidirectional_full_head"
"""--full-head: the bidirectional DiT once more, its MDLM loss with method.head_at_masked=false (the output head
at every position), timed beside the default so that the head's saving is a ratio of one run."""
FULL_LAST_BLOCK_MODEL = "seqdiff_bidirectional_full_last_block"
"""--full-last-block: the bidirectional DiT once more, the same sparse-head MDLM loss, with
DiT.last_block_at_outputs=false (its last block's output projection and MLP at every position, the positions
selected after the final norm), timed beside the default so that the saving is a ratio of one run."""
UNFUSED_MODELS = {"seqdiff_bidirectional_unfused": "seqdiff_bidirectional", "seqdiff_causal_unfused": "seqdiff_causal"}
"""--unfused: each seqdiff model once more with method.fused_loss=false (the head's (N, V) logits, then the
cross-entropy), timed beside the default so that the fused loss's effect is a ratio of one run. At the default
character vocabulary both take the plain path (method.fused_loss=null fuses from 4,096 ids on)."""
OURS = (*SEQDIFF_MODELS, FULL_HEAD_MODEL, FULL_LAST_BLOCK_MODEL, *UNFUSED_MODELS)
"""Every seqdiff contender (built by seqdiff, trained with a seqdiff method, compiled by --compile)."""
SAMPLERS = {"mdlm_uncached": "ancestral", "mdlm_cached": "cached", "ar_kv": "ar"}
TRAIN_RATIO_TARGET = 1.0
CACHED_SPEEDUP_TARGET = 2.5
DEFAULT_OUT = Path("reports") / "bench"


def train_models(activation: str, full_head: bool = False, unfused: bool = False,
                 full_last_block: bool = False) -> tuple[str, ...]:
    """The training contenders: TRAIN_MODELS, plus GPT-2 with the exact GELU when the DiT uses it, plus the MDLM
    with the output head at every position when `full_head` (--full-head), plus the seqdiff models without the
    fused loss when `unfused` (--unfused), plus the MDLM with its whole last block at every position when
    `full_last_block` (--full-last-block)."""
    return (TRAIN_MODELS + (("hf_gpt2_gelu",) if activation == "gelu" else ())
            + ((FULL_HEAD_MODEL,) if full_head else ()) + (tuple(UNFUSED_MODELS) if unfused else ())
            + ((FULL_LAST_BLOCK_MODEL,) if full_last_block else ()))


def same_activation_pairs(activation: str) -> dict[str, tuple[str, str]]:
    """seqdiff model -> the Hugging Face model that uses the same GELU as the DiT (`--activation`)."""
    return EXACT_GELU_PAIRS if activation == "gelu" else SAME_ACTIVATION_PAIRS



def vocab_stub(vocab_size: int) -> SimpleNamespace:
    """What a Method reads from a tokenizer: the size and the 4 special ids, appended after the regular ids."""
    v = vocab_size
    return SimpleNamespace(vocab_size=v, bos_id=v - 4, eos_id=v - 3, pad_id=v - 2, mask_id=v - 1)


def autocast(device: torch.device, bf16: bool | None = None) -> contextlib.AbstractContextManager:
    """bf16 autocast (train.precision=bf16-mixed) or none; `bf16=None`: the `auto` precision of training, bf16 on
    CUDA and float32 on CPU."""
    if bf16 is None:
        bf16 = device.type == "cuda"
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())



# ---------------------------------------------------------------------------------------------- models
@dataclass
class Shape:
    hidden_size: int
    n_layers: int
    n_heads: int
    seq_len: int
    batch_size: int
    vocab_size: int
    activation: str = "gelu_tanh"

    def model_config(self) -> ModelConfig:
        return ModelConfig(hidden_size=self.hidden_size, n_layers=self.n_layers, n_heads=self.n_heads, mlp_ratio=4,
                           dropout=0.0, time_conditioning=False, max_seq_len=self.seq_len,
                           activation=self.activation)


def _hf_quiet() -> None:
    import transformers

    transformers.logging.set_verbosity_error()


def build_model(name: str, shape: Shape) -> nn.Module:
    """One of train_models(), randomly initialized (call torch.manual_seed first for a fixed init)."""
    if name in OURS:
        causal = UNFUSED_MODELS.get(name, name) == "seqdiff_causal"
        backbone = build_backbone(shape.model_config(), shape.vocab_size, causal=causal)
        backbone.last_block_at_outputs = name != FULL_LAST_BLOCK_MODEL
        return backbone
    _hf_quiet()
    if name.startswith("hf_bert"):
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                         num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads,
                         intermediate_size=4 * shape.hidden_size, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, max_position_embeddings=shape.seq_len,
                         hidden_act="gelu_new" if name == "hf_bert_gelu_new" else "gelu",
                         pad_token_id=vocab_stub(shape.vocab_size).pad_id, attn_implementation="sdpa")
        return BertForMaskedLM(cfg)
    if name in ("hf_gpt2", "hf_gpt2_gelu"):
        from transformers import GPT2Config, GPT2LMHeadModel

        ids = vocab_stub(shape.vocab_size)
        cfg = GPT2Config(vocab_size=shape.vocab_size, n_embd=shape.hidden_size, n_layer=shape.n_layers,
                         n_head=shape.n_heads, n_inner=4 * shape.hidden_size, n_positions=shape.seq_len,
                         activation_function="gelu" if name == "hf_gpt2_gelu" else "gelu_new", resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                         bos_token_id=ids.bos_id, eos_token_id=ids.eos_id, attn_implementation="sdpa")
        return GPT2LMHeadModel(cfg)
    every = train_models("gelu", full_head=True, unfused=True, full_last_block=True)
    raise ValueError(f"unknown model {name!r}; choose one of {list(every)}")


def method_of(name: str, shape: Shape) -> MDLM | AR:
    """The loss a seqdiff contender trains with: MDLM (bidirectional; the full-head one without
    method.head_at_masked) or AR (causal); the --unfused ones with method.fused_loss=false."""
    vocab = vocab_stub(shape.vocab_size)
    fused = False if name in UNFUSED_MODELS else None
    if UNFUSED_MODELS.get(name, name) == "seqdiff_causal":
        return AR(MethodConfig(name="ar", fused_loss=fused), vocab)
    return MDLM(MethodConfig(name="mdlm", head_at_masked=name != FULL_HEAD_MODEL, fused_loss=fused), vocab)


def make_train_step(name: str, model: nn.Module, shape: Shape, device: torch.device,
                    seed: int, bf16: bool | None = None) -> Callable[[], None]:
    """A closure doing one optimizer step of `model` on a fixed random batch (no data loading is timed), under
    `autocast(device, bf16)`."""
    vocab = vocab_stub(shape.vocab_size)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(0, vocab.bos_id, (shape.batch_size, shape.seq_len), generator=gen, device=device)  # (B, L)
    batch = Batch(input_ids=x)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, **adamw_implementation(params))  # fused: what both sides train with
    model.train()
    if name in OURS:
        method = method_of(name, shape)

        def loss_fn() -> torch.Tensor:
            return method.loss(model, batch, gen).loss
    else:  # HF: masked-LM cross-entropy on all positions (BERT), next-token cross-entropy (GPT-2)

        def loss_fn() -> torch.Tensor:
            return model(input_ids=x, labels=x).loss

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with autocast(device, bf16):
            loss = loss_fn()
        loss.backward()
        opt.step()

    return step



def expected_cached_speedup(steps: int, seq_len: int) -> float:
    """Uncached / cached denoiser work for one sequence, log-linear schedule, uniform time grid.

    Each token's reveal step is uniform over the `steps` steps (alpha is linear in t), independently, so a
    step reveals nothing in a row with probability q = (1 - 1/steps)^seq_len; the cached sampler recomputes a
    row at the first step and after every step that revealed something in it.
    """
    q = (1 - 1 / steps) ** seq_len
    return steps / (1 + (steps - 1) * (1 - q))
