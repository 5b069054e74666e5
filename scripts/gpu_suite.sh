#!/usr/bin/env bash
# On one CUDA GPU, in about 9 minutes: the issue-18 check as specified (scripts/gpu_check.sh: fsdp2, compile,
# bf16, accumulation, with a profiled last step), the same recipe with train.strategy=auto, the same with
# micro-batches of 32 rows (global 64), `seqdiff bench` on the GPU against the Hugging Face models, and the same
# bench at GPT-2's vocabulary with the fused head and loss beside the plain one (method.fused_loss). Each part
# has its own time limit, so one that fails or hangs leaves the others. Results: reports/bench/gpu/ (spec) and its
# folders auto_accum/, auto_mb32/, bench_small/, bench_gpt2/.
# Runs from the repository root without installing seqdiff (python3 -m ...), so a machine that has torch,
# lightning and transformers but no network can run it. An optional argument names a folder to copy results to;
# each part's files are copied as soon as it ends, so a suite cut off by an outer limit keeps what finished.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
COPY=${1:-}
part() {  # part NAME DIR LIMIT_S COMMAND...: run one part under its limit, say how it ended, copy what it wrote
    local name=$1 dir=$2 limit=$3; shift 3
    echo "=== $name ($(date -u +%T), limit ${limit}s): $*"
    timeout "$limit" "$@"; echo "=== $name: exit $?"
    if [ -n "$COPY" ]; then  # only what this run wrote (a part that failed leaves the committed files alone)
        mkdir -p "$COPY/$name"
        find "reports/bench/gpu/$dir" -maxdepth 1 -type f -newer "$START" \( -name '*.json' -o -name '*.md' \) \
            -exec cp {} "$COPY/$name/" \;
    fi
}
START=$(mktemp); touch "$START"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
part spec "" 200 $PY -m seqdiff.bench.gpu_check --steps 200 --skip-steps 40 --out reports/bench/gpu
part auto_accum auto_accum 200 $PY -m seqdiff.bench.gpu_check --steps 200 --skip-steps 40 --strategy auto \
    --out reports/bench/gpu/auto_accum
part auto_mb32 auto_mb32 130 $PY -m seqdiff.bench.gpu_check --steps 200 --skip-steps 40 --strategy auto \
    --batch-size 64 --micro-batch-size 32 --out reports/bench/gpu/auto_mb32
part bench_small bench_small 120 $PY -m seqdiff.cli bench --device cuda --preset small --seq-len 1024 \
    --batch-size 16 --repeats 3 --steps-per-repeat 10 --warmup 5 --sample-batches 8 --sample-repeats 1 \
    --sample-budget-s 5 --matmul-size 8192 --out reports/bench/gpu/bench_small
part bench_gpt2 bench_gpt2 100 $PY -m seqdiff.cli bench --device cuda --preset small --seq-len 1024 \
    --batch-size 16 --vocab-size 50261 --unfused --repeats 3 --steps-per-repeat 5 --warmup 3 --sample-batches 1 \
    --sample-repeats 1 --sample-budget-s 2 --matmul-size 8192 --out reports/bench/gpu/bench_gpt2
rm -f "$START"
