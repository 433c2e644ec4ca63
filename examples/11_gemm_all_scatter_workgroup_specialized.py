"""11 · GEMM + all-scatter, workgroup-specialised.

C = A x B with B sharded by columns: rank r computes its block C_r = A x B_r, and every
rank must end with the whole C (the problem and its check: gemm_all_scatter_problem.py).

One kernel, two kinds of programs. GEMM programs compute tiles, store them into this
rank's own C and raise a per-tile flag (``iris.signal``: a release after the tile's
stores). Communication programs wait on those flags (``iris.wait_until``: an acquire,
so the tile is visible) and push each finished tile into every peer's C. The GEMM
never waits for the network. Flags are set to the call number, so they need no reset,
and only this GPU reads them: ``scope="gpu"``, far cheaper than the default system
scope that a flag a peer reads needs.
The grid fits on the GPU at once (one program per SM), so every GEMM program runs even
while communication programs spin. The library's tuned version of this style is
``ctx.ops.matmul_all_gather(c, a, b, dim=1)``, its default for large GEMMs; the four
styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/11_gemm_all_scatter_workgroup_specialized.py
"""

import sys

import torch
import triton
import triton.language as tl
from gemm_all_scatter_problem import run, tile_sizes

import iris
from iris.ops.gemm import tile_gemm, tile_offsets


# ``call`` changes every call: not specialised on, or each new value would compile again.
@triton.jit(do_not_specialize=["call"])
def workgroup_specialized_kernel(
    a, b, c, flags, call, M, n, K, ldc, rank, world_size, heap_bases, GEMM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_n = tl.cdiv(n, BLOCK_N)
    tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    block = c + rank * n  # C_r lives at columns rank * n of every rank's C
    if pid < GEMM_PROGRAMS:
        for tile_id in range(pid, tiles, GEMM_PROGRAMS):
            pid_m, pid_n = tile_id // tiles_n, tile_id % tiles_n
            acc = tile_gemm(a, b, pid_m, pid_n, M, n, K, K, 1, n, 1, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
            offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
            tl.store(block + offsets, acc.to(c.dtype.element_ty), mask=mask)
            iris.signal(flags + tile_id, call, rank, rank, heap_bases, scope="gpu", pid_m=pid_m, pid_n=pid_n)
    else:
        comm_programs = tl.num_programs(0) - GEMM_PROGRAMS
        for tile_id in range(pid - GEMM_PROGRAMS, tiles, comm_programs):
            pid_m, pid_n = tile_id // tiles_n, tile_id % tiles_n
            iris.wait_until(flags + tile_id, "ge", call, "gpu", heap_bases, pid_m=pid_m, pid_n=pid_n)
            offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
            tile = tl.load(block + offsets, mask=mask)
            for i in range(1, world_size):
                peer = (rank + i) % world_size
                iris.store(block + offsets, tile, rank, peer, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n)


_flags = {}


def gemm_all_scatter(ctx, a, b, c, call):
    (M, K), n = a.shape, b.shape[1]
    tiles = tile_sizes(ctx)
    count = triton.cdiv(M, tiles["BLOCK_M"]) * triton.cdiv(n, tiles["BLOCK_N"])
    if count not in _flags:  # one flag per tile, on the heap (iris.signal targets heap memory)
        _flags[count] = ctx.zeros(count, dtype=torch.int32)
    programs = ctx.get_cu_count()
    comm_programs = max(1, programs // 8)
    workgroup_specialized_kernel[(programs,)](
        a, b, c, _flags[count], call, M, n, K, c.stride(0), ctx.get_rank(), ctx.get_num_ranks(),
        ctx.get_heap_bases(), programs - comm_programs, **tiles, EVEN_K=K % tiles["BLOCK_K"] == 0,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run("11_workgroup_specialized", gemm_all_scatter))
