"""Device side of the flight recorder and of wait timeouts.

**The ring.** Every synchronisation op (``signal``, each atomic, ``atomic_cas``)
and every *slow* ``wait_until`` that has ``heap_bases`` writes one 64-byte entry
into a ring of per-SM regions in device memory. A wait is recorded once it has
spun ``CHECK_EVERY`` polls: a wait satisfied sooner cannot be a hang, and
recording it would cost every fast wait a timer read and a ring write. While it
spins, the wait sits in its program's *pending* entry (``PENDING_SLOTS`` per SM
region, after the ring), written without atomics or barriers because each thread
of a spinning program leaves the loop at its own poll; when it ends, the pending
entry is cleared and the ring gets its begin and end. Data ops
(``load``/``store``/``get``/``put``/``copy``) are not recorded here: they are what
tracing records, and a ring entry per data op doubled what a traced data op costs
(docs/tracing.md). ``IRIS_FLIGHT=0`` at import compiles the ring out.

An op claims its slot with a relaxed GPU-scope atomic on its SM's counter and
writes the entry with one coalesced 64-byte store; it never waits for its own
op's result. Both stay in device memory: an entry written to host memory would
make every later release (each signal) wait for a PCIe round trip. The host
copies the ring out when asked (``iris.host.flight``), which a running kernel does not notice.

Entry (8 x int64)::

    0 seq (claim index + 1; 0 = never written)
    1 kind | sub << 8 | cur_rank << 16 | target_rank << 32 | sm << 48
    2 pid | op_id << 32                  (op_id: which API issued a wait, see OP_IDS)
    3 heap offset of the flag or of a block's first element
    4 value signalled, added, swapped in, or waited for
    5 timestamp (%globaltimer; the tracing start stamp in traced kernels)
    6 for wait ends: the value seen; for block ops: bytes touched
    7 reserved

``kind`` is the tracing event id (``iris_trace.schema.EVENT_NAMES``) or WAIT_BEGIN;
``sub`` is the comparison of a wait (index in CMPS) or 1 for ``signal(op="add")``.

**The report.** A wait that times out claims the rank's report record (the first
thread to time out wins, with an atomic of its own: the threads of a spinning
program time out at different polls, so no step here may need them together), a
block of *host* memory the GPU writes directly. That thread copies the ring behind
the record (a trapped GPU's memory can no longer be read), writes rank, SM,
program, op, heap offset, expected and last seen value, then a fence, then the
``state`` word, and stops the kernel (``trap`` on GPUs, an exception under the
interpreter).
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from iris_trace import schema

from ..config import FLIGHT as _FLIGHT
from . import blocks, layout, tracing
from . import intrinsics as hw

#: Compile-time switch (``IRIS_FLIGHT=0`` removes the recorder from every kernel).
ENABLED: tl.constexpr = tl.constexpr(_FLIGHT)

# This recorder's slots of the context tensor (``iris.device.layout.flight_slots``).
SLOT_TIMEOUT_NS: tl.constexpr = tl.constexpr(0)
SLOT_RING: tl.constexpr = tl.constexpr(1)
SLOT_RING_MASK: tl.constexpr = tl.constexpr(2)
SLOT_NUM_REGIONS: tl.constexpr = tl.constexpr(3)
SLOT_COUNTERS: tl.constexpr = tl.constexpr(4)
SLOT_REPORT: tl.constexpr = tl.constexpr(5)
SLOT_CLAIM: tl.constexpr = tl.constexpr(6)

ENTRY_WORDS: tl.constexpr = tl.constexpr(schema.ENTRY_WORDS)
#: int64 stride between per-SM counters: one 128-byte line each.
COUNTER_STRIDE: tl.constexpr = tl.constexpr(16)
WAIT_BEGIN: tl.constexpr = tl.constexpr(schema.WAIT_BEGIN)
#: A timed-out wait reads the timer only once every this many spins.
CHECK_EVERY: tl.constexpr = tl.constexpr(256)

#: int64 words of the timeout report (``iris_trace.schema.REPORT_FIELDS``); the ring's copy follows.
REPORT_WORDS: tl.constexpr = tl.constexpr(schema.REPORT_WORDS)
#: Per SM region, entries that say which waits are spinning now (after the ring).
PENDING_SLOTS: tl.constexpr = tl.constexpr(4)

CMPS = schema.CMPS
#: Names a wait can be issued under (``wait_until(..., op=...)``); unknown names record 0.
OP_IDS = schema.OP_IDS


# Triton hashes what these bodies reference, so they use no methods of module globals:
# the names are spelled out (tests check them against iris_trace.schema).
@constexpr_function
def cmp_id(cmp):
    name = str(cmp)
    ident = 0
    for index, known in enumerate(("eq", "ne", "gt", "ge", "lt", "le")):
        if name == known:
            ident = index
    return ident


@constexpr_function
def report_word(name):
    # The word of report field ``name`` (iris_trace.schema.REPORT_FIELDS, spelled out).
    fields = ("state", "rank", "sm", "pid", "op", "offset", "expected", "seen", "cmp", "waited_ns")
    fields = fields + ("written_ns", "timeout_ns")
    return fields.index(str(name))


@constexpr_function
def signal_sub(op):
    # A signal's op as its index in iris_trace.schema.SIGNAL_OPS (spelled out: a compiled
    # kernel's cache key cannot take a method of a module's tuple; a test holds them equal).
    ops = ("set", "add")
    return ops.index(str(op))


@constexpr_function
def op_id(op):
    # "iris.ccl.all_reduce" and the like count as their family (see OP_IDS).
    name = str(op)
    ident = 0
    if name == "iris.wait_until":
        ident = 1
    elif name == "iris.device_barrier":
        ident = 2
    elif name[:8] == "iris.ccl":
        ident = 3
    elif name[:8] == "iris.ops":
        ident = 4
    return ident


@triton.jit
def _word(slots, index):
    return tl.load(slots + index).to(tl.int64, bitcast=True)


@triton.jit
def timeout_ns(heap_bases):
    """The rank's wait timeout in ns (0: none), set by ``Iris.hang.set_timeout``."""
    return _word(layout.flight_slots(heap_bases), SLOT_TIMEOUT_NS)


@triton.jit
def _linear_pid():
    return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))


@triton.jit
def _value_of(value):
    as_int = tl.cast(value, tl.int64)
    if blocks.is_block(as_int.type):
        return tl.cast(0, tl.int64)
    else:
        return as_int


@triton.jit
def _entry(seq, kind, sub, cur_rank, target_rank, sm, offset, value, when, extra, op: tl.constexpr):
    # The 8 words of one entry (layout above), one lane per word: one coalesced store.
    # Register work only, so it is safe inside a spin loop.
    ident = (
        kind
        | (sub << 8)
        | ((cur_rank & 0xFFFF) << 16)
        | ((tl.cast(target_rank, tl.int64) & 0xFFFF) << 32)
        | ((sm.to(tl.int64) & 0xFFFF) << 48)
    )
    where = (_linear_pid().to(tl.int64) & 0xFFFFFFFF) | (op_id(op) << 32)
    word = blocks.word_lanes(ENTRY_WORDS)
    data = tl.where(word == 0, seq, tl.cast(0, tl.int64))
    data = tl.where(word == 1, ident, data)
    data = tl.where(word == 2, where, data)
    data = tl.where(word == 3, offset, data)
    data = tl.where(word == 4, value, data)
    data = tl.where(word == 5, when, data)
    data = tl.where(word == 6, extra, data)
    return word, data


@triton.jit
def record(
    heap_bases,
    kind: tl.constexpr,
    sub: tl.constexpr,
    target_rank,
    pointer,
    value,
    extra,
    stamp,
    mask=None,
    op: tl.constexpr = tl.constexpr(""),
    fresh: tl.constexpr = tl.constexpr(False),
    use_stamp: tl.constexpr = tl.constexpr(False),
):
    """Write one ring entry (nothing when compiled out or when the ring is not set up).

    It claims its slot with an atomic whose result every thread needs, which costs a
    CTA barrier: call it where the program's threads run together, never inside a spin loop.
    """
    if ENABLED:
        slots = layout.flight_slots(heap_bases)
        ring = _word(slots, SLOT_RING)
        if ring != 0:
            # Traced kernels, while enabled, already read the clock for this op: reuse it.
            if use_stamp:
                when = tl.cast(stamp, tl.int64)
            elif fresh:
                when = hw.timer_ns()
            elif tracing.compiled_in(heap_bases.dtype):
                when = tl.cast(stamp, tl.int64)
                if when < 0:  # tracing disabled: the op read no clock
                    when = hw.timer_ns()
            else:
                when = hw.timer_ns()
            cur_rank = layout.cur_rank(heap_bases)
            offset, nbytes = tracing._touched(pointer, mask, layout.heap_base(heap_bases, cur_rank))
            if blocks.is_block(pointer.type):
                extra_word = nbytes
            else:
                extra_word = tl.cast(extra, tl.int64)
            sm = hw.sm_id()
            region = sm.to(tl.int64) % _word(slots, SLOT_NUM_REGIONS)
            counters = _word(slots, SLOT_COUNTERS).to(tl.pointer_type(tl.int64))
            index = tl.atomic_add(counters + region * COUNTER_STRIDE, 1, sem="relaxed", scope="gpu")
            mask_word = _word(slots, SLOT_RING_MASK)
            entry = region * (mask_word + 1) + (index & mask_word)
            word, data = _entry(
                index + 1,
                kind,
                sub,
                cur_rank,
                target_rank,
                sm,
                offset,
                _value_of(value),
                when,
                extra_word,
                op,
            )
            tl.store(ring.to(tl.pointer_type(tl.int64)) + entry * ENTRY_WORDS + word, data)


@triton.jit
def _pending_entry(slots):
    # This program's "waiting now" entry, behind the ring: one of PENDING_SLOTS per SM region.
    regions = _word(slots, SLOT_NUM_REGIONS)
    ring_entries = regions * (_word(slots, SLOT_RING_MASK) + 1)
    sm = hw.sm_id().to(tl.int64) % regions
    entry = ring_entries + sm * PENDING_SLOTS + _linear_pid().to(tl.int64) % PENDING_SLOTS
    return _word(slots, SLOT_RING).to(tl.pointer_type(tl.int64)) + entry * ENTRY_WORDS


@triton.jit
def note_waiting(heap_bases, pointer, cmp: tl.constexpr, value, now, op: tl.constexpr):
    """Say in this program's pending entry that it spins on ``pointer`` since ``now``.

    Called inside the spin loop, where each thread leaves at its own poll: so no
    atomic and no barrier, and every thread writes the same words.
    """
    if ENABLED:
        slots = layout.flight_slots(heap_bases)
        if _word(slots, SLOT_RING) != 0:
            cur_rank = layout.cur_rank(heap_bases)
            offset = pointer.to(tl.int64) - layout.heap_base(heap_bases, cur_rank)
            word, data = _entry(
                1,
                WAIT_BEGIN,
                cmp_id(cmp),
                cur_rank,
                -1,
                hw.sm_id(),
                offset,
                tl.cast(value, tl.int64),
                now,
                0,
                op,
            )
            tl.store(_pending_entry(slots) + word, data)


@triton.jit
def clear_waiting(heap_bases):
    """Empty this program's pending entry: its wait is over (the ring keeps the history)."""
    if ENABLED:
        slots = layout.flight_slots(heap_bases)
        if _word(slots, SLOT_RING) != 0:
            tl.store(_pending_entry(slots), 0)


@triton.jit
def expire(heap_bases, pointer, cmp: tl.constexpr, value, seen, waited_ns, timeout, op: tl.constexpr):
    """A wait ran out of time: fill the report (first thread of the rank wins) and stop.

    Called inside the spin loop, where each thread leaves or times out at its own poll:
    so every step is one thread's own (``hw.*_alone``), with no CTA barrier that the
    program's threads would have to reach together. The winning thread writes the whole
    report; the others go back to spinning until its trap stops the kernel.
    """
    won = tl.cast(1, tl.int32)
    sm = hw.sm_id()
    pid = _linear_pid()
    rank = tl.cast(-1, tl.int64)
    offset = pointer.to(tl.int64)
    if heap_bases is not None:
        slots = layout.flight_slots(heap_bases)
        rank = layout.cur_rank(heap_bases)
        offset = offset - layout.heap_base(heap_bases, rank)
        claim = _word(slots, SLOT_CLAIM)
        report = _word(slots, SLOT_REPORT)
        if claim != 0:
            won = hw.claim_alone(claim.to(tl.pointer_type(tl.int32)))
        if (won != 0) & (report != 0):
            records = report.to(tl.pointer_type(tl.int64))
            ring = _word(slots, SLOT_RING)
            if ring != 0:
                regions = _word(slots, SLOT_NUM_REGIONS)
                words = regions * (_word(slots, SLOT_RING_MASK) + 1 + PENDING_SLOTS) * ENTRY_WORDS
                hw.copy_alone(records + REPORT_WORDS, ring.to(tl.pointer_type(tl.int64)), words)
            hw.store_alone(records + report_word("rank"), rank)
            hw.store_alone(records + report_word("sm"), sm)
            hw.store_alone(records + report_word("pid"), pid)
            hw.store_alone(records + report_word("op"), tl.cast(op_id(op), tl.int64))
            hw.store_alone(records + report_word("offset"), offset)
            hw.store_alone(records + report_word("expected"), value)
            hw.store_alone(records + report_word("seen"), seen)
            hw.store_alone(records + report_word("cmp"), tl.cast(cmp_id(cmp), tl.int64))
            hw.store_alone(records + report_word("waited_ns"), waited_ns)
            hw.store_alone(records + report_word("written_ns"), hw.timer_ns())
            hw.store_alone(records + report_word("timeout_ns"), timeout)
            # Every field reaches host memory before the state word says they are there.
            hw.fence_system()
            hw.store_alone(records + report_word("state"), tl.cast(1, tl.int64))
            hw.fence_system()
    hw.wait_expired(won, rank, sm, pid, op, offset, value, seen, cmp, waited_ns, timeout)
