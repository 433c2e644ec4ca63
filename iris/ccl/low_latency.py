"""The low-latency protocol: data and its flag cross NVLink in one 8-byte store.

The staged protocol (:mod:`iris.ccl.staged`) still needs one handshake before it
reads: a fence, an arrival on every member, a wait, then a round trip per remote
read. Here a sender writes every 4-byte payload word ``d`` as the 8-byte word
``epoch << 32 | d`` straight into the receiver's slot. An aligned 8-byte store lands
whole, so a receiver that reads the call's epoch in a word's upper half holds that
word's data too: no fence, no arrival, no round trip; a call costs one one-way
trip across the link. Twice the payload crosses the links, so it only pays for
small messages (``Config.low_latency_max_bytes``).

Every rank's heap holds two halves of ``GROUP`` receive slots
(``Runtime.low_latency_slots``). Call ``c`` (``Runtime.protocol_calls``, shared
with :mod:`iris.ccl.staged`) writes half ``c % 2`` with epoch ``c + 1``. A sender
rewrites a half at call ``c + 2`` only after finishing call ``c + 1``, which
needed every member's words of call ``c + 1``, which each member sent only after
finishing its reads of call ``c``. Stale words carry older epochs and never match.
As for staged calls, every member must take part in every call, so only the
whole-world group uses the protocol, and a broadcast (where receivers send
nothing) does not.

What a call moves, for ``words`` payload words per member (a block of ``cols``
words, or with ``ROWS`` several rows of ``cols`` words, ``in_stride`` and
``out_stride`` words apart):

* ``all_reduce`` / ``all_gather``: the whole input goes to every member;
* ``reduce_scatter`` / ``all_to_all`` (``SCATTER``): block ``j`` goes to member ``j``;
* ``all_reduce`` / ``reduce_scatter`` (``REDUCE``): the slots are combined in
  member order (every member gets bit-identical results); otherwise slot ``s``
  is placed at block ``s`` of the output.
"""

import torch
import triton
import triton.language as tl

from ..device import flight, layout, rma, tracing
from ..device import intrinsics as hw
from . import device as ccl
from .device import RANK_ARGS
from .staged import finish_call

#: What a low-latency call computes: mode -> (SCATTER, REDUCE).
MODES = {
    "all_reduce": (False, True),
    "all_gather": (False, False),
    "reduce_scatter": (True, True),
    "all_to_all": (True, False),
}
#: Payload words per tile (8 KiB on the wire to each member).
BLOCK_WORDS = 1024
#: What a wait that runs out of time reports as its op.
WAIT_OP: tl.constexpr = tl.constexpr("iris.ccl.low_latency")


@triton.jit
def _pack(payload, flag):
    return (payload.to(tl.int64) & 0xFFFFFFFF) | flag


@triton.jit
def _late(got, mask, epoch):
    return tl.sum((((got >> 32).to(tl.int32) != epoch) & mask).to(tl.int32), axis=0)


@triton.jit
def receive(slot, BLOCK: tl.constexpr, mask, epoch, heap_bases, op: tl.constexpr):
    """Wait until the ``BLOCK`` words at ``slot`` (on this rank) carry ``epoch``; returns their payloads.

    The loop condition is reduced over the whole program, so every thread spins
    together; a wait longer than the rank's timeout stops the kernel with a report
    (``Iris.set_wait_timeout``), and the wait appears in traces as a stall.

    Example:
        >>> data = receive(slots + s * slot_words + tile * BLOCK, BLOCK, mask, epoch, heap_bases,
        ...                "iris.ccl.all_reduce")
    """
    start = tracing.begin(heap_bases)
    words = slot + tl.arange(0, BLOCK)
    got = tl.load(words, mask=mask, other=0, volatile=True)
    late = _late(got, mask, epoch)
    if late > 0:
        timeout = flight.timeout_ns(heap_bases)
        since = hw.timer_ns()
        while late > 0:
            waited = hw.timer_ns() - since
            if (timeout > 0) & (waited > timeout):
                flags = (got >> 32).to(tl.int32)
                seen = tl.min(tl.where(mask & (flags != epoch), flags, epoch), axis=0)
                flight.expire(heap_bases, slot, "eq", epoch, seen, waited, timeout, op)
            hw.progress()
            got = tl.load(words, mask=mask, other=0, volatile=True)
            late = _late(got, mask, epoch)
    tracing.end(heap_bases, start, tracing.WAIT_UNTIL, layout.cur_rank(heap_bases), slot, None, epoch)
    return got.to(tl.int32)


@triton.jit
def _lanes(payload, DTYPE: tl.constexpr):
    # A word holds one 32-bit element or two 16-bit ones: (low, high) accumulators.
    if DTYPE.primitive_bitwidth == 16:
        low = (payload & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
        high = ((payload >> 16) & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    else:
        low = ccl.accumulator(payload.to(DTYPE, bitcast=True))
        high = low
    return low, high


@triton.jit
def _word(low, high, DTYPE: tl.constexpr):
    if DTYPE.primitive_bitwidth == 16:
        low_bits = low.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        high_bits = high.to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32)
        result = low_bits | (high_bits << 16)
    else:
        result = low.to(DTYPE).to(tl.int32, bitcast=True)
    return result


@triton.jit
def _at(w, cols, stride, ROWS: tl.constexpr):
    # Word w of a block of rows; one row keeps the offsets visibly contiguous (vector accesses).
    if ROWS:
        result = (w // cols) * stride + w % cols
    else:
        result = w
    return result


@triton.jit(do_not_specialize=RANK_ARGS)
def low_latency_kernel(
    out, inp, words,
    cols, in_stride, out_stride,
    ranks,
    my_index, cur_rank, heap_bases,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
    slots, slot_words, calls,
    SCATTER: tl.constexpr, REDUCE: tl.constexpr, ROWS: tl.constexpr,
):  # fmt: skip
    """One low-latency collective over ``words`` payload words per member (see the module doc).

    Example:
        >>> kernel, grid, args, num_warps = low_latency_launch(runtime, state, "all_reduce", out, inp,
        ...                                                    config)
        >>> kernel[grid](*args, num_warps=num_warps)
    """
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    call = tl.load(calls, volatile=True)
    epoch = call + 1
    flag = epoch.to(tl.int64) << 32
    half = slots + (call % 2).to(tl.int64) * GROUP * slot_words
    src = inp.to(tl.pointer_type(tl.int32), bitcast=True)
    dst = out.to(tl.pointer_type(tl.int32), bitcast=True)
    DTYPE: tl.constexpr = out.dtype.element_ty
    tiles = tl.cdiv(words, BLOCK)
    # Program p sends tiles p, p + programs, ... and receives the same tiles, which
    # program p of every member sent: it never waits on another program of its launch.
    for tile in range(pid, tiles, programs):
        w = tile * BLOCK + tl.arange(0, BLOCK)
        mask = w < words
        at = _at(w, cols, in_stride, ROWS)
        into = half + my_index * slot_words + w
        if not SCATTER:
            packed = _pack(tl.load(src + at, mask=mask), flag)
        for i in tl.static_range(GROUP):
            member = (my_index + i) % GROUP
            if SCATTER:
                packed = _pack(tl.load(src + at + member * cols, mask=mask), flag)
            rma.store(into, packed, cur_rank, tl.load(ranks + member), heap_bases, mask=mask)
    for tile in range(pid, tiles, programs):
        w = tile * BLOCK + tl.arange(0, BLOCK)
        mask = w < words
        at = _at(w, cols, out_stride, ROWS)
        first = half + tile * BLOCK
        if REDUCE:
            low, high = _lanes(receive(first, BLOCK, mask, epoch, heap_bases, WAIT_OP), DTYPE)
            for s in tl.static_range(1, GROUP):
                got = receive(first + s * slot_words, BLOCK, mask, epoch, heap_bases, WAIT_OP)
                more_low, more_high = _lanes(got, DTYPE)
                low = ccl.combine(low, more_low, OP)
                high = ccl.combine(high, more_high, OP)
            tl.store(dst + at, _word(low, high, DTYPE), mask=mask)
        else:
            for s in tl.static_range(GROUP):
                got = receive(first + s * slot_words, BLOCK, mask, epoch, heap_bases, WAIT_OP)
                tl.store(dst + at + s * cols, got, mask=mask)
    finish_call(calls, call)


def payload_bytes(payload: int, *tensors, row_bytes: int | None = None) -> int | None:
    """``payload`` (bytes a member sends each member), or None if the protocol cannot carry it.

    The blocks' rows (``row_bytes``, default the whole ``payload``) must be whole
    4-byte words of 4-byte-aligned tensors; a non-tensor gives None (the argument
    checks report it).

    Example:
        >>> payload_bytes(inp.numel() * inp.element_size(), out, inp)
        4096
    """
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    whole_words = (payload if row_bytes is None else row_bytes) % 4 == 0
    return payload if whole_words and all(t.data_ptr() % 4 == 0 for t in tensors) else None


def low_latency_launch(runtime, state, mode: str, out, inp, config, op=None, rows: int = 1, strides=(0, 0)):
    """``(kernel, grid, args, num_warps)`` of a low-latency ``mode`` call, for ``Runtime.prepare``.

    Each member's block is ``rows`` rows (``strides`` elements apart in ``inp`` and
    ``out``) of the payload; 1-D tensors are one row.

    Example:
        >>> low_latency_launch(runtime, state, "all_reduce", out, inp, config)
    """
    scatter, reduce = MODES[mode]
    size = inp.element_size()
    block_elements = (inp.numel() // state.size if scatter else inp.numel()) // rows
    cols = block_elements * size // 4
    words = rows * cols
    slots = runtime.low_latency_slots()
    grid = (runtime.programs(triton.cdiv(words, BLOCK_WORDS), config),)
    in_stride, out_stride = (s * size // 4 for s in strides)
    args = (
        out, inp, words, cols, in_stride, out_stride,
        state.ranks, state.my_index, runtime.ctx.cur_rank, runtime.ctx._heap_bases_for_iris(),
        state.size, BLOCK_WORDS, op.value if op is not None else "sum",
        slots, slots.shape[-1], runtime.protocol_calls, scatter, reduce, rows > 1,
    )  # fmt: skip
    return low_latency_kernel, grid, args, config.num_warps
