#!/usr/bin/env bash
# The whole GPU pass in one command: test suite (examples included), put/get, tracing and fused-ops benchmarks.
#   bash scripts/gpu_check.sh        results land in $OUT (device tool) or ./out
#   SKIP_TESTS=1 / SKIP_BENCH=1      to leave a part out
#   TESTS="tests/test_ccl.py"          to run some test files only
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
sizes=1,2; [ "$gpus" -ge 4 ] && sizes=1,2,4
sizes=${IRIS_TEST_WORLD_SIZES:-$sizes}
nvidia-smi -L
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  IRIS_TEST_WORLD_SIZES=$sizes timeout "${TEST_TIMEOUT:-420}" python -m pytest ${TESTS:-tests} -q -p no:cacheprovider \
    --timeout=300 -rfE 2>&1 | tee "$out/pytest_cuda_${gpus}gpu.log" | grep -v Warning | tail -25
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  for bench in ${BENCHES:-put_get_bandwidth tracing_overhead collectives fused_ops}; do
    timeout "${BENCH_TIMEOUT:-300}" python -m iris.run -n "$gpus" "benchmarks/$bench.py" \
      --out "$out/${bench}_h200x${gpus}.json" 2>&1 | grep -v -e Warning -e "^\[rank" | tee "$out/${bench}_h200x${gpus}.log"
  done
fi
