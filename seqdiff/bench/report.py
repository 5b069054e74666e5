"""The tables and the prose of bench.md, from bench.json's numbers (harness.py writes both)."""

from __future__ import annotations

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
    cfg = result["config"]
    names = train_models(activation, cfg.get("full_head", False), cfg.get("unfused", False),
                         cfg.get("full_last_block", False))
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
    lines += ["", f"{matmul_dtype(result)} matmul {result['config']['matmul_size']}²: "
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


def matmul_dtype(result: dict[str, Any]) -> str:
    """The precision of the reference matmul: the one the models train in."""
    return "bf16" if result.get("precision") == "bf16 autocast" else "float32"


def explanation(result: dict[str, Any], train: dict[str, Any], sampling: dict[str, Any]) -> str:
    """The measured figures of bench.md as bullet lines: numbers and targets met / not met, no interpretation
    (what the operator categories hold and why the cached sampler's saving does not depend on the weights is
    in docs/training.md, "Reading seqdiff bench")."""
    cfg = result["config"]
    mm = train["matmul"]["median"]
    r, rs, met = result["ratio_vs_hf"], result["ratio_vs_hf_same_activation"], result["train_ratio_target_met"]
    frac = result["matmul_fraction"]
    p = train["profiles"]["seqdiff_bidirectional"]
    total = sum(p["ms"].values())
    share = {k: v / total for k, v in p["ms"].items()}
    kernel = p["matmul_kernel_flops_per_s"] or 0.0
    word = {True: "met", False: "not met"}
    lines = [
        f"- **Training**, seqdiff / Hugging Face throughput (median of per-round ratios), target ≥ "
        f"{TRAIN_RATIO_TARGET:g}: bidirectional (MDLM loss vs BertForMaskedLM) {r['bidirectional']:.3f} "
        f"({word[met['bidirectional']]}), causal (AR loss vs GPT2LMHeadModel) {r['causal']:.3f} "
        f"({word[met['causal']]}); with the same activation on both sides: bidirectional "
        f"{rs['bidirectional']:.3f}, causal {rs['causal']:.3f}.",
        f"- **Matmul fraction**, model FLOPs (6 N + attention per token) over this device's "
        f"{matmul_dtype(result)} matmul rate "
        f"({mm / 1e9:.0f} GFLOP/s on {cfg['matmul_size']}² operands): bidirectional "
        f"{frac['seqdiff_bidirectional']:.0%}, causal {frac['seqdiff_causal']:.0%}. In the profiled bidirectional "
        f"step ({p['wall_ms']:.0f} ms) the matmul kernels run at {kernel / 1e9:.0f} GFLOP/s ({kernel / mm:.0%} of "
        "that rate); shares of the step: "
        + ", ".join(f"{c} {share[c]:.0%}" for c in sorted(CATEGORIES, key=lambda c: -share[c]) if share[c] >= 0.005)
        + ".",
        *ceiling_line(result),
        f"- **Sampling**, cached / uncached MDLM at steps = length = {cfg['seq_len']} (target ≥ "
        f"{CACHED_SPEEDUP_TARGET:g}×): "
        + ", ".join(f"{s:.2f}× at batch {b}" for b, s in result["cached_speedup"].items())
        + f" ({word[all(result['cached_speedup_target_met'].values())]}); expected saving in denoiser calls "
        f"{sampling['expected_speedup']:.2f}× (measured "
        f"{result['sample_denoiser_calls']['mdlm_cached'].get('1', float('nan')):.0f} calls at batch 1 against "
        f"{cfg['seq_len']}); at T = 4L the expected factor is "
        f"{expected_cached_speedup(4 * cfg['seq_len'], cfg['seq_len']):.1f}×.",
        f"- **Memory**, peak of building a model with its AdamW optimizer and two training steps: "
        f"{result['peak_memory_method']}.",
    ]
    head = result.get("ratio_head_at_masked_vs_full_head")
    if head:
        share = result["head_share"]["seqdiff_bidirectional"]
        lines.insert(1, f"- **Output head at the masked positions** (`method.head_at_masked`, on average "
                     f"{share:.0%} of them; model FLOPs count the head that often): MDLM tokens/s with it over "
                     f"MDLM with the head at every position, median of per-round ratios: {_ratio(head)}.")
    last_block = result.get("ratio_last_block_at_outputs_vs_full_last_block")
    if last_block:
        share = result["head_share"]["seqdiff_bidirectional"]
        lines.insert(1, f"- **Last block at the masked positions** (`DiT.last_block_at_outputs`: its output "
                     f"projection and MLP where the head runs, on average {share:.0%} of the positions; model FLOPs "
                     f"count them that often): MDLM tokens/s with it over MDLM with the whole last block at every "
                     f"position, median of per-round ratios: {_ratio(last_block)}.")
    fused = result.get("ratio_fused_loss_vs_unfused")
    if fused:
        lines.insert(1, "- **Fused head and loss** (`method.fused_loss`, no (N, V) logits): tokens/s of each seqdiff "
                     "model over the same model with the plain head and cross-entropy, median of per-round ratios: "
                     + ", ".join(f"{name.removeprefix('seqdiff_')} {_ratio(r)}" for name, r in fused.items())
                     + ("" if all(result.get("fused_loss", {}).get(n) for n in fused) else
                        " (at this vocabulary the defaults take the plain path too: method.fused_loss=null fuses "
                        "from 4,096 ids on)") + ".")
    return "\n".join(lines)


def ceiling_line(result: dict[str, Any]) -> list[str]:
    """The ceiling of each seqdiff / HF ratio on this device (`measure.ratio_ceiling`), as one bullet; none for
    bench.json files written before it was measured."""
    ceiling = result.get("ratio_vs_hf_ceiling")
    if not ceiling:
        return []
    return [f"- **Ceiling of the ratio on this device**: were all of a seqdiff model's FLOPs run at the "
            f"{matmul_dtype(result)} matmul rate above with nothing else taking time, it would train at most "
            + ", ".join(f"{ceiling[pair]:.2f}× {PAIRS[pair][1]} ({pair})" for pair in PAIRS if pair in ceiling)
            + " (median of rounds; the measured ratio over the matmul fraction). A ratio target above it needs "
            "fewer FLOPs per token, not a faster step."]


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
