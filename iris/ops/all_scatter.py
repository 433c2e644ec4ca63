"""GEMM + all-scatter, in the four overlap styles of the taxonomy (docs/fused.md).

Every rank computes its block ``C_r = A @ B_r`` of a matrix that every rank
holds whole, and writes the block into every rank's copy at the same place
(``out_block`` is a view of the symmetric ``out``; its pointer is valid on every
heap). The styles differ in who moves the finished tiles and when:

* bulk-synchronous: :func:`iris.ops.gemm.matmul_kernel`, then :func:`all_scatter_kernel`
* fused sequential: :func:`fused_sequential_kernel` stores each tile to every peer itself
* workgroup-specialised: :func:`workgroup_specialized_kernel` with ``ROLE=BOTH``: the
  first ``GEMM_PROGRAMS`` programs compute, the rest push tiles as their flags rise
* producer-consumer: the same kernel launched twice, ``ROLE=PRODUCER`` and
  ``ROLE=CONSUMER``, on two streams

Per-tile flags (one int32 per tile, on the heap) are set to 1 by the computing
program after its tile is stored (``iris.signal``: CTA barrier, then release) and
reset to 0 by the one program that pushes that tile, after its acquire
(``iris.wait_until``). Each flag has exactly one consumer, so every launch leaves
all flags at 0: no host reset between calls, and CUDA graphs can replay it.

Before its first store into a peer's ``out``, a program waits until that peer has
entered the same call (``entry`` flags holding the call's epoch, a device counter
the host bumps before each call): a rank that runs ahead never overwrites an
``out`` that a slower peer is still reading from the previous call.
"""

import triton
import triton.language as tl

from ..device import rma
from .gemm import tile_coords, tile_offsets, traced_tile_gemm

#: Roles of :func:`workgroup_specialized_kernel`.
BOTH: tl.constexpr = tl.constexpr(0)
PRODUCER: tl.constexpr = tl.constexpr(1)
CONSUMER: tl.constexpr = tl.constexpr(2)


@triton.jit
def announce_entry(entry, epoch, cur_rank, world_size, heap_bases):
    """Tell every peer that this rank has entered call ``epoch`` (``entry[cur_rank] = epoch`` there).

    Example:
        >>> if tl.program_id(0) == 0:
        >>>     announce_entry(entry, epoch, rank, world, heap_bases)
    """
    for i in range(1, world_size):
        peer = (cur_rank + i) % world_size
        rma.signal(entry + cur_rank, epoch, cur_rank, peer, heap_bases, op="set")


@triton.jit
def wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases):
    """Wait until every peer has entered call ``epoch`` (see :func:`announce_entry`).

    Example:
        >>> wait_for_peers(entry, epoch, rank, world, heap_bases)
        >>> iris.store(out + offs, tile, rank, peer, heap_bases)
    """
    for i in range(1, world_size):
        peer = (cur_rank + i) % world_size
        rma.wait_until(entry + peer, "ge", epoch, heap_bases=heap_bases)


@triton.jit
def push_tile(
    out_block,
    pid_m,
    pid_n,
    rows,
    cols,
    stride_m,
    stride_n,
    cur_rank,
    world_size,
    heap_bases,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMM_ROWS: tl.constexpr,
):
    """Copy tile ``(pid_m, pid_n)`` of the local ``out_block`` to the same place on every peer.

    Rows go ``COMM_ROWS`` at a time: one load, then a store per peer, so a whole tile
    never has to sit in registers.

    Example:
        >>> push_tile(out_block, pid_m, pid_n, M, N, N, 1, rank, world, heap_bases, 128, 256, 32)
    """
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    for r0 in range(0, BLOCK_M, COMM_ROWS):
        rm = pid_m * BLOCK_M + r0 + tl.arange(0, COMM_ROWS)
        offsets = rm[:, None] * stride_m + rn[None, :] * stride_n
        mask = (rm[:, None] < rows) & (rn[None, :] < cols)
        values = tl.load(out_block + offsets, mask=mask)
        # Start at the next rank so the ranks do not all hit rank 0's links first.
        for i in range(1, world_size):
            peer = (cur_rank + i) % world_size
            rma.store(
                out_block + offsets, values, cur_rank, peer, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n
            )


@triton.jit
def all_scatter_kernel(
    out_block,
    entry,
    epoch_ptr,
    rows,
    cols,
    stride_m,
    stride_n,
    cur_rank,
    world_size,
    heap_bases,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    COMM_ROWS: tl.constexpr,
):
    """The communication kernel of the bulk-synchronous style: push the whole local block.

    Example:
        >>> all_scatter_kernel[(num_sms,)](block, entry, epoch, M, N, *block.stride(), rank, world,
        ...                                ctx.get_heap_bases(), 128, 256, 32)
    """
    epoch = tl.load(epoch_ptr)
    if tl.program_id(0) == 0:
        announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
    wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)
    num_pid_n = tl.cdiv(cols, BLOCK_N)
    total = tl.cdiv(rows, BLOCK_M) * num_pid_n
    for tile_id in range(tl.program_id(0), total, tl.num_programs(0)):
        push_tile(
            out_block,
            tile_id // num_pid_n,
            tile_id % num_pid_n,
            rows,
            cols,
            stride_m,
            stride_n,
            cur_rank,
            world_size,
            heap_bases,
            BLOCK_M,
            BLOCK_N,
            COMM_ROWS,
        )


@triton.jit
def fused_sequential_kernel(
    a,
    b,
    out_block,
    entry,
    epoch_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    cur_rank,
    world_size,
    heap_bases,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """Persistent GEMM whose programs store every finished tile to every rank themselves.

    Example:
        >>> fused_sequential_kernel[(num_sms,)](a, b, block, entry, epoch, M, N, K, *a.stride(),
        ...     *b.stride(), *block.stride(), rank, world, ctx.get_heap_bases(), 128, 256, 64, 8, K % 64 == 0)
    """
    epoch = tl.load(epoch_ptr)
    if tl.program_id(0) == 0:
        announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = traced_tile_gemm(
            a,
            b,
            pid_m,
            pid_n,
            M,
            N,
            K,
            stride_am,
            stride_ak,
            stride_bk,
            stride_bn,
            heap_bases,
            BLOCK_M,
            BLOCK_N,
            BLOCK_K,
            EVEN_K,
        )
        tile = acc.to(out_block.dtype.element_ty)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        tl.store(out_block + offsets, tile, mask=mask)
        # Satisfied at once after the first tile; waiting here, not before the loop,
        # lets the first tile's GEMM hide the handshake.
        wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)
        for i in range(1, world_size):
            peer = (cur_rank + i) % world_size
            rma.store(
                out_block + offsets, tile, cur_rank, peer, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n
            )


@triton.jit
def workgroup_specialized_kernel(
    a,
    b,
    out_block,
    flags,
    entry,
    epoch_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    cur_rank,
    world_size,
    heap_bases,
    GEMM_PROGRAMS,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    COMM_ROWS: tl.constexpr,
    ROLE: tl.constexpr,
):
    """GEMM programs store tiles locally and raise per-tile flags; communication programs push them.

    ``ROLE=BOTH``: programs ``[0, GEMM_PROGRAMS)`` compute and the others communicate
    (communication programs come last because they wait and the computing ones never
    do: a program may only wait for lower-numbered ones, see docs/memory_model.md).
    ``ROLE=PRODUCER`` / ``ROLE=CONSUMER``: every program of the launch has that role
    (the producer-consumer style, two launches on two streams).

    Example:
        >>> workgroup_specialized_kernel[(num_sms,)](a, b, block, flags, entry, epoch, M, N, K, *a.stride(),
        ...     *b.stride(), *block.stride(), rank, world, ctx.get_heap_bases(), num_sms - 16,
        ...     128, 256, 64, 8, K % 64 == 0, 32, 0)
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total = num_pid_m * num_pid_n
    pid = tl.program_id(0)
    epoch = tl.load(epoch_ptr)
    if ROLE != CONSUMER:
        if pid == 0:
            announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
    if ROLE == PRODUCER:
        gemm_programs = tl.num_programs(0)
    elif ROLE == CONSUMER:
        gemm_programs = 0
    else:
        gemm_programs = GEMM_PROGRAMS
    if pid < gemm_programs:
        for tile_id in range(pid, total, gemm_programs):
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            acc = traced_tile_gemm(
                a,
                b,
                pid_m,
                pid_n,
                M,
                N,
                K,
                stride_am,
                stride_ak,
                stride_bk,
                stride_bn,
                heap_bases,
                BLOCK_M,
                BLOCK_N,
                BLOCK_K,
                EVEN_K,
            )
            offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
            tl.store(out_block + offsets, acc.to(out_block.dtype.element_ty), mask=mask)
            # Only this GPU reads the flag, so GPU scope is enough for the release.
            rma.signal(
                flags + tile_id,
                1,
                cur_rank,
                cur_rank,
                heap_bases,
                op="set",
                scope="gpu",
                pid_m=pid_m,
                pid_n=pid_n,
            )
    else:
        comm_programs = tl.num_programs(0) - gemm_programs
        wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)
        # Tiles in the order the GEMM programs finish them (tile t is done in round t // GEMM_PROGRAMS).
        for tile_id in range(pid - gemm_programs, total, comm_programs):
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            rma.wait_until(
                flags + tile_id, "ge", 1, scope="gpu", heap_bases=heap_bases, pid_m=pid_m, pid_n=pid_n
            )
            # This program is the flag's only reader: clearing it readies the next launch.
            tl.atomic_xchg(flags + tile_id, 0, sem="relaxed", scope="gpu")
            push_tile(
                out_block,
                pid_m,
                pid_n,
                M,
                N,
                stride_cm,
                stride_cn,
                cur_rank,
                world_size,
                heap_bases,
                BLOCK_M,
                BLOCK_N,
                COMM_ROWS,
            )
