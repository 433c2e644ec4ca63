#!/usr/bin/env bash
# One pass on a 2-GPU machine for the sharing and Triton-version work:
#   1. TESTS (default: the files that failed on one shared GPU) at 1, 2, 4 ranks sharing GPU 0;
#   2. what sharing costs: benchmarks/shared_gpu.py at 2 ranks on 2 GPUs, then on GPU 0 alone;
#   3. put/get bandwidth before and after a change, twice each, alternating: BEFORE names a
#      copy of the previous tree (iris/, iris_trace/, viewer_exports/, benchmarks/), carried;
#   4. the test suite at 1 and 2 ranks, one rank per GPU.
# Results land in $OUT (device tool) or ./out.  PARTS="shared cost putget suite" picks parts.
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
parts=${PARTS:-shared cost putget suite}
site=$PYTHONPATH
if [[ " $parts " == *" shared "* ]]; then
  CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=4 IRIS_TEST_WORLD_SIZES=1,2,4 timeout 200 python -m pytest -n 4 -q \
    -p no:cacheprovider ${TESTS:-tests/test_errors.py tests/test_codegen.py tests/test_stress.py} 2>&1 | tail -4
fi
if [[ " $parts " == *" cost "* ]]; then
  timeout 90 python -m iris.run -n 2 benchmarks/shared_gpu.py --out "$out/shared_gpu_2ranks_2gpus.json" 2>&1 | grep -v Warning
  CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=2 timeout 90 python -m iris.run -n 2 benchmarks/shared_gpu.py \
    --out "$out/shared_gpu_2ranks_1gpu.json" 2>&1 | grep -v Warning
fi
if [[ " $parts " == *" putget "* ]]; then
  for trial in 1 2; do
    (cd "${BEFORE:-.before}" && PYTHONPATH=$PWD:${site#*:} timeout 120 python -m iris.run -n 2 \
      benchmarks/put_get_bandwidth.py --out "$out/put_get_before_$trial.json" 2>&1 | grep -v Warning | tail -4)
    timeout 120 python -m iris.run -n 2 benchmarks/put_get_bandwidth.py --out "$out/put_get_after_$trial.json" \
      2>&1 | grep -v Warning | tail -4
  done
fi
if [[ " $parts " == *" suite "* ]]; then
  IRIS_TEST_WORLD_SIZES=1,2 SKIP_BENCH=1 bash "$(dirname "$0")/gpu_check.sh"
fi
