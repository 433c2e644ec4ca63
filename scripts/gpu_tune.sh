#!/usr/bin/env bash
# One GPU call that checks the collectives and measures what their tuning rules need:
# the forced protocols of small calls (eager and graph), launch settings of large ones,
# and the fused GEMM + all-scatter over tile shapes and communication programs.
#   bash scripts/gpu_tune.sh          results in $OUT (device tool) or ./out
#   SKIP_TESTS=1 / PARTS="small large pushed fused fused_helpers fused_shared fused_rows fused_split fused_copies copy_engine collectives collectives_small fused_ops"
#   (the last three write the results of record: collectives_<card>x<count>.json, ...)
set -u
# shellcheck source=scripts/gpu_env.sh
. "$(dirname "$0")/gpu_env.sh"
quiet() { grep -v -e Warning -e "^\[rank" -e TCPStore -e "^$"; }
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  IRIS_TEST_WORLD_SIZES=${IRIS_TEST_WORLD_SIZES:-$gpus} timeout -s INT "${TEST_TIMEOUT:-240}" python -m pytest \
    ${TESTS:-tests/test_ccl.py} -q -p no:cacheprovider -rfE -k "${TEST_FILTER:-not compiles_for_hopper}" \
    >"$out/pytest.log" 2>&1
  tail -4 "$out/pytest.log"
fi
for part in ${PARTS-small large fused}; do  # PARTS="" runs the tests only
  case $part in
    small) args="--max-mib 1 --iters 100 --trials 3 --protocols --collectives all_reduce,all_gather,reduce_scatter,all_to_all" ;;
    large) args="--min-kib 16384 --max-mib 256 --iters 30 --trials 1 --no-graphs --collectives all_reduce,reduce_scatter
                 --configs comm_sms=32;comm_sms=64;comm_sms=96;num_warps=16;num_warps=4;block_size=8192;block_size=2048;comm_sms=64,block_size=8192" ;;
    fused) args="--ops gemm_all_scatter --shapes 4096,8192,8192;4096,14336,4096 --iters 50 --no-styles
                 --sweep comm_sms=4;comm_sms=8;comm_sms=16;comm_sms=32;block_n=128,comm_sms=16;block_n=128,comm_sms=24;block_n=128,comm_sms=29;block_n=128,comm_sms=36" ;;
    fused_helpers) args="--ops gemm_all_scatter --iters 50 --no-styles --sweep comm_sms=4;comm_sms=8;comm_sms=16;comm_sms=32" ;;
    pushed) args="--min-kib 1024 --max-mib 256 --iters 30 --trials 3 --no-graphs --collectives all_reduce,reduce_scatter
                 --configs protocol=pushed;protocol=pushed,num_warps=16;protocol=pushed,comm_sms=64;protocol=pushed,block_size=8192;protocol=direct" ;;
    fused_shared) args="--ops gemm_all_scatter --shapes 4096,8192,8192;4096,14336,4096;16384,8192,8192 --iters 50 --no-styles
                 --sweep variant=producer_consumer;variant=producer_consumer,consumer_warps=1;variant=producer_consumer,consumer_warps=2;variant=producer_consumer,consumer_warps=4;variant=producer_consumer,consumer_warps=2,comm_rows=16;variant=producer_consumer,consumer_warps=4,comm_rows=16" ;;
    fused_rows) args="--ops gemm_all_scatter --shapes 4096,8192,8192 --iters 50 --no-styles
                 --sweep comm_rows=64;comm_rows=128;comm_sms=16,comm_rows=64;comm_sms=32,comm_rows=64;num_stages=4" ;;
    collectives) args="--max-mib 256 --iters 50 --trials 3" ;;  # the results of record
    collectives_small) args="--max-mib 1 --iters 200 --trials 5" ;;
    fused_ops) args="--iters 50" ;;
    fused_split) args="--ops gemm_all_scatter --shapes 4096,8192,8192;4096,14336,4096;16384,8192,8192;16384,14336,4096 --iters 50 --no-styles
                 --sweep split_last_wave=1;split_last_wave=1,num_stages=4;num_stages=4" ;;
    fused_copies) args="--ops gemm_all_scatter matmul_reduce_scatter all_gather_matmul --iters 50 --no-styles
                 --sweep variant=copy_engine,copy_chunks=2;variant=copy_engine,copy_chunks=8" ;;
    copy_engine) args="--max-mib 256 --iters 20" ;;  # copy-engine bandwidth beside SM puts and NCCL
  esac
  bench=collectives; [ "${part#fused}" != "$part" ] && bench=fused_ops
  [ "$part" = copy_engine ] && bench=copy_engine
  case $part in small|large|pushed|fused|fused_helpers|fused_shared|fused_rows|fused_split|fused_copies) name=tune_$part ;; *) name=$part ;; esac
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-240}" python -m iris.run -n "$gpus" "benchmarks/$bench.py" $args \
    --out "$out/${name}_${tag}.json" 2>&1 | quiet | tail -60
done
