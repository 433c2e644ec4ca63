#!/usr/bin/env bash
# The whole GPU pass in one command: test suite (examples included), put/get, tracing and fused-ops benchmarks.
#   bash scripts/gpu_check.sh        results land in $OUT (device tool) or ./out
#   SKIP_TESTS=1 / SKIP_BENCH=1      to leave a part out
#   TESTS="tests/test_ccl.py"          to run some test files only
#   IRIS_TEST_WORLD_SIZES=1,2,4      world sizes; on fewer GPUs than ranks the ranks share GPUs
#                                    (IRIS_RANKS_PER_GPU is set) and the benchmarks are skipped
#   PYTEST_WORKERS=4                 test processes (pytest-xdist), each with its own rank pools
#   TEST_ARGS="-v"                    more pytest arguments (-v names each result as it comes)
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
sizes=1,2; [ "$gpus" -ge 4 ] && sizes=1,2,4
sizes=${IRIS_TEST_WORLD_SIZES:-$sizes}
largest=$(echo "$sizes" | tr ',' '\n' | sort -n | tail -1)
if [ "$largest" -gt "$gpus" ]; then
  export IRIS_RANKS_PER_GPU=$(( (largest + gpus - 1) / gpus ))
  echo "gpu_check: $largest ranks on $gpus GPU(s): IRIS_RANKS_PER_GPU=$IRIS_RANKS_PER_GPU (benchmarks skipped)"
  SKIP_BENCH=1
fi
nvidia-smi -L
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  started=$(date +%s)
  IRIS_TEST_WORLD_SIZES=$sizes timeout "${TEST_TIMEOUT:-420}" python -m pytest -n "${PYTEST_WORKERS:-1}" ${TESTS:-tests} -q -p no:cacheprovider \
    --timeout=300 -rfEs ${TEST_ARGS:-} ${TEST_FILTER:+-k "$TEST_FILTER"} 2>&1 \
    | tee "$out/pytest_cuda_${gpus}gpu_${sizes//,/-}.log" | grep -v -e Warning -e "PASSED" -e "^\[gw" | tail -40
  grep -h -E "(FAILED|ERROR) " "$out/pytest_cuda_${gpus}gpu_${sizes//,/-}.log" | sort -u | tail -30
  echo "gpu_check: tests took $(( $(date +%s) - started )) s"
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  for bench in ${BENCHES:-put_get_bandwidth tracing_overhead collectives fused_ops}; do
    timeout "${BENCH_TIMEOUT:-300}" python -m iris.run -n "$gpus" "benchmarks/$bench.py" \
      --out "$out/${bench}_${tag}.json" 2>&1 | grep -v -e Warning -e "^\[rank" | tee "$out/${bench}_${tag}.log"
  done
fi
