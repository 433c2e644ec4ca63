#!/usr/bin/env bash
# The cross-node path between real NVSHMEM PEs, on a machine with two GPUs or more (one rank
# per GPU, every rank a "node" of its own): tests/test_crossnode_path.py at one rank, the RMA,
# atomics and sync suites at two, then the put/get benchmark through mapped pointers and
# through NVSHMEM, one after the other. XN_SIZES and XN_PER_NODE change the suites' ranks and
# ranks per node (XN_SIZES=4 XN_PER_NODE=2: two nodes of two, peers reached both ways);
# SKIP_PUTGET=1 leaves the benchmark out.
#
#   OUT=out bash scripts/gpu_crossnode_pass.sh
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
OUT=$out
nvidia-smi -L
python -c "import importlib.metadata as m; print('nvshmem', m.version('nvidia-nvshmem-cu13'))" 2>/dev/null
# One rank with every op on the cross-node path (NVSHMEM to its own PE).
timeout "${PATH_TIMEOUT:-300}" python -m pytest -q -p no:cacheprovider -rfEs tests/test_crossnode_path.py \
  > "$OUT/crossnode_path.log" 2>&1
echo "cross-node path at one rank: rc $?"
grep -v "Warning\|warner" "$OUT/crossnode_path.log" | tail -4
IRIS_TEST_RANKS_PER_NODE=${XN_PER_NODE:-1} IRIS_TEST_WORLD_SIZES=${XN_SIZES:-2} IRIS_WAIT_TIMEOUT=60 timeout "${TEST_TIMEOUT:-300}" \
  python -m pytest -q -n "${PYTEST_WORKERS:-4}" -p no:randomly -rfEs ${TESTS:-tests/test_rma.py tests/test_atomics.py tests/test_sync.py} \
  > "$OUT/crossnode_tests.log" 2>&1
echo "cross-node tests at ${XN_SIZES:-2} ranks, ${XN_PER_NODE:-1} per node: rc $?"
grep -v "^\[gw\|Warning\|warner" "$OUT/crossnode_tests.log" | tail -25
[ -n "${SKIP_PUTGET:-}" ] && exit 0
for path in mapped nvshmem; do
  per_node=$([ "$path" = nvshmem ] && echo 1 || echo "")
  IRIS_RANKS_PER_NODE=$per_node timeout 150 python -m iris.run -n 2 benchmarks/put_get_bandwidth.py \
    --max-mib "${MAX_MIB:-64}" --out "$OUT/put_get_${path}.json" > "$OUT/put_get_${path}.log" 2>&1
  echo "put/get through $path: rc $?"
  tail -12 "$OUT/put_get_${path}.log"
done
