"""GEMM + reduction across ranks, workgroup-specialised: the kernel behind
``matmul_all_reduce`` and ``matmul_reduce_scatter``.

Every rank computes partial tiles of ``A_r @ B_r`` into a partial buffer on its
own heap. Each tile has an owner rank; the computing program adds 1 to the
owner's arrival counter for that tile (``iris.signal(op="add")``: CTA barrier,
then release at system scope). The owner's reduction programs wait until the
counter reaches ``world_size``, pull the partial tile from every rank, sum in
fp32 and store the result: to every rank (all-reduce, the two-shot algorithm)
or to the owner's output only (reduce-scatter, owner = row block).

A reduction program then subtracts ``world_size`` from the counter instead of
zeroing it, so an arrival from a rank that has already started the next call is
never lost; counters return to 0 after every call (no host reset, graph-safe).
"""

import triton
import triton.language as tl

from ..device import rma
from .gemm import tile_coords, traced_tile_gemm


@triton.jit
def _tile_of(g, cur_rank, world_size, tiles_m, tiles_n, GROUP_M: tl.constexpr, SCATTER: tl.constexpr):
    # (owner, counter index, pid_m, pid_n) of global tile g. Owners interleave
    # (g % world_size) so every owner gets finished tiles from the start of the GEMM.
    owner = g % world_size
    if SCATTER:
        index = g // world_size
    else:
        index = g
    pid_m, pid_n = tile_coords(index, tiles_m, tiles_n, GROUP_M)
    return owner, index, pid_m, pid_n


@triton.jit
def gemm_reduce_kernel(
    a, b, partial, out, counters,
    rows, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_pm, stride_pn, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    GEMM_PROGRAMS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, COMM_ROWS: tl.constexpr, SCATTER: tl.constexpr,
):  # fmt: skip
    """Programs ``[0, GEMM_PROGRAMS)`` compute partial tiles; the others reduce the tiles this rank owns.

    All-reduce (``SCATTER=False``): ``a`` is ``rows x K``, ``partial`` and ``out`` are
    ``rows x N``; tile ``g`` is owned by rank ``g % world_size``. Reduce-scatter
    (``SCATTER=True``): ``a`` and ``partial`` have ``world_size * rows`` rows, ``out``
    has ``rows``; row block ``r`` is owned by rank ``r``.

    Example:
        >>> gemm_reduce_kernel[(num_sms,)](a, b, partial, out, counters, M, N, K, *a.stride(),
        ...     *b.stride(), *partial.stride(), *out.stride(), rank, world, ctx.get_heap_bases(),
        ...     num_sms - 16, 128, 256, 64, 8, K % 64 == 0, 32, False)
    """
    tiles_m = tl.cdiv(rows, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if SCATTER:
        total = tiles_m * tiles_n * world_size
    else:
        total = tiles_m * tiles_n
    pid = tl.program_id(0)
    if pid < GEMM_PROGRAMS:
        for g in range(pid, total, GEMM_PROGRAMS):
            owner, index, pid_m, pid_n = _tile_of(g, cur_rank, world_size, tiles_m, tiles_n, GROUP_M, SCATTER)
            if SCATTER:
                row0 = owner * rows
            else:
                row0 = 0
            acc = traced_tile_gemm(
                a + row0 * stride_am, b, pid_m, pid_n, rows, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                heap_bases, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
            )  # fmt: skip
            rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            offsets = (row0 + rm)[:, None] * stride_pm + rn[None, :] * stride_pn
            mask = (rm[:, None] < rows) & (rn[None, :] < N)
            tl.store(partial + offsets, acc.to(partial.dtype.element_ty), mask=mask)
            rma.signal(counters + index, 1, cur_rank, owner, heap_bases, op="add", pid_m=pid_m, pid_n=pid_n)
    else:
        comm_programs = tl.num_programs(0) - GEMM_PROGRAMS
        if SCATTER:
            owned = tiles_m * tiles_n
            row0 = cur_rank * rows
        else:
            owned = tl.cdiv(total - cur_rank, world_size)
            row0 = 0
        for j in range(pid - GEMM_PROGRAMS, owned, comm_programs):
            g = j * world_size + cur_rank
            owner, index, pid_m, pid_n = _tile_of(g, cur_rank, world_size, tiles_m, tiles_n, GROUP_M, SCATTER)
            rma.wait_until(
                counters + index, "ge", world_size, heap_bases=heap_bases, pid_m=pid_m, pid_n=pid_n
            )
            tl.atomic_add(counters + index, -world_size, sem="relaxed", scope="sys")
            rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            for r0 in range(0, BLOCK_M, COMM_ROWS):
                rm = pid_m * BLOCK_M + r0 + tl.arange(0, COMM_ROWS)
                mask = (rm[:, None] < rows) & (rn[None, :] < N)
                p_offsets = (row0 + rm)[:, None] * stride_pm + rn[None, :] * stride_pn
                total_tile = tl.load(partial + p_offsets, mask=mask, other=0.0).to(tl.float32)
                for i in range(1, world_size):
                    peer = (cur_rank + i) % world_size
                    theirs = rma.load(
                        partial + p_offsets, cur_rank, peer, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n
                    )
                    total_tile += theirs.to(tl.float32)
                result = total_tile.to(out.dtype.element_ty)
                c_offsets = rm[:, None] * stride_cm + rn[None, :] * stride_cn
                tl.store(out + c_offsets, result, mask=mask)
                if not SCATTER:
                    for i in range(1, world_size):
                        peer = (cur_rank + i) % world_size
                        rma.store(
                            out + c_offsets,
                            result,
                            cur_rank,
                            peer,
                            heap_bases,
                            mask=mask,
                            pid_m=pid_m,
                            pid_n=pid_n,
                        )
