"""Dense bf16 peaks of GPUs and model FLOP utilization (MFU) against them: shared by the training run's throughput
log (seqdiff.training.throughput) and the GPU check (seqdiff.bench.gpu_check). No Lightning import, so the check's
command line starts without it."""

from __future__ import annotations

PEAK_BF16_TFLOPS: list[tuple[tuple[str, ...], float]] = [
    (("H100", "PCIE"), 756.0),
    (("H100",), 989.4),  # SXM / HBM3
    (("H200",), 989.4),
    (("GH200",), 989.4),
    (("B200",), 2250.0),
    (("A100",), 312.0),
    (("L40S",), 362.0),
    (("L4",), 121.0),
    (("A10",), 125.0),
]
"""Dense bf16 tensor-core peaks (vendor data sheets, no sparsity), matched in order against the device name
(upper case, every word of a key must occur)."""


def peak_bf16_flops(device_name: str) -> float | None:
    """FLOP/s of the device's dense bf16 peak, from its name; None for a device not in PEAK_BF16_TFLOPS."""
    name = device_name.upper()
    for words, tflops in PEAK_BF16_TFLOPS:
        if all(w in name for w in words):
            return tflops * 1e12
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None) -> float | None:
    """Model FLOP utilization: achieved model FLOP/s over the peak."""
    return None if not peak_flops else flops_per_token * tokens_per_s / peak_flops


__all__ = ["PEAK_BF16_TFLOPS", "mfu", "peak_bf16_flops"]
