"""Barriers across ranks run by kernels, with no host involvement (CUDA-graph capturable).

Each member keeps, in a *row* of counters on its heap, one arrival counter per
rank. Arriving means adding 1 to *my* counter in every member's row; my own
copy's new value is the epoch, and the barrier is passed once every member's
counter in my row has reached it. The counters only grow, so no host-side epoch
is ever needed and replays of a captured graph keep working.

:func:`arrive` and :func:`wait_arrivals` are the two halves, for kernels (the
collectives of :mod:`iris.ccl` use one row per program); :func:`device_barrier_kernel`
is ``Iris.device_barrier``. Waits carry an ``op`` name, so a barrier some member
never reaches times out (``Iris.set_wait_timeout``) with a report naming that member.
"""

import triton
import triton.language as tl

from . import rma


@triton.jit
def arrive(row, cur_rank, ranks, GROUP: tl.constexpr, heap_bases):
    """Count this program's arrival at ``row[cur_rank]`` on every member; returns the epoch.

    ``row`` is a ``world_size``-long counter row at the same heap offset on every
    member; ``ranks`` holds the ``GROUP`` member ranks. The epoch is how many times
    this rank has arrived at this row, including now. Everything this program (and
    every kernel before it on the stream) wrote is visible to a member that sees
    the arrival.

    Example:
        >>> epoch = arrive(flags + pid * world_size, cur_rank, ranks, GROUP, heap_bases)
    """
    # Only this rank ever writes its own slot on its own heap, so a plain
    # read-increment-write is enough there; peers get a remote add.
    epoch = tl.load(row + cur_rank, volatile=True) + 1
    # Every warp reads the old count before one thread writes the new one; a warp
    # reading late would otherwise wait for an epoch that never comes.
    tl.debug_barrier()
    tl.store(row + cur_rank, epoch)
    # One system fence for all peers, then relaxed adds: a release add per peer would
    # wait for the previous peer's round trip before leaving.
    rma.fence()
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + i)
        if peer != cur_rank:
            rma.signal(row + cur_rank, 1, cur_rank, peer, heap_bases, op="add", sem="relaxed")
    return epoch


@triton.jit
def wait_arrivals(
    row,
    epoch,
    cur_rank,
    ranks,
    GROUP: tl.constexpr,
    heap_bases,
    op: tl.constexpr = tl.constexpr("iris.wait_arrivals"),
):
    """Wait until every member has arrived ``epoch`` times at its slot of ``row`` on this rank.

    Example:
        >>> wait_arrivals(flags + pid * world_size, epoch, cur_rank, ranks, GROUP, heap_bases)
    """
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + i)
        # Never spin on our own slot: its plain store may legally sink below the
        # spin loop, and it is already known to hold ``epoch``.
        if peer != cur_rank:
            rma.wait_until(row + peer, "ge", epoch, heap_bases=heap_bases, op=op)


@triton.jit(do_not_specialize=["cur_rank"])
def device_barrier_kernel(arrivals, heap_bases, member_ranks, cur_rank, GROUP: tl.constexpr):
    """One program: arrive at ``arrivals`` on every member, then wait for all of them.

    Example:
        >>> device_barrier_kernel[(1,)](arrivals, heap_bases, ranks, rank, GROUP=world)
    """
    epoch = arrive(arrivals, cur_rank, member_ranks, GROUP, heap_bases)
    wait_arrivals(arrivals, epoch, cur_rank, member_ranks, GROUP, heap_bases, op="iris.device_barrier")
