"""Where one call of a fused op spends its time on the GPU: every kernel and copy, per stream.

A diagnostic beside ``benchmarks/fused_ops.py`` (same operands, same configs): after a
warm-up, one call per config runs under ``torch.profiler`` (CUPTI), and each rank prints
its GPU activities in start order, relative to the first, with the stream they ran on
and the gaps on the compute stream. It shows what a timing cannot: whether copies hide
behind the GEMM, how long the tail after the last GEMM is, what the handshakes cost.
Profiling adds a little to every launch, so read the structure, not the totals.
``--calls N`` profiles N calls back to back and gives each activity's mean start and
duration within a call; ``--traced`` profiles every config again with tracing enabled,
which says in which kernel (and in which gap between kernels) tracing's cost lies.

Then, per config, three times per call over a loop (max over ranks): the GPU's (CUDA
events around the loop), the host's (enqueueing the loop, before any wait), and the
GPU's when the call is replayed from a CUDA graph (no host work at all). A host time
near the GPU time means the loop is host-bound; the graph time is the GPU's own.

    python -m iris.run -n 2 scripts/profile_op.py --shape 4096,8192,8192 \\
        --configs "variant=copy_engine;variant=copy_engine,sm_tail=1" --out /tmp/profile.json
    python -m iris.run -n 4 scripts/profile_op.py --shape 4096,8192,8192 --configs variant=auto \\
        --calls 20 --traced
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from common import parse_configs, parse_shapes, write_report  # noqa: E402
from fused_ops import OPS, Problem  # noqa: E402

import iris  # noqa: E402

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def gpu_activities(prof) -> list[dict]:
    """The GPU activities of a finished profile: name, stream, start and duration (us)."""
    with tempfile.NamedTemporaryFile(suffix=".json") as handle:
        prof.export_chrome_trace(handle.name)
        with open(handle.name) as trace:
            events = json.load(trace)["traceEvents"]
    rows = [
        {"name": e["name"], "stream": e.get("tid"), "start_us": float(e["ts"]), "us": float(e.get("dur", 0))}
        for e in events
        if e.get("cat") in GPU_CATEGORIES
    ]
    rows.sort(key=lambda row: row["start_us"])
    first = rows[0]["start_us"] if rows else 0.0
    for row in rows:
        row["start_us"] = round(row["start_us"] - first, 2)
    return rows


def mean_call(rows: list[dict], calls: int) -> list[dict]:
    """The activities of ``calls`` identical calls profiled back to back, as one mean call.

    Each call launches the same activities, so the ``i``-th of a call is the ``i``-th of
    every call: its start (relative to its call's first activity) and duration are
    averaged. The rows come back unchanged when they do not split into equal calls.
    """
    if calls <= 1 or len(rows) % calls:
        return rows
    per_call = len(rows) // calls
    split = [rows[i * per_call : (i + 1) * per_call] for i in range(calls)]
    if any([r["name"] for r in call] != [r["name"] for r in split[0]] for call in split):
        return rows
    mean = []
    for i, first in enumerate(split[0]):
        starts = [call[i]["start_us"] - call[0]["start_us"] for call in split]
        mean.append(
            {
                "name": first["name"],
                "stream": first["stream"],
                "start_us": round(sum(starts) / calls, 2),
                "us": round(sum(call[i]["us"] for call in split) / calls, 2),
            }
        )
    return mean


def describe(rows: list[dict], rank: int, label: str) -> str:
    """One line per activity, then the span and the idle time of the busiest stream."""
    lines = [f"[rank {rank}] {label}"]
    for row in rows:
        end = row["start_us"] + row["us"]
        lines.append(
            f"  {row['start_us']:9.1f} {end:9.1f} {row['us']:8.1f} us  stream {row['stream']!s:>4}  "
            f"{row['name'][:70]}"
        )
    if rows:
        span = max(r["start_us"] + r["us"] for r in rows)
        per_stream = {}
        for r in rows:
            per_stream[r["stream"]] = per_stream.get(r["stream"], 0.0) + r["us"]
        busiest, busy = max(per_stream.items(), key=lambda item: item[1])
        lines.append(f"  span {span:.1f} us; stream {busiest} busy {busy:.1f} us, idle {span - busy:.1f} us")
    return "\n".join(lines)


def loop_times(ctx, call, iters: int) -> dict:
    """Microseconds per call: GPU (events), host (enqueue only) and CUDA-graph replay; max over ranks."""
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = {}
    ctx.barrier()
    call()
    start.record()
    began = time.perf_counter()
    for _ in range(iters):
        call()
    times["host_us"] = (time.perf_counter() - began) / iters * 1e6
    stop.record()
    torch.cuda.synchronize()
    times["gpu_us"] = start.elapsed_time(stop) * 1e3 / iters
    try:
        graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            call()  # warm the side stream's cuBLAS workspace before capturing
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        ctx.barrier()
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize()
        ctx.barrier()
        graph.replay()
        start.record()
        for _ in range(iters):
            graph.replay()
        stop.record()
        torch.cuda.synchronize()
        times["graph_us"] = start.elapsed_time(stop) * 1e3 / iters
    except Exception as error:  # noqa: BLE001 - a config that cannot be captured says why
        times["graph_us"] = f"not captured: {type(error).__name__}: {str(error)[:120]}"
        torch.cuda.synchronize()
    ctx.barrier()
    every = [None] * ctx.get_num_ranks()
    dist.all_gather_object(every, times)
    return {
        key: max(t[key] for t in every) if all(isinstance(t[key], float) for t in every) else every[0][key]
        for key in times
    }


def profile_config(ctx, call, args, timed: bool) -> dict:
    """One config's mean call under the profiler (after a warm-up) and, if ``timed``, its loop times."""
    for _ in range(args.warmup):
        call()
    torch.cuda.synchronize()
    ctx.barrier()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.calls):
            call()
        torch.cuda.synchronize()
    ctx.barrier()
    entry = {"activities": mean_call(gpu_activities(prof), args.calls)}
    if timed:
        entry["times"] = loop_times(ctx, call, args.iters)
    return entry


def _number(name: str, value) -> str:
    return f"{name} {value:.1f}" if isinstance(value, float) else f"{name} {value}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", default="gemm_all_scatter", choices=OPS)
    parser.add_argument(
        "--shape", type=parse_shapes, default=[(4096, 8192, 8192)], help="'M,N,K;M,N,K' (global sizes)"
    )
    parser.add_argument("--configs", type=parse_configs, default=[{"variant": "copy_engine"}])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30, help="calls per timing loop")
    parser.add_argument("--calls", type=int, default=1, help="calls profiled back to back (mean per call)")
    parser.add_argument(
        "--traced", action="store_true", help="profile each config again with tracing enabled"
    )
    parser.add_argument("--times-only", action="store_true", help="print the loop times, not the activities")
    parser.add_argument("--out", default=None, help="JSON of every rank's activities and times")
    args = parser.parse_args()
    if iris.BACKEND != "cuda":
        raise SystemExit("this script profiles GPUs: run it with IRIS_BACKEND=cuda")
    ctx = iris.iris(heap_size=8 << 30)
    rank = ctx.get_rank()
    args.comm_sms = 0  # Problem reads fused_ops.py's --comm-sms: keep each op's default
    arena = ctx.empty(max(m * n for m, n, _ in args.shape), dtype=torch.bfloat16)
    shapes = {}
    for M, N, K in args.shape:
        problem = Problem(ctx, args.op, (M, N, K), arena, args)
        report = shapes[f"{M}x{N}x{K}"] = {}
        for fields in [{"variant": "baseline"}, {"variant": "cublas"}, *args.configs]:
            fields = dict(fields)
            variant = fields.pop("variant", "fused")
            label = variant + ("[" + ",".join(f"{k}={v}" for k, v in fields.items()) + "]" if fields else "")
            if variant in ("baseline", "cublas"):
                call = getattr(problem, variant)
            else:
                config = problem.config.replace(**fields)
                call = lambda v=variant, c=config: problem.iris(v, c)  # noqa: E731
            traced_too = args.traced and variant not in ("baseline", "cublas")
            for traced in (False, True) if traced_too else (False,):
                name = label + (" traced" if traced else "")
                if traced:
                    ctx.tracing.enable(max_events=1 << 22)
                report[name] = profile_config(ctx, call, args, variant != "baseline")
                if traced:
                    ctx.tracing.disable()
                    ctx.tracing.reset()
                if not args.times_only:
                    for r in range(ctx.get_num_ranks()):
                        if r == rank:
                            print(
                                describe(report[name]["activities"], rank, f"{args.op} {M}x{N}x{K} {name}"),
                                flush=True,
                            )
                        ctx.barrier()
        if rank == 0:
            for label, entry in report.items():
                if "times" in entry:
                    times = "  ".join(_number(k, v) for k, v in entry["times"].items())
                    print(f"{M}x{N}x{K} {label:45} {times}", flush=True)
    every = [None] * ctx.get_num_ranks()
    dist.all_gather_object(every, shapes)
    write_report({"op": args.op, "ranks": every}, args.out, ctx.get_num_ranks())
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
