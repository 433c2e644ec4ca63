#!/usr/bin/env bash
# One pass over the examples and the PTX check on a GPU machine.
set -u
export PYTHONPATH=$PWD IRIS_BACKEND=cuda PYTHONUNBUFFERED=1
nvidia-smi -L
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"
timeout 120 python tests/codegen/inspect_ptx.py
n=${1:-2}
fails=0
for example in examples/0*.py; do
  if ! timeout 120 python -m iris.run -n "$n" "$example"; then echo "FAILED $example"; fails=$((fails+1)); fi
done
echo "examples failed: $fails"
