"""Tile-level collective building blocks that any Triton kernel can call.

Every collective in :mod:`iris.ccl` is a persistent kernel whose programs run the
same three steps on their share of the tiles:

1. :func:`arrive` + :func:`wait_arrivals` on the *ready* row (:func:`handshake`): every member has
   started this call, so its inputs are written and its output may be overwritten;
2. move data with :func:`push_tile` (store to every member) or
   :func:`reduce_tile` (load from every member and combine);
3. :func:`arrive` + :func:`wait_arrivals` on the *done* row: nobody touches this
   rank's buffers any more, so the kernel may end.

Flags are monotone counters, one per (program, source rank) on each rank's heap:
the epoch of a call is this rank's own count plus one, so no host epoch is
passed in and the kernels replay unchanged under CUDA graphs. Program ``p`` of
every member handles the same tiles, so it only waits for program ``p`` of the
others.

Example (a user kernel that all-gathers one tile per program)::

    @triton.jit
    def my_all_gather(out, inp, n, flags, ranks, my_index, cur_rank, world_size, heap_bases,
                      GROUP: tl.constexpr, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        ready = flags + pid * world_size
        epoch = ccl.arrive(ready, cur_rank, ranks, GROUP, heap_bases)
        ccl.wait_arrivals(ready, epoch, cur_rank, ranks, GROUP, heap_bases)
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        values = tl.load(inp + offs, mask=offs < n)
        ccl.push_tile(out + my_index * n + offs, values, cur_rank, ranks, my_index, GROUP,
                      heap_bases, offs < n)
        ...  # arrive/wait on a done row before returning
"""

import triton
import triton.language as tl

from ..device import rma
from ..device.accumulate import accumulator, combine
from ..device.barrier import arrive, sync_row, wait_arrivals
from ..device.locks import acquire_lock, release_lock

__all__ = [
    "arrive", "wait_arrivals", "sync_row", "handshake", "push_tile", "combine", "accumulator", "reduce_tile",
    "flag_row",
    "acquire_lock", "release_lock",
    "READY", "DONE", "STEPS", "ARRIVED", "LANDED", "LOCKS", "PHASES", "RANK_ARGS",
]  # fmt: skip

#: Kernel arguments that differ between ranks. Not specialising them (Triton would
#: turn a 1 into a constant) gives every rank the same compiled kernel.
RANK_ARGS = ["my_index", "cur_rank"]

#: A group's flag rows (``flag_row``'s ``phase``): ready, done, the ring's step counters,
#: the pushed protocol's arrivals and landed results (:mod:`iris.ccl.pushed`), and the
#: spinlock all-reduce's locks (the first word of a program's row).
READY: tl.constexpr = tl.constexpr(0)
DONE: tl.constexpr = tl.constexpr(1)
STEPS: tl.constexpr = tl.constexpr(2)
ARRIVED: tl.constexpr = tl.constexpr(3)
LANDED: tl.constexpr = tl.constexpr(4)
LOCKS: tl.constexpr = tl.constexpr(5)
#: Number of flag rows per program (the host reserves them: ``Runtime.flag_piece``).
PHASES = 6


@triton.jit
def handshake(flags, phase, pid, max_programs, world_size, cur_rank, ranks, GROUP: tl.constexpr, heap_bases):
    """:func:`sync_row` on program ``pid``'s row of ``phase``: steps 1 and 3 of every collective.

    Example:
        >>> ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    """
    return sync_row(flag_row(flags, phase, pid, max_programs, world_size), cur_rank, ranks, GROUP, heap_bases)


@triton.jit
def push_tile(dst, values, cur_rank, ranks, my_index, GROUP: tl.constexpr, heap_bases, mask=None):
    """Store ``values`` at ``dst`` on every member of the group (this rank included).

    Members are visited starting after this rank so that concurrent pushes spread
    over different links.

    Example:
        >>> ccl.push_tile(out + my_index * n + offs, vals, cur_rank, ranks, my_index, GROUP,
        ...               heap_bases, offs < n)
    """
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + (my_index + i) % GROUP)
        rma.store(dst, values, cur_rank, peer, heap_bases, mask=mask)


@triton.jit
def exchange_unit(unit, my_index, tiles_n, GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(member, first row, first column)`` of all-to-all work unit ``unit``: tile ``unit // GROUP``
    (of ``tiles_n`` a row) of the block for member ``(my_index + unit) % GROUP``, so consecutive
    units go to different members. The Triton and Gluon all-to-all kernels share it.

    Example:
        >>> target, row0, col0 = ccl.exchange_unit(unit, my_index, tl.cdiv(cols, 64), GROUP, 64, 64)
    """
    tile = unit // GROUP
    return (my_index + unit % GROUP) % GROUP, (tile // tiles_n) * BLOCK_M, (tile % tiles_n) * BLOCK_N


@triton.jit
def exchange_tile(
    out, inp, r, c, rows, cols, in_stride, out_stride, target, my_index, cur_rank, ranks, heap_bases
):
    """Send elements ``(r, c)`` of block ``target`` of ``inp`` into block ``my_index`` of member
    ``target``'s ``out``: both hold ``GROUP`` blocks of ``rows x cols`` side by side (row strides
    ``in_stride``, ``out_stride``). ``r`` and ``c`` broadcast to a tile, with any layout.

    Example:
        >>> ccl.exchange_tile(out, inp, r, c, rows, cols, inp_stride, out_stride, target, my_index,
        ...                   cur_rank, ranks, heap_bases)
    """
    mask = (r < rows) & (c < cols)
    row64 = r.to(tl.int64)
    values = tl.load(inp + row64 * in_stride + (target * cols + c), mask=mask)
    peer = tl.load(ranks + target)
    rma.store(out + row64 * out_stride + (my_index * cols + c), values, cur_rank, peer, heap_bases, mask=mask)


@triton.jit
def reduce_tile(
    src,
    cur_rank,
    ranks,
    my_index,
    GROUP: tl.constexpr,
    heap_bases,
    mask=None,
    OP: tl.constexpr = tl.constexpr("sum"),
):
    """Combine ``src`` over every member of the group; floats accumulate in fp32.

    Returns the result in fp32 for floating inputs and in the input type otherwise.

    Example:
        >>> total = ccl.reduce_tile(inp + offs, cur_rank, ranks, my_index, GROUP, heap_bases, offs < n)
        >>> tl.store(out + offs, total.to(out.dtype.element_ty), mask=offs < n)
    """
    # Issue every member's load before combining so the remote reads overlap.
    acc = accumulator(rma.load(src, cur_rank, tl.load(ranks + my_index), heap_bases, mask=mask))
    for i in tl.static_range(1, GROUP):
        peer = tl.load(ranks + (my_index + i) % GROUP)
        acc = combine(acc, accumulator(rma.load(src, cur_rank, peer, heap_bases, mask=mask)), OP)
    return acc


@triton.jit
def flag_row(flags, phase, pid, max_programs, world_size):
    """Program ``pid``'s row of ``phase`` (:data:`READY`, :data:`DONE`, ...) in a group's flags."""
    return flags + (phase * max_programs + pid) * world_size
