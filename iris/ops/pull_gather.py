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
``async_op``). Rows past ``M`` wrap onto real rows on load, as in
:func:`iris.ops.gemm.tile_gemm`, and are masked when stored.

Example:
    >>> pull_gather_matmul_kernel[(tiles,)](a_shard, b, out, bias, M, N, K_local,
    ...     *a_shard.stride(), *b.stride(), *out.stride(), 1, rank, world, ctx.get_heap_bases(),
    ...     BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, HAS_BIAS=False)
"""

import triton
import triton.language as tl

from ..device import intrinsics as hw
from ..device import rma, tracing
from .gemm import SCOPE_GEMM, tile_coords, tile_offsets


@triton.jit
def _add_shard_product(
    acc, a_shard, b, source, rm, rn, K_local, stride_am, stride_ak, stride_bk, stride_bn,
    cur_rank, heap_bases, pid_m, pid_n, BLOCK_K: tl.constexpr, REMOTE: tl.constexpr,
):  # fmt: skip
    # acc + A_source @ B[source * K_local : (source + 1) * K_local] for this tile. REMOTE is
    # a constexpr so that each K loop has one kind of load and no branch to pipeline around.
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_shard + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b + (source * K_local + rk)[:, None] * stride_bk + rn[None, :] * stride_bn
    for k in range(0, tl.cdiv(K_local, BLOCK_K)):
        k_left = K_local - k * BLOCK_K
        if REMOTE:
            tile_a = rma.load(
                a_ptrs, cur_rank, source, heap_bases, mask=rk[None, :] < k_left, other=0.0,
                pid_m=pid_m, pid_n=pid_n,
            )  # fmt: skip
        else:
            tile_a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
        tile_b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = tl.dot(hw.dot_operand(tile_a), hw.dot_operand(tile_b), acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def pull_gather_matmul_kernel(
    a_shard,
    b,
    out,
    bias,
    M,
    N,
    K_local,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_bias,
    cur_rank,
    world_size,
    heap_bases,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    """One program per output tile: ``out = concat_K(A_0 .. A_{world-1}) @ b (+ bias[:, None])``.

    ``a_shard (M x K_local)`` is on the heap at the same offset on every rank; ``b``
    is ``(world_size * K_local) x N``; ``bias`` (read when ``HAS_BIAS``) has ``M`` entries.

    Example:
        >>> pull_gather_matmul_kernel[(tiles,)](a, b, out, out, M, N, K_local, *a.stride(),
        ...     *b.stride(), *out.stride(), 1, rank, world, heap_bases, 128, 128, 64, 8, False)
    """
    pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    started = tracing.trace_begin(heap_bases)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # This rank's own shard first (nothing to wait for), then each peer's, read remotely.
    acc = _add_shard_product(
        acc, a_shard, b, cur_rank, rm, rn, K_local, stride_am, stride_ak, stride_bk, stride_bn,
        cur_rank, heap_bases, pid_m, pid_n, BLOCK_K, False,
    )  # fmt: skip
    for i in range(1, world_size):
        acc = _add_shard_product(
            acc, a_shard, b, (cur_rank + i) % world_size, rm, rn, K_local, stride_am, stride_ak,
            stride_bk, stride_bn, cur_rank, heap_bases, pid_m, pid_n, BLOCK_K, True,
        )  # fmt: skip
    if HAS_BIAS:
        acc += tl.load(bias + rm * stride_bias).to(tl.float32)[:, None]
    tracing.trace_end(heap_bases, started, SCOPE_GEMM, pid_m, pid_n)
    offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    tl.store(out + offsets, acc.to(out.dtype.element_ty), mask=mask)
