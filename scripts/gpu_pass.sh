#!/usr/bin/env bash
# One pass on a multi-GPU machine at NRANKS ranks (default: one per GPU, at most 4);
# PARTS picks the parts (default "tracing fused crossnode"):
#   shared     TESTS (default: the files that failed on one shared GPU) at SHARED_SIZES (1,2,4) ranks sharing GPU 0;
#   cost       what sharing costs: benchmarks/shared_gpu.py at 2 ranks on 2 GPUs, then on GPU 0 alone;
#   putget     put/get bandwidth before and after a change, twice each, alternating: BEFORE names a
#              copy of the previous tree (iris/, iris_trace/, benchmarks/), carried;
#   tracing    benchmarks/tracing_overhead.py --breakdown at NRANKS, before (if BEFORE) and after;
#              BUILDS (copies of the tree like BEFORE, e.g. ".var/base .var/idea", carried) times each
#              of them instead, into tracing_overhead_<ranks>_<folder>.json; TRACING_ARGS replaces
#              "--breakdown --iters 100 --trials 12" (e.g. "--iters 50 --trials 6 --op-shapes 4096,8192,8192");
#   fused      benchmarks/fused_ops.py at NRANKS, every op, or FUSED_ARGS
#              (e.g. --ops and --sweep) into fused_ops_${tag}${FUSED_NAME};
#   profile    scripts/profile_op.py PROFILE_ARGS at NRANKS: each call's kernels and copies per stream;
#   crossnode  the collectives, fused ops and tile collectives across "nodes" at XN_SIZES (2) ranks,
#              XN_PER_NODE (1) per node;
#   suite      the test suite at SUITE_SIZES (default 1,2) ranks, one rank per GPU, PYTEST_WORKERS (12) processes;
#   check      CHECK_TESTS (with -k CHECK_FILTER if set) at CHECK_SIZES ranks (default NRANKS), one rank per GPU;
#   quickstart the README's quick start (example 13) at 2 ranks, one per GPU; picture and report kept;
#   topology   scripts/show_topology.py at NRANKS (one node, then nodes of two ranks) and tests/test_topology.py;
#   trust      upstream's first example (spawn + its own process group) at 2 ranks, one per GPU over NCCL
#              (sharing GPU 0 over gloo on a one-GPU machine), and scripts/context_rounds.py: ROUNDS (6)
#              contexts of HEAP_GIB (8) GiB per rank created and dropped, then closed, at 2 ranks.
# Results land in $OUT (device tool) or ./out.
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
parts=${PARTS:-tracing fused crossnode}
ranks=${NRANKS:-$(( gpus < 4 ? gpus : 4 ))}
rtag=${card:-gpu}x$ranks  # result files are named after the ranks that ran, one per GPU
site=$PYTHONPATH
if [[ " $parts " == *" shared "* ]]; then
  CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=4 IRIS_TEST_WORLD_SIZES=${SHARED_SIZES:-1,2,4} timeout "${SHARED_TIMEOUT:-200}" \
    python -m pytest -n 4 -q -p no:cacheprovider -rfE \
    ${TESTS:-tests/test_errors.py tests/test_codegen.py tests/test_stress.py} 2>&1 | tail -12
fi
if [[ " $parts " == *" trust "* ]]; then
  share=()
  [ "$gpus" -lt 2 ] && share=(env CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=2)
  timeout 180 "${share[@]}" python tests/upstream_first_example.py 2 29517 2>&1 | grep -v Warning | tail -5
  echo "upstream first example: exit ${PIPESTATUS[0]}"
  for how in "" --close; do
    timeout 240 "${share[@]}" python -m iris.run -n 2 scripts/context_rounds.py --rounds "${ROUNDS:-6}" \
      --heap-gib "${HEAP_GIB:-8}" $how 2>&1 | grep -v Warning | tail -16
    echo "context rounds ${how:-dropped}: exit ${PIPESTATUS[0]}"
  done
fi
if [[ " $parts " == *" check "* ]]; then
  IRIS_TEST_WORLD_SIZES=${CHECK_SIZES:-$ranks} timeout "${CHECK_TIMEOUT:-240}" python -m pytest -n "${CHECK_WORKERS:-4}" -q \
    -p no:cacheprovider --timeout 200 -rfEs ${CHECK_FILTER:+-k "$CHECK_FILTER"} ${CHECK_TESTS:-tests/test_ccl.py} 2>&1 | tail -15
fi
if [[ " $parts " == *" quickstart "* ]]; then
  started=$(date +%s)
  timeout 150 python -m iris.run -n 2 examples/13_traced_gemm_all_scatter.py "$out/quickstart_${tag}" 2>&1 \
    | grep -v -e Warning -e "^\[rank" | tail -25
  echo "quick start: exit ${PIPESTATUS[0]}, $(( $(date +%s) - started )) s; files: $(ls "$out/quickstart_${tag}" | tr '\n' ' ')"
  rm -f "$out/quickstart_${tag}/trace.json"  # the Perfetto file and report come back; the JSON twin is large
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
if [[ " $parts " == *" tracing "* ]]; then
  # shellcheck disable=SC2086 - BUILDS and TRACING_ARGS are lists
  for tree in ${BUILDS:-${BEFORE:+"$BEFORE"} .}; do
    name=after
    [ "$tree" = "${BEFORE:-}" ] && name=before
    [ -n "${BUILDS:-}" ] && name=$(basename "$tree")
    (cd "$tree" && PYTHONPATH=$PWD:${site#*:} timeout 150 python -m iris.run -n "$ranks" benchmarks/tracing_overhead.py \
      ${TRACING_ARGS:---breakdown --iters 100 --trials 12} --out "$out/tracing_overhead_${rtag}_$name.json" 2>&1 \
      | grep -v Warning | tail -20)
  done
fi
if [[ " $parts " == *" fused "* ]]; then
  # shellcheck disable=SC2086 - FUSED_ARGS is a list of arguments
  timeout "${FUSED_TIMEOUT:-240}" python -m iris.run -n "$ranks" benchmarks/fused_ops.py --iters 50 ${FUSED_ARGS:-} \
    --out "$out/fused_ops_${rtag}${FUSED_NAME:-}.json" 2>&1 | grep -v Warning | tail -60
fi
if [[ " $parts " == *" profile "* ]]; then
  # shellcheck disable=SC2086 - PROFILE_ARGS is a list of arguments
  timeout 180 python -m iris.run -n "$ranks" scripts/profile_op.py ${PROFILE_ARGS:-} --out "$out/profile_${rtag}.json" \
    2>&1 | grep -v Warning | tail -150
fi
if [[ " $parts " == *" crossnode "* ]]; then
  # Every cross-node kernel links NVSHMEM's bitcode as it compiles (seconds each): many
  # workers, and a log that names each result as it comes, so a cut-off run still says
  # what passed. At 4 ranks keep to about 8 workers: 16 (64 rank processes) got ranks
  # killed by the host on nvidia-h200-x4.
  IRIS_TEST_RANKS_PER_NODE=${XN_PER_NODE:-1} IRIS_TEST_WORLD_SIZES=${XN_SIZES:-2} IRIS_WAIT_TIMEOUT=60 \
    timeout -s INT "${CROSSNODE_TIMEOUT:-480}" python -m pytest -v -n "${CROSSNODE_WORKERS:-8}" -p no:cacheprovider \
    --timeout 300 -rfEs ${CROSSNODE_TESTS:-tests/test_ccl.py tests/test_ops.py tests/test_tile_collectives.py} \
    > "$out/crossnode.log" 2>&1
  grep -c PASSED "$out/crossnode.log" | sed 's/^/crossnode passed: /'
  grep -E "(FAILED|ERROR) tests" "$out/crossnode.log" | sort -u | tail -20
fi
if [[ " $parts " == *" topology "* ]]; then
  timeout 90 python -m iris.run -n "$ranks" scripts/show_topology.py 2>&1 | grep -v Warning | tail -20
  IRIS_RANKS_PER_NODE=2 timeout 120 python -m iris.run -n "$ranks" scripts/show_topology.py 2>&1 | grep -v Warning | tail -12
  IRIS_TEST_WORLD_SIZES=2,$ranks timeout 150 python -m pytest -q -n 4 -p no:cacheprovider -rfEs tests/test_topology.py \
    2>&1 | tail -6
fi
if [[ " $parts " == *" suite "* ]]; then
  # One test process finishes about half the suite in gpu_check's 420 s; 12 finish it at 1, 2 and 4 ranks in about 320 s.
  IRIS_TEST_WORLD_SIZES=${SUITE_SIZES:-1,2} PYTEST_WORKERS=${PYTEST_WORKERS:-12} SKIP_BENCH=1 bash "$(dirname "$0")/gpu_check.sh"
fi
