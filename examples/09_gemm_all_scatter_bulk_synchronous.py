"""09 · GEMM + all-scatter, bulk-synchronous.

C = A x B with B sharded by columns: rank r computes its block C_r = A x B_r, and every
rank must end with the whole C (the problem and its check: gemm_all_scatter_problem.py).

Two kernels, one after the other: the GEMM writes C_r into this rank's own C, then a
communication kernel reads it back and stores it into every peer's C. Nothing
overlaps, so the time is GEMM + communication. The library's tuned version of this
style is ``ctx.ops.matmul_all_gather(c, a, b, dim=1, config=...variant="bulk_synchronous")``;
the four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/09_gemm_all_scatter_bulk_synchronous.py
"""

import sys

import triton
import triton.language as tl
from gemm_all_scatter_problem import run, tile_sizes

import iris
from iris.ops.gemm import tile_gemm, tile_offsets


@triton.jit
def gemm_kernel(
    a, b, c, M, n, K, ldc, rank,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    # One program per tile of C_r; C_r lives at columns rank * n of this rank's C.
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    acc = tile_gemm(a, b, pid_m, pid_n, M, n, K, K, 1, n, 1, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
    tl.store(c + rank * n + offsets, acc.to(c.dtype.element_ty), mask=mask)


@triton.jit
def all_scatter_kernel(
    c, M, n, ldc, rank, world_size, heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    # One program per tile of C_r: read it here, store it at the same place in every peer's C.
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
    block = c + rank * n
    tile = tl.load(block + offsets, mask=mask)
    for i in range(1, world_size):
        peer = (rank + i) % world_size  # each rank starts with a different peer
        iris.store(block + offsets, tile, rank, peer, heap_bases, mask=mask)


def gemm_all_scatter(ctx, a, b, c, call):
    (M, K), n = a.shape, b.shape[1]
    tiles = tile_sizes(ctx)
    grid = (triton.cdiv(M, tiles["BLOCK_M"]), triton.cdiv(n, tiles["BLOCK_N"]))
    even_k = K % tiles["BLOCK_K"] == 0
    gemm_kernel[grid](a, b, c, M, n, K, c.stride(0), ctx.get_rank(), **tiles, EVEN_K=even_k)
    # Same stream: the communication kernel starts once the whole GEMM has finished.
    scatter = {key: tiles[key] for key in ("BLOCK_M", "BLOCK_N")}
    all_scatter_kernel[grid](
        c, M, n, c.stride(0), ctx.get_rank(), ctx.get_num_ranks(), ctx.get_heap_bases(), **scatter
    )


if __name__ == "__main__":
    sys.exit(run("09_bulk_synchronous", gemm_all_scatter))
