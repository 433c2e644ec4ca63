"""The one source of truth for what devices record: event ids, the trace record, the flight entry.

Plain Python ints only (importing it needs nothing), so every reader takes its
constants from here: the device recorders (``iris.device.tracing`` and
``iris.device.flight`` wrap them in ``tl.constexpr``), the collector and decoder
(``iris_trace.events``), the analysis, the exporters and the hang reports.

**Event ids** (8 bits in a record). 1-16 are the device API's ops, 20 a copy-engine
put, 21-23 waits issued by the library for a named purpose (the device barrier, a
collective, a fused op: they stall like ``wait_until`` and are reported under their
own names), and ``SCOPE_BASE + s`` the user's compute scope ``s``.

**Trace record** (8 x int64, one per event)::

    0 start_ns   1 end_ns
    2 address | launch << 40        (address: heap offset of the flag or a block's first
                                    element, signed 40 bits; launch: the kernel launch's tag)
    3 payload_bytes | site << 40    (site: the call site's id, 0 unknown; see site_id)
    4 event_id | cur_rank << 8 | target_rank << 24 | cu_id << 40 | path << 56 | sub << 57
                                    (target_rank EVERY_PEER: one record for every other rank;
                                    sub: a signal's set 0 or add 1, see SIGNAL_OPS)
    5 pid | op_index << 32          (op_index: the record's slot in its buffer region)
    6 pid_m | pid_n << 32           (tile coordinates, -1 when not given)
    7 value                         (flag value waited for or signalled, else 0)

**Flight entry** (8 x int64, the hang recorder's ring; ``iris.device.flight``)::

    0 seq (claim index + 1; 0 = never written)
    1 kind | sub << 8 | cur_rank << 16 | target_rank << 32 | sm << 48
    2 pid | op_id << 32
    3 heap offset   4 value   5 timestamp   6 seen value or bytes   7 reserved

A flight ``kind`` is an event id, or ``WAIT_BEGIN`` for the start of a slow wait.

Example:
    >>> from iris_trace import schema
    >>> schema.EVENT_NAMES[schema.SIGNAL], schema.SIGNAL in schema.RELEASE_EVENTS
    ('signal', True)
"""

from __future__ import annotations

import enum
import zlib


# ---------------------------------------------------------------- event ids
class Event(enum.IntEnum):
    """Every event id below :data:`SCOPE_BASE`, the one place each is written.

    Exports and reports show an event by its name in lower case (:data:`EVENT_NAMES`);
    each id is also a plain constant of this module (``schema.PUT``). The device's
    constexprs and ``iris.TraceEvent``'s fields (``iris.device.tracing``) are made from
    this class, so a new op's id is added here and nowhere else: any free id below
    :data:`SCOPE_BASE` but the flight recorder's :data:`WAIT_BEGIN` (a test holds that the
    two never meet).
    """

    LOAD = 1
    STORE = 2
    GET = 3
    PUT = 4
    COPY = 5
    ATOMIC_ADD = 6
    ATOMIC_SUB = 7
    ATOMIC_XCHG = 8
    ATOMIC_XOR = 9
    ATOMIC_AND = 10
    ATOMIC_OR = 11
    ATOMIC_MIN = 12
    ATOMIC_MAX = 13
    ATOMIC_CAS = 14
    SIGNAL = 15
    WAIT_UNTIL = 16
    #: A copy-engine put (``iris.host.copy_engine``): filed on lane ``DMA_CU_BASE + target rank``, no SM.
    DMA_PUT = 20
    #: Waits the library issues for a named purpose (``wait_until(..., op="iris.device_barrier")``...).
    DEVICE_BARRIER_WAIT = 21
    COLLECTIVE_WAIT = 22
    FUSED_OP_WAIT = 23


globals().update({event.name: int(event) for event in Event})
#: The device API's ops (what kernels issue through ``iris.load`` ... ``iris.wait_until``):
#: every event but those the library records for its own purposes.
DEVICE_OPS = tuple(
    event
    for event in Event
    if event not in (Event.DMA_PUT, Event.DEVICE_BARRIER_WAIT, Event.COLLECTIVE_WAIT, Event.FUSED_OP_WAIT)
)
#: Event ids from here up are user compute scopes: ``SCOPE_BASE + scope``.
SCOPE_BASE = 64
#: Lanes of copy-engine puts start here (``cu_id`` of a ``dma_put``): the copy engines are not SMs.
DMA_CU_BASE = 0x7F00
#: ``target_rank`` field of an event that has none.
NO_RANK = 0xFFFF
#: ``target_rank`` field of one record that stands for the same op to every rank but its
#: own, with the same times and ``payload_bytes`` to each: a fused op's push of a tile,
#: which interleaves its peers row by row, writes one record instead of one per peer, and
#: the reader (``iris_trace.events.decode_records``) expands it into an event per peer.
EVERY_PEER = 0xFFFE

#: event id -> name, as exports and reports show it. Ids from SCOPE_BASE up are scopes.
EVENT_NAMES = {int(event): event.name.lower() for event in Event}
#: Ops that wait for another rank (their time is stall time).
WAIT_EVENTS = frozenset(
    map(int, (Event.WAIT_UNTIL, Event.DEVICE_BARRIER_WAIT, Event.COLLECTIVE_WAIT, Event.FUSED_OP_WAIT))
)
#: Ops that change memory another rank may wait on: possible releasers of a wait (flow
#: sources in exports), and what a rank "sent" in hang reports.
RELEASE_EVENTS = frozenset(
    int(event) for event in DEVICE_OPS if event not in (Event.LOAD, Event.GET, Event.WAIT_UNTIL)
)
#: Releases whose ``value`` says what they set, so a waiter's ``value`` can pick among them.
VALUED_RELEASES = frozenset(RELEASE_EVENTS - {int(Event.STORE), int(Event.PUT), int(Event.COPY)})
#: Ops that move data (bytes), as opposed to flags and atomics.
DATA_EVENTS = frozenset(map(int, (Event.LOAD, Event.STORE, Event.GET, Event.PUT, Event.COPY, Event.DMA_PUT)))

#: ``wait_until``'s ``op=`` name (or its family prefix) -> the event id its trace record gets.
WAIT_OPS = {
    "iris.wait_until": int(Event.WAIT_UNTIL),
    "iris.device_barrier": int(Event.DEVICE_BARRIER_WAIT),
    "iris.ccl": int(Event.COLLECTIVE_WAIT),
    "iris.ops": int(Event.FUSED_OP_WAIT),
}


def wait_event_id(op: str) -> int:
    """The event id of a wait issued under ``op`` (``"iris.ccl.all_reduce"`` counts as ``"iris.ccl"``).

    Example:
        >>> wait_event_id("iris.ccl.all_reduce") == COLLECTIVE_WAIT
        True
    """
    name = str(op)
    for prefix, event_id in WAIT_OPS.items():
        if name == prefix or name.startswith(prefix + "."):
            return event_id
    return int(Event.WAIT_UNTIL)


def event_name(event_id: int, scope_names: dict[int, str] | None = None) -> str:
    """Human name of an event id (user scopes use ``scope_names`` or ``scope<N>``).

    Example:
        >>> event_name(SIGNAL), event_name(SCOPE_BASE + 3), event_name(SCOPE_BASE, {0: "gemm"})
        ('signal', 'scope3', 'gemm')
    """
    if event_id >= SCOPE_BASE:
        scope = event_id - SCOPE_BASE
        return (scope_names or {}).get(scope, f"scope{scope}")
    return EVENT_NAMES.get(event_id, f"event{event_id}")


# ---------------------------------------------------------------- the trace record
RECORD_WORDS = 8
W_START, W_END, W_ADDRESS, W_BYTES, W_IDENT, W_WHERE, W_TILE, W_VALUE = range(RECORD_WORDS)
#: Bit position of ``op_index`` (the record's slot in the buffer region it went to) in the W_WHERE word.
WHERE_OP_INDEX_SHIFT = 32
#: Bit positions in the ``ident`` word (W_IDENT) and the widths of its fields.
IDENT_EVENT_BITS = 8
IDENT_CUR_RANK_SHIFT, IDENT_TARGET_SHIFT, IDENT_CU_SHIFT = 8, 24, 40
IDENT_RANK_BITS = IDENT_CU_BITS = 16
IDENT_PATH_SHIFT = 56
#: ``sub``, the op's variant, in the ident word's top 7 bits: a signal's index in
#: :data:`SIGNAL_OPS` (0 for every other op). Rank files written before it have 0 there.
IDENT_SUB_SHIFT = 57
#: ``address`` and ``payload_bytes`` keep the low 40 bits of their words (1 TiB); the top 24
#: bits carry the launch's tag and the call site's id.
FIELD_BITS = 40
#: The tag of the kernel launch an event came from (W_ADDRESS's top bits): the low 24 bits of
#: the GPU's ``%gridid`` (unique per launch in a process), or the launch's number under
#: emulation. The collector names each tag's kernel, launch index and grid.
LAUNCH_SHIFT = SITE_SHIFT = FIELD_BITS
TAG_BITS = 24
TAG_MASK = (1 << TAG_BITS) - 1
FIELD_MASK = (1 << FIELD_BITS) - 1
#: ``site`` of an event whose call site is not known (a kernel compiled without the site pass).
UNKNOWN_SITE = 0
#: A signal's ops by their ``sub`` (in trace records and flight entries).
SIGNAL_OPS = ("set", "add")
#: ``path``: how an op reached its target rank, a mapped pointer (same node) or the
#: cross-node path (NVSHMEM; ``iris.device.crossnode``).
PATH_MAPPED, PATH_CROSS_NODE = 0, 1
PATH_NAMES = {PATH_MAPPED: "mapped", PATH_CROSS_NODE: "cross-node"}


def site_id(kernel: str, file: str, line: int) -> int:
    """The id a call site of a traced op gets in records: 24 bits of a hash of where it is.

    Fixed at compile time (a kernel's binary carries it, so a kernel loaded from Triton's
    cache needs nothing recomputed) and the same on every rank; never :data:`UNKNOWN_SITE`.
    The file counts by its name only: Triton's cache keys a kernel by its source, not by
    where the source lies, so two copies of one file (two checkouts) share binaries.

    Example:
        >>> 0 < site_id("my_kernel", "/work/app.py", 42) < 1 << TAG_BITS
        True
    """
    name = file.replace("\\", "/").rsplit("/", 1)[-1]
    digest = zlib.crc32(f"{kernel}\0{name}\0{int(line)}".encode())
    return (digest ^ (digest >> TAG_BITS)) & TAG_MASK or 1


# Tracing slots of the context tensor, counted from the first slot after ``heap_size``.
# SLOT_ENABLED: 0 while tracing is disabled; while enabled, the sampling period k, a power of
# two (a program records when its linear id is a multiple of k; k = 1 records every program).
SLOT_ENABLED, SLOT_MAX_EVENTS, SLOT_REGION_CAPACITY, SLOT_NUM_REGIONS = 0, 1, 2, 3
SLOT_COUNTERS, SLOT_DROPPED, SLOT_RECORDS = 4, 5, 6
#: Context slots reserved for tracing (the flight recorder's slots follow them).
TRACING_SLOTS = 17
#: int32 stride between per-region counters: one 128-byte line each.
COUNTER_STRIDE = 32
#: An event goes to region ``(sm + (stop_ns >> REGION_ROTATE_SHIFT)) % regions`` (one
#: region per SM): every SM moves on to the next region each 2^14 ns (16 us), so the SMs
#: still use distinct regions at any moment (no contended counter) while the buffer fills
#: evenly even when few SMs record, as one-program kernels (signals, copy-engine puts) do.
REGION_ROTATE_SHIFT = 14


# ---------------------------------------------------------------- the flight ring
#: Flight kind of the start of a slow wait (the end is recorded as the wait's event id).
WAIT_BEGIN = 17
ENTRY_WORDS = 8
#: ``wait_until``'s comparisons, by their index in a flight entry's ``sub`` field.
CMPS = ("eq", "ne", "gt", "ge", "lt", "le")
#: The API that issued a wait (flight entry ``op_id``), by family.
OP_IDS = {"iris.wait_until": 1, "iris.device_barrier": 2, "iris.ccl": 3, "iris.ops": 4}
OP_NAMES = {0: "wait", **{ident: name for name, ident in OP_IDS.items()}}

# ---------------------------------------------------------------- the timeout report
#: int64 words of the report a timed-out wait writes (the ring's copy follows them).
REPORT_WORDS = 16
#: The report's words in order: ``state`` becomes 1 once every other word is written;
#: ``op`` is an OP_IDS value, ``cmp`` an index in CMPS, ``written_ns`` the GPU clock when
#: the report was written.
REPORT_FIELDS = (
    "state",
    "rank",
    "sm",
    "pid",
    "op",
    "offset",
    "expected",
    "seen",
    "cmp",
    "waited_ns",
    "written_ns",
    "timeout_ns",
)
REPORT_WORD = {name: index for index, name in enumerate(REPORT_FIELDS)}
