"""Collectives on one tile, called inside a user's kernel: ``ctx.all_reduce_one_shot(tile, ...)``.

:mod:`iris.ccl` runs each collective as a kernel of its own. These run inside the
kernel that computed the data, tile by tile, so the communication of one tile
overlaps the computation of the next. They are the bodies of upstream Iris's
``DeviceContext`` methods of the same names (``all_reduce_atomic``,
``all_reduce_spinlock``, ``all_reduce_one_shot``, ``all_reduce_two_shot``,
``all_reduce_ring``, ``all_gather``, ``gather``, ``all_to_all``, ``reduce_scatter``)
and keep their arguments and protocol:

- **Ready locks.** One-shot, two-shot and reduce-scatter read every peer's
  partial tile from ``src_view``. Before calling, each rank stores its partial
  there and sets its own ``locks[tile_id]`` to 1 with release semantics
  (``tl.atomic_xchg(locks + tile_id, 1, sem="release")`` after a
  ``tl.debug_barrier()``), where ``tile_id = pid_m * cdiv(N, block_n) + pid_n``. The
  collective waits for the peer's lock with :func:`iris.wait_until` on the peer's
  copy (``from_rank=``): the wait is traced, enters the flight recorder when slow
  and obeys the rank's wait timeout, like every other wait. Resetting the locks
  between calls is the caller's job, as upstream.
- **No locks.** ``all_gather``, ``gather`` and ``all_to_all`` only move data, and
  ``all_reduce_ring`` reads every peer's ``src_view`` as it is; the caller orders them
  against the peers' writes (a barrier before the launch, or its own flags).
- **Spinlock.** ``all_reduce_spinlock`` takes each destination's lock with a
  compare-and-swap, adds this rank's tile into the destination, and releases it
  (``iris.device.locks.acquire_lock``/``release_lock``, as the host all-reduce's
  ``spinlock`` variant). While the lock is held it waits for it to look free with the
  same peer-flag wait, so a lock never released times out with the lock named in the
  hang report.

Reductions accumulate floating types in fp32 through the collectives' own
``accumulator`` (:mod:`iris.device.accumulate`); every remote access goes through the traced
device ops, so each appears in a trace as the load, store or atomic it is.
"""

import triton
import triton.language as tl

from .accumulate import accumulator
from .locks import acquire_lock, release_lock


@triton.jit
def tile_id(tile, dst_view):
    """Row-major index of ``tile`` among the tiles covering ``dst_view`` (the lock it uses)."""
    return tile.pid_m * tl.cdiv(dst_view.N, tile.block_n) + tile.pid_n


@triton.jit
def _wait_ready(ctx, locks, index, peer, op: tl.constexpr):
    # Upstream polls with atomic_add(lock, 0); an acquire load of the peer's lock is
    # the same read without a write, and it is the traced, timed wait.
    ctx.wait_until(locks + index, "eq", 1, from_rank=peer, op=op)


@triton.jit
def _reduce_from_peers(ctx, tile, src_view, locks, index, op: tl.constexpr):
    """This rank's ``tile.data`` plus every peer's partial of the tile (after its ready lock)."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    acc = accumulator(tile.data)
    for i in range(1, ctx.world_size):
        peer = (ctx.rank + i) % ctx.world_size
        _wait_ready(ctx, locks, index, peer, op)
        acc += accumulator(ctx.load(src_ptrs, peer, mask=mask))
    return acc.to(tile.data.dtype), mask


@triton.jit
def all_reduce_atomic(ctx, tile, dst_view):
    """Add ``tile.data`` into ``dst_view`` on every rank with atomic adds (zero it first)."""
    dst_ptrs, mask = dst_view.tile_ptr(tile)
    for i in range(ctx.world_size):
        ctx.atomic_add(dst_ptrs, tile.data, (ctx.rank + i) % ctx.world_size, mask=mask)


@triton.jit
def all_reduce_spinlock(ctx, tile, dst_view, locks):
    """Add ``tile.data`` into ``dst_view`` on every rank, one rank at a time under its tile lock."""
    index = tile_id(tile, dst_view)
    dst_ptrs, mask = dst_view.tile_ptr(tile)
    for i in range(ctx.world_size):
        peer = (ctx.rank + i) % ctx.world_size
        acquire_lock(locks + index, ctx.rank, peer, ctx.heap_bases, "iris.ccl.tile.all_reduce_spinlock")
        current = ctx.load(dst_ptrs, peer, mask=mask)
        total = (accumulator(current) + accumulator(tile.data)).to(tile.data.dtype)
        ctx.store(dst_ptrs, total, peer, mask=mask)
        release_lock(locks + index, ctx.rank, peer, ctx.heap_bases)


@triton.jit
def all_reduce_one_shot(ctx, tile, src_view, dst_view, locks):
    """Sum the tile over all ranks into this rank's ``dst_view``, reading every peer's ``src_view``."""
    index = tile_id(tile, dst_view)
    total, mask = _reduce_from_peers(ctx, tile, src_view, locks, index, "iris.ccl.tile.all_reduce_one_shot")
    dst_ptrs, _ = dst_view.tile_ptr(tile)
    tl.store(dst_ptrs, total, mask=mask)


@triton.jit
def all_reduce_two_shot(ctx, tile, src_view, dst_view, locks):
    """The tile's owner (``tile_id % world_size``) sums it and stores the sum on every rank."""
    index = tile_id(tile, dst_view)
    if index % ctx.world_size == ctx.rank:
        total, mask = _reduce_from_peers(
            ctx, tile, src_view, locks, index, "iris.ccl.tile.all_reduce_two_shot"
        )
        dst_ptrs, _ = dst_view.tile_ptr(tile)
        for i in range(ctx.world_size):
            ctx.store(dst_ptrs, total, (ctx.rank + i) % ctx.world_size, mask=mask)


@triton.jit
def all_reduce_ring(ctx, tile, src_view, dst_view):
    """Sum the tile of every rank's ``src_view``, read in ring order, into this rank's ``dst_view``.

    No locks: every rank's ``src_view`` must hold its data when the kernel starts (a
    barrier before the launch), as upstream requires. Upstream follows this with a pass
    that copies the peers' ``dst_view`` tiles without waiting for them to be written;
    every rank holds the whole sum after the first pass, so that racy copy is left out.
    """
    src_ptrs, mask = src_view.tile_ptr(tile)
    own = tl.load(src_ptrs, mask=mask, other=0.0)
    acc = accumulator(own)
    for step in range(1, ctx.world_size):
        peer = (ctx.rank - step + ctx.world_size) % ctx.world_size
        acc += accumulator(ctx.load(src_ptrs, peer, mask=mask))
    dst_ptrs, _ = dst_view.tile_ptr(tile)
    tl.store(dst_ptrs, acc.to(own.dtype), mask=mask)


@triton.jit
def reduce_scatter(ctx, tile, src_view, dst_view, locks):
    """Rank r sums the r-th contiguous share of the tiles into its ``dst_view`` (the last takes the rest)."""
    index = tile_id(tile, dst_view)
    total_tiles = tl.cdiv(dst_view.M, tile.block_m) * tl.cdiv(dst_view.N, tile.block_n)
    share = total_tiles // ctx.world_size
    first = ctx.rank * share
    last = tl.where(ctx.rank == ctx.world_size - 1, total_tiles, first + share)
    if (index >= first) & (index < last):
        total, mask = _reduce_from_peers(ctx, tile, src_view, locks, index, "iris.ccl.tile.reduce_scatter")
        dst_ptrs, _ = dst_view.tile_ptr(tile)
        tl.store(dst_ptrs, total, mask=mask)


@triton.jit
def all_gather(ctx, tile, dst_view, dim: tl.constexpr):
    """Store ``tile.data`` on every rank, at this rank's block of ``dst_view`` along ``dim`` (0 or 1).

    Each rank's block is ``1 / world_size`` of ``dst_view`` along ``dim``; a tile's
    rows (or columns) past its block are masked off, so a partial last tile does not
    spill into the next rank's block (upstream masks only at the whole view's edge).
    """
    rm, rn = tile.indices()
    if dim == 0:
        block = dst_view.M // ctx.world_size
        dst_ptrs, mask = dst_view.offset_tile_ptr(
            tile, offset_m=ctx.rank * block, src_mask=(rm < block)[:, None]
        )
    else:
        block = dst_view.N // ctx.world_size
        dst_ptrs, mask = dst_view.offset_tile_ptr(
            tile, offset_n=ctx.rank * block, src_mask=(rn < block)[None, :]
        )
    for i in range(ctx.world_size):
        ctx.store(dst_ptrs, tile.data, (ctx.rank + i) % ctx.world_size, mask=mask)


@triton.jit
def gather(ctx, tile, src_view, source_rank, hint: tl.constexpr = None):
    """The tile of ``src_view`` as ``source_rank`` holds it (a local load when it is this rank)."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    return ctx.load(src_ptrs, source_rank, mask=mask, other=0, hint=hint)


@triton.jit
def all_to_all(ctx, tile, src_view, dst_view, N_per_rank: tl.constexpr):
    """Fill this rank's output tile from the senders whose ``N_per_rank``-column blocks it spans.

    Output columns ``[s * N_per_rank, (s + 1) * N_per_rank)`` come from rank ``s``'s
    input columns ``[rank * N_per_rank, (rank + 1) * N_per_rank)``, rows unchanged.
    """
    first_col = tile.pid_n * tile.block_n
    rows = tile.pid_m * tile.block_m + tl.arange(0, tile.block_m)
    cols = first_col + tl.arange(0, tile.block_n)
    row_mask = (rows < src_view.M) & (rows < dst_view.M)
    first_sender = first_col // N_per_rank
    last_sender = tl.minimum((first_col + tile.block_n - 1) // N_per_rank, ctx.world_size - 1)
    for sender in range(first_sender, last_sender + 1):
        # Output column c comes from the sender's column c - sender * N + rank * N.
        src_cols = cols - sender * N_per_rank + ctx.rank * N_per_rank
        in_block = (cols >= sender * N_per_rank) & (cols < (sender + 1) * N_per_rank) & (cols < dst_view.N)
        mask = row_mask[:, None] & (in_block & (src_cols < src_view.N))[None, :]
        src_ptrs = src_view.ptr + rows[:, None] * src_view.stride_m + src_cols[None, :] * src_view.stride_n
        values = ctx.load(src_ptrs, sender, mask=mask)
        dst_ptrs = dst_view.ptr + rows[:, None] * dst_view.stride_m + cols[None, :] * dst_view.stride_n
        tl.store(dst_ptrs, values, mask=mask)
