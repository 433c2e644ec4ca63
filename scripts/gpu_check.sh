#!/usr/bin/env bash
# The whole GPU pass in one command: test suite, examples (inside the suite) and the put/get benchmark.
#   bash scripts/gpu_check.sh            (on a machine with 2 or 4 GPUs; results land in $OUT or ./out)
set -u
export PYTHONPATH=$PWD IRIS_BACKEND=cuda PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-out}; mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
sizes=1,2; [ "$gpus" -ge 4 ] && sizes=1,2,4
nvidia-smi -L
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
IRIS_TEST_WORLD_SIZES=$sizes timeout "${TEST_TIMEOUT:-420}" python -m pytest tests -q -p no:cacheprovider \
  --timeout=300 -rfE 2>&1 | tee "$out/pytest_cuda_${gpus}gpu.log" | tail -40
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  timeout "${BENCH_TIMEOUT:-300}" python -m iris.run -n "$gpus" benchmarks/put_get_bandwidth.py \
    --out "$out/put_get_h200x${gpus}.json" 2>&1 | tee "$out/put_get_h200x${gpus}.log" | grep -v Warning
fi
