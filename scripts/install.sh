#!/usr/bin/env bash
# Install Iris and its test tools into the current Python environment.
# Where torch is missing, take the CPU build of torch 2.13.0: an unpinned torch would pull
# several GB of CUDA wheels. Where torch is already there (GPU machines), keep it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[dev]"
