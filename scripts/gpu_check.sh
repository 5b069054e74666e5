#!/usr/bin/env bash
# On a CUDA machine: train MDLM and AR for a few hundred steps at the `small` preset and 1,024 tokens with
# train.compile, bf16, gradient accumulation and fsdp2 on one device; write tokens/s, MFU (against the device's
# bf16 peak) and peak memory to reports/bench/gpu/ (see seqdiff/bench/gpu_check.py). Extra arguments pass through,
# e.g. scripts/gpu_check.sh --steps 200 --peak-tflops 989.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python -m seqdiff.bench.gpu_check "$@"
