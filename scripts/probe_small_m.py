"""Where the time of the fused ops goes at small M (a diagnostic, not a benchmark of record).

Times, at one global shape (default M=1024, N=K=8192, 4 ranks, bf16), each piece the
ops are made of on its own: cuBLAS, NCCL and ctx.ccl collectives of the sizes the ops
move, the device barrier, the all-scatter kernel under several tile settings, and the
ops with async_op=True and False.

    python -m iris.run -n 4 scripts/probe_small_m.py --m 1024
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
from common import time_loop  # noqa: E402

import iris  # noqa: E402
from iris.ops import FusedConfig  # noqa: E402
from iris.ops.all_scatter import all_scatter_kernel  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=30)
    args = parser.parse_args()
    ctx = iris.iris(heap_size=4 << 30)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, N, K = args.m, args.n, args.k
    n_r = N // world
    dev = ctx.get_device()
    bf16 = dict(dtype=torch.bfloat16, device=dev)
    torch.manual_seed(rank)
    results = {}

    def t(name, fn, iters=args.iters):
        results[name] = time_loop(ctx, fn, iters, 5) * 1e6
        if rank == 0:
            print(f"{name:55s} {results[name]:9.1f} us", flush=True)

    a = torch.randn(M, K, **bf16)
    b = torch.randn(K, n_r, **bf16)
    local = torch.empty(M, n_r, **bf16)
    local_heap = ctx.empty(M, n_r, **bf16)
    gathered = torch.empty(world * M, n_r, **bf16)
    gathered_heap = ctx.empty(world * M, n_r, **bf16)
    out = ctx.empty(M, N, **bf16)
    t("cublas (M, N/w, K)", lambda: torch.matmul(a, b, out=local))
    t("nccl all_gather 16MiB out", lambda: dist.all_gather_into_tensor(gathered, local))
    t("nccl all_gather into heap", lambda: dist.all_gather_into_tensor(gathered_heap, local))
    t("ccl all_gather heap->heap", lambda: ctx.ccl.all_gather(gathered_heap, local_heap))
    t("ccl all_gather off->heap", lambda: ctx.ccl.all_gather(gathered_heap, local))
    t("device_barrier", lambda: ctx.device_barrier())
    t(
        "relayout copy (w,M,n)->(M,N)",
        lambda: out.view(M, world, n_r).copy_(gathered_heap.view(world, M, n_r).transpose(0, 1)),
    )
    for variant in ("unfused", "bulk_synchronous", "workgroup_specialized", "fused_sequential"):
        cfg = FusedConfig(block_n=128, num_stages=4, comm_sms=24, variant=variant)
        t(
            f"ops gemm_all_scatter {variant} async",
            lambda c=cfg: ctx.ops.matmul_all_gather(out, a, b, dim=1, async_op=True, config=c),
        )
    cfg = FusedConfig(block_n=128, num_stages=4, comm_sms=24, variant="unfused")
    t("ops gemm_all_scatter unfused sync", lambda: ctx.ops.matmul_all_gather(out, a, b, dim=1, config=cfg))
    for comm in (32, 48, 66):
        c = FusedConfig(block_n=128, num_stages=4, comm_sms=comm, variant="workgroup_specialized")
        t(
            f"ops gemm_all_scatter ws comm_sms={comm} async",
            lambda c=c: ctx.ops.matmul_all_gather(out, a, b, dim=1, async_op=True, config=c),
        )
    block = out.narrow(1, rank * n_r, n_r)
    entry = ctx.ops._flags("entry", world)
    epoch = ctx.ops._epoch_counter()
    for bm, bn, cr, warps, grid in (
        (128, 128, 32, 8, 132),
        (128, 256, 16, 8, 132),
        (64, 256, 8, 4, 132),
        (32, 512, 8, 8, 132),
        (16, 1024, 4, 4, 132),
        (32, 256, 32, 8, 264),
        (8, 1024, 8, 4, 264),
    ):
        t(
            f"all_scatter_kernel bm={bm} bn={bn} rows={cr} w={warps} grid={grid}",
            lambda bm=bm, bn=bn, cr=cr, warps=warps, grid=grid: all_scatter_kernel[(grid,)](
                block,
                entry,
                epoch,
                M,
                n_r,
                *block.stride(),
                rank,
                world,
                ctx.get_heap_bases(),
                BLOCK_M=bm,
                BLOCK_N=bn,
                COMM_ROWS=cr,
                num_warps=warps,
            ),
        )
    # all_gather_matmul pieces: A shard (M/w, K)
    a_shard = torch.randn(M // world, K, **bf16)
    a_shard_heap = ctx.empty(M // world, K, **bf16)
    a_full = torch.empty(M, K, **bf16)
    a_full_heap = ctx.empty(M, K, **bf16)
    t("nccl all_gather A shards", lambda: dist.all_gather_into_tensor(a_full, a_shard))
    t("ccl all_gather A heap", lambda: ctx.ccl.all_gather(a_full_heap, a_shard_heap))
    t("cublas gathered A @ B", lambda: torch.matmul(a_full, b, out=local))
    for variant in ("unfused", "fused"):
        out2 = ctx.empty(M, n_r, **bf16)
        c = FusedConfig(block_n=128, num_stages=4, comm_sms=24, variant=variant)
        t(
            f"ops all_gather_matmul {variant} async",
            lambda c=c, o=out2: ctx.ops.all_gather_matmul(o, a_shard, b, async_op=True, config=c),
        )
        t(
            f"ops all_gather_matmul {variant} async heap A",
            lambda c=c, o=out2: ctx.ops.all_gather_matmul(o, a_shard_heap, b, async_op=True, config=c),
        )
    # reduce pieces: partial (M, N) 16 MiB
    partial = ctx.randn(M, N, **bf16)
    partial_plain = torch.randn(M, N, **bf16)
    red = ctx.empty(M, N, **bf16)
    rs = torch.empty(M // world, N, **bf16)
    t("nccl all_reduce (M,N)", lambda: dist.all_reduce(partial_plain))
    t("ccl all_reduce (M,N)", lambda: ctx.ccl.all_reduce(red, partial))
    t("nccl reduce_scatter (M,N)", lambda: dist.reduce_scatter_tensor(rs, partial_plain))
    t("ccl reduce_scatter (M,N)", lambda: ctx.ccl.reduce_scatter(rs, partial))
    ctx.barrier()
    if rank == 0:
        print(results)
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
