"""The context tensor's layout: where every slot is, for the host and for kernels.

Each rank hands its kernels one int64 tensor (``Iris.get_device_context()``) that holds
everything a device op needs to know about the job::

    [cur_rank, world_size, heap_base_0 .. heap_base_{n-1},
     <TRACING_SLOTS tracing slots>, <FLIGHT_SLOTS flight-recorder slots>, heap_size,
     ranks_per_node, <STAGING_SLOTS cross-node staging slots>]

The functional API's ``heap_bases`` (``Iris.get_heap_bases()``) is a view of the
``heap_base_*`` slots, so every other slot is reachable from it: the rank two slots
before it, the world size one before, the tracing slots ``world_size`` after it, then
the flight slots, the heap size, the ranks per node (rank ``r`` is on node
``r // ranks_per_node``) and the cross-node staging area (:mod:`iris.device.crossnode`;
zero in single-node jobs). The tracing slots come first after the heap bases, their
switch and event budget first among them, because upstream Iris's context tensor has
them there (``trace_enabled`` at ``2 + world_size``, ``max_events`` after it) and
upstream's programs read them by position. The host builds and fills the tensor
through the functions below and kernels read it through the accessors below; no
other module counts slots.

The tracing slots' contents are part of the trace format (``iris_trace.schema``:
``SLOT_*``); the flight recorder's are ``iris.device.flight.SLOT_*``.

Example:
    >>> @triton.jit
    >>> def kernel(buf, heap_bases):
    >>>     rank = layout.cur_rank(heap_bases)
    >>>     peer = (rank + 1) % layout.world_size(heap_bases)
"""

import triton
import triton.language as tl

from iris_trace import schema

from ..config import CROSS_NODE_ALWAYS as _CROSS_NODE_ALWAYS
from . import intrinsics as hw

#: Slots before the heap bases: this rank, then the world size.
RANK_SLOT = 0
WORLD_SIZE_SLOT = 1
HEADER_SLOTS = 2
#: Slots of the tracing state (``iris_trace.schema.SLOT_*``), zero while tracing was never enabled.
TRACING_SLOTS = schema.TRACING_SLOTS
#: Slots of wait timeouts and the flight recorder (``iris.device.flight.SLOT_*``).
FLIGHT_SLOTS = 7
#: Slots after the flight slots: the heap size (``IRIS_DEBUG``'s bound), the ranks per node.
HEAP_SIZE_SLOT, RANKS_PER_NODE_SLOT = 0, 1
TAIL_SLOTS = 2
#: Slots of the cross-node staging area: its address, its claim flags' address and how many
#: slots it has (``STAGING_*`` below; the bytes of each are a constant,
#: ``iris.device.crossnode.STAGING_SLOT_BYTES``).
STAGING_SLOTS = 3
STAGING_AREA, STAGING_FLAGS, STAGING_COUNT = range(STAGING_SLOTS)

# Constexpr copies for kernels: slots before heap_bases, counted back from it.
_HEADER: tl.constexpr = tl.constexpr(HEADER_SLOTS)
_RANK_BACK: tl.constexpr = tl.constexpr(HEADER_SLOTS - RANK_SLOT)
_WORLD_SIZE_BACK: tl.constexpr = tl.constexpr(HEADER_SLOTS - WORLD_SIZE_SLOT)
_TRACING_SLOTS: tl.constexpr = tl.constexpr(TRACING_SLOTS)
_SLOT_ENABLED: tl.constexpr = tl.constexpr(schema.SLOT_ENABLED)
_FLIGHT_SLOTS: tl.constexpr = tl.constexpr(FLIGHT_SLOTS)
_HEAP_SIZE_SLOT: tl.constexpr = tl.constexpr(HEAP_SIZE_SLOT)
_RANKS_PER_NODE_SLOT: tl.constexpr = tl.constexpr(RANKS_PER_NODE_SLOT)
_TAIL_SLOTS: tl.constexpr = tl.constexpr(TAIL_SLOTS)
_STAGING_AREA: tl.constexpr = tl.constexpr(STAGING_AREA)
_STAGING_FLAGS: tl.constexpr = tl.constexpr(STAGING_FLAGS)
_STAGING_COUNT: tl.constexpr = tl.constexpr(STAGING_COUNT)
CROSS_NODE_ALWAYS: tl.constexpr = tl.constexpr(_CROSS_NODE_ALWAYS)


# ---------------------------------------------------------------- host side
def context_length(world_size: int) -> int:
    """Number of int64 slots in the context tensor of a ``world_size``-rank job.

    Example:
        >>> context = torch.zeros(layout.context_length(4), dtype=torch.int64)
    """
    return staging_slot(world_size, STAGING_SLOTS - 1) + 1


def heap_bases_slots(world_size: int) -> slice:
    """The context slots ``heap_bases`` views: one heap base per rank.

    Example:
        >>> heap_bases = context[layout.heap_bases_slots(4)].view(torch.uint64)
    """
    return slice(HEADER_SLOTS, HEADER_SLOTS + world_size)


def heap_size_slot(world_size: int) -> int:
    """Index in the context tensor of the heap size (the bytes ``IRIS_DEBUG``'s bounds check allows).

    Example:
        >>> context[layout.heap_size_slot(4)]
        tensor(1073741824)
    """
    return flight_slot(world_size, FLIGHT_SLOTS + HEAP_SIZE_SLOT)


def tracing_slot(world_size: int, slot: int) -> int:
    """Index in the context tensor of tracing slot ``slot`` (``iris_trace.schema.SLOT_*``).

    Example:
        >>> context[layout.tracing_slot(4, schema.SLOT_ENABLED)] = 1
    """
    return HEADER_SLOTS + world_size + int(slot)


def flight_slot(world_size: int, slot: int) -> int:
    """Index in the context tensor of flight slot ``slot`` (``iris.device.flight.SLOT_*``).

    Example:
        >>> context[layout.flight_slot(4, flight.SLOT_TIMEOUT_NS)] = 10**9
    """
    return tracing_slot(world_size, TRACING_SLOTS + int(slot))


def ranks_per_node_slot(world_size: int) -> int:
    """Index in the context tensor of the ranks per node.

    Example:
        >>> context[layout.ranks_per_node_slot(4)] = 2
    """
    return flight_slot(world_size, FLIGHT_SLOTS + RANKS_PER_NODE_SLOT)


def staging_slot(world_size: int, slot: int) -> int:
    """Index in the context tensor of staging slot ``slot`` (``STAGING_*``).

    Example:
        >>> context[layout.staging_slot(4, layout.STAGING_COUNT)] = 264
    """
    return flight_slot(world_size, FLIGHT_SLOTS + TAIL_SLOTS + int(slot))


# ---------------------------------------------------------------- device side
@triton.jit
def heap_bases_of(context):
    """``heap_bases`` inside a kernel that was handed the whole context tensor.

    Example:
        >>> heap_bases = layout.heap_bases_of(context)
    """
    return context + _HEADER


@triton.jit
def cur_rank(heap_bases):
    """This rank (int64).

    Example:
        >>> rank = layout.cur_rank(heap_bases)
    """
    return tl.load(heap_bases - _RANK_BACK).to(tl.int64, bitcast=True)


@triton.jit
def world_size(heap_bases):
    """Number of ranks (int64).

    Example:
        >>> peers = layout.world_size(heap_bases) - 1
    """
    return tl.load(heap_bases - _WORLD_SIZE_BACK).to(tl.int64, bitcast=True)


@triton.jit
def different_nodes(heap_bases, rank_a, rank_b):
    """Whether ``rank_a`` and ``rank_b`` run on different nodes (so no mapped pointer joins them).

    Example:
        >>> tl.device_assert(layout.different_nodes(heap_bases, cur_rank, peer) == 0)
    """
    per_node = tl.load(_tail_slots(heap_bases) + _RANKS_PER_NODE_SLOT).to(tl.int64, bitcast=True)
    # Not foldable when both ranks are one value (iris.load(..., rank, rank, ...)): a branch
    # the compiler proves dead keeps no layout facts for the block ops inside it, and
    # Triton 3.6's coalescing pass then fails on them (a staged cross-node load or store).
    other = hw.opaque(tl.cast(rank_b, tl.int32)).to(tl.int64)
    return tl.cast(rank_a, tl.int64) // per_node != other // per_node


@triton.jit
def off_node(heap_bases, rank_a, rank_b):
    """Whether an op between ``rank_a`` and ``rank_b`` takes the cross-node path.

    That is whether they run on different nodes, or always with ``IRIS_CROSS_NODE_ALWAYS=1``.

    Example:
        >>> if layout.off_node(heap_bases, cur_rank, peer):
        >>>     crossnode.store_block(ptr, values, peer, heap_bases, mask)
    """
    far = different_nodes(heap_bases, rank_a, rank_b)
    if CROSS_NODE_ALWAYS:
        far = far == far
    return far


@triton.jit
def heap_base(heap_bases, rank):
    """Address of ``rank``'s heap as mapped in this process (int64).

    Example:
        >>> offset = ptr.to(tl.int64) - layout.heap_base(heap_bases, layout.cur_rank(heap_bases))
    """
    return tl.load(heap_bases + rank).to(tl.int64, bitcast=True)


@triton.jit
def heap_size(heap_bases):
    """Bytes from the heap base that ``IRIS_DEBUG``'s bounds check allows (int64).

    The user's heap in the context users pass; the whole mapping, Iris's reserved region
    included, in the copy Iris's own kernels take (``Iris._heap_bases_for_iris``).

    Example:
        >>> inside = (offset >= 0) & (offset < layout.heap_size(heap_bases))
    """
    return tl.load(_tail_slots(heap_bases) + _HEAP_SIZE_SLOT).to(tl.int64, bitcast=True)


@triton.jit
def tracing_slots(heap_bases):
    """Pointer to the first tracing slot (same element type as ``heap_bases``).

    Example:
        >>> on = tl.load(layout.tracing_slots(heap_bases) + schema.SLOT_ENABLED) != 0
    """
    return _tracing_slots_after(heap_bases, world_size(heap_bases))


@triton.jit
def _tracing_slots_after(heap_bases, size):
    return heap_bases + size  # past the heap bases


@triton.jit
def tracing_switch(heap_bases):
    """The tracing slots' run-time switch (``schema.SLOT_ENABLED``), read as a constant of the kernel.

    The host sets it only between launches, so both reads (the world size, then the
    switch) are invariant loads (``intrinsics.load_invariant``) that the compiler may
    hoist out of loops and share between ops, rather than plain loads repeated after
    every op's stores.

    Example:
        >>> if layout.tracing_switch(heap_bases) != 0:
        >>>     start = intrinsics.timer_ns()
    """
    size = hw.load_invariant(heap_bases - _WORLD_SIZE_BACK)
    return hw.load_invariant(_tracing_slots_after(heap_bases, size) + _SLOT_ENABLED)


@triton.jit
def flight_slots(heap_bases):
    """Pointer to the first flight-recorder slot (same element type as ``heap_bases``).

    Example:
        >>> timeout = tl.load(layout.flight_slots(heap_bases) + flight.SLOT_TIMEOUT_NS)
    """
    return tracing_slots(heap_bases) + _TRACING_SLOTS


@triton.jit
def _tail_slots(heap_bases):
    return flight_slots(heap_bases) + _FLIGHT_SLOTS


@triton.jit
def staging(heap_bases):
    """``(area address, claim flags, slot count)`` of the cross-node staging area.

    Example:
        >>> area, flags, count = layout.staging(heap_bases)
    """
    slots = _tail_slots(heap_bases) + _TAIL_SLOTS
    area = tl.load(slots + _STAGING_AREA).to(tl.int64, bitcast=True)
    flags = tl.load(slots + _STAGING_FLAGS).to(tl.int64, bitcast=True).to(tl.pointer_type(tl.int32))
    count = tl.load(slots + _STAGING_COUNT).to(tl.int64, bitcast=True).to(tl.int32)
    return area, flags, count
