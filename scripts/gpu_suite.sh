#!/usr/bin/env bash
# On one CUDA GPU, in about 8 minutes: the issue-18 check as specified (scripts/gpu_check.sh: fsdp2, compile,
# bf16, accumulation, with a profiled last step), the same recipe with train.strategy=auto, the same with
# micro-batches of 32 rows (global 64), and `seqdiff bench` on the GPU against the Hugging Face models. Each part
# has its own time limit, so one that fails or hangs leaves the others. Results: reports/bench/gpu/ (spec) and its
# folders auto_accum/, auto_mb32/, bench_small/.
# Runs from the repository root without installing seqdiff (python3 -m ...), so a machine that has torch,
# lightning and transformers but no network can run it. An optional argument names a folder to copy results to.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
PY=${PYTHON:-python3}
COPY=${1:-}
part() {  # part NAME LIMIT_S COMMAND...: run one part under its limit and say how it ended
    local name=$1 limit=$2; shift 2
    echo "=== $name ($(date -u +%T), limit ${limit}s): $*"
    timeout "$limit" "$@"; echo "=== $name: exit $?"
}
START=$(mktemp); touch "$START"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null
part spec 200 $PY -m seqdiff.bench.gpu_check --steps 200 --skip-steps 40 --out reports/bench/gpu
part auto_accum 200 $PY -m seqdiff.bench.gpu_check --steps 200 --skip-steps 40 --strategy auto \
    --out reports/bench/gpu/auto_accum
part auto_mb32 160 $PY -m seqdiff.bench.gpu_check --steps 200 --skip-steps 40 --strategy auto --batch-size 64 \
    --micro-batch-size 32 --out reports/bench/gpu/auto_mb32
part bench 150 $PY -m seqdiff.cli bench --device cuda --preset small --seq-len 1024 --batch-size 16 --repeats 3 \
    --steps-per-repeat 10 --warmup 5 --sample-batches 8 --sample-repeats 1 --sample-budget-s 5 --matmul-size 8192 \
    --out reports/bench/gpu/bench_small
if [ -n "$COPY" ]; then  # only what this run wrote (a part that failed leaves the committed files alone)
    for d in "" auto_accum auto_mb32 bench_small; do
        mkdir -p "$COPY/${d:-spec}"
        find "reports/bench/gpu/$d" -maxdepth 1 -type f -newer "$START" \( -name '*.json' -o -name '*.md' \) \
            -exec cp {} "$COPY/${d:-spec}/" \;
    done
fi
rm -f "$START"
