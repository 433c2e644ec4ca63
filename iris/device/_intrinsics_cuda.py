"""Hardware primitives for NVIDIA GPUs, written as PTX inline assembly."""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from ..backends import _cuda_call_sites as call_site_pass
from ..config import static_wait_timeout_ns

#: Timeout of waits that have no ``heap_bases`` (so no context slot to read it from):
#: fixed when ``iris`` is imported (``IRIS_WAIT_TIMEOUT``, or ``IRIS_DEBUG=1``).
STATIC_TIMEOUT_NS: tl.constexpr = tl.constexpr(static_wait_timeout_ns())
HAS_STATIC_TIMEOUT: tl.constexpr = tl.constexpr(static_wait_timeout_ns() > 0)


@triton.jit
def load_acquire(pointer, scope: tl.constexpr):
    """Read a 32- or 64-bit flag with acquire semantics at ``scope`` (sys, gpu or cta)."""
    tl.static_assert(scope == "sys" or scope == "gpu" or scope == "cta", "scope must be sys, gpu or cta")
    bits: tl.constexpr = pointer.dtype.element_ty.primitive_bitwidth
    tl.static_assert(bits == 32 or bits == 64, "flags must be 32 or 64 bits wide")
    if bits == 64:
        raw = tl.inline_asm_elementwise(
            "ld.acquire." + scope + ".global.b64 $0, [$1];",
            "=l,l",
            [pointer.to(tl.int64)],
            dtype=tl.int64,
            is_pure=False,
            pack=1,
        )
    else:
        raw = tl.inline_asm_elementwise(
            "ld.acquire." + scope + ".global.b32 $0, [$1];",
            "=r,l",
            [pointer.to(tl.int64)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    return raw.to(pointer.dtype.element_ty, bitcast=True)


@triton.jit
def load_invariant(pointer):
    """Read a 64-bit word that nothing writes while the kernel runs (int64).

    Marked pure, so the compiler may read it once and reuse it across loops and ops
    (a plain load cannot move past the kernel's own stores, which might alias it).
    Through the read-only data path (``ld.global.nc``), whose cache starts every
    launch afresh, so a word the host changes between launches is seen changed.
    """
    return tl.inline_asm_elementwise(
        "ld.global.nc.b64 $0, [$1];", "=l,l", [pointer.to(tl.int64)], dtype=tl.int64, is_pure=True, pack=1
    )


@triton.jit
def spin_start():
    """Marks the start of a spin-wait (used by the emulator's timeout)."""
    return 0


@triton.jit
def spin_check(start, pointer, seen, expected, op: tl.constexpr):
    """Called on every spin iteration; a no-op on GPUs."""
    pass


@triton.jit
def device_check(condition, message: tl.constexpr):
    """Fails the kernel with ``message`` where ``condition`` is false (debug builds)."""
    tl.device_assert(condition, message)


@triton.jit
def timer_ns():
    """The GPU's %globaltimer in nanoseconds (not synchronised across GPUs)."""
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1
    )


@triton.jit
def opaque(x):
    """``x`` (int32), hidden from the compiler's constant folding: a register move it cannot see through."""
    return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def sm_id():
    """The SM this program runs on (%smid)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


#: What :func:`call_site` compiles to before the site pass gives each copy its id.
_SITE_PLACEHOLDER: tl.constexpr = tl.constexpr(call_site_pass.PLACEHOLDER_ASM)


@triton.jit
def call_site():
    """The id of the source line that called the traced op (``iris_trace.schema.site_id``).

    A placeholder move of :data:`iris_trace.schema.UNKNOWN_SITE`: after inlining, the site
    pass (``iris.backends._cuda_call_sites``) gives every copy of it the id of the line
    its debug location names, so the id costs one immediate move and is fixed at compile
    time. Not pure: two call sites must never be merged into one.
    """
    return tl.inline_asm_elementwise(_SITE_PLACEHOLDER, "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def launch_tag():
    """The launch's tag: the low bits of %gridid, which the GPU numbers each launch of a process by."""
    return tl.inline_asm_elementwise("mov.u64 $0, %gridid;", "=l", [], dtype=tl.int64, is_pure=True, pack=1)


@triton.jit
def static_timeout_ns():
    """The import-time wait timeout (ns) for waits without ``heap_bases``."""
    return tl.cast(STATIC_TIMEOUT_NS, tl.int64)


@triton.jit
def sleep_ns(NS: tl.constexpr):
    """Let the SM's other warps issue for about ``NS`` nanoseconds (a polite spin)."""
    tl.inline_asm_elementwise(
        f"nanosleep.u32 {NS};\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def progress():
    """Called by every spin loop; nothing to do on GPUs, where communication progresses by itself."""
    pass


@triton.jit
def fence_system():
    """Order this thread's earlier writes before its later ones for every observer, the CPU included."""
    tl.inline_asm_elementwise(
        "fence.sc.sys;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def claim_alone(pointer):
    """Flip the int32 at ``pointer`` from 0 to 1 in this thread; 1 if this thread flipped it.

    Triton's scalar ``tl.atomic_cas`` is issued by one thread, which hands the result
    to the others through shared memory behind a CTA barrier: threads that get here at
    different times (each leaves a spin loop at its own poll) would not meet there.
    """
    old = tl.inline_asm_elementwise(
        "atom.relaxed.gpu.global.cas.b32 $0, [$1], 0, 1;",
        "=r,l",
        [pointer.to(tl.int64)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )
    return (old == 0).to(tl.int32)


@triton.jit
def store_alone(pointer, value):
    """Store ``value`` as an int64 at ``pointer`` from this thread.

    A scalar ``tl.store`` is issued by thread 0 only, which may not be here.
    """
    tl.inline_asm_elementwise(
        "st.global.b64 [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,l",
        [pointer.to(tl.int64), tl.cast(value, tl.int64)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def copy_alone(destination, source, count):
    """Copy ``count`` int64 words from ``source`` to ``destination`` in this thread, with no barrier.

    The reads bypass L1 (``ld.volatile``): other SMs wrote the words.
    """
    for index in range(0, count):
        word = tl.inline_asm_elementwise(
            "ld.volatile.global.b64 $0, [$1];",
            "=l,l",
            [(source + index).to(tl.int64)],
            dtype=tl.int64,
            is_pure=False,
            pack=1,
        )
        store_alone(destination + index, word)


@constexpr_function
def _record_stores_asm(first_word, slot_word, slot_shift):
    # PTX that writes a 64-byte record at slot ``rec_slot`` of the region at ``$3`` if
    # ``rec_room``: the eight words are operands ``$first_word`` on, word ``slot_word``
    # with the slot << slot_shift or'd in.
    words = [f"${first_word + i}" for i in range(8)]
    words[slot_word] = "rec_slot_word"
    stores = "".join(
        f"@rec_room st.global.v2.b64 [rec_addr+{16 * i}], {{{words[2 * i]}, {words[2 * i + 1]}}};\n\t"
        for i in range(4)
    )
    return (
        "cvt.u64.u32 rec_wide, rec_slot;\n\t"
        "mad.lo.u64 rec_addr, rec_wide, 64, $3;\n\t"
        f"shl.b64 rec_slot_word, rec_wide, {slot_shift};\n\t"
        f"or.b64 rec_slot_word, rec_slot_word, ${first_word + slot_word};\n\t" + stores
    )


#: The registers and the thread-0 predicate of the record-writing PTX blocks.
_RECORD_REGS = (
    "{\n\t.reg .pred rec_lead, rec_room, rec_full;\n\t.reg .u32 rec_tid, rec_slot;\n\t"
    ".reg .u64 rec_wide, rec_addr, rec_slot_word;\n\t"
    "mov.u32 rec_tid, %tid.x;\n\tsetp.eq.u32 rec_lead, rec_tid, 0;\n\tmov.u32 rec_slot, 0;\n\t"
)


@constexpr_function
def _record_asm(slot_word, slot_shift):
    # PTX for write_record: operands $1 counter, $2 capacity, $3 region base, $4 dropped
    # counter, $5..$12 the record's words.
    return (
        _RECORD_REGS + "@rec_lead atom.relaxed.gpu.global.add.u32 rec_slot, [$1], 1;\n\t"
        "setp.lt.and.u32 rec_room, rec_slot, $2, rec_lead;\n\t"
        "setp.ge.and.u32 rec_full, rec_slot, $2, rec_lead;\n\t"
        + _record_stores_asm(5, slot_word, slot_shift)
        + "@rec_full red.relaxed.gpu.global.add.u32 [$4], 1;\n\t"
        "selp.b64 $0, rec_wide, -1, rec_room;\n\t}"
    )


@constexpr_function
def _reserved_record_asm(slot_word, slot_shift):
    # PTX for write_reserved_record: operands $1 first slot, $2 index, $3 region base,
    # $4 capacity, $5 dropped counter, $6..$13 the record's words.
    return (
        _RECORD_REGS + "@rec_lead add.u32 rec_slot, $1, $2;\n\t"
        "setp.lt.and.u32 rec_room, rec_slot, $4, rec_lead;\n\t"
        "setp.ge.and.u32 rec_full, rec_slot, $4, rec_lead;\n\t"
        + _record_stores_asm(6, slot_word, slot_shift)
        + "@rec_full red.relaxed.gpu.global.add.u32 [$5], 1;\n\tmov.u32 $0, 0;\n\t}"
    )


@triton.jit
def write_record(
    counter, capacity, records, dropped, w0, w1, w2, w3, w4, w5, w6, w7,
    SLOT_WORD: tl.constexpr, SLOT_SHIFT: tl.constexpr,
):  # fmt: skip
    """Claim the next slot of ``counter`` and write the 64-byte record there, from thread 0 alone.

    The eight int64 words go out in order, word ``SLOT_WORD`` with the slot's index
    or'd in at bit ``SLOT_SHIFT``; a full region (``capacity`` slots taken) adds 1 to
    ``dropped`` instead. Returns the slot (or -1 when full) in thread 0 and -1 in every
    other thread. One thread does all of it: Triton's scalar atomic would hand the slot
    to every thread through shared memory behind two CTA barriers, making every warp
    wait for the atomic's round trip to L2; here only thread 0's warp does.
    """
    return tl.inline_asm_elementwise(
        _record_asm(SLOT_WORD, SLOT_SHIFT),
        "=l,l,r,l,l,l,l,l,l,l,l,l,l",
        [
            counter.to(tl.int64), capacity.to(tl.int32), records.to(tl.int64), dropped.to(tl.int64),
            w0, w1, w2, w3, w4, w5, w6, w7,
        ],
        dtype=tl.int64,
        is_pure=False,
        pack=1,
    )  # fmt: skip


@triton.jit
def reserve_slots(counter, count):
    """Add ``count`` to ``counter`` from thread 0 and return its old value there (0 elsewhere).

    Nothing here reads the reply: the atomic is issued and the program goes on until an
    instruction uses the value (:func:`write_reserved_record`), so work between the two
    hides the round trip to L2 that :func:`write_record` waits for.
    """
    return tl.inline_asm_elementwise(
        "{\n\t.reg .pred res_lead;\n\t.reg .u32 res_tid;\n\t"
        "mov.u32 res_tid, %tid.x;\n\tsetp.eq.u32 res_lead, res_tid, 0;\n\tmov.u32 $0, 0;\n\t"
        "@res_lead atom.relaxed.gpu.global.add.u32 $0, [$1], $2;\n\t}",
        "=r,l,r",
        [counter.to(tl.int64), tl.cast(count, tl.int32)],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def write_reserved_record(
    first, index, capacity, records, dropped, w0, w1, w2, w3, w4, w5, w6, w7,
    SLOT_WORD: tl.constexpr, SLOT_SHIFT: tl.constexpr,
):  # fmt: skip
    """Write a record into slot ``first + index`` (``first`` from :func:`reserve_slots`), from thread 0.

    As :func:`write_record` without the claim: a slot past ``capacity`` adds 1 to
    ``dropped`` instead.
    """
    tl.inline_asm_elementwise(
        _reserved_record_asm(SLOT_WORD, SLOT_SHIFT),
        "=r,r,r,l,r,l,l,l,l,l,l,l,l,l",
        [
            tl.cast(first, tl.int32), tl.cast(index, tl.int32), records.to(tl.int64), capacity.to(tl.int32),
            dropped.to(tl.int64), w0, w1, w2, w3, w4, w5, w6, w7,
        ],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )  # fmt: skip


@triton.jit
def wait_expired(
    won, rank, sm, pid, op: tl.constexpr, offset, expected, seen, cmp: tl.constexpr, waited_ns, timeout
):
    """Stop the kernel (``trap``) if this program wrote the rank's report; others keep spinning until then.

    The facts travel through the report record in host memory: a trapped GPU cannot print them.
    """
    tl.inline_asm_elementwise(
        "{\n\t.reg .pred p;\n\tsetp.ne.s32 p, $1, 0;\n\t@p trap;\n\tmov.u32 $0, 0;\n\t}",
        "=r,r",
        [won],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def set_hang_describer(describe) -> None:
    """Nothing to install on GPUs: a trapped kernel cannot call back; the host reads the report."""
