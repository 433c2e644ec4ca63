"""GEMM + reduce-scatter by tile ownership: the kernel behind upstream Iris's ``matmul_reduce_scatter``.

Upstream Iris scatters the reduced ``M x N`` result by *tiles*, not by rows: with
``T`` tiles of ``BLOCK_M x BLOCK_N`` in row-major order, rank ``r`` owns tiles
``[r * (T // world), (r + 1) * (T // world))`` and the last rank also the rest.
Every rank's ``out`` is ``M x N``; after the call its owned tiles hold the sum over
ranks of ``A_r @ B_r`` and the others are zero (the host zeroes ``out`` first).

One program per tile computes the partial tile into this rank's ``partial`` buffer
on the heap and raises its ready lock there (:func:`iris.signal`: after the
tile's stores, with release semantics); the tile's owner then sums every
rank's partial through :meth:`iris.DeviceContext.reduce_scatter`, the in-kernel
tile collective of :mod:`iris.device.tile_collectives` (which waits on each peer's
lock with a traced, timed wait). The locks are plain 0/1 flags, as upstream's, so
the host zeroes them and runs a device barrier before every call.

Example:
    >>> tile_reduce_scatter_kernel[(tiles,)](a, b, partial, out, locks, M, N, K, *a.stride(),
    ...     *b.stride(), *partial.stride(), *out.stride(), ctx.get_device_context(), rank, world,
    ...     BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, EVEN_K=True)
"""

import triton
import triton.language as tl

from ..device.context import DeviceContext
from ..device.tiles import Tile, make_tensor_view
from .gemm import traced_tile_gemm


@triton.jit
def tile_reduce_scatter_kernel(
    a, b, partial, out, locks,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_pm, stride_pn, stride_cm, stride_cn,
    context,
    cur_rank, world_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """Tile ``program_id`` (row-major) of ``A @ B`` into ``partial``, then its owner reduces it into ``out``.

    ``partial`` (``M x N``) and ``locks`` (one int32 per tile, zero on entry) are on the heap.

    Example:
        >>> tile_reduce_scatter_kernel[(tiles,)](a, b, partial, out, locks, M, N, K, K, 1, N, 1,
        ...     N, 1, N, 1, context, rank, world, 64, 64, 32, True)
    """
    ctx = DeviceContext.initialize(context, cur_rank, world_size)
    index = tl.program_id(0)
    pid_m = index // tl.cdiv(N, BLOCK_N)
    pid_n = index % tl.cdiv(N, BLOCK_N)
    acc = traced_tile_gemm(
        a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, ctx.heap_bases,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
    )  # fmt: skip
    tile = Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc.to(out.dtype.element_ty))
    partial_view = make_tensor_view(partial, M, N, stride_pm, stride_pn)
    ptrs, mask = partial_view.tile_ptr(tile)
    tl.store(ptrs, tile.data, mask=mask)
    # A traced signal to this rank's own lock: the peers' waits link to it in a trace.
    ctx.signal(locks + index, 1, cur_rank)
    ctx.reduce_scatter(tile, partial_view, make_tensor_view(out, M, N, stride_cm, stride_cn), locks)
