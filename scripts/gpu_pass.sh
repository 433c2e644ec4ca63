#!/usr/bin/env bash
# The GPU pass: tests, benchmarks and checks of Iris on any machine with NVIDIA GPUs.
#
#   bash scripts/gpu_pass.sh                       # the suite, then the benchmarks of record
#   PARTS="suite" SUITE_SIZES=1,2 bash scripts/gpu_pass.sh
#   PARTS="fused tracing" NRANKS=2 bash scripts/gpu_pass.sh
#
# Results and logs go to $OUT (default ./out); benchmark files are named after the card and
# the ranks that ran (fused_ops_h200x4.json). Wheels in .whl/ (packages the machine lacks, such
# as perfetto) are installed into /tmp/site first. NVLink multicast stays off. PARTS (default
# "suite bench") picks, in this order:
#   suite      the test suite with IRIS_BACKEND=cuda at SUITE_SIZES ranks (default 1,2, and 4 on
#              4+ GPUs), PYTEST_WORKERS (12) processes; TESTS, TEST_FILTER (-k), TEST_TIMEOUT (420).
#              Sizes above the GPU count run with ranks sharing GPUs (IRIS_RANKS_PER_GPU).
#   check      CHECK_TESTS (tests/test_ccl.py; -k CHECK_FILTER) at CHECK_SIZES (NRANKS) ranks.
#   shared     TESTS at SHARED_SIZES (1,2,4) ranks, all sharing GPU 0.
#   smoke      every example at NRANKS ranks and the offline PTX check.
#   quickstart the README's quick start at 2 ranks, one per GPU; picture and report kept.
#   trust      upstream's first example (its own process group) at 2 ranks, NCCL one per GPU (gloo,
#              sharing GPU 0, on one GPU), then scripts/context_rounds.py: ROUNDS (6) contexts of
#              HEAP_GIB (8) GiB per rank dropped, then closed.
#   bench      BENCHES (put_get_bandwidth tracing_overhead collectives fused_ops) at NRANKS, with
#              BENCH_ARGS (each result file holds the command that made it); refused where ranks
#              would share GPUs.
#   putget     put/get bandwidth, twice, alternating with BEFORE (a copy of an earlier tree) if set.
#   tracing    benchmarks/tracing_overhead.py (TRACING_ARGS, default "--breakdown --iters 100
#              --trials 12"), for BEFORE too, or for each tree of BUILDS (copies under .var/).
#   fused      benchmarks/fused_ops.py --iters 50 FUSED_ARGS into fused_ops_<tag>FUSED_NAME.json.
#   profile    scripts/profile_op.py PROFILE_ARGS: each call's kernels and copies per stream.
#   cost       what sharing a GPU costs: benchmarks/shared_gpu.py at 2 ranks on 2 GPUs and on GPU 0.
#   crossnode  across "nodes": tests/test_crossnode_path.py at one rank; the collective, fused-op
#              and tile-collective suites (CROSSNODE_TESTS) at XN_SIZES (2) ranks, XN_PER_NODE (1)
#              per node; put/get through mapped pointers and through NVSHMEM.
#   topology   scripts/show_topology.py at NRANKS (one node, then nodes of two) and its tests.
#   upstream   upstream Iris's own tests, then its application examples and benchmark files, through
#              scripts/upstream_tests.py on UPSTREAM (default .upstream/: a copy of upstream's tests/,
#              examples/ and benchmark/, brought along where the machine cannot fetch) at UPSTREAM_RANKS (2, and
#              4 on 4+ GPUs; one GPU per rank, as upstream's runner takes), UPSTREAM_ARGS added.
#              UPSTREAM_KINDS (tests examples benchmarks) picks; at 2 ranks on 2 x H200 the tests took
#              about 11 minutes at 8-10 files at once, the examples 6 and the benchmark files 5, so a
#              machine that limits each command splits them (UPSTREAM_ARGS="--dirs unittests").
#              `python benchmarks/records.py --keep` makes their --results files into files of record.
#   tune       the sweeps behind the defaults (TUNE: small large pushed fused_shared fused_split
#              fused_copies), into tune_<name>_<tag>.json.
set -u
cd "$(dirname "$0")/.."
site=$PWD
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  site=$PWD:/tmp/site
fi
export PYTHONPATH=$site IRIS_BACKEND=cuda PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-out}; mkdir -p "$out"; out=$(cd "$out" && pwd)
gpus=$(nvidia-smi -L | wc -l)
# nvidia-smi lists every GPU; the ranks see only CUDA_VISIBLE_DEVICES.
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && gpus=$(echo "$CUDA_VISIBLE_DEVICES" | tr ',' '\n' | grep -c .)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i 'h[0-9]00' | tr 'H' 'h')
ranks=${NRANKS:-$(( gpus < 4 ? gpus : 4 ))}
tag=${card:-gpu}x$ranks  # results are named after the ranks that ran, one per GPU
parts=" ${PARTS:-suite bench} "
quiet() { grep -v -e Warning -e warner -e "^\[rank" -e "^\[gw"; }
has() { [[ "$parts" == *" $1 "* ]]; }

nvidia-smi -L
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

run_suite() {  # sizes, workers, log name, files...
  local sizes=$1 workers=$2 log=$3; shift 3
  local largest; largest=$(echo "$sizes" | tr ',' '\n' | sort -n | tail -1)
  local share=()
  if [ "$largest" -gt "$gpus" ]; then
    share=(env IRIS_RANKS_PER_GPU=$(( (largest + gpus - 1) / gpus )))
    echo "$largest ranks on $gpus GPU(s): ranks share GPUs (${share[1]})"
  fi
  local started; started=$(date +%s)
  # shellcheck disable=SC2086 - TEST_ARGS is a list
  IRIS_TEST_WORLD_SIZES=$sizes timeout "${TEST_TIMEOUT:-420}" "${share[@]}" python -m pytest -n "$workers" -q \
    -p no:cacheprovider --timeout=300 -rfEs ${TEST_ARGS:-} ${TEST_FILTER:+-k "$TEST_FILTER"} "$@" 2>&1 \
    | tee "$out/$log.log" | quiet | tail -30
  grep -h -E "(FAILED|ERROR) " "$out/$log.log" | sort -u | tail -30
  echo "$log: $(( $(date +%s) - started )) s"
}

if has suite; then
  sizes=1,2; [ "$gpus" -ge 4 ] && sizes=1,2,4
  # shellcheck disable=SC2086 - TESTS is a list of files
  run_suite "${SUITE_SIZES:-$sizes}" "${PYTEST_WORKERS:-12}" "suite_${card:-gpu}x${gpus}" ${TESTS:-tests}
fi
if has check; then
  # shellcheck disable=SC2086 - CHECK_TESTS is a list of files
  TEST_FILTER=${CHECK_FILTER:-} run_suite "${CHECK_SIZES:-$ranks}" "${CHECK_WORKERS:-4}" check ${CHECK_TESTS:-tests/test_ccl.py}
fi
if has shared; then
  # shellcheck disable=SC2086 - TESTS is a list of files
  (export CUDA_VISIBLE_DEVICES=0; gpus=1; run_suite "${SHARED_SIZES:-1,2,4}" 4 shared \
    ${TESTS:-tests/test_errors.py tests/test_codegen.py tests/test_stress.py})
fi
if has smoke; then
  timeout 120 python tests/codegen/inspect_ptx.py | tail -5
  failed=0
  for example in examples/[0-9]*.py; do
    where=()  # the examples that write traces take their directory (06 takes a round count)
    grep -q '"iris_traces"' "$example" && where=("$out/example_traces")
    timeout 150 python -m iris.run -n "$ranks" "$example" "${where[@]}" 2>&1 | quiet | tail -2
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "FAILED $example"; failed=$((failed + 1)); }
  done
  echo "examples failed: $failed"
fi
if has quickstart; then
  started=$(date +%s)
  timeout 150 python -m iris.run -n 2 examples/13_traced_gemm_all_scatter.py "$out/quickstart_${card:-gpu}x2" 2>&1 \
    | quiet | tail -25
  echo "quick start: exit ${PIPESTATUS[0]}, $(( $(date +%s) - started )) s"
  rm -f "$out/quickstart_${card:-gpu}x2/trace.json"  # the Perfetto file and report come back; the JSON twin is large
fi
if has trust; then
  share=()
  [ "$gpus" -lt 2 ] && share=(env CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=2)
  timeout 180 "${share[@]}" python tests/upstream_first_example.py 2 29517 2>&1 | quiet | tail -5
  echo "upstream first example: exit ${PIPESTATUS[0]}"
  for how in "" --close; do
    # shellcheck disable=SC2086 - how is one flag or none
    timeout 240 "${share[@]}" python -m iris.run -n 2 scripts/context_rounds.py --rounds "${ROUNDS:-6}" \
      --heap-gib "${HEAP_GIB:-8}" $how 2>&1 | quiet | tail -16
    echo "context rounds ${how:-dropped}: exit ${PIPESTATUS[0]}"
  done
fi
if has bench; then
  if [ "$ranks" -gt "$gpus" ]; then
    echo "bench: $ranks ranks on $gpus GPU(s) would share them; timings need one rank per GPU"
  else
    for bench in ${BENCHES:-put_get_bandwidth tracing_overhead collectives fused_ops}; do
      # shellcheck disable=SC2086 - BENCH_ARGS is a list of arguments
      timeout "${BENCH_TIMEOUT:-300}" python -m iris.run -n "$ranks" "benchmarks/$bench.py" ${BENCH_ARGS:-} \
        --out "$out/${bench}_${tag}.json" 2>&1 | quiet | tee "$out/${bench}_${tag}.log" | tail -30
    done
  fi
fi
if has putget; then
  for trial in 1 2; do
    if [ -n "${BEFORE:-}" ]; then
      (cd "$BEFORE" && PYTHONPATH=$PWD:${site#*:} timeout 120 python -m iris.run -n 2 \
        benchmarks/put_get_bandwidth.py --out "$out/put_get_before_$trial.json" 2>&1 | quiet | tail -4)
    fi
    timeout 120 python -m iris.run -n 2 benchmarks/put_get_bandwidth.py --out "$out/put_get_after_$trial.json" \
      2>&1 | quiet | tail -4
  done
fi
if has tracing; then
  # shellcheck disable=SC2086 - BUILDS and TRACING_ARGS are lists
  for tree in ${BUILDS:-${BEFORE:+"$BEFORE"} .}; do
    name=after
    [ "$tree" = "${BEFORE:-}" ] && name=before
    [ -n "${BUILDS:-}" ] && name=$(basename "$tree")
    (cd "$tree" && PYTHONPATH=$PWD:${site#*:} timeout 150 python -m iris.run -n "$ranks" benchmarks/tracing_overhead.py \
      ${TRACING_ARGS:---breakdown --iters 100 --trials 12} --out "$out/tracing_overhead_${tag}_$name.json" 2>&1 \
      | quiet | tail -20)
  done
fi
if has fused; then
  # shellcheck disable=SC2086 - FUSED_ARGS is a list of arguments
  timeout "${FUSED_TIMEOUT:-240}" python -m iris.run -n "$ranks" benchmarks/fused_ops.py --iters 50 ${FUSED_ARGS:-} \
    --out "$out/fused_ops_${tag}${FUSED_NAME:-}.json" 2>&1 | quiet | tail -60
fi
if has profile; then
  # shellcheck disable=SC2086 - PROFILE_ARGS is a list of arguments
  timeout 180 python -m iris.run -n "$ranks" scripts/profile_op.py ${PROFILE_ARGS:-} --out "$out/profile_${tag}.json" \
    2>&1 | quiet | tail -150
fi
if has cost; then
  timeout 90 python -m iris.run -n 2 benchmarks/shared_gpu.py --out "$out/shared_gpu_2ranks_2gpus.json" 2>&1 | quiet
  CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=2 timeout 90 python -m iris.run -n 2 benchmarks/shared_gpu.py \
    --out "$out/shared_gpu_2ranks_1gpu.json" 2>&1 | quiet
fi
if has crossnode; then
  timeout 300 python -m pytest -q -p no:cacheprovider -rfEs tests/test_crossnode_path.py 2>&1 | quiet | tail -4
  # Every cross-node kernel links NVSHMEM's bitcode as it compiles (seconds each): many
  # workers, and a log that names each result as it comes. At 4 ranks keep to about 8
  # workers: 16 (64 rank processes) got ranks killed by the host on 4 x H200.
  # shellcheck disable=SC2086 - CROSSNODE_TESTS is a list of files
  IRIS_TEST_RANKS_PER_NODE=${XN_PER_NODE:-1} IRIS_TEST_WORLD_SIZES=${XN_SIZES:-2} IRIS_WAIT_TIMEOUT=60 \
    timeout -s INT "${CROSSNODE_TIMEOUT:-480}" python -m pytest -v -n "${CROSSNODE_WORKERS:-8}" -p no:cacheprovider \
    --timeout 300 -rfEs ${CROSSNODE_TESTS:-tests/test_ccl.py tests/test_ops.py tests/test_tile_collectives.py} \
    > "$out/crossnode.log" 2>&1
  grep -c PASSED "$out/crossnode.log" | sed 's/^/crossnode passed: /'
  grep -E "(FAILED|ERROR) tests" "$out/crossnode.log" | sort -u | tail -20
  for path in mapped nvshmem; do
    per_node=$([ "$path" = nvshmem ] && echo 1 || echo "")
    IRIS_RANKS_PER_NODE=$per_node timeout 150 python -m iris.run -n 2 benchmarks/put_get_bandwidth.py \
      --max-mib "${MAX_MIB:-64}" --out "$out/put_get_${path}.json" 2>&1 | quiet | tail -12
  done
fi
if has topology; then
  timeout 90 python -m iris.run -n "$ranks" scripts/show_topology.py 2>&1 | quiet | tail -20
  IRIS_RANKS_PER_NODE=2 timeout 120 python -m iris.run -n "$ranks" scripts/show_topology.py 2>&1 | quiet | tail -12
  IRIS_TEST_WORLD_SIZES=2,$ranks timeout 150 python -m pytest -q -n 4 -p no:cacheprovider -rfEs tests/test_topology.py \
    2>&1 | tail -6
fi
if has upstream; then
  upstream=${UPSTREAM:-.upstream}
  upstream_ranks=${UPSTREAM_RANKS:-$([ "$gpus" -ge 4 ] && echo "2 4" || echo 2)}
  # shellcheck disable=SC2086 - the rank counts and arguments are lists
  for kind in ${UPSTREAM_KINDS:-tests examples benchmarks}; do
    flag=$([ $kind != tests ] && echo --$kind)
    timeout "${UPSTREAM_TIMEOUT:-3000}" python scripts/upstream_tests.py "$upstream" --ranks $upstream_ranks $flag \
      ${UPSTREAM_ARGS:-} --results "$out/upstream_${kind}_${card:-gpu}x${gpus}.json" 2>&1 | quiet | tail -40
  done
fi
if has tune; then
  for sweep in ${TUNE:-small large pushed}; do
    case $sweep in
      small) bench=collectives args="--max-mib 1 --iters 100 --trials 3 --protocols" ;;
      large) bench=collectives args="--min-kib 16384 --max-mib 256 --iters 30 --trials 1 --no-graphs
               --configs comm_sms=32;comm_sms=64;comm_sms=96;num_warps=16;num_warps=4;block_size=8192;block_size=2048" ;;
      pushed) bench=collectives args="--min-kib 1024 --max-mib 256 --iters 30 --trials 3 --no-graphs
               --collectives all_reduce,reduce_scatter --configs protocol=pushed;protocol=pushed,num_warps=16;protocol=direct" ;;
      fused_shared) bench=fused_ops args="--ops gemm_all_scatter --iters 50 --no-styles --sweep
               variant=producer_consumer;variant=producer_consumer,consumer_warps=2;variant=producer_consumer,consumer_warps=4" ;;
      fused_split) bench=fused_ops args="--ops gemm_all_scatter --iters 50 --no-styles
               --sweep split_last_wave=1;split_last_wave=1,num_stages=4;num_stages=4" ;;
      fused_copies) bench=fused_ops args="--ops gemm_all_scatter matmul_reduce_scatter all_gather_matmul --iters 50
               --no-styles --sweep variant=copy_engine,copy_chunks=2;variant=copy_engine,copy_chunks=8" ;;
      *) echo "tune: no sweep $sweep"; continue ;;
    esac
    # shellcheck disable=SC2086 - args is a list of arguments
    timeout "${BENCH_TIMEOUT:-240}" python -m iris.run -n "$ranks" "benchmarks/$bench.py" $args \
      --out "$out/tune_${sweep}_${tag}.json" 2>&1 | quiet | tail -60
  done
fi
