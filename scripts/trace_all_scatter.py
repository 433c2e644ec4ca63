"""Where a GEMM + all-scatter call spends its time, from a trace of one steady-state call.

Runs ``ctx.ops.matmul_all_gather(out, A, B, dim=1)`` at a global shape with a
config (the defaults, changed by ``--config``), traced, and prints per rank: when
the GEMM tiles end (quartiles), from the rank's first event, when the last push ends, how many bytes each rank
still had to push once its GEMM was done and at what rate they went, and the
outgoing bytes per time bin, and roughly what tracing costs the call (one loop of calls
untraced and one traced: a few percent of noise; ``benchmarks/tracing_overhead.py``
times it in trials, for the record). The traced times are for comparing configs, not
for the record (benchmarks/fused_ops.py times untraced).

    python -m iris.run -n 4 scripts/trace_all_scatter.py --shape 4096,8192,8192 --out trace.json
    ... --config "block_n=128,num_warps=4,num_stages=4"  --bin-us 10
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from common import parse_configs, time_loop, write_report  # noqa: E402

import iris  # noqa: E402
from iris.ops.gemm import SCOPE_GEMM  # noqa: E402
from iris_trace.events import SCOPE_BASE  # noqa: E402

STORE = 2
WAIT = 16


def summarize(events, rank: int, bin_ns: int) -> tuple[str, dict]:
    mine = events[events["cur_rank"] == rank]
    # Times from this rank's first event: ranks start the call microseconds apart.
    origin = int(mine["start_ns"].min())
    gemm = np.sort(mine[mine["event_id"] == SCOPE_BASE + int(SCOPE_GEMM)]["end_ns"]) - origin
    pushes = mine[(mine["event_id"] == STORE) & (mine["target_rank"] != rank)]
    push_end = pushes["end_ns"] - origin
    gemm_done = int(gemm[-1])
    late = pushes[push_end > gemm_done]
    late_bytes = int(late["payload_bytes"].sum())
    last = int(push_end.max())
    waits = mine[mine["event_id"] == WAIT]["start_ns"] - origin
    numbers = {
        "gemm_tiles_end_us": {f"p{q}": float(np.percentile(gemm, q)) / 1e3 for q in (0, 25, 50, 75, 100)},
        "last_push_end_us": last / 1e3,
        "pushed_after_gemm_mib": late_bytes / 2**20,
        "after_gemm_gb_per_s": late_bytes / max(last - gemm_done, 1),
    }
    lines = [
        f"rank {rank}: {len(gemm)} gemm tiles end at (us) "
        + " ".join(f"{q}={us:.1f}" for q, us in numbers["gemm_tiles_end_us"].items())
        + f"; first wait {waits.min() / 1e3:.1f}"
        + f", first push {(pushes['start_ns'].min() - origin) / 1e3:.1f}, "
        f"last push ends {last / 1e3:.1f}; after the GEMM {numbers['pushed_after_gemm_mib']:.1f} MiB in "
        f"{(last - gemm_done) / 1e3:.1f} us ({numbers['after_gemm_gb_per_s']:.0f} GB/s)",
    ]
    bin_ns = max(bin_ns, -(-last // 60))  # at most 60 bins
    bins = np.arange(0, last + bin_ns, bin_ns)
    sent, _ = np.histogram(push_end, bins=bins, weights=pushes["payload_bytes"])
    lines.append(f"  GB/s per {bin_ns / 1e3:.0f} us: " + " ".join(f"{b / bin_ns:.0f}" for b in sent))
    return "\n".join(lines), numbers


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="4096,8192,8192", help="global M,N,K (N is split over the ranks)")
    parser.add_argument("--config", type=parse_configs, default=[{}], help="FusedConfig changes")
    parser.add_argument("--bin-us", type=float, default=20.0)
    parser.add_argument("--out", help="JSON report (rank 0)")
    args = parser.parse_args()
    M, N, K = (int(x) for x in args.shape.split(","))
    ctx = iris.iris(heap_size=2 << 30)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = N // world
    a = ctx.randn(M, K, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    b = ctx.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + rank))
    out = ctx.empty(M, world * n, dtype=torch.bfloat16)
    base = ctx.ops.default_config(M, n, K, "matmul_all_gather")
    results = []
    for changes in args.config:
        config = base.replace(**changes)
        call = lambda: ctx.ops.matmul_all_gather(out, a, b, dim=1, config=config)  # noqa: E731
        untraced = time_loop(ctx, call, 20) if iris.BACKEND == "cuda" else float("nan")
        ctx.tracing.enable(max_events=1 << 22)
        for _ in range(3):  # compile, then warm
            ctx.ops.matmul_all_gather(out, a, b, dim=1, config=config)
        # What recording costs this op: the same loop, traced (a few thousand events a call).
        traced = time_loop(ctx, call, 20) if iris.BACKEND == "cuda" else float("nan")
        ctx.barrier()
        ctx.device_barrier()
        ctx.tracing.reset()
        ctx.ops.matmul_all_gather(out, a, b, dim=1, config=config)
        ctx.barrier()
        trace = ctx.tracing.collect()
        ctx.tracing.disable()
        if rank == 0:
            print(
                f"== {args.shape}, {world} ranks, {changes}: untraced {untraced * 1e3:.3f} ms, "
                f"traced {traced * 1e3:.3f} ms ({traced / untraced - 1:+.1%})",
                flush=True,
            )
            ranks = []
            for r in range(world):
                text, numbers = summarize(trace.events, r, int(args.bin_us * 1e3))
                print(text, flush=True)
                ranks.append(numbers)
            results.append(
                {
                    "config": changes,
                    "untraced_ms": untraced * 1e3,
                    "traced_ms": traced * 1e3,
                    "overhead_pct": (traced / untraced - 1) * 100,
                    "ranks": ranks,
                }
            )
    report = {"shape": [M, N, K], "world_size": world, "iters": 20, "results": results}
    write_report(report, args.out, world)
    ctx.close()


if __name__ == "__main__":
    main()
