"""10 · GEMM + all-scatter, fused sequential.

C = A x B with B sharded by columns: rank r computes its block C_r = A x B_r, and every
rank must end with the whole C (the problem and its check: gemm_all_scatter_problem.py).

One kernel: each program computes a tile and stores it straight into every rank's C,
then moves on. One program's stores overlap the GEMM of the others, but each program
stalls on its own stores. The library's tuned version of this style is
``ctx.ops.matmul_all_gather(c, a, b, dim=1, config=...variant="fused_sequential")``;
the four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/10_gemm_all_scatter_fused_sequential.py
"""

import sys

import triton
import triton.language as tl
from gemm_all_scatter_problem import run, tile_sizes

import iris
from iris.ops.gemm import tile_gemm, tile_offsets


@triton.jit
def fused_sequential_kernel(
    a, b, c, M, n, K, ldc, rank, world_size, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    # One program per tile of C_r; C_r lives at columns rank * n of every rank's C.
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    acc = tile_gemm(a, b, pid_m, pid_n, M, n, K, K, 1, n, 1, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    tile = acc.to(c.dtype.element_ty)
    offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
    block = c + rank * n
    for i in range(world_size):
        target = (rank + i) % world_size  # this rank's own C first, then each peer's
        iris.store(block + offsets, tile, rank, target, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n)


def gemm_all_scatter(ctx, a, b, c, call):
    (M, K), n = a.shape, b.shape[1]
    tiles = tile_sizes(ctx)
    grid = (triton.cdiv(M, tiles["BLOCK_M"]), triton.cdiv(n, tiles["BLOCK_N"]))
    fused_sequential_kernel[grid](
        a, b, c, M, n, K, c.stride(0), ctx.get_rank(), ctx.get_num_ranks(), ctx.get_heap_bases(),
        **tiles, EVEN_K=K % tiles["BLOCK_K"] == 0,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run("10_fused_sequential", gemm_all_scatter))
