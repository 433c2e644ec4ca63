"""What tracing costs: the same kernels untraced, compiled with tracing but disabled, and traced.

Kernels:
  put      ring put of a large buffer (grid-stride, 16 KiB per op): communication only
  gemm+as  bf16 GEMM tiles (128x128x64) each stored to every rank (all-scatter), with a
           compute scope around each tile's K loop: compute plus communication

Modes, in one run with the same fixed iteration count on every rank (max over ranks):
  untraced   plain heap_bases (tracing compiled out; the code tracing never touched)
  disabled   the traced kernel variant launched while the host has tracing disabled
  enabled    traced and recording
  untraced   again, to show run-to-run noise

    python -m iris.run -n 4 benchmarks/tracing_overhead.py --out benchmarks/results/tracing_overhead_h200x4.json
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from common import all_ranks_agree, require_own_gpu, time_loop, write_report

import iris


@triton.jit
def put_ring(src, dst, n, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    peer = (cur_rank + 1) % world_size
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases, mask=offsets < n)


@triton.jit
def gemm_all_scatter(
    a,
    b,
    c_all,
    M,
    N,
    K,
    cur_rank,
    world_size,
    heap_bases,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = pid // tiles_n, pid % tiles_n
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    started = iris.trace_begin(heap_bases)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        tile_a = tl.load(a + rows[:, None] * K + (k + ks)[None, :])
        tile_b = tl.load(b + (k + ks)[:, None] * N + cols[None, :])
        acc = tl.dot(tile_a, tile_b, acc)
    iris.trace_end(heap_bases, started, 0, pid_m, pid_n)
    tile = acc.to(tl.bfloat16)
    offsets = cur_rank * M * N + rows[:, None] * N + cols[None, :]
    for i in range(world_size):
        target = (cur_rank + i) % world_size
        iris.store(c_all + offsets, tile, cur_rank, target, heap_bases, pid_m=pid_m, pid_n=pid_n)


MAX_EVENTS = 1 << 22


def measure(ctx, launch, iters):
    """Time ``launch(heap_bases)`` in every mode; returns {mode: seconds}, events per call, no-drop flag."""
    plain = ctx.get_heap_bases()
    ctx.tracing.enable(max_events=MAX_EVENTS)
    traced = ctx.get_heap_bases()
    ctx.tracing.disable()
    results = {"untraced": time_loop(ctx, lambda: launch(plain), iters)}
    results["disabled"] = time_loop(ctx, lambda: launch(traced), iters)
    ctx.tracing.enable(max_events=MAX_EVENTS)
    ctx.tracing.reset()
    launch(ctx.get_heap_bases())
    events_per_call = len(ctx.tracing.events()) + ctx.tracing.dropped()
    dropped_before = ctx.tracing.dropped()
    results["enabled"] = time_loop(ctx, lambda: launch(ctx.get_heap_bases()), iters)
    recorded_ok = ctx.tracing.dropped() == dropped_before
    ctx.tracing.disable()
    results["untraced_again"] = time_loop(ctx, lambda: launch(plain), iters)
    ctx.tracing.reset()
    return results, events_per_call, all_ranks_agree(recorded_ok)


def row(name, results, events_per_call):
    base = results["untraced"]
    out = {"kernel": name, "events_per_call_rank0": events_per_call}
    for mode, seconds in results.items():
        out[mode] = {"us": seconds * 1e6, "overhead_pct": 100 * (seconds / base - 1)}
    out["events_per_second"] = events_per_call / results["enabled"]
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--put-mib", type=int, default=256)
    parser.add_argument("--gemm", type=int, nargs=3, default=[4096, 4096, 4096], metavar=("M", "N", "K"))
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if iris.BACKEND != "cuda":
        raise SystemExit("this benchmark times GPUs: run it with IRIS_BACKEND=cuda")
    started = time.time()
    ctx = iris.iris(heap_size=4 << 30)
    require_own_gpu(ctx)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    device = ctx.get_device()

    n = args.put_mib * (1 << 20) // 4
    src, dst = ctx.randn(n), ctx.zeros(n)
    grid = (ctx.get_cu_count() * 2,)
    put, put_events, put_ok = measure(
        ctx, lambda hb: put_ring[grid](src, dst, n, rank, world, hb, BLOCK=4096, num_warps=16), args.iters
    )

    M, N, K = args.gemm
    generator = torch.Generator().manual_seed(rank)
    a = ctx.randn(M, K, dtype=torch.bfloat16, generator=generator)
    b = ctx.randn(K, N, dtype=torch.bfloat16, generator=generator)
    c_all = ctx.full((world, M, N), float("nan"), dtype=torch.bfloat16)
    tiles = (triton.cdiv(M, 128) * triton.cdiv(N, 128),)
    ctx.barrier()

    def gemm(heap_bases):
        gemm_all_scatter[tiles](
            a,
            b,
            c_all,
            M,
            N,
            K,
            rank,
            world,
            heap_bases,
            BLOCK_M=128,
            BLOCK_N=128,
            BLOCK_K=64,
            num_warps=8,
            num_stages=3,
        )

    gemm_results, gemm_events, gemm_ok = measure(ctx, gemm, args.iters)
    ctx.barrier()  # every rank's last all-scatter has landed
    errors = []
    for owner in range(world):
        g = torch.Generator().manual_seed(owner)
        ref_a = torch.randn(M, K, dtype=torch.bfloat16, generator=g).to(device)
        ref_b = torch.randn(K, N, dtype=torch.bfloat16, generator=g).to(device)
        ref = ref_a.float() @ ref_b.float()
        errors.append(((c_all[owner].float() - ref).norm() / ref.norm()).item())
    correct = all_ranks_agree(max(errors) < 1e-2)

    report = {
        "world_size": world,
        "put_bytes": n * 4,
        "gemm_shape": [M, N, K],
        "iters": args.iters,
        "results": [row("put", put, put_events), row("gemm+all-scatter", gemm_results, gemm_events)],
        "gemm_result_correct": correct,
        "gemm_max_relative_error": max(errors),
        "no_events_dropped": put_ok and gemm_ok,
        "seconds": round(time.time() - started, 1),
    }
    if rank == 0:
        print(
            f"{'kernel':18} {'untraced':>10} {'disabled':>10} {'enabled':>10} {'again':>10}  events/call  Mevents/s"
        )
        for r in report["results"]:
            cells = " ".join(
                f"{r[m]['us']:8.1f}us" for m in ("untraced", "disabled", "enabled", "untraced_again")
            )
            print(
                f"{r['kernel']:18} {cells}  {r['events_per_call_rank0']:11d}  {r['events_per_second'] / 1e6:9.1f}"
            )
            print(
                f"{'':18} overhead: disabled {r['disabled']['overhead_pct']:+.1f}%  enabled "
                f"{r['enabled']['overhead_pct']:+.1f}%  untraced again {r['untraced_again']['overhead_pct']:+.1f}%"
            )
        print(
            f"gemm result correct: {correct} (max relative error {max(errors):.2e}); "
            f"no events dropped: {report['no_events_dropped']}"
        )
    write_report(report, args.out, world)
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
