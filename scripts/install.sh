#!/usr/bin/env bash
# Install Iris and its test tools into the current Python environment, at tested versions.
#
# Where torch is missing, take the CPU build of torch 2.13.0: an unpinned torch would pull
# several GB of CUDA wheels. Where torch is already there (GPU machines: torch 2.11 with
# Triton 3.6), keep it and the Triton it came with. Otherwise Triton is pinned to
# IRIS_TRITON_VERSION (default 3.6.0, what the GPU machines run; 3.9.0, the newest, is
# tested too): pip would otherwise take whatever is newest on the day.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0"
fi
triton=()
if [ -n "${IRIS_TRITON_VERSION:-}" ] || ! python -c "import triton" 2>/dev/null; then
  triton=("triton==${IRIS_TRITON_VERSION:-3.6.0}")
fi
python -m pip install -q -e ".[dev]" "${triton[@]}"
