"""`seqdiff bench`: how fast seqdiff trains and samples, side by side with Hugging Face models of the same shape.

What one run measures (all on one device, in one process):

1. Training throughput (tokens/s of forward + backward + AdamW step; float32 on CPU, bf16 autocast on CUDA)
   of the bidirectional DiT with the MDLM loss against `BertForMaskedLM`, and of the causal DiT with the AR
   loss against `GPT2LMHeadModel` (untied embeddings, so the parameter counts match). Same width, depth,
   heads, vocabulary, sequence length, MLP width 4x, no dropout, SDPA attention. BERT runs twice: with its
   default exact GELU (what `ratio_vs_hf` uses) and with the tanh GELU (`gelu_new`). The DiT uses the tanh
   GELU by default (MDLM's choice); `--activation gelu` switches it to the exact GELU, so that the plain
   BERT is the same-activation contender (and GPT-2 runs once more with the exact GELU for the causal pair).
2. The float32 matmul rate of the device (a large square matmul) and the fraction of it the seqdiff models
   reach while training (model FLOPs from `DiT.flops_per_token`), with a torch.profiler breakdown of one
   training step of every model by kind of operator, to show where the rest of the time goes.
3. Sampling throughput at a few batch sizes: MDLM ancestral (uncached) and cached with steps = length, and
   AR with the KV cache, on untrained models (the cached sampler's savings depend on the schedule only).
4. Peak memory of a training step (CUDA: allocator peak; CPU: peak RSS above the baseline).

Every model trains with the fused AdamW where torch has it (what seqdiff's training uses, and Hugging Face
Trainer's default optimizer since torch 2.8). `--compile` compiles the seqdiff models in place, as
`train.compile` does (the warm-up steps absorb the compilation); the Hugging Face models stay eager.

Noise control (the machines this runs on are shared): every model is warmed up first; then the contenders
are timed in rounds, one after another with the order rotated every round, and the figures reported are
medians over rounds with their spread. Ratios (seqdiff / HF, cached / uncached, model FLOP/s / matmul
FLOP/s) are medians of per-round ratios, so both sides of each ratio saw the same machine load. As a cross-check
against bursts of other work (which on a 2-core machine can slow a 2-thread model several times over), the
ratio of each side's best round is reported too; the two agree when the machine was quiet. Each round also
records how much CPU other processes used meanwhile (Linux /proc); when at least 3 training rounds (1 sampling
round) were quiet (others below 10% of the CPUs), the headline figures use only the quiet rounds, and the
report says which were used.

Writes <out>/bench.json and <out>/bench.md (each to a temporary file, then renamed) and prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import gc
import json
import math
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from seqdiff.backbones import build_backbone
from seqdiff.config import MODEL_PRESETS, MethodConfig, ModelConfig, finite_float
from seqdiff.methods import AR, MDLM, Batch
from seqdiff.safe_io import atomic_write_text
from seqdiff.samplers import build_sampler
from seqdiff.training.module import adamw_implementation

TRAIN_MODELS = ("seqdiff_bidirectional", "hf_bert", "hf_bert_gelu_new", "seqdiff_causal", "hf_gpt2")
SEQDIFF_MODELS = ("seqdiff_bidirectional", "seqdiff_causal")
PAIRS = {"bidirectional": ("seqdiff_bidirectional", "hf_bert"), "causal": ("seqdiff_causal", "hf_gpt2")}
SAME_ACTIVATION_PAIRS = {"bidirectional": ("seqdiff_bidirectional", "hf_bert_gelu_new"),
                         "causal": ("seqdiff_causal", "hf_gpt2")}  # GPT-2's default is already tanh GELU
EXACT_GELU_PAIRS = {"bidirectional": ("seqdiff_bidirectional", "hf_bert"),
                    "causal": ("seqdiff_causal", "hf_gpt2_gelu")}  # with --activation gelu
SAMPLERS = {"mdlm_uncached": "ancestral", "mdlm_cached": "cached", "ar_kv": "ar"}
TRAIN_RATIO_TARGET = 1.0
CACHED_SPEEDUP_TARGET = 2.5
DEFAULT_OUT = Path("reports") / "bench"


def train_models(activation: str) -> tuple[str, ...]:
    """The training contenders: TRAIN_MODELS, plus GPT-2 with the exact GELU when the DiT uses it."""
    return TRAIN_MODELS + (("hf_gpt2_gelu",) if activation == "gelu" else ())


def same_activation_pairs(activation: str) -> dict[str, tuple[str, str]]:
    """seqdiff model -> the Hugging Face model that uses the same GELU as the DiT (`--activation`)."""
    return EXACT_GELU_PAIRS if activation == "gelu" else SAME_ACTIVATION_PAIRS


# ---------------------------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="seqdiff bench",
        description="Training and sampling throughput, matmul utilization and peak memory of seqdiff models, "
        "against Hugging Face BERT / GPT-2 of the same shape. Writes bench.json and bench.md.",
    )
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `seqdiff bench` (seqdiff.cli's command table adds them to its subparser)."""
    p.add_argument("--preset", default="cpu-small", choices=sorted(MODEL_PRESETS),
                   help="model size preset (hidden size, layers, heads); default cpu-small")
    p.add_argument("--activation", default="gelu_tanh", choices=["gelu_tanh", "gelu"],
                   help="MLP activation of the seqdiff models (model.activation): gelu_tanh (default, MDLM's) or "
                   "the exact gelu, BERT's default, for a same-activation comparison with plain BERT")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (training and sampling)")
    p.add_argument("--batch-size", type=int, default=8, help="training batch size (sequences)")
    p.add_argument("--vocab-size", type=int, default=31,
                   help="vocabulary size including 4 special tokens (31 = character level, text8)")
    p.add_argument("--repeats", type=int, default=12, help="interleaved timing rounds for training")
    p.add_argument("--steps-per-repeat", type=int, default=1, help="optimizer steps per model per round")
    p.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps per model before timing")
    p.add_argument("--sample-batches", default="1,16", help="comma-separated sampling batch sizes")
    p.add_argument("--sample-repeats", type=int, default=3, help="most interleaved sampling rounds per batch size")
    p.add_argument("--sample-budget-s", type=finite_float, default=30.0,
                   help="start another sampling round for a batch size only while less than this many seconds "
                   "were spent on it (at least one round always runs; a second one, up to twice the budget, when "
                   "other processes were busy during the first)")
    p.add_argument("--matmul-size", type=int, default=2048, help="n of the n x n @ n x n reference matmul")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the seqdiff models (train.compile); Hugging Face's stay eager, their default")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:1, ...")
    p.add_argument("--threads", type=int, default=0,
                   help="torch intra-op threads (0 = torch's default, usually the number of cores)")
    p.add_argument("--seed", type=int, default=0, help="seed of initializations, data and sampling")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder for bench.json and bench.md")


def _validate(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int]:
    for key in ("seq_len", "batch_size", "repeats", "steps_per_repeat", "sample_repeats", "matmul_size"):
        if getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0, got {args.threads}")
    if args.warmup < 0:
        parser.error(f"--warmup must be >= 0, got {args.warmup}")
    if args.compile and args.warmup < 1:
        parser.error("--compile needs --warmup >= 1 (the first step compiles; it must not be timed)")
    if args.vocab_size < 5:
        parser.error(f"--vocab-size must be >= 5 (4 special tokens + 1), got {args.vocab_size}")
    try:
        batches = [int(b) for b in args.sample_batches.split(",") if b.strip()]
    except ValueError:
        parser.error(f"--sample-batches must be comma-separated integers, got {args.sample_batches!r}")
    if any(b < 1 for b in batches):
        parser.error(f"--sample-batches must be positive, got {args.sample_batches!r}")
    return batches


# ---------------------------------------------------------------------------------------------- helpers
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of fn(), with the device synchronized on both sides."""
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _spread(values: list[float]) -> dict[str, Any]:
    """Median and spread of a list of measurements (quartiles only when there are enough of them)."""
    out: dict[str, Any] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "n": len(values)}
    if len(values) >= 4:
        q1, _, q3 = statistics.quantiles(values, n=4)
        out["q1"], out["q3"] = q1, q3
    out["values"] = [round(v, 6) for v in values]
    return out


def _load_average() -> float | None:
    """1-minute load average of the machine (None where the OS has none): how busy it was with other work."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


class OtherLoad:
    """CPU time that other processes used over an interval, as a fraction of all the machine's CPUs.

    Linux only (/proc/stat minus this process' own utime + stime from /proc/self/stat, clock ticks); None
    elsewhere. A measurement is called quiet when others used less than QUIET_OTHERS of the CPUs meanwhile.
    """

    @staticmethod
    def snapshot() -> tuple[int, int, int] | None:
        try:
            with open("/proc/stat") as f:
                ticks = [int(v) for v in f.readline().split()[1:9]]  # user nice system idle iowait irq softirq steal
            with open("/proc/self/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime of all threads
        except (OSError, ValueError, IndexError):
            return None
        return sum(ticks) - ticks[3] - ticks[4], sum(ticks), own

    @staticmethod
    def between(a: tuple[int, int, int] | None, b: tuple[int, int, int] | None) -> float | None:
        if a is None or b is None or b[1] <= a[1]:
            return None
        return max(0.0, (b[0] - a[0]) - (b[2] - a[2])) / (b[1] - a[1])


QUIET_OTHERS = 0.1


def _quiet(others: list[float | None]) -> list[bool]:
    return [o is None or o < QUIET_OTHERS for o in others]


def _rotated(items: list, r: int) -> list:
    k = r % len(items)
    return items[k:] + items[:k]


def _vocab(vocab_size: int) -> SimpleNamespace:
    """What a Method reads from a tokenizer: the size and the 4 special ids, appended after the regular ids."""
    v = vocab_size
    return SimpleNamespace(vocab_size=v, bos_id=v - 4, eos_id=v - 3, pad_id=v - 2, mask_id=v - 1)


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _num_params(model: nn.Module) -> int:
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
    if name in SEQDIFF_MODELS:
        return build_backbone(shape.model_config(), shape.vocab_size, causal=name == "seqdiff_causal")
    _hf_quiet()
    if name.startswith("hf_bert"):
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                         num_hidden_layers=shape.n_layers, num_attention_heads=shape.n_heads,
                         intermediate_size=4 * shape.hidden_size, hidden_dropout_prob=0.0,
                         attention_probs_dropout_prob=0.0, max_position_embeddings=shape.seq_len,
                         hidden_act="gelu_new" if name == "hf_bert_gelu_new" else "gelu",
                         pad_token_id=_vocab(shape.vocab_size).pad_id, attn_implementation="sdpa")
        return BertForMaskedLM(cfg)
    if name in ("hf_gpt2", "hf_gpt2_gelu"):
        from transformers import GPT2Config, GPT2LMHeadModel

        ids = _vocab(shape.vocab_size)
        cfg = GPT2Config(vocab_size=shape.vocab_size, n_embd=shape.hidden_size, n_layer=shape.n_layers,
                         n_head=shape.n_heads, n_inner=4 * shape.hidden_size, n_positions=shape.seq_len,
                         activation_function="gelu" if name == "hf_gpt2_gelu" else "gelu_new", resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                         bos_token_id=ids.bos_id, eos_token_id=ids.eos_id, attn_implementation="sdpa")
        return GPT2LMHeadModel(cfg)
    raise ValueError(f"unknown model {name!r}; choose one of {list(train_models('gelu'))}")


def make_train_step(name: str, model: nn.Module, shape: Shape, device: torch.device,
                    seed: int) -> Callable[[], None]:
    """A closure doing one optimizer step of `model` on a fixed random batch (no data loading is timed)."""
    vocab = _vocab(shape.vocab_size)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(0, vocab.bos_id, (shape.batch_size, shape.seq_len), generator=gen, device=device)  # (B, L)
    batch = Batch(input_ids=x)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, **adamw_implementation(params))  # fused: what both sides train with
    model.train()
    if name == "seqdiff_bidirectional":
        method = MDLM(MethodConfig(name="mdlm"), vocab)

        def loss_fn() -> torch.Tensor:
            return method.loss(model, batch, gen).loss
    elif name == "seqdiff_causal":
        method = AR(MethodConfig(name="ar"), vocab)

        def loss_fn() -> torch.Tensor:
            return method.loss(model, batch, gen).loss
    else:  # HF: masked-LM cross-entropy on all positions (BERT), next-token cross-entropy (GPT-2)

        def loss_fn() -> torch.Tensor:
            return model(input_ids=x, labels=x).loss

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with _autocast(device):
            loss = loss_fn()
        loss.backward()
        opt.step()

    return step


# ---------------------------------------------------------------------------------------------- matmul
def make_matmul(n: int, device: torch.device, seed: int) -> tuple[Callable[[], None], int]:
    gen = torch.Generator(device=device).manual_seed(seed)
    a = torch.randn(n, n, generator=gen, device=device)
    b = torch.randn(n, n, generator=gen, device=device)
    out = torch.empty(n, n, device=device)
    return (lambda: torch.mm(a, b, out=out)), 2 * n**3


# ---------------------------------------------------------------------------------------------- memory
class PeakMemory:
    """Peak memory of a block of work above the level at its start, in bytes.

    CUDA: the caching allocator's peak (`torch.cuda.max_memory_allocated`, reset first). CPU: the process's
    peak resident set (VmHWM in /proc/self/status), reset by writing "5" to /proc/self/clear_refs after
    freeing what glibc holds (malloc_trim), so the baseline is the memory really in use. Where the reset is
    not permitted, the increase of `ru_maxrss` (a lower bound: it only moves above the previous peak).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self._libc = None
        with contextlib.suppress(OSError):
            self._libc = ctypes.CDLL("libc.so.6")
        if device.type == "cuda":
            self.method = "torch.cuda.max_memory_allocated (reset before each model)"
        elif self._can_reset_hwm():
            self.method = "peak RSS: /proc/self/status VmHWM, reset via /proc/self/clear_refs '5', after malloc_trim"
        else:
            self.method = "ru_maxrss increase (lower bound: it cannot be reset)"

    @staticmethod
    def _can_reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            return PeakMemory._status_kb("VmHWM") is not None
        except OSError:
            return False

    @staticmethod
    def _status_kb(key: str) -> int | None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith(key + ":"):
                        return int(line.split()[1])
        except OSError:
            return None
        return None

    def _release(self) -> None:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        elif self._libc is not None:
            with contextlib.suppress(AttributeError):
                self._libc.malloc_trim(0)

    def measure(self, fn: Callable[[], Any]) -> int:
        """Bytes of peak memory while fn() runs, above what was in use when it started."""
        self._release()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            base = torch.cuda.memory_allocated(self.device)
            fn()
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) - base
        if self.method.startswith("peak RSS"):
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            base = self._status_kb("VmRSS") or 0
            fn()
            return max(0, ((self._status_kb("VmHWM") or 0) - base) * 1024)
        import resource

        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn()
        return max(0, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)


# ---------------------------------------------------------------------------------------------- profile
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addmv", "aten::mv", "aten::dot",
              "aten::_addmm_activation"}
CATEGORIES = ("matmul", "attention", "gelu", "layernorm", "elementwise", "copies", "loss", "embedding",
              "optimizer", "autograd", "unattributed")
COPY_OPS = {"aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::cat", "aten::stack",
            "aten::fill_", "aten::zero_", "aten::zeros", "aten::zeros_like", "aten::empty", "aten::empty_like",
            "aten::empty_strided"}


def _category(key: str) -> str:
    """Kind of a profiler event by operator name (each event's self time counts once)."""
    k = key.lower()
    if key in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in k or "flash_attention" in k or "efficient_attention" in k or "cudnn_attention" in k:
        return "attention"
    if "layer_norm" in k:
        return "layernorm"
    if "gelu" in k:
        return "gelu"
    if "softmax" in k or "nll_loss" in k or "cross_entropy" in k:
        return "loss"
    if "embedding" in k or k == "aten::index_select":
        return "embedding"
    if k.startswith("optimizer.") or k.startswith("aten::_foreach") or "adam" in k:
        return "optimizer"
    if key in COPY_OPS:
        return "copies"
    if k.startswith("autograd::") or "backward" in k:  # autograd Node wrappers: bookkeeping between kernels
        return "autograd"
    if k.startswith("aten::"):
        return "elementwise"  # adds, muls (the rotary complex multiply), reductions (bias gradients), views
    return "unattributed"


def _under_optimizer(evt: Any) -> bool:
    while evt is not None:
        if evt.name.startswith("Optimizer."):
            return True
        evt = evt.cpu_parent
    return False


def profile_step(step: Callable[[], None], device: torch.device) -> dict[str, Any]:
    """One profiled training step: milliseconds per kind of operator, and the rate of the matmul kernels.

    Every operator's self time (CPU; device time on CUDA) goes to one category; all work inside
    `optimizer.step()` / `zero_grad()` counts as `optimizer`. `unattributed` is wall time outside any operator
    (Python, dispatch between operators, plus the profiler's own overhead), so it overstates eager overhead.
    """
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, with_flops=True) as prof:
        wall = _timed(step, device)
    ms = dict.fromkeys(CATEGORIES, 0.0)
    matmul_flops = 0.0
    for evt in prof.events():
        if cuda and str(getattr(evt, "device_type", "")).endswith("CUDA"):
            continue  # kernels are counted through the CPU operators that launched them
        us = getattr(evt, "self_device_time_total", 0.0) if cuda else evt.self_cpu_time_total
        cat = "optimizer" if _under_optimizer(evt) else _category(evt.name)
        ms[cat] += us / 1e3
        if cat == "matmul":
            matmul_flops += float(evt.flops or 0)
    wall_ms = wall * 1e3
    if not cuda:
        ms["unattributed"] += max(0.0, wall_ms - sum(ms.values()))
    matmul_s = ms["matmul"] / 1e3
    total = max(sum(ms.values()), 1e-9)
    return {
        "wall_ms": round(wall_ms, 3),
        "ms": {k: round(v, 3) for k, v in ms.items()},
        "share": {k: round(v / total, 4) for k, v in ms.items()},
        "matmul_gflop": matmul_flops / 1e9,
        "matmul_kernel_flops_per_s": matmul_flops / matmul_s if matmul_s > 0 else None,
    }


# ---------------------------------------------------------------------------------------------- phases
def bench_training(shape: Shape, args: argparse.Namespace, device: torch.device,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Interleaved training rounds (+ the reference matmul as one more contender), then one profiled step each."""
    models, steps = {}, {}
    names = train_models(shape.activation)
    for i, name in enumerate(names):
        torch.manual_seed(args.seed + i)
        models[name] = build_model(name, shape).to(device)
        if args.compile and name in SEQDIFF_MODELS:  # as train.compile does it: in place, compiled at warm-up
            models[name].compile()
        steps[name] = make_train_step(name, models[name], shape, device, args.seed)
    matmul, matmul_flop = make_matmul(args.matmul_size, device, args.seed)
    params = {name: _num_params(m) for name, m in models.items()}
    flops_per_token = {name: int(models[name].flops_per_token(shape.seq_len)) for name in SEQDIFF_MODELS}

    log(f"warm-up: {args.warmup} steps per model")
    for name in names:
        for _ in range(args.warmup):
            steps[name]()
    for _ in range(3):
        matmul()

    tokens_per_step = shape.batch_size * shape.seq_len
    tok_s: dict[str, list[float]] = {name: [] for name in names}
    mm_rate: list[float] = []
    others: list[float | None] = []  # CPU share used by other processes during each round
    contenders = [*names, "matmul"]
    for r in range(args.repeats):
        load0 = OtherLoad.snapshot()
        for name in _rotated(contenders, r):
            if name == "matmul":
                secs = [_timed(matmul, device) for _ in range(3)]
                mm_rate.append(matmul_flop / statistics.median(secs))
                continue
            k = args.steps_per_repeat
            seconds = _timed(lambda step=steps[name], k=k: [step() for _ in range(k)], device)
            tok_s[name].append(k * tokens_per_step / seconds)
        others.append(OtherLoad.between(load0, OtherLoad.snapshot()))
        busy = "" if others[-1] is None else f"; other processes {others[-1]:.0%} of the CPUs"
        log(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{n} {tok_s[n][-1]:.0f}" for n in names)
            + f" tok/s; matmul {mm_rate[-1] / 1e9:.1f} GFLOP/s{busy}")

    # Headline figures come from the quiet rounds when there are at least 3 of them, else from all rounds.
    quiet = _quiet(others)
    use = quiet if sum(quiet) >= 3 else [True] * len(quiet)
    tok_s = {name: [v for v, u in zip(vals, use, strict=True) if u] for name, vals in tok_s.items()}
    mm_rate = [v for v, u in zip(mm_rate, use, strict=True) if u]

    def per_round(a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(tok_s[a], tok_s[b], strict=True)]

    def best(a: str, b: str) -> float:
        return max(tok_s[a]) / max(tok_s[b])

    fraction = {name: [t * flops_per_token[name] / m for t, m in zip(tok_s[name], mm_rate, strict=True)]
                for name in SEQDIFF_MODELS}
    log("profiling training steps of each model")
    profiles = {}
    for name in names:  # of 3 profiled steps, the fastest: the least disturbed by other work
        profiles[name] = min((profile_step(steps[name], device) for _ in range(3)), key=lambda p: p["wall_ms"])
    return {
        "rounds": {"total": len(quiet), "quiet": sum(quiet), "used": "quiet" if use == quiet and not all(quiet)
                   else "all", "others_cpu": [None if o is None else round(o, 3) for o in others]},
        "tok_s": {name: _spread(v) for name, v in tok_s.items()},
        "ratio": {pair: _spread(per_round(a, b)) for pair, (a, b) in PAIRS.items()},
        "ratio_best": {pair: best(a, b) for pair, (a, b) in PAIRS.items()},
        "ratio_same_activation": {pair: _spread(per_round(a, b))
                                  for pair, (a, b) in same_activation_pairs(shape.activation).items()},
        "matmul": _spread(mm_rate),
        "matmul_fraction": {name: _spread(v) for name, v in fraction.items()},
        "params": params,
        "flops_per_token": flops_per_token,
        "profiles": profiles,
    }


def bench_memory(shape: Shape, args: argparse.Namespace, device: torch.device) -> tuple[dict[str, float], str]:
    """Peak memory (MB) of building each model + optimizer and running two training steps."""
    meter = PeakMemory(device)

    def run(name: str) -> None:
        torch.manual_seed(args.seed)
        model = build_model(name, shape).to(device)
        step = make_train_step(name, model, shape, device, args.seed)
        step()
        step()

    run(TRAIN_MODELS[0])  # first-use allocations of the libraries are not any model's memory
    peak = {name: meter.measure(lambda name=name: run(name)) / 2**20 for name in train_models(shape.activation)}
    return peak, meter.method


def expected_cached_speedup(steps: int, seq_len: int) -> float:
    """Uncached / cached denoiser work for one sequence, log-linear schedule, uniform time grid.

    Each token's reveal step is uniform over the `steps` steps (alpha is linear in t), independently, so a
    step reveals nothing in a row with probability q = (1 - 1/steps)^seq_len; the cached sampler recomputes a
    row at the first step and after every step that revealed something in it.
    """
    q = (1 - 1 / steps) ** seq_len
    return steps / (1 + (steps - 1) * (1 - q))


def bench_sampling(shape: Shape, batches: list[int], args: argparse.Namespace, device: torch.device,
                   log: Callable[[str], None]) -> dict[str, Any]:
    """Interleaved sampling rounds per batch size on untrained models, float64 draws as in `seqdiff sample`."""
    vocab = _vocab(shape.vocab_size)
    torch.manual_seed(args.seed)
    bi = build_backbone(shape.model_config(), shape.vocab_size, causal=False).to(device).eval()
    causal = build_backbone(shape.model_config(), shape.vocab_size, causal=True).to(device).eval()
    mdlm, ar = MDLM(MethodConfig(name="mdlm"), vocab), AR(MethodConfig(name="ar"), vocab)
    L = shape.seq_len

    def sampler(key: str, steps: int):
        method, model = (ar, causal) if key == "ar_kv" else (mdlm, bi)
        return build_sampler(SAMPLERS[key], method, model, steps=steps)

    samplers = {key: sampler(key, L) for key in SAMPLERS}
    warm = {key: sampler(key, min(4, L)) for key in SAMPLERS}
    tok_s = {key: {} for key in SAMPLERS}
    calls = {key: {} for key in SAMPLERS}
    speedup, rounds_done = {}, {}
    for B in batches:
        with _autocast(device):
            for key in SAMPLERS:  # same shapes, a few steps: allocator and kernels warm
                warm[key].generate(B, L, torch.Generator(device=device).manual_seed(args.seed))
        runs = {key: [] for key in SAMPLERS}
        n_calls = {key: [] for key in SAMPLERS}
        spent, r, others = 0.0, 0, []
        # Past the budget, one more round is run only while no round so far was quiet (bursts of other work).
        while r < args.sample_repeats and (r == 0 or spent < args.sample_budget_s
                                           or (not any(_quiet(others)) and spent < 2 * args.sample_budget_s
                                               and r < 2)):
            load0 = OtherLoad.snapshot()
            for key in _rotated(list(SAMPLERS), r):
                gen = torch.Generator(device=device).manual_seed(args.seed + r)  # same draws for cached / uncached
                out = {}

                def go(smp=samplers[key], B=B, gen=gen, out=out) -> None:
                    with _autocast(device):
                        out["s"] = smp.generate(B, L, gen)

                secs = _timed(go, device)
                spent += secs
                runs[key].append(B * L / secs)
                n_calls[key].append(out["s"].num_denoiser_calls)
            r += 1
            others.append(OtherLoad.between(load0, OtherLoad.snapshot()))
            busy = "" if others[-1] is None else f"; other processes {others[-1]:.0%} of the CPUs"
            log(f"sampling batch {B}, round {r}: " + ", ".join(f"{k} {runs[k][-1]:.0f}" for k in SAMPLERS)
                + f" tok/s{busy}")
        quiet = _quiet(others)
        use = quiet if any(quiet) else [True] * r  # the quiet rounds, if any
        runs = {key: [v for v, u in zip(vals, use, strict=True) if u] for key, vals in runs.items()}
        for key in SAMPLERS:
            tok_s[key][str(B)] = _spread(runs[key])
            calls[key][str(B)] = statistics.median(n_calls[key])
        speedup[str(B)] = _spread([c / u for c, u in zip(runs["mdlm_cached"], runs["mdlm_uncached"], strict=True)])
        rounds_done[str(B)] = {"total": r, "quiet": sum(quiet), "used": "quiet" if any(quiet) and not all(quiet)
                               else "all", "others_cpu": [None if o is None else round(o, 3) for o in others]}
    return {"tok_s": tok_s, "calls": calls, "speedup": speedup, "rounds": rounds_done,
            "expected_speedup": expected_cached_speedup(L, L)}


# ---------------------------------------------------------------------------------------------- report
def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def _range(s: dict[str, Any], fmt: Callable[[float], str] = _fmt_rate) -> str:
    return f"{fmt(s['median'])} [{fmt(s['min'])}–{fmt(s['max'])}]"


def _ratio(s: dict[str, Any]) -> str:
    return _range(s, lambda x: f"{x:.3f}")


GELU_NAMES = {"gelu_tanh": "tanh GELU", "gelu": "exact GELU"}


def render_tables(result: dict[str, Any], train: dict[str, Any], sampling: dict[str, Any]) -> str:
    peak = result["peak_memory_mb"]
    activation = result["config"].get("activation", "gelu_tanh")  # bench.json files from before --activation
    names = train_models(activation)
    lines = ["Training (forward + backward + AdamW), median [min–max] over rounds", "",
             "| model | params | tokens/s | peak MB | model FLOP/s ÷ matmul FLOP/s |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name in names:
        frac = train["matmul_fraction"].get(name)
        lines.append(f"| {name} | {train['params'][name]:,} | {_range(train['tok_s'][name])} | {peak[name]:.0f} | "
                     + (_ratio(frac) if frac else "") + " |")
    lines += ["", f"| ratio seqdiff / HF, median of rounds [min–max] | HF defaults | HF with the DiT's "
              f"{GELU_NAMES[activation]} | best round / best round (HF defaults) |", "| --- | ---: | ---: | ---: |"]
    for pair in PAIRS:
        lines.append(f"| {pair} ({PAIRS[pair][1]}) | {_ratio(train['ratio'][pair])} | "
                     f"{_ratio(train['ratio_same_activation'][pair])} | {train['ratio_best'][pair]:.3f} |")
    mm = train["matmul"]
    lines += ["", f"float32 matmul {result['config']['matmul_size']}²: "
              f"{_range(mm, lambda x: f'{x / 1e9:.1f}')} GFLOP/s", ""]
    lines += ["Operator time of one profiled training step (ms; `unattributed` = outside any operator)", "",
              "| model | " + " | ".join(CATEGORIES) + " | matmul kernels GFLOP/s |",
              "| --- | " + " | ".join("---:" for _ in CATEGORIES) + " | ---: |"]
    for name in names:
        p = train["profiles"][name]
        rate = p["matmul_kernel_flops_per_s"]
        cells = " | ".join(f"{p['ms'][c]:.1f}" for c in CATEGORIES)
        lines.append(f"| {name} | {cells} | " + (f"{rate / 1e9:.1f} |" if rate else "|"))
    batches = list(sampling["speedup"])
    lines += ["", f"Sampling tokens/s, sequence length {result['config']['seq_len']} (untrained models), "
              "median [min–max]; denoiser calls in brackets", "",
              "| sampler | " + " | ".join(f"batch {b}" for b in batches) + " |",
              "| --- | " + " | ".join("---:" for _ in batches) + " |"]
    for key in SAMPLERS:
        lines.append(f"| {key} | " + " | ".join(
            f"{_range(sampling['tok_s'][key][b])} ({sampling['calls'][key][b]:.0f})" for b in batches) + " |")
    lines.append("| cached / uncached | " + " | ".join(_ratio(sampling["speedup"][b]) for b in batches) + " |")
    return "\n".join(lines)


def explanation(result: dict[str, Any], train: dict[str, Any], sampling: dict[str, Any]) -> str:
    """The prose of bench.md, built from this run's numbers."""
    cfg = result["config"]
    mm = train["matmul"]["median"]
    paras = []
    r = result["ratio_vs_hf"]
    rs = result["ratio_vs_hf_same_activation"]
    met = result["train_ratio_target_met"]
    activation = cfg.get("activation", "gelu_tanh")
    if activation == "gelu":
        same = (f"The DiT ran with the exact GELU (`--activation gelu`), BERT's default, so the bidirectional "
                f"pair above already compares like with like; against GPT-2 switched to the exact GELU the causal "
                f"ratio is {rs['causal']:.3f}.")
    else:
        same = (f"With BERT switched to the tanh GELU that the DiT uses (its default, `--activation gelu_tanh`; "
                f"`--activation gelu` runs the DiT with BERT's exact GELU instead) the bidirectional ratio is "
                f"{rs['bidirectional']:.3f} (GPT-2's default activation is already the tanh GELU).")

    def d(cat: str) -> float:  # DiT minus BERT, ms per profiled step
        return train["profiles"]["seqdiff_bidirectional"]["ms"][cat] - train["profiles"]["hf_bert"]["ms"][cat]

    paras.append(
        f"**Training.** seqdiff / Hugging Face training throughput, as the median of per-round ratios: "
        f"bidirectional (MDLM loss vs BertForMaskedLM) {r['bidirectional']:.3f}, causal (AR loss vs "
        f"GPT2LMHeadModel) {r['causal']:.3f}; target ≥ {TRAIN_RATIO_TARGET:g}: "
        f"{'met' if met['bidirectional'] else 'not met'} / {'met' if met['causal'] else 'not met'}. "
        f"{same} The models are not "
        f"identical beyond the shape: BERT adds learned absolute and token-type embeddings, an embedding "
        f"LayerNorm and a dense + GELU + LayerNorm transform before its output layer (and ties that layer to the "
        f"input embedding); GPT-2 adds learned absolute positions; the DiT applies rotary embeddings to queries "
        f"and keys in every layer. Parameter counts are in the table and in bench.json. In the profiled steps "
        f"(table above) the DiT spends {d('gelu'):+.1f} ms on GELU, {d('elementwise'):+.1f} ms on elementwise "
        f"operators (the rotary multiply among them) and {d('matmul'):+.1f} ms on matmuls relative to BERT."
    )
    prof = train["profiles"]
    p = prof["seqdiff_bidirectional"]
    total = sum(p["ms"].values())
    share = {k: v / total for k, v in p["ms"].items()}
    kernel = p["matmul_kernel_flops_per_s"] or 0.0
    tokens = cfg["batch_size"] * cfg["seq_len"]
    attn_flop = 12 * cfg["n_layers"] * cfg["hidden_size"] * cfg["seq_len"] * tokens  # QK^T and AV, fwd + bwd
    attn_rate = attn_flop / (p["ms"]["attention"] / 1e3) if p["ms"]["attention"] > 0 else 0.0
    others = sorted((c for c in CATEGORIES if c != "matmul"), key=lambda c: -share[c])
    frac = result["matmul_fraction"]
    paras.append(
        f"**Matmul fraction.** Training, the bidirectional model turns {frac['seqdiff_bidirectional']:.0%} of "
        f"this device's measured float32 matmul rate ({mm / 1e9:.0f} GFLOP/s on {cfg['matmul_size']}² operands) "
        f"into model FLOPs (6 N + attention per token), the causal model {frac['seqdiff_causal']:.0%} (its count "
        f"includes the full attention term; causal attention does about half of it). A profiled training step "
        f"of the bidirectional model ({p['wall_ms']:.0f} ms under the profiler) says where the rest goes. "
        f"Matrix multiplies take {share['matmul']:.0%} of it, and at the model's shapes ({tokens} rows of width "
        f"{cfg['hidden_size']} against weights with {cfg['hidden_size']}–{4 * cfg['hidden_size']} columns) those "
        f"kernels run at {kernel / 1e9:.0f} GFLOP/s, {kernel / mm:.0%} of the large-matmul rate (the cost of "
        f"small matrices). The other {1 - share['matmul']:.0%} of the step: "
        + ", ".join(f"{c} {share[c]:.0%}" for c in others if share[c] >= 0.005)
        + f". `attention` is the fused SDPA kernel, forward and backward (about {attn_rate / 1e9:.0f} GFLOP/s on its "
        "own FLOPs; on CPU its backward also zero-fills the q / k / v gradient buffers). `gelu` is the "
        + ("exact (erf) GELU, as in BERT: " if activation == "gelu" else "tanh-approximate GELU: ")
        + f"{p['ms']['gelu']:.0f} ms here against {prof['hf_bert']['ms']['gelu']:.0f} ms for "
        "the exact (erf) GELU in BERT's profiled step"
        + (" (torch's kernel for the tanh form is the slower one)" if activation != "gelu" and p["ms"]["gelu"]
           > 1.2 * prof["hf_bert"]["ms"]["gelu"] else "")
        + "; HF's `gelu_new` is composed of Python-level elementwise ops, which is why hf_bert_gelu_new and "
        "hf_gpt2 show large `elementwise` and no `gelu`. "
        "`elementwise` holds the residual adds, the rotary complex multiply, the bias-gradient reductions and the "
        "loss' masking; `copies` are mostly, on CPU, the bias rows that addmm broadcasts into each newly "
        "allocated output before its GEMM (the first touch of fresh activation memory), plus the stacking of the "
        "q / k / v gradients in the backward of the fused qkv projection; `optimizer` is everything inside "
        "AdamW's step (torch's CPU default is the per-parameter, single-tensor implementation); `autograd` and "
        "`unattributed` (time outside any operator, profiler overhead included) are the eager Python and "
        f"dispatch overhead: {share['autograd'] + share['unattributed']:.0%} of this step. The output layer is "
        f"{'negligible' if cfg['vocab_size'] < cfg['hidden_size'] else 'a visible cost'} at vocabulary "
        f"{cfg['vocab_size']}. The memory-bound operators (gelu, layernorm, elementwise, copies: "
        f"{share['gelu'] + share['layernorm'] + share['elementwise'] + share['copies']:.0%} together) cost O(H) "
        "per token against the GEMMs' O(H²), so their weight, like the small-matrix penalty, falls as the width "
        "grows."
    )
    speed = result["cached_speedup"]
    exp = sampling["expected_speedup"]
    paras.append(
        f"**Sampling.** MDLM samplers run with steps = length = {cfg['seq_len']}; the models are randomly "
        "initialized. That does not bias the cached sampler: whether a step reveals a token is drawn from the "
        "schedule alone (probability (alpha_s - alpha_t) / (1 - alpha_t) per masked position), never from the "
        "denoiser's output, so the number of steps that reveal nothing — the steps the cached sampler skips — is "
        "the same for a trained model. With the log-linear schedule each token's reveal step is uniform over the "
        f"steps, so a row is unchanged after a step with probability (1 - 1/T)^L ≈ {math.exp(-1):.2f} at T = L, "
        f"and the cache saves a factor {exp:.2f} of the denoiser work per row in expectation (the measured "
        f"{result['sample_denoiser_calls']['mdlm_cached'].get('1', float('nan')):.0f} calls at batch 1 against "
        f"{cfg['seq_len']} agree). In wall-clock time the factor can differ a little: at batch > 1 the cached "
        "sampler recomputes only the rows that changed, as a smaller batch, and skips their float64 softmax. "
        "Measured cached / uncached speedup: " + ", ".join(f"{s:.2f}× at batch {b}" for b, s in speed.items())
        + f"; the issue's target (≥ {CACHED_SPEEDUP_TARGET:g}× at steps = length) is "
        + ("met." if all(result["cached_speedup_target_met"].values()) else
           "not met, and is out of reach of this sampler with the log-linear schedule at steps = length; the "
           "saving grows when steps exceed the length (at T = 4L the expected factor is "
           f"{expected_cached_speedup(4 * cfg['seq_len'], cfg['seq_len']):.1f}×).")
        + " AR decodes one token per forward pass from its KV cache."
    )
    paras.append(f"**Memory.** Peak memory of building a model with its AdamW optimizer and running two training "
                 f"steps, above the level before: {result['peak_memory_method']}.")
    return "\n\n".join(paras)


def _contention_note(result: dict[str, Any]) -> str:
    """One paragraph on how many rounds other processes disturbed and which rounds the figures use."""

    def describe(rounds: dict[str, Any]) -> str:
        if all(o is None for o in rounds["others_cpu"]):
            return f"{rounds['total']} rounds (no /proc to check for other work)"
        used = "quiet rounds only" if rounds["used"] == "quiet" else "all rounds"
        return f"{rounds['quiet']} of {rounds['total']} rounds quiet, figures from {used}"

    parts = [f"training: {describe(result['train_rounds'])}"]
    parts += [f"sampling batch {b}: {describe(r)}" for b, r in result["sample_rounds"].items()]
    disturbed = result["train_rounds"]["quiet"] < 3 or any(r["quiet"] == 0 for r in result["sample_rounds"].values())
    warn = (" **Other processes were busy during rounds that had to be used: treat those figures as lower "
            "bounds and rerun on a quiet machine.**" if disturbed else "")
    return (f"Rounds during which other processes used under {QUIET_OTHERS:.0%} of the CPUs count as quiet — "
            + "; ".join(parts) + "." + warn + "\n\n")


# ---------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    return run(parser.parse_args(argv), parser, argv)


def run(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The benchmark of parsed `args` (`parser` reports bad combinations; `argv` is named in the report)."""
    batches = _validate(args, parser)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if args.device == "auto" else args.device))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available")
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = MODEL_PRESETS[args.preset]
    shape = Shape(hidden_size=preset["hidden_size"], n_layers=preset["n_layers"], n_heads=preset["n_heads"],
                  seq_len=args.seq_len, batch_size=args.batch_size, vocab_size=args.vocab_size,
                  activation=args.activation)
    command = shlex.join(["seqdiff", "bench", *argv])
    out_dir = Path(args.out)
    t_start = time.perf_counter()

    def log(msg: str) -> None:
        print(f"[bench {time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    load_start = _load_average()
    log(f"device {device}, {torch.get_num_threads()} threads, load average {load_start}; {args.preset} {shape}")
    train = bench_training(shape, args, device, log)
    gc.collect()
    log("peak memory")
    peak, peak_method = bench_memory(shape, args, device)
    sampling = bench_sampling(shape, batches, args, device, log)

    import transformers

    ratio = {pair: s["median"] for pair, s in train["ratio"].items()}
    speedup = {b: s["median"] for b, s in sampling["speedup"].items()}
    result: dict[str, Any] = {
        "command": command,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
        or platform.machine(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "precision": "bf16 autocast" if device.type == "cuda" else "float32",
        "config": {"preset": args.preset, "hidden_size": shape.hidden_size, "n_layers": shape.n_layers,
                   "n_heads": shape.n_heads, "mlp_ratio": 4, "activation": shape.activation, "seq_len": shape.seq_len,
                   "batch_size": shape.batch_size, "vocab_size": shape.vocab_size, "repeats": args.repeats,
                   "steps_per_repeat": args.steps_per_repeat, "warmup": args.warmup, "sample_batches": batches,
                   "sample_repeats": args.sample_repeats, "sample_budget_s": args.sample_budget_s,
                   "sample_steps": shape.seq_len, "matmul_size": args.matmul_size, "seed": args.seed,
                   "compile": args.compile, "optimizer": "AdamW fused (both sides) where torch has it"},
        "train_tokens_per_s": {name: s["median"] for name, s in train["tok_s"].items()},
        "train_tokens_per_s_spread": train["tok_s"],
        "ratio_vs_hf": ratio,
        "ratio_vs_hf_spread": train["ratio"],
        "ratio_vs_hf_best_of_rounds": train["ratio_best"],
        "ratio_vs_hf_same_activation": {pair: s["median"] for pair, s in train["ratio_same_activation"].items()},
        "ratio_vs_hf_same_activation_spread": train["ratio_same_activation"],
        "train_ratio_target": TRAIN_RATIO_TARGET,
        "train_ratio_target_met": {pair: v >= TRAIN_RATIO_TARGET for pair, v in ratio.items()},
        "train_rounds": train["rounds"],
        "quiet_threshold_others_cpu": QUIET_OTHERS,
        "params": train["params"],
        "flops_per_token": train["flops_per_token"],
        "matmul_flops_per_s": train["matmul"]["median"],
        "matmul_flops_per_s_spread": train["matmul"],
        "matmul_dtype": "float32",
        "matmul_fraction": {name: s["median"] for name, s in train["matmul_fraction"].items()},
        "matmul_fraction_spread": train["matmul_fraction"],
        "profile": train["profiles"],
        "sample_tokens_per_s": {k: {b: s["median"] for b, s in v.items()} for k, v in sampling["tok_s"].items()},
        "sample_tokens_per_s_spread": sampling["tok_s"],
        "sample_denoiser_calls": sampling["calls"],
        "sample_rounds": sampling["rounds"],
        "cached_speedup": speedup,
        "cached_speedup_spread": sampling["speedup"],
        "cached_speedup_expected_max": sampling["expected_speedup"],
        "cached_speedup_target": CACHED_SPEEDUP_TARGET,
        "cached_speedup_target_met": {b: v >= CACHED_SPEEDUP_TARGET for b, v in speedup.items()},
        "peak_memory_mb": peak,
        "peak_memory_method": peak_method,
    }
    result["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    result["load_average"] = {"start": load_start, "end": _load_average()}  # 1-minute, other work included
    tables = render_tables(result, train, sampling)
    md = (f"# seqdiff bench\n\nMade by `{command}` on {result['date']} — device {device} "
          f"({result['device_name']}, {result['threads']} threads), {result['precision']}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}; preset {args.preset} ({shape.hidden_size} wide, "
          f"{shape.n_layers} layers, {shape.n_heads} heads; {GELU_NAMES[shape.activation]} in the seqdiff models), "
          f"vocabulary {shape.vocab_size}, sequence length "
          f"{shape.seq_len}, training batch {shape.batch_size}; {result['elapsed_s']:.0f} s. 1-minute load average "
          f"{result['load_average']['start']} at the start, {result['load_average']['end']} at the end, on "
          f"{result['cpu_count']} CPUs (other work on the machine lowers the absolute figures; the ratios come "
          "from interleaved rounds).\n\n" + _contention_note(result) +
          f"{tables}\n\n{explanation(result, train, sampling)}\n")
    atomic_write_text(out_dir / "bench.json", json.dumps(result, indent=2) + "\n")
    atomic_write_text(out_dir / "bench.md", md)
    print()
    print(tables)
    print(f"\nwritten: {out_dir / 'bench.json'}, {out_dir / 'bench.md'} ({result['elapsed_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
