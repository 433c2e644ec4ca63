#!/usr/bin/env bash
# Multi-rank checks on ONE GPU, every rank sharing it (IRIS_RANKS_PER_GPU): the README's
# quick start at 2 ranks, what sharing costs (benchmarks/shared_gpu.py at 2 and 4 ranks),
# then the whole test suite at 1, 2 and 4 ranks. Results land in $OUT (device tool) or ./out.
#   PARTS="quickstart cost tests"   to run some parts only
#   PYTEST_WORKERS=6 TEST_TIMEOUT=420 TESTS=tests TEST_FILTER=...   passed to gpu_check.sh
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} IRIS_RANKS_PER_GPU=4
parts=${PARTS:-quickstart cost tests}
if [[ " $parts " == *" quickstart "* ]]; then
  started=$(date +%s)
  timeout 150 python -m iris.run -n 2 examples/13_traced_gemm_all_scatter.py "$out/quickstart" 2>&1 \
    | grep -v -e Warning -e "^\[rank" | tail -25
  echo "quick start: exit ${PIPESTATUS[0]}, $(( $(date +%s) - started )) s; files: $(ls "$out/quickstart" | tr '\n' ' ')"
  rm -f "$out/quickstart/trace.json"  # the Perfetto file and report come back; the JSON twin is large
fi
if [[ " $parts " == *" cost "* ]]; then
  for n in 2 4; do
    timeout 90 python -m iris.run -n "$n" benchmarks/shared_gpu.py --out "$out/shared_gpu_${n}ranks_1gpu.json" 2>&1 \
      | grep -v -e Warning -e "^\[rank"
  done
fi
if [[ " $parts " == *" tests "* ]]; then
  IRIS_TEST_WORLD_SIZES=${IRIS_TEST_WORLD_SIZES:-1,2,4} SKIP_BENCH=1 bash "$(dirname "$0")/gpu_check.sh"
fi
