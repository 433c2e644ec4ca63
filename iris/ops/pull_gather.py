"""All-gather along K + GEMM, pulled: the kernel behind upstream Iris's ``all_gather_matmul``.

Upstream Iris shards the *reduction* dimension: rank ``r`` holds ``A_r``, columns
``[r * K_local, (r + 1) * K_local)`` of ``A (M x K)``, every rank holds all of
``B (K x N)``, and every rank computes the whole ``out = A @ B``, which is the sum
over ranks of ``A_r @ B[r * K_local : (r + 1) * K_local]``.

Nothing is pushed and no buffer is filled: each output tile walks the ranks, this
rank's shard first, then each peer's, and reads the peer's ``BLOCK_M x BLOCK_K``
slices of ``A_r`` straight from its heap (:func:`iris.load`, traced and routed
across nodes like any other load) into the dot product. The peers' shards must be
in place before the kernel starts (the host runs a device barrier first) and must
not change until every rank has finished (a device barrier after, unless
``async_op``). Each shard's product is :func:`iris.ops.gemm.tile_gemm`, reading ``A``
from the peer's heap for the peers' shards.

Example:
    >>> pull_gather_matmul_kernel[(tiles,)](a_shard, b, out, bias, M, N, K_local,
    ...     *a_shard.stride(), *b.stride(), *out.stride(), 1, rank, world, ctx.get_heap_bases(),
    ...     BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, EVEN_K=True, HAS_BIAS=False)
"""

import triton
import triton.language as tl

from ..device import tracing
from .gemm import SCOPE_GEMM, tile_coords, tile_gemm, tile_offsets


@triton.jit
def pull_gather_matmul_kernel(
    a_shard, b, out, bias,
    M, N,
    K_local,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
    cur_rank, world_size, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, HAS_BIAS: tl.constexpr,
):  # fmt: skip
    """One program per output tile: ``out = concat_K(A_0 .. A_{world-1}) @ b (+ bias[:, None])``.

    ``a_shard (M x K_local)`` is on the heap at the same offset on every rank; ``b``
    is ``(world_size * K_local) x N``; ``bias`` (read when ``HAS_BIAS``) has ``M`` entries.

    Example:
        >>> pull_gather_matmul_kernel[(tiles,)](a, b, out, out, M, N, K_local, *a.stride(),
        ...     *b.stride(), *out.stride(), 1, rank, world, heap_bases, 128, 128, 64, 8, True, False)
    """
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    started = tracing.trace_begin(heap_bases)
    # This rank's own shard first (nothing to wait for), then each peer's, read remotely.
    acc = tile_gemm(
        a_shard, b + cur_rank * K_local * stride_bk, pid_m, pid_n, M, N, K_local,
        stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
    )  # fmt: skip
    for i in range(1, world_size):
        source = (cur_rank + i) % world_size
        acc = tile_gemm(
            a_shard, b + source * K_local * stride_bk, pid_m, pid_n, M, N, K_local,
            stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
            acc, source, cur_rank, heap_bases,
        )  # fmt: skip
    if HAS_BIAS:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        acc += tl.load(bias + rm * stride_bias, mask=rm < M, other=0.0).to(tl.float32)[:, None]
    tracing.trace_end(heap_bases, started, SCOPE_GEMM, pid_m, pid_n)
    offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    tl.store(out + offsets, acc.to(out.dtype.element_ty), mask=mask)
