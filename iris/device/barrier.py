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

Traced, each half keeps its records (a signal per member, then a wait per member) in a
register stash and writes them with one slot claim once its last signal has left or its
last wait has passed (``iris.device.tracing.stash``). A record written as each op
happens claims its slot with an atomic whose reply the program waits for: in a barrier
that put two round trips per member between one signal and the next and between one
wait and the next, on the path every rank waits for (a synchronous ``ctx.ops`` call ends
with ``Iris.device_barrier``). A barrier that times out leaves the records of its half
unwritten; the flight recorder, which records as it goes, still has them.
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from . import rma, tracing


@constexpr_function
def _stash_rows(group):
    # Room for one record per other member (a power of two, at most 32 held at once).
    rows = 1
    while rows < group - 1 and rows < 32:
        rows *= 2
    return rows


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
    held, count = tracing.stash_new(heap_bases, _stash_rows(GROUP))
    plain = tracing.untraced(heap_bases)
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + i)
        if peer != cur_rank:
            began = tracing.begin(heap_bases)
            rma.signal(row + cur_rank, 1, cur_rank, peer, plain, op="add", sem="relaxed")
            held, count = tracing.stash_room(heap_bases, held, count, 1)
            held, count = tracing.stash(
                heap_bases, held, count, began, tracing.SIGNAL, peer, row + cur_rank, value=1,
                path=rma.path_between(heap_bases, cur_rank, peer),
            )  # fmt: skip
    tracing.stash_write(heap_bases, held, count)
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
    held, count = tracing.stash_new(heap_bases, _stash_rows(GROUP))
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + i)
        # Never spin on our own slot: its plain store may legally sink below the
        # spin loop, and it is already known to hold ``epoch``.
        if peer != cur_rank:
            began = tracing.begin(heap_bases)
            seen = rma.wait_until(row + peer, "ge", epoch, heap_bases=tracing.untraced(heap_bases), op=op)
            held, count = tracing.stash_room(heap_bases, held, count, 1)
            held, count = tracing.stash(
                heap_bases, held, count, began, tracing.wait_event(op), cur_rank, row + peer, value=seen
            )
    tracing.stash_write(heap_bases, held, count)


@triton.jit(do_not_specialize=["cur_rank"])
def device_barrier_kernel(arrivals, heap_bases, member_ranks, cur_rank, GROUP: tl.constexpr):
    """One program: arrive at ``arrivals`` on every member, then wait for all of them.

    Example:
        >>> device_barrier_kernel[(1,)](arrivals, heap_bases, ranks, rank, GROUP=world)
    """
    epoch = arrive(arrivals, cur_rank, member_ranks, GROUP, heap_bases)
    wait_arrivals(arrivals, epoch, cur_rank, member_ranks, GROUP, heap_bases, op="iris.device_barrier")
