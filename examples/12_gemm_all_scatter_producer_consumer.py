"""12 · GEMM + all-scatter, producer-consumer.

C = A x B with B sharded by columns: rank r computes its block C_r = A x B_r, and every
rank must end with the whole C (the problem and its check: gemm_all_scatter_problem.py).

The two roles of example 11 as two kernels on two streams: the GEMM (producer) stores
each tile into this rank's own C and raises its flag; the communication kernel
(consumer), launched beside it on a side stream, waits on the flags and pushes the
tiles into every peer's C. The two grids together fit on the GPU at once, so the
consumer's spinning programs never keep a producer program off an SM. Under emulation
the interpreter runs the producer to its end, then the consumer. The library's tuned
version of this style is ``ctx.ops.matmul_all_gather(c, a, b, dim=1,
config=...variant="producer_consumer")``; the four styles side by side: docs/fused.md.

Run: python -m iris.run -n 2 examples/12_gemm_all_scatter_producer_consumer.py
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
def producer_kernel(
    a, b, c, flags, call, M, n, K, ldc, rank, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    tiles_n = tl.cdiv(n, BLOCK_N)
    block = c + rank * n  # C_r lives at columns rank * n of every rank's C
    for tile_id in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = tile_id // tiles_n, tile_id % tiles_n
        acc = tile_gemm(a, b, pid_m, pid_n, M, n, K, K, 1, n, 1, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
        tl.store(block + offsets, acc.to(c.dtype.element_ty), mask=mask)
        iris.signal(flags + tile_id, call, rank, rank, heap_bases, scope="gpu", pid_m=pid_m, pid_n=pid_n)


@triton.jit(do_not_specialize=["call"])
def consumer_kernel(
    c, flags, call, M, n, ldc, rank, world_size, heap_bases, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):  # fmt: skip
    tiles_n = tl.cdiv(n, BLOCK_N)
    block = c + rank * n
    for tile_id in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tiles_n, tl.num_programs(0)):
        pid_m, pid_n = tile_id // tiles_n, tile_id % tiles_n
        iris.wait_until(flags + tile_id, "ge", call, "gpu", heap_bases, pid_m=pid_m, pid_n=pid_n)
        offsets, mask = tile_offsets(pid_m, pid_n, M, n, ldc, 1, BLOCK_M, BLOCK_N)
        tile = tl.load(block + offsets, mask=mask)
        for i in range(1, world_size):
            peer = (rank + i) % world_size
            iris.store(block + offsets, tile, rank, peer, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n)


_state = {}


def gemm_all_scatter(ctx, a, b, c, call):
    (M, K), n = a.shape, b.shape[1]
    tiles = tile_sizes(ctx)
    count = triton.cdiv(M, tiles["BLOCK_M"]) * triton.cdiv(n, tiles["BLOCK_N"])
    if not _state:  # one flag per tile on the heap, and the consumer's stream (None under emulation)
        _state["flags"] = ctx.zeros(count, dtype=torch.int32)
        _state["side"] = ctx.backend.side_stream(ctx.get_device())
    flags, rank, heap_bases = _state["flags"], ctx.get_rank(), ctx.get_heap_bases()
    consumers = max(1, ctx.get_cu_count() // 8)
    producers = ctx.get_cu_count() - consumers
    scatter = {key: tiles[key] for key in ("BLOCK_M", "BLOCK_N")}

    def produce():
        producer_kernel[(producers,)](
            a, b, c, flags, call, M, n, K, c.stride(0), rank, heap_bases,
            **tiles, EVEN_K=K % tiles["BLOCK_K"] == 0,
        )  # fmt: skip

    def consume():
        consumer_kernel[(consumers,)](
            c, flags, call, M, n, c.stride(0), rank, ctx.get_num_ranks(), heap_bases, **scatter
        )

    # The consumer runs beside the producer, after this stream's earlier work; this
    # stream's later work (the host barrier in the check) waits for both.
    ctx.backend.run_beside(_state["side"], produce, consume)


if __name__ == "__main__":
    sys.exit(run("12_producer_consumer", gemm_all_scatter))
