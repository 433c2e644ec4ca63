"""All-gather + GEMM, workgroup-specialised: the kernel behind ``all_gather_matmul``.

Each rank holds a row shard ``A_r`` (``rows x K``). The first ``COMM_PROGRAMS``
programs push this rank's shard, ``BLOCK_M`` rows at a time, into every peer's
gather buffer and raise the matching flag there (a row block goes in ``PARTS``
slices of ``K``, each with its own flag, so that few row blocks still keep every
pusher busy); the other programs compute the
output tile by tile, own shard first (read in place, nothing to wait for), then
each peer's row blocks as their flags rise.

A flag is read by every tile of its row block, so no single reader may clear
it. Flags therefore hold the call's *epoch* instead: a device counter the host
bumps (``epoch.add_(1)``, queued on the stream, so CUDA graphs replay it) before
every launch; a flag counts as raised once it reaches the current epoch. Flags
only grow, so they never need a reset.
"""

import triton
import triton.language as tl

from ..device import rma
from .gemm import tile_coords, tile_offsets, traced_tile_gemm


@triton.jit
def all_gather_matmul_kernel(
    a_shard, gathered, b, out, flags, epoch_ptr,
    rows, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    COMM_PROGRAMS, PARTS,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, COMM_K: tl.constexpr,
):  # fmt: skip
    """``out = all_gather(a_shard) @ b``; ``a_shard`` and ``gathered`` share strides.

    Example:
        >>> all_gather_matmul_kernel[(num_sms,)](a, gathered, b, out, flags, epoch, M, N, K,
        ...     *a.stride(), *b.stride(), *out.stride(), rank, world, ctx.get_heap_bases(), 16, 1,
        ...     128, 256, 64, 8, K % 64 == 0, 64)
    """
    epoch = tl.load(epoch_ptr)
    chunks = tl.cdiv(rows, BLOCK_M)
    pid = tl.program_id(0)
    if pid < COMM_PROGRAMS:
        # Pushers come first: the computing programs wait for them, never the other way round.
        # Work unit = (chunk, peer, part of K), chunk-major (the order the GEMM needs
        # them), so that every pusher has work even when there are few chunks.
        rk = tl.arange(0, COMM_K)
        k_steps = tl.cdiv(tl.cdiv(K, COMM_K), PARTS) * COMM_K
        per_chunk = (world_size - 1) * PARTS
        for u in range(pid, chunks * per_chunk, COMM_PROGRAMS):
            c = u // per_chunk
            peer = (cur_rank + 1 + (u % per_chunk) // PARTS) % world_size
            part = u % PARTS
            rm = c * BLOCK_M + tl.arange(0, BLOCK_M)
            for k0 in range(part * k_steps, tl.minimum(K, (part + 1) * k_steps), COMM_K):
                mask = (rm[:, None] < rows) & ((k0 + rk)[None, :] < K)
                src = rm[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak
                dst = (cur_rank * rows + rm)[:, None] * stride_am + (k0 + rk)[None, :] * stride_ak
                rma.put(a_shard + src, gathered + dst, cur_rank, peer, heap_bases, mask=mask, pid_m=c)
            rma.signal(
                flags + (cur_rank * chunks + c) * PARTS + part,
                epoch,
                cur_rank,
                peer,
                heap_bases,
                op="set",
                pid_m=c,
            )
    else:
        gemm_programs = tl.num_programs(0) - COMM_PROGRAMS
        tiles_n = tl.cdiv(N, BLOCK_N)
        per_shard = chunks * tiles_n
        for g in range(pid - COMM_PROGRAMS, world_size * per_shard, gemm_programs):
            # Own shard first; then rank - 1, rank - 2, ...: the order in which pushes arrive.
            source = (cur_rank + world_size - g // per_shard) % world_size
            pid_m, pid_n = tile_coords(g % per_shard, chunks, tiles_n, GROUP_M)
            if source == cur_rank:
                a_rows = a_shard
            else:
                for part in range(PARTS):
                    rma.wait_until(
                        flags + (source * chunks + pid_m) * PARTS + part,
                        "ge",
                        epoch,
                        heap_bases=heap_bases,
                        pid_m=pid_m,
                        pid_n=pid_n,
                    )
                a_rows = gathered + source * rows * stride_am
            acc = traced_tile_gemm(
                a_rows, b, pid_m, pid_n, rows, N, K, stride_am, stride_ak, stride_bk, stride_bn, heap_bases,
                BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
            )  # fmt: skip
            offsets, mask = tile_offsets(pid_m, pid_n, rows, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
            tl.store(out + source * rows * stride_cm + offsets, acc.to(out.dtype.element_ty), mask=mask)
