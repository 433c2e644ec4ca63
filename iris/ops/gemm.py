"""The tile GEMM every fused op is built from, plus the plain persistent GEMM kernels.

``tile_gemm`` computes one ``BLOCK_M x BLOCK_N`` tile of ``A @ B`` in fp32 from
any strides; rows and columns past the matrix edge are clamped on load (they
read valid memory and are masked when stored), so shapes need not divide the
tile sizes. ``tile_coords`` (:mod:`iris.device.tiles`) maps a linear tile index to
``(pid_m, pid_n)`` in GROUP_M-row bands so that consecutive tiles of a persistent
program share panels of A and B in L2.

``matmul_tma_kernel`` is the plain GEMM through tensor descriptors (Hopper's TMA
copy engine): whole tiles of A and B land in shared memory without passing through
registers, out-of-range rows, columns and K are zero-filled, and the finished tile
leaves with one asynchronous bulk store that the next tile's loads overlap. It needs
unit inner strides and 16-byte aligned rows (:func:`iris.ops.matmul.tma_compatible`);
``matmul_kernel`` takes any strides.

Example:
    >>> @triton.jit
    >>> def kernel(a, b, c, M, N, K, ...):
    >>>     pid_m, pid_n = tile_coords(tl.program_id(0), tl.cdiv(M, BM), tl.cdiv(N, BN), GROUP_M)
    >>>     acc = tile_gemm(a, b, pid_m, pid_n, M, N, K, sam, sak, sbk, sbn, BM, BN, BK, EVEN_K)
"""

import triton
import triton.language as tl

from ..device import rma, tracing
from ..device.tiles import tile_coords

#: Compute scope ids the ops record (named on the host by ``iris.ops.Ops``); user code
#: tends to use the low scope numbers, so the ops keep clear of them.
SCOPE_GEMM: tl.constexpr = tl.constexpr(8)
SCOPE_REDUCE: tl.constexpr = tl.constexpr(9)


@triton.jit
def tile_gemm(
    a, b, pid_m, pid_n,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
    acc=None, a_rank=None,
    cur_rank=None, heap_bases=None,
):  # fmt: skip
    """fp32 accumulator of tile ``(pid_m, pid_n)`` of ``A (M x K) @ B (K x N)`` (plus ``acc`` if given).

    With ``a_rank``, ``A`` is read from that rank's heap at the address ``a`` has on
    ``cur_rank`` (:func:`iris.load`: traced, and routed across nodes); ``B`` stays local.

    Example:
        >>> acc = tile_gemm(a, b, pid_m, pid_n, M, N, K, K, 1, N, 1, 128, 256, 64, True)
        >>> acc = tile_gemm(a, b2, pid_m, pid_n, M, N, K, K, 1, N, 1, 128, 256, 64, True,
        ...                 acc, peer, cur_rank, heap_bases)   # + the peer's A @ b2
        >>> tl.store(c + offsets, acc.to(tl.bfloat16), mask=mask)
    """
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # Wrapping out-of-range rows and columns onto real ones keeps the K loop free of
    # M/N masks (the store masks them); Triton still sees the contiguity of rn % N
    # whenever N is a multiple of 16, so B loads stay 16-byte vectors.
    ram = rm % M
    rbn = rn % N
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a + ram[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b + rk[:, None] * stride_bk + rbn[None, :] * stride_bn
    if acc is None:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # A full last K step needs no mask, and a load without a mask takes no ``other``.
    pad = None if EVEN_K else 0.0
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a_mask = None
        b_mask = None
        if not EVEN_K:
            k_left = K - k * BLOCK_K
            a_mask = rk[None, :] < k_left
            b_mask = rk[:, None] < k_left
        if a_rank is None:
            tile_a = tl.load(a_ptrs, mask=a_mask, other=pad)
        else:
            tile_a = rma.load(
                a_ptrs, cur_rank, a_rank, heap_bases, mask=a_mask, other=pad, pid_m=pid_m, pid_n=pid_n
            )
        tile_b = tl.load(b_ptrs, mask=b_mask, other=pad)
        acc = tl.dot(tile_a, tile_b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def traced_tile_gemm(
    a, b, pid_m, pid_n,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """:func:`tile_gemm` recorded as a ``gemm tile`` compute scope when tracing is on.

    Example:
        >>> acc = traced_tile_gemm(a, b, pid_m, pid_n, M, N, K, sam, sak, sbk, sbn, heap_bases,
        ...                        128, 256, 64, True)
    """
    started = tracing.trace_begin(heap_bases)
    acc = tile_gemm(
        a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K,
        EVEN_K,
    )  # fmt: skip
    tracing.trace_end(heap_bases, started, SCOPE_GEMM, pid_m, pid_n)
    return acc


@triton.jit
def tile_offsets(pid_m, pid_n, rows, cols, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Element offsets and in-bounds mask of tile ``(pid_m, pid_n)`` in a ``rows x cols`` matrix.

    Example:
        >>> offsets, mask = tile_offsets(pid_m, pid_n, M, N, N, 1, 128, 256)
        >>> tl.store(c + offsets, tile, mask=mask)
    """
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offsets = rm[:, None] * stride_m + rn[None, :] * stride_n
    mask = (rm[:, None] < rows) & (rn[None, :] < cols)
    return offsets, mask


@triton.jit
def compute_tile(
    a, b, out_block, pid_m, pid_n,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    """Compute tile ``(pid_m, pid_n)`` (of ``BLOCK_M x BLOCK_N``) of ``A @ B`` into ``out_block`` (traced).

    Example:
        >>> compute_tile(a, b, block, pid_m, pid_n, M, N, K, K, 1, N, 1, N, 1, heap_bases, 128, 256, 64, True)
    """
    acc = traced_tile_gemm(
        a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, heap_bases,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
    )  # fmt: skip
    offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    tl.store(out_block + offsets, acc.to(out_block.dtype.element_ty), mask=mask)


@triton.jit
def matmul_kernel(
    a, b, c,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, FLATTEN: tl.constexpr = False,
):  # fmt: skip
    """Persistent ``C = A @ B``: program ``p`` of ``P`` computes tiles ``p, p + P, ...``.

    ``heap_bases`` only switches tracing on (compute scopes); ``c`` may be any tensor.
    ``FLATTEN`` lets Triton's pipeliner treat the tile loop and the K loop as one, so
    the next tile's loads overlap this tile's epilogue.

    Example:
        >>> matmul_kernel[(num_sms,)](a, b, c, M, N, K, *a.stride(), *b.stride(), *c.stride(),
        ...                           ctx.get_heap_bases(), 128, 256, 64, 8, K % 64 == 0)
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        compute_tile(
            a, b, c, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
            heap_bases, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
        )  # fmt: skip


@triton.jit
def tile_gemm_tma(
    a_desc, b_desc, pid_m, pid_n, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):
    """fp32 accumulator of tile ``(pid_m, pid_n)``, A and B read through tensor descriptors.

    The descriptors' block shapes are ``[BLOCK_M, BLOCK_K]`` and ``[BLOCK_K, BLOCK_N]``;
    reads past the matrix edges (rows, columns or the last K step) return zeros.

    Example:
        >>> acc = tile_gemm_tma(a_desc, b_desc, pid_m, pid_n, K, 128, 256, 64)
    """
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        tile_a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        tile_b = b_desc.load([k * BLOCK_K, pid_n * BLOCK_N])
        acc = tl.dot(tile_a, tile_b, acc)
    return acc


@triton.jit
def matmul_tma_kernel(
    a_desc, b_desc, c_desc,
    M, N, K,
    heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    FLATTEN: tl.constexpr = False,
):  # fmt: skip
    """Persistent ``C = A @ B`` through tensor descriptors (module docstring); tiles as in ``matmul_kernel``.

    ``c_desc``'s block shape is ``[BLOCK_M, BLOCK_N]``; stores past its edges are dropped.
    :func:`iris.ops.matmul.matmul_launch` builds the descriptors and picks this kernel.

    Example:
        >>> a_desc = TensorDescriptor.from_tensor(a, [128, 64])
        >>> b_desc = TensorDescriptor.from_tensor(b, [64, 256])
        >>> c_desc = TensorDescriptor.from_tensor(c, [128, 256])
        >>> matmul_tma_kernel[(num_sms,)](a_desc, b_desc, c_desc, M, N, K, ctx.get_heap_bases(),
        ...                               128, 256, 64, 8, FLATTEN=True)
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        started = tracing.trace_begin(heap_bases)
        acc = tile_gemm_tma(a_desc, b_desc, pid_m, pid_n, K, BLOCK_M, BLOCK_N, BLOCK_K)
        tracing.trace_end(heap_bases, started, SCOPE_GEMM, pid_m, pid_n)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
