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

Traced, the barrier records a signal per other member, then a wait per other member.
Their trace slots are reserved before the first signal leaves, with one atomic from
thread 0 whose reply nothing reads until the first record is written
(``iris.device.tracing.reserve``): the system fence before the signals hides its round
trip, and each record then goes out as its op ends, with stores nobody waits for. A
record that claims its own slot makes its program wait for that atomic's reply: in a
barrier, on the path every rank waits for (a synchronous ``ctx.ops`` call ends with
``Iris.device_barrier``), claims cost the traced barrier about 2 us on four GPUs. A
barrier that times out has written the records of the ops that ended before it.
"""

import triton
import triton.language as tl

from . import rma, tracing


@triton.jit
def arrive(row, cur_rank, ranks, GROUP: tl.constexpr, heap_bases):
    """Count this program's arrival at ``row[cur_rank]`` on every member; returns the epoch.

    ``row`` is a ``world_size``-long counter row at the same heap offset on every
    member; ``ranks`` holds the ``GROUP`` member ranks, ``cur_rank`` among them. The
    epoch is how many times this rank has arrived at this row, including now.
    Everything this program (and every kernel before it on the stream) wrote is
    visible to a member that sees the arrival. Traced, each signal is recorded.

    Example:
        >>> epoch = arrive(flags + pid * world_size, cur_rank, ranks, GROUP, heap_bases)
    """
    epoch, _, _ = _arrive(row, cur_rank, ranks, GROUP, heap_bases, 1)
    return epoch


@triton.jit
def _arrive(row, cur_rank, ranks, GROUP: tl.constexpr, heap_bases, HALVES: tl.constexpr):
    # arrive, reserving the trace slots of HALVES halves once the epoch's load is issued
    # (the reservation's loads and atomic then overlap that load's round trip); returns
    # the epoch and the reservation (first slot, region), whose first GROUP - 1 slots
    # hold the signals' records.
    # Only this rank ever writes its own slot on its own heap, so a plain
    # read-increment-write is enough there; peers get a remote add.
    epoch = tl.load(row + cur_rank, volatile=True) + 1
    first, region = tracing.reserve_if_recording(heap_bases, HALVES * (GROUP - 1))
    # Every warp reads the old count before one thread writes the new one; a warp
    # reading late would otherwise wait for an epoch that never comes.
    tl.debug_barrier()
    tl.store(row + cur_rank, epoch)
    # One system fence for all peers, then relaxed adds: a release add per peer would
    # wait for the previous peer's round trip before leaving.
    rma.fence()
    plain = tracing.untraced(heap_bases)
    index = cur_rank * 0  # the next slot of the reservation (a run-time zero: Gluon kernels call this too)
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + i)
        if peer != cur_rank:
            began = tracing.begin(heap_bases)
            rma.signal(row + cur_rank, 1, cur_rank, peer, plain, op="add", sem="relaxed")
            tracing.write_reserved(
                heap_bases, (first, region), index, began, tracing.SIGNAL, peer, row + cur_rank, value=1,
                path=rma.path_between(heap_bases, cur_rank, peer), sub=tracing.SIGNAL_ADD,
            )  # fmt: skip
            index += 1
    return epoch, first, region


@triton.jit
def wait_arrivals(
    row,
    epoch,
    cur_rank,
    ranks,
    GROUP: tl.constexpr,
    heap_bases,
    op: tl.constexpr = tl.constexpr("iris.wait_arrivals"),
    reservation=None,
):
    """Wait until every member has arrived ``epoch`` times at its slot of ``row`` on this rank.

    ``ranks`` holds the ``GROUP`` member ranks, ``cur_rank`` among them. Traced, each
    wait is recorded, into the first ``GROUP - 1`` slots of ``reservation`` if given (a
    :func:`iris.device.tracing.reserve` reservation; without one it reserves its own).

    Example:
        >>> wait_arrivals(flags + pid * world_size, epoch, cur_rank, ranks, GROUP, heap_bases)
    """
    if reservation is None:
        reservation = tracing.reserve_if_recording(heap_bases, GROUP - 1)
    plain = tracing.untraced(heap_bases)
    index = cur_rank * 0  # the next slot of the reservation (a run-time zero: Gluon kernels call this too)
    for i in tl.static_range(GROUP):
        peer = tl.load(ranks + i)
        # Never spin on our own slot: its plain store may legally sink below the
        # spin loop, and it is already known to hold ``epoch``.
        if peer != cur_rank:
            began = tracing.begin(heap_bases)
            seen = rma.wait_until(row + peer, "ge", epoch, heap_bases=plain, op=op)
            tracing.write_reserved(
                heap_bases, reservation, index, began, tracing.wait_event(op), cur_rank, row + peer,
                value=seen,
            )  # fmt: skip
            index += 1


@triton.jit
def sync_row(
    row, cur_rank, ranks, GROUP: tl.constexpr, heap_bases,
    op: tl.constexpr = tl.constexpr("iris.wait_arrivals"),
):  # fmt: skip
    """:func:`arrive` then :func:`wait_arrivals` on ``row``: a barrier of this program across the group.

    Returns the epoch. Traced, both halves' slots are reserved before the arrival, so
    no record waits for a slot claim.

    Example:
        >>> epoch = sync_row(ready_row, cur_rank, ranks, GROUP, heap_bases)
    """
    epoch, first, region = _arrive(row, cur_rank, ranks, GROUP, heap_bases, 2)
    wait_arrivals(row, epoch, cur_rank, ranks, GROUP, heap_bases, op, (first + (GROUP - 1), region))
    return epoch


@triton.jit(do_not_specialize=["cur_rank"])
def device_barrier_kernel(arrivals, heap_bases, member_ranks, cur_rank, GROUP: tl.constexpr):
    """One program: arrive at ``arrivals`` on every member, then wait for all of them.

    Example:
        >>> device_barrier_kernel[(1,)](arrivals, heap_bases, ranks, rank, GROUP=world)
    """
    sync_row(arrivals, cur_rank, member_ranks, GROUP, heap_bases, "iris.device_barrier")
