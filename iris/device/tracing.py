"""Device-side tracing: every RMA op records one event into heap-resident buffers.

**The switch.** Tracing is a compile-time property of a kernel, carried by the
element type of ``heap_bases``: ``Iris.get_heap_bases()`` is a ``uint64`` tensor
normally and an ``int64`` view of the same memory while tracing is enabled.
Triton specialises kernels on argument dtypes, so enabling tracing makes the
next launch compile a traced variant (no change at any call site), and a kernel
launched with the plain tensor compiles to exactly the code it had before
tracing existed. A traced variant still checks the run-time switch
(``schema.SLOT_ENABLED``), so launching it while the host has tracing disabled
records nothing; :func:`begin` reads it as a constant of the launch, so the
compiler reads it once per kernel, not after every op.

**Where events go.** The context's tracing slots (``iris.device.layout``) hold the
tracing state; the buffers are on the symmetric heap, split into as many regions as
the GPU has SMs. Thread 0 of the program claims a slot with an atomic on one region's
counter and writes the 64-byte record itself, so no other thread waits for the claim
(``intrinsics.write_record``); a full region counts the event as dropped instead. The
region is the SM's index plus the time in steps of 16 us (``schema.REGION_ROTATE_SHIFT``),
modulo the regions: at any moment each SM has a region of its own (no GPU-wide
serialisation on one counter), and over time every SM passes through every region, so
a few SMs that record many events (one-program kernels: signals, copy-engine puts) fill
the whole buffer rather than their own share of it.

**Batched records.** A program that records between units of work on its critical
path (a fused op's GEMM programs, between tiles) can keep records in a register stash
instead (:func:`stash_new`, :func:`stash`, :func:`stash_room`) and write them with one
slot claim and one coalesced store when the stash fills and when it ends
(:func:`stash_write`). A stash costs registers for as long as it is held, and its
records reach the buffer only when written: a program that never ends leaves its last
ones unwritten.

**Where an op came from.** Each record also carries its launch's tag (``%gridid``,
``intrinsics.launch_tag``) and the id of the source line that called the op
(``intrinsics.call_site``): a constant the site pass (``iris.backends._cuda_call_sites``)
writes into each inlined copy of the recorder at compile time, so naming the line costs
a kernel one immediate move. Both ride in the top 24 bits of the address and bytes words.

The record layout and every event id are in ``iris_trace.schema``, the one place
the device recorder and every reader take them from.
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from iris_trace import schema

from . import blocks, layout
from . import intrinsics as hw
from .aggregate import aggregate

# Every event id as a constexpr under its schema name (``tracing.PUT`` is ``schema.PUT``),
# made from ``iris_trace.schema.Event``, where each id is written once.
_EVENT_IDS = {event.name: tl.constexpr(int(event)) for event in schema.Event}
globals().update(_EVENT_IDS)
# The ones this module's own code issues, named for readers and the linter (the same constexprs).
WAIT_UNTIL: tl.constexpr = _EVENT_IDS["WAIT_UNTIL"]
DMA_PUT: tl.constexpr = _EVENT_IDS["DMA_PUT"]
DEVICE_BARRIER_WAIT: tl.constexpr = _EVENT_IDS["DEVICE_BARRIER_WAIT"]
COLLECTIVE_WAIT: tl.constexpr = _EVENT_IDS["COLLECTIVE_WAIT"]
FUSED_OP_WAIT: tl.constexpr = _EVENT_IDS["FUSED_OP_WAIT"]
# The record layout: constexpr copies of ``iris_trace.schema``.
SCOPE_BASE: tl.constexpr = tl.constexpr(schema.SCOPE_BASE)
#: ``target_rank`` of one record for the same op to every other rank (the reader expands it).
EVERY_PEER: tl.constexpr = tl.constexpr(schema.EVERY_PEER)

SLOT_ENABLED: tl.constexpr = tl.constexpr(schema.SLOT_ENABLED)
SLOT_MAX_EVENTS: tl.constexpr = tl.constexpr(schema.SLOT_MAX_EVENTS)
SLOT_REGION_CAPACITY: tl.constexpr = tl.constexpr(schema.SLOT_REGION_CAPACITY)
SLOT_NUM_REGIONS: tl.constexpr = tl.constexpr(schema.SLOT_NUM_REGIONS)
SLOT_COUNTERS: tl.constexpr = tl.constexpr(schema.SLOT_COUNTERS)
SLOT_DROPPED: tl.constexpr = tl.constexpr(schema.SLOT_DROPPED)
SLOT_RECORDS: tl.constexpr = tl.constexpr(schema.SLOT_RECORDS)
COUNTER_STRIDE: tl.constexpr = tl.constexpr(schema.COUNTER_STRIDE)
REGION_ROTATE_SHIFT: tl.constexpr = tl.constexpr(schema.REGION_ROTATE_SHIFT)
RECORD_WORDS: tl.constexpr = tl.constexpr(schema.RECORD_WORDS)
_CUR_RANK_SHIFT: tl.constexpr = tl.constexpr(schema.IDENT_CUR_RANK_SHIFT)
_TARGET_SHIFT: tl.constexpr = tl.constexpr(schema.IDENT_TARGET_SHIFT)
_CU_SHIFT: tl.constexpr = tl.constexpr(schema.IDENT_CU_SHIFT)
_PATH_SHIFT: tl.constexpr = tl.constexpr(schema.IDENT_PATH_SHIFT)
_SUB_SHIFT: tl.constexpr = tl.constexpr(schema.IDENT_SUB_SHIFT)
#: A signal's ``sub``: it set the flag, or added to it (``schema.SIGNAL_OPS``).
SIGNAL_SET: tl.constexpr = tl.constexpr(schema.SIGNAL_OPS.index("set"))
SIGNAL_ADD: tl.constexpr = tl.constexpr(schema.SIGNAL_OPS.index("add"))
#: How an op reached its target: a mapped pointer (within a node) or the cross-node path.
PATH_MAPPED: tl.constexpr = tl.constexpr(schema.PATH_MAPPED)
PATH_CROSS_NODE: tl.constexpr = tl.constexpr(schema.PATH_CROSS_NODE)
_W_START: tl.constexpr = tl.constexpr(schema.W_START)
_W_END: tl.constexpr = tl.constexpr(schema.W_END)
_W_ADDRESS: tl.constexpr = tl.constexpr(schema.W_ADDRESS)
_W_BYTES: tl.constexpr = tl.constexpr(schema.W_BYTES)
_W_IDENT: tl.constexpr = tl.constexpr(schema.W_IDENT)
_W_WHERE: tl.constexpr = tl.constexpr(schema.W_WHERE)
_W_TILE: tl.constexpr = tl.constexpr(schema.W_TILE)
_W_VALUE: tl.constexpr = tl.constexpr(schema.W_VALUE)
_OP_INDEX_SHIFT: tl.constexpr = tl.constexpr(schema.WHERE_OP_INDEX_SHIFT)
_FIELD_MASK: tl.constexpr = tl.constexpr(schema.FIELD_MASK)
_TAG_MASK: tl.constexpr = tl.constexpr(schema.TAG_MASK)
_LAUNCH_SHIFT: tl.constexpr = tl.constexpr(schema.LAUNCH_SHIFT)
_SITE_SHIFT: tl.constexpr = tl.constexpr(schema.SITE_SHIFT)


#: ``iris.TraceEvent()``'s fields: the device API's ops under their names, and upstream
#: Iris's ``wait`` and ``barrier`` (plain ints: Triton hashes what its functions read).
_TRACE_EVENT_FIELDS = tuple(
    [(event.name.lower(), int(event)) for event in schema.DEVICE_OPS]
    + [("wait", int(schema.Event.WAIT_UNTIL)), ("barrier", int(schema.Event.DEVICE_BARRIER_WAIT))]
)


@aggregate
class TraceEvent:
    """Event ids by name, as upstream Iris's ``iris.TraceEvent().put`` spells them.

    The ids are this package's (``iris_trace.schema``), not upstream's numbers:
    the ops (``load`` ... ``atomic_max``, ``signal``, ``wait_until``) and
    ``wait``/``barrier`` for a user's wait and the device barrier's. Upstream's
    ``fetch``/``compute``/``reduce`` categories are compute scopes here
    (:func:`iris.trace_begin`/:func:`iris.trace_end` with ``scope=``).

    Example:
        >>> tl.static_assert(iris.TraceEvent().put == 4)
    """

    __annotations__ = dict.fromkeys((name for name, _ in _TRACE_EVENT_FIELDS), tl.constexpr)

    @constexpr_function
    def __init__(self):
        for name, event_id in _TRACE_EVENT_FIELDS:
            setattr(self, name, tl.constexpr(event_id))


@constexpr_function
def wait_event(op):
    """The event id of a wait issued under ``op``, as ``iris_trace.schema.wait_event_id`` gives it.

    Spelled out: Triton hashes what a constexpr function references and refuses
    calls to plain functions (a test checks it against the schema's).
    """
    name = str(op)
    if name == "iris.device_barrier" or name.startswith("iris.device_barrier."):
        return DEVICE_BARRIER_WAIT
    if name == "iris.ccl" or name.startswith("iris.ccl."):
        return COLLECTIVE_WAIT
    if name == "iris.ops" or name.startswith("iris.ops."):
        return FUSED_OP_WAIT
    return WAIT_UNTIL


@constexpr_function
def compiled_in(heap_bases_type):
    """True when ``heap_bases`` is the traced (int64) variant."""
    return heap_bases_type.element_ty == tl.int64


@triton.jit
def begin(heap_bases):
    """Start timestamp of an op, or -1 when nothing is to be recorded (pass it to :func:`end`).

    The run-time flag is read here, before the op, rather than after it in :func:`end`:
    its load (two, the slots' address first) then overlaps the op's own address
    arithmetic instead of following its stores, and a disabled variant reads no
    clock. The host flips the flag only between launches, so before and after agree.
    A dead constant when tracing is compiled out.
    """
    start = tl.cast(-1, tl.int64)
    if compiled_in(heap_bases.dtype):
        if enabled(heap_bases):
            start = hw.timer_ns()
    return start


@triton.jit
def _linear_pid():
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _add_pairs(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _touched(ptr, mask, local_base):
    """(heap offset of the block's first element, payload bytes) of an access (bytes 0: none active).

    The offset is the first element's in row-major order (element ``[0, 0]`` of a tile),
    whether or not the mask leaves it active: the lowest byte touched for every block
    whose addresses ascend and whose mask cuts its end (tiles, flat ranges). Naming the
    first element costs a kernel almost no registers: each thread keeps the first
    element's address if it holds it and 0 otherwise, and a sum gives it; the lowest of
    all active addresses would keep every address of the block live, which in a GEMM
    epilogue costs ~45 registers per thread and halves occupancy even while tracing is
    disabled (docs/tracing.md). The first address and the count of active lanes are
    summed in one reduction, so a masked op exchanges partial results between warps
    once, not twice. Blocks of four or more dimensions still take the lowest address.
    """
    if blocks.is_block(ptr.type):
        addresses = ptr.to(tl.int64)
        if blocks.rank_of(ptr.type) <= 3:
            # Sums do not care about order, so the reshapes may reorder elements.
            firsts = tl.where(blocks.row_major_index(ptr) == 0, addresses, 0)
            if blocks.in_gluon():
                first = blocks.sum_all(firsts)
                count = blocks.numel(ptr.type)
                if mask is not None:
                    count = blocks.sum_all(tl.broadcast_to(mask != 0, ptr.shape).to(tl.int64))
            else:
                flat_firsts = tl.reshape(firsts, [blocks.numel(ptr.type)], can_reorder=True)
                if mask is None:
                    first = tl.reduce(flat_firsts, 0, _add)
                    count = blocks.numel(ptr.type)
                else:
                    active = tl.broadcast_to(mask != 0, ptr.shape).to(tl.int64)
                    flat_active = tl.reshape(active, [blocks.numel(ptr.type)], can_reorder=True)
                    first, count = tl.reduce((flat_firsts, flat_active), 0, _add_pairs)
        else:
            first = tl.min(addresses)
            if mask is None:
                count = blocks.numel(ptr.type)
            else:
                count = tl.sum(tl.broadcast_to(mask != 0, ptr.shape).to(tl.int64))
    else:
        first = ptr.to(tl.int64)
        count = 1
    return first - local_base, count * blocks.element_bytes(ptr.type)


@triton.jit
def enabled(heap_bases):
    """Whether this program records now (the run-time flag; read it only in traced variants).

    The switch (``schema.SLOT_ENABLED``) is 0 while the host has tracing disabled and
    the sampling period ``k``, a power of two, while enabled: a program records when its
    linear id is a multiple of ``k`` (every program at ``k = 1``; program 0 always, so
    one-program kernels such as the device barrier are never sampled out). Branch-free
    and made of launch constants (a mask, not a remainder, which could not be moved out
    of a loop), so the compiler computes it once per program.

    Example:
        >>> if tracing.compiled_in(heap_bases.dtype):
        >>>     if tracing.enabled(heap_bases):
        >>>         tracing.record(heap_bases, start, tracing.PUT, peer, ptr, mask)
    """
    switch = layout.tracing_switch(heap_bases)
    return (switch != 0) & ((_linear_pid().to(switch.dtype) & (switch - 1)) == 0)


@triton.jit
def end(
    heap_bases, start, event: tl.constexpr, target_rank, ptr,
    mask=None, value=0, pid_m=-1, pid_n=-1, path=0, stop=None, sub: tl.constexpr = 0,
):  # fmt: skip
    """Record one event that began at ``start`` from :func:`begin` (nothing when compiled out,
    when ``start`` is -1 because tracing was disabled, or when ``mask`` leaves no lane of
    a block op active). ``path`` says how the op reached its target (``PATH_MAPPED`` or
    ``PATH_CROSS_NODE``); the event ends at ``stop`` (default: now), for an event
    recorded after it ended; ``sub`` is the op's variant (``schema.IDENT_SUB_SHIFT``: a
    signal's set or add).

    Example:
        >>> start = tracing.begin(heap_bases)
        >>> tl.atomic_add(remote, 1, sem="release", scope="sys")
        >>> tracing.end(heap_bases, start, tracing.ATOMIC_ADD, peer, flag)
    """
    if compiled_in(heap_bases.dtype):
        if start >= 0:
            record(heap_bases, start, event, target_rank, ptr, mask, value, pid_m, pid_n, path, stop, sub)


@triton.jit
def record(
    heap_bases, start, event: tl.constexpr, target_rank, ptr,
    mask=None, value=0, pid_m=-1, pid_n=-1, path=0, stop=None, sub: tl.constexpr = 0,
):  # fmt: skip
    """:func:`end` for a caller that has checked :func:`compiled_in` and :func:`enabled` itself.

    The event ends at ``stop`` (default: now). Returns the record's index in the buffer
    (-1: nothing recorded, because ``mask`` left no lane active or the buffer was full).

    Example:
        >>> tracing.record(heap_bases, start, tracing.STORE, peer, ptr, mask)
    """
    if stop is None:
        stop = hw.timer_ns()
    cur_rank = layout.cur_rank(heap_bases)
    offset, nbytes = _touched(ptr, mask, layout.heap_base(heap_bases, cur_rank))
    written = tl.cast(-1, tl.int64)
    # A fully masked-off block op moved nothing: it is not an event.
    if nbytes != 0:
        slots = layout.tracing_slots(heap_bases)
        written = _write(
            slots, start, stop, event, cur_rank, target_rank, offset, nbytes, value, pid_m, pid_n, path=path,
            sub=sub,
        )  # fmt: skip
    return written


@triton.jit
def record_block(
    heap_bases, start, event: tl.constexpr, target_rank, first, nbytes, pid_m=-1, pid_n=-1, path=0
):
    """Record one event for a block moved by several untraced ops: from ``start`` (:func:`begin`) to now.

    ``first`` points at the block's first element (its heap offset is recorded) and
    ``nbytes`` is what moved. Nothing when compiled out or when ``start`` is -1. Each
    event costs its program a slot claim (an atomic whose reply the program waits for);
    a loop of many small ops to the same peer (the fused ops push a tile in steps of a
    few rows) records the whole as one event instead, with :func:`untraced` for the ops.
    ``target_rank`` :data:`EVERY_PEER` records one event for a block that went to every
    other rank in the same steps (the reader gives each peer an event with its times).

    Example:
        >>> start = tracing.begin(heap_bases)
        >>> for r0 in range(0, BLOCK_M, ROWS):
        >>>     rma.store(ptrs + r0 * stride, rows, rank, peer, tracing.untraced(heap_bases))
        >>> tracing.record_block(heap_bases, start, tracing.STORE, peer, ptrs, BLOCK_M * BLOCK_N * 2)
    """
    if compiled_in(heap_bases.dtype):
        if start >= 0:
            cur_rank = layout.cur_rank(heap_bases)
            offset = first.to(tl.int64) - layout.heap_base(heap_bases, cur_rank)
            slots = layout.tracing_slots(heap_bases)
            stop = hw.timer_ns()
            _write(
                slots, start, stop, event, cur_rank, target_rank, offset, nbytes, 0, pid_m, pid_n, path=path
            )


@triton.jit
def untraced(heap_bases):
    """``heap_bases`` as the untraced variant takes it: ops given it record nothing (:func:`record_block`).

    Example:
        >>> rma.store(ptrs, values, rank, peer, tracing.untraced(heap_bases), mask=mask)
    """
    return heap_bases.to(tl.pointer_type(tl.uint64), bitcast=True)


@triton.jit
def _region(sm, stop, num_regions):
    # The buffer region of an event that ended at ``stop`` on ``sm`` (module docstring):
    # one 64-bit remainder, as a region per SM took (a mask of a power-of-two count
    # compiled to fewer instructions but 7 more registers in the traced GEMM).
    return ((sm.to(tl.int64) + (tl.cast(stop, tl.int64) >> REGION_ROTATE_SHIFT)) % num_regions).to(tl.int32)


@triton.jit
def _write(
    slots,
    start,
    stop,
    event: tl.constexpr,
    cur_rank,
    target_rank,
    offset,
    nbytes,
    value,
    pid_m,
    pid_n,
    lane=-1,
    path=0,
    sub: tl.constexpr = 0,
):
    # ``lane`` >= 0 files the event under that lane id instead of the SM it ran on.
    # Returns the record's index in the buffer (-1: the region was full, the event
    # dropped; also -1 in every thread but the one that wrote it, hw.write_record).
    sm, region, capacity, counters, dropped, records = _region_buffers(slots, stop)
    if lane >= 0:
        sm = lane
    ident = _ident(event, cur_rank, target_rank, sm, path, sub)
    where = _where()
    tile = _tile(pid_m, pid_n)
    tl.static_assert(
        (_W_START == 0) & (_W_END == 1) & (_W_ADDRESS == 2) & (_W_BYTES == 3) & (_W_IDENT == 4)
        & (_W_TILE == 6) & (_W_VALUE == 7),
        "hw.write_record takes the record's words in iris_trace.schema's order",
    )  # fmt: skip
    region_records = _region_records(records, region, capacity)
    slot = hw.write_record(
        counters + region * COUNTER_STRIDE, capacity, region_records, dropped + region * COUNTER_STRIDE,
        tl.cast(start, tl.int64), tl.cast(stop, tl.int64), _address_word(offset),
        _bytes_word(nbytes), ident, where, tile, tl.cast(value, tl.int64),
        _W_WHERE, _OP_INDEX_SHIFT,
    )  # fmt: skip
    return tl.where(slot >= 0, region.to(tl.int64) * capacity + slot, -1)


@triton.jit
def _address_word(offset):
    # The record's address word: the heap offset's low 40 bits, the launch's tag above them.
    launch = hw.launch_tag() & _TAG_MASK
    return (tl.cast(offset, tl.int64) & _FIELD_MASK) | (launch << _LAUNCH_SHIFT)


@triton.jit
def _bytes_word(nbytes):
    # The record's bytes word: the bytes moved, the id of the line that called the op above
    # them (fixed at compile time: intrinsics.call_site).
    site = hw.call_site().to(tl.int64)
    return (tl.cast(nbytes, tl.int64) & _FIELD_MASK) | (site << _SITE_SHIFT)


@triton.jit
def _region_buffers(slots, stop=None):
    # Where an event that ended at ``stop`` (default: now) on this SM goes: the SM, its
    # region (_region), a region's capacity in records, and the buffers' counters, dropped
    # counts and records (a region's entries are at ``region * COUNTER_STRIDE`` and
    # ``region * capacity * RECORD_WORDS``).
    capacity = tl.load(slots + SLOT_REGION_CAPACITY)
    sm = hw.sm_id()
    if stop is None:
        stop = hw.timer_ns()
    region = _region(sm, stop, tl.load(slots + SLOT_NUM_REGIONS))
    counters = tl.load(slots + SLOT_COUNTERS).to(tl.pointer_type(tl.int32))
    dropped, records = _dropped_and_records(slots)
    return sm, region, capacity, counters, dropped, records


@triton.jit
def _dropped_and_records(slots):
    # The buffers' dropped counts (int32, ``COUNTER_STRIDE`` apart) and records (int64).
    dropped = tl.load(slots + SLOT_DROPPED).to(tl.pointer_type(tl.int32))
    records = tl.load(slots + SLOT_RECORDS).to(tl.pointer_type(tl.int64))
    return dropped, records


@triton.jit
def _region_records(records, region, capacity):
    # The first record of buffer region ``region`` (``capacity`` records each).
    return records + region.to(tl.int64) * capacity * RECORD_WORDS


@triton.jit
def _where():
    # The record's ``where`` word before its slot is claimed: the program's linear id
    # (the slot's index is or'd in by whoever writes the record).
    return _linear_pid().to(tl.int64) & 0xFFFFFFFF


@triton.jit
def _tile(pid_m, pid_n):
    # The record's tile word: pid_m in the low half, pid_n in the high half.
    return (tl.cast(pid_m, tl.int64) & 0xFFFFFFFF) | (tl.cast(pid_n, tl.int64) << 32)


@triton.jit
def stash_new(heap_bases, CAPACITY: tl.constexpr):
    """An empty stash for :func:`stash`: room for ``CAPACITY`` records in registers, and a count.

    A program that records inside a loop on its critical path (a fused op's GEMM
    programs, ``iris.ops.all_scatter.produce_tiles``) keeps its records here and writes
    them with one slot claim when the stash is full and at its end (:func:`stash_write`),
    instead of claiming a slot and writing 64 bytes from thread 0 at every event while
    the next tile waits. Untraced, both are dead scalars.

    Example:
        >>> held, count = tracing.stash_new(heap_bases, 8)
        >>> for unit in range(...):
        >>>     held, count = tracing.stash(heap_bases, held, count, start, tracing.STORE, peer, ptr, nbytes)
        >>> tracing.stash_write(heap_bases, held, count)
    """
    if compiled_in(heap_bases.dtype):
        held = tl.zeros([CAPACITY, RECORD_WORDS], dtype=tl.int64)
    else:
        held = tl.zeros([], dtype=tl.int64)
    return held, tl.zeros([], dtype=tl.int32)


@triton.jit
def stash(
    heap_bases, held, count, start, event: tl.constexpr, target_rank, address=None, nbytes=None,
    value=0, pid_m=-1, pid_n=-1, path=0, stop=None, sub: tl.constexpr = 0,
):  # fmt: skip
    """Keep an event that began at ``start`` (:func:`begin`) in the stash; returns ``(held, count)``.

    The record is the one :func:`end` would write: ``address`` (a pointer; None for a
    compute scope, recorded as offset -1) names the heap offset, ``nbytes`` defaults to
    one element of ``address`` (0 without one), the event ends at ``stop`` (default:
    now), ``sub`` is the op's variant (:func:`end`). Make room first (:func:`stash_room`):
    an event stashed into a full stash is lost. Nothing when compiled out or when
    ``start`` is -1.

    Example:
        >>> held, count = tracing.stash(heap_bases, held, count, began, tracing.WAIT_UNTIL, rank,
        ...                             flags + unit, value=seen, stop=ended)
    """
    if compiled_in(heap_bases.dtype):
        if start >= 0:
            ended, address_word, bytes_word, ident = _event_words(
                heap_bases, event, target_rank, address, nbytes, path, stop, sub
            )
            tile = _tile(pid_m, pid_n)
            where = _where()
            col = tl.arange(0, RECORD_WORDS)[None, :]
            word = tl.where(col == _W_START, tl.cast(start, tl.int64), tl.cast(value, tl.int64))
            word = tl.where(col == _W_END, ended, word)
            word = tl.where(col == _W_ADDRESS, address_word, word)
            word = tl.where(col == _W_BYTES, bytes_word, word)
            word = tl.where(col == _W_IDENT, ident, word)
            word = tl.where(col == _W_WHERE, where, word)
            word = tl.where(col == _W_TILE, tile, word)
            row = tl.arange(0, held.shape[0])[:, None]
            held = tl.where(row == count, word, held)
            count = tl.minimum(count + 1, held.shape[0])
    return held, count


@triton.jit
def _event_words(
    heap_bases, event: tl.constexpr, target_rank, address, nbytes, path, stop, sub: tl.constexpr
):
    # A stashed or reserved record's end (``stop``, default now), address word (heap offset,
    # launch), bytes word (bytes, call site) and identity word (``address`` None: a compute
    # scope, offset -1 and 0 bytes; ``nbytes`` defaults to one element of ``address``).
    if stop is None:
        ended = hw.timer_ns()
    else:
        ended = tl.cast(stop, tl.int64)
    cur_rank = layout.cur_rank(heap_bases)
    if address is None:
        offset = tl.cast(-1, tl.int64)
        size = tl.cast(0, tl.int64)
    else:
        offset = address.to(tl.int64) - layout.heap_base(heap_bases, cur_rank)
        size = tl.cast(blocks.element_bytes(address.type), tl.int64)
    if nbytes is not None:
        size = tl.cast(nbytes, tl.int64)
    ident = _ident(event, cur_rank, target_rank, hw.sm_id(), path, sub)
    return ended, _address_word(offset), _bytes_word(size), ident


@triton.jit
def reserve(heap_bases, count):
    """Claim ``count`` trace slots now for events written later (:func:`write_reserved`).

    Returns the reservation, ``(first slot, region)``.

    Thread 0 issues the claim's atomic and nothing waits for its reply until the first
    write, so work between the two (a tile's push) hides the round trip to L2 that
    :func:`end` waits for at each event. Write every slot reserved, each once: a slot
    left unwritten (an op that never ended) is not read as an event. Nothing when
    compiled out or when ``count`` is 0.

    Example:
        >>> start = tracing.begin(heap_bases)
        >>> reservation = tracing.reserve(heap_bases, (start >= 0).to(tl.int32))
        >>> push_tile(...)
        >>> tracing.write_reserved(heap_bases, reservation, 0, start, tracing.STORE, peer, first, nbytes)
    """
    first = tl.cast(0, tl.int32)
    region = tl.cast(0, tl.int32)
    if compiled_in(heap_bases.dtype):
        if count > 0:
            _, region, _, counters, _, _ = _region_buffers(layout.tracing_slots(heap_bases))
            first = hw.reserve_slots(counters + region * COUNTER_STRIDE, count)
    return first, region


@triton.jit
def reserve_if_recording(heap_bases, count):
    """:func:`reserve` ``count`` slots while events are recorded; none while tracing is switched off.

    For a caller that will write ``count`` records, each from a :func:`begin` that is
    -1 exactly when tracing is off, so every slot reserved is written.

    Example:
        >>> reservation = tracing.reserve_if_recording(heap_bases, world_size - 1)
        >>> for i in range(1, world_size):
        >>>     began = tracing.begin(heap_bases)
        >>>     seen = iris.wait_until(flags + i, "ge", epoch, heap_bases=tracing.untraced(heap_bases))
        >>>     tracing.write_reserved(heap_bases, reservation, i - 1, began, tracing.WAIT_UNTIL, rank,
        ...                            flags + i, value=seen)
    """
    recording = begin(heap_bases) >= 0
    return reserve(heap_bases, tl.where(recording, count, 0))


@triton.jit
def write_reserved(
    heap_bases, reservation, index, start, event: tl.constexpr, target_rank, address=None, nbytes=None,
    value=0, pid_m=-1, pid_n=-1, path=0, stop=None, sub: tl.constexpr = 0,
):  # fmt: skip
    """Write an event that began at ``start`` into slot ``index`` of a :func:`reserve` reservation.

    The record is the one :func:`stash` keeps (``address``, ``nbytes``, ``stop`` alike);
    a slot past the region's end counts as dropped. Nothing when compiled out or when
    ``start`` is -1 (reserve no slot for such an event).

    Example:
        >>> tracing.write_reserved(heap_bases, reservation, 1, began, tracing.WAIT_UNTIL, rank, flag,
        ...                        value=seen, stop=ended)
    """
    if compiled_in(heap_bases.dtype):
        if start >= 0:
            ended, address_word, bytes_word, ident = _event_words(
                heap_bases, event, target_rank, address, nbytes, path, stop, sub
            )
            first, region = reservation
            slots = layout.tracing_slots(heap_bases)
            capacity = tl.load(slots + SLOT_REGION_CAPACITY)
            dropped, records = _dropped_and_records(slots)
            hw.write_reserved_record(
                first, index, capacity, _region_records(records, region, capacity),
                dropped + region * COUNTER_STRIDE, tl.cast(start, tl.int64), ended, address_word, bytes_word,
                ident, _where(), _tile(pid_m, pid_n),
                tl.cast(value, tl.int64), _W_WHERE, _OP_INDEX_SHIFT,
            )  # fmt: skip


@triton.jit
def stash_room(heap_bases, held, count, events):
    """Make room for ``events`` more records in a stash: write it first if they would not fit.

    Returns the stash ``(held, count)``. Call it before a group of :func:`stash` calls;
    a :func:`stash` into a full stash drops the event.

    Example:
        >>> held, count = tracing.stash_room(heap_bases, held, count, world_size)
    """
    if compiled_in(heap_bases.dtype):
        if count + events > held.shape[0]:
            stash_write(heap_bases, held, count)
            count = tl.zeros([], dtype=tl.int32)
    return held, count


@triton.jit
def stash_write(heap_bases, held, count):
    """Write the ``count`` records of a stash (:func:`stash`) with one slot claim.

    Every thread writes its share of the rows: one coalesced store, after one atomic
    on the region's counter. Records past the region's end count as dropped.

    Example:
        >>> tracing.stash_write(heap_bases, held, count)
    """
    if compiled_in(heap_bases.dtype):
        if count > 0:
            row = tl.arange(0, held.shape[0])[:, None]
            col = tl.arange(0, RECORD_WORDS)[None, :]
            # The region goes by the stash's last end time, a reduction every thread agrees
            # on. Each thread reads the clock itself, so "now" can fall on both sides of a
            # region's time step in one program: the claim (one thread) and the stores (all
            # of them) would then take different regions, and the records would be lost.
            last_end = tl.max(tl.where((row < count) & (col == _W_END), held, 0))
            slots = layout.tracing_slots(heap_bases)
            _, region, capacity, counters, dropped, records = _region_buffers(slots, last_end)
            first = tl.atomic_add(counters + region * COUNTER_STRIDE, count, sem="relaxed", scope="gpu")
            slot = first.to(tl.int64) + row
            words = tl.where(col == _W_WHERE, held | (slot << _OP_INDEX_SHIFT), held)
            region_records = _region_records(records, region, capacity)
            tl.store(
                region_records + slot * RECORD_WORDS + col,
                words,
                mask=(row < count) & (slot < capacity),
            )
            room = tl.minimum(tl.maximum(capacity - first, 0), count)
            if room < count:
                tl.atomic_add(
                    dropped + region * COUNTER_STRIDE, (count - room).to(tl.int32), sem="relaxed", scope="gpu"
                )


@triton.jit
def _ident(event: tl.constexpr, cur_rank, target_rank, sm, path, sub: tl.constexpr):
    # The record's identity word (iris_trace.schema, IDENT_*).
    EVENT_AND_SUB: tl.constexpr = event | (tl.constexpr(sub) << _SUB_SHIFT)
    return (
        EVENT_AND_SUB
        | (cur_rank.to(tl.int64) << _CUR_RANK_SHIFT)
        | ((tl.cast(target_rank, tl.int64) & 0xFFFF) << _TARGET_SHIFT)
        | ((sm.to(tl.int64) & 0xFFFF) << _CU_SHIFT)
        | (tl.cast(path, tl.int64) << _PATH_SHIFT)
    )


#: A copy-engine put (``iris.host.copy_engine``): not an SM op, so it is filed under the lane
#: ``DMA_CU_BASE + target_rank``.
DMA_PUT: tl.constexpr = tl.constexpr(schema.DMA_PUT)
DMA_CU_BASE: tl.constexpr = tl.constexpr(schema.DMA_CU_BASE)


@triton.jit
def record_dma(heap_bases, start, target_rank, offset, nbytes):
    """Record a copy-engine put of ``nbytes`` to ``target_rank``'s heap ``offset`` that began at ``start``.

    Launched on the copy lane right after the copy (see ``iris.device.dma_trace``).

    Example:
        >>> tracing.record_dma(heap_bases, tl.load(stamps + lane), peer, offset, nbytes)
    """
    if compiled_in(heap_bases.dtype):
        if enabled(heap_bases):
            stop = hw.timer_ns()
            lane = DMA_CU_BASE + target_rank
            slots = layout.tracing_slots(heap_bases)
            cur_rank = layout.cur_rank(heap_bases)
            _write(slots, start, stop, DMA_PUT, cur_rank, target_rank, offset, nbytes, 0, -1, -1, lane)


@triton.jit
def trace_begin(heap_bases):
    """Open a compute scope; returns its start time (-1 while tracing is disabled) for :func:`trace_end`.

    Example:
        >>> t = iris.trace_begin(heap_bases)
        >>> acc = tl.dot(a, b, acc)
        >>> iris.trace_end(heap_bases, t, scope=0, pid_m=pid_m, pid_n=pid_n)
    """
    return begin(heap_bases)


@triton.jit
def trace_end(heap_bases, start, scope: tl.constexpr = 0, pid_m=-1, pid_n=-1):
    """Close a compute scope opened by :func:`trace_begin`; it is recorded as event ``64 + scope``.

    Name scopes on the host with ``ctx.tracing.name_scope(scope, "gemm")``.

    Example:
        >>> iris.trace_end(heap_bases, t, scope=1)
    """
    if compiled_in(heap_bases.dtype):
        if start >= 0:
            slots = layout.tracing_slots(heap_bases)
            cur_rank = layout.cur_rank(heap_bases)
            _write(slots, start, hw.timer_ns(), SCOPE_BASE + scope, cur_rank, -1, -1, 0, 0, pid_m, pid_n)


@triton.jit
def record_event_start(
    heap_bases, event_id: tl.constexpr, target_rank, address, pid_m=-1, pid_n=-1, mask=None
):
    """Open an event by hand: upstream Iris's ``ctx.tracing.record_event_start``; returns its handle.

    The record is written now (``event_id`` from :class:`TraceEvent` or a scope id,
    the heap offset of ``address``, the bytes ``mask`` leaves active) with its end
    time equal to its start; :func:`record_event_end` sets the end. The handle is -1
    when nothing was recorded (tracing compiled out or disabled, every lane masked
    off, or the buffer full), and ending it then does nothing. The ops record
    themselves; this is for upstream programs and for spans the ops do not cover.

    Example:
        >>> handle = tracing.record_event_start(heap_bases, iris.TraceEvent().put, peer, ptrs, mask=mask)
        >>> ...
        >>> tracing.record_event_end(heap_bases, handle)
    """
    handle = tl.cast(-1, tl.int64)
    if compiled_in(heap_bases.dtype):
        if enabled(heap_bases):
            now = hw.timer_ns()
            handle = record(heap_bases, now, event_id, target_rank, address, mask, 0, pid_m, pid_n, stop=now)
    return handle


@triton.jit
def record_event_end(heap_bases, handle):
    """Set the end time of the event ``handle`` (from :func:`record_event_start`) to now.

    Example:
        >>> tracing.record_event_end(heap_bases, handle)
    """
    if compiled_in(heap_bases.dtype):
        if handle >= 0:
            records = tl.load(layout.tracing_slots(heap_bases) + SLOT_RECORDS).to(tl.pointer_type(tl.int64))
            tl.store(records + handle * RECORD_WORDS + _W_END, hw.timer_ns())
