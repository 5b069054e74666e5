"""The tables and the prose of bench.md, from bench.json's numbers (harness.py writes both)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from seqdiff.bench.measure import QUIET_OTHERS
from seqdiff.bench.models import (
    CACHED_SPEEDUP_TARGET,
    PAIRS,
    SAMPLERS,
    TRAIN_RATIO_TARGET,
    expected_cached_speedup,
    train_models,
)
from seqdiff.bench.profile import CATEGORIES


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


def contention_note(result: dict[str, Any]) -> str:
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
