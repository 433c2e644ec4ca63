# Sourced by the GPU scripts: packages the GPU image lacks (carried as wheels in .whl),
# the backend, NVLink multicast kept off, and $out / $gpus.
site=$PWD
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  site=$PWD:/tmp/site
fi
export PYTHONPATH=$site IRIS_BACKEND=cuda PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-out}; mkdir -p "$out"
gpus=$(nvidia-smi -L | wc -l)
# nvidia-smi lists every GPU; the ranks see only CUDA_VISIBLE_DEVICES.
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
# Result files are named after the card and count the run had, e.g. h100x2.
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]00' | tr 'H' 'h')
tag=${card:-gpu}x$gpus
