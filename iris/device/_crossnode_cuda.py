"""The cross-node path on GPUs: NVSHMEM device calls, through ``_nvshmem_calls.ll``.

Every function moves raw words (8, 16, 32 or 64 bits: NVSHMEM's ``uint<N>`` calls), so
one set of calls serves every dtype; values are reinterpreted, never converted.

* ``put`` and ``get`` are element-wise: each element is an NVSHMEM single-element put
  (``nvshmem_uint<N>_p``, complete at the next :func:`quiet`) or get (complete on
  return), predicated by ``mask``. A thread that holds a replicated copy of an element
  repeats the same put or get, which is harmless.
* ``put_run`` and ``get_run`` move one run of consecutive bytes with NVSHMEM's block
  calls (``nvshmemx_putmem_block`` / ``getmem_block``), which every thread of the CTA
  makes together; :mod:`iris.device.crossnode` decides when a block op is one run.
* Atomics are issued once per element by thread 0 of the CTA, which hands the old value
  to every thread (``iris_xn_amo<N>``). NVSHMEM's native atomics serve integer add, swap,
  and, or, xor and compare-and-swap; float add and min/max of any type run as a
  compare-and-swap loop. An atomic over a block runs one element after another: correct,
  and as slow as that many network round trips, so move bulk data with puts and a signal.
* :func:`quiet` completes every put of every thread of the CTA, then meets the CTA, so
  a release issued by one thread afterwards (``signal``) follows all of them.

Every call expects all threads of the CTA to reach it together, as Triton's own scalar
operations do; the device ops of :mod:`iris.device.rma` call them that way.
"""

import triton
import triton.language as tl
from triton.language import core
from triton.runtime.jit import constexpr_function

from . import blocks

#: Operation codes of ``iris_xn_amo32`` / ``iris_xn_amo64`` (``_nvshmem_calls.ll``), by the
#: name ``iris.device.atomic_ops`` gives the op; the native integer ops, and the two every
#: type has (swap, compare-and-swap).
_AMO_CODES = {"add": 0, "xchg": 1, "and": 2, "or": 3, "xor": 4, "cas": 5}


@constexpr_function
def _amo_code(op):
    return _AMO_CODES[str(op)]


@constexpr_function
def _native(op, dtype):
    # NVSHMEM has swap and compare-and-swap for every word, and add/and/or/xor on integers.
    return str(op) in ("xchg", "cas") or (str(op) in _AMO_CODES and dtype.is_int())


_I32 = core.dtype("int32")
_I64 = core.dtype("int64")
_WORDS = [core.dtype(f"uint{bits}") for bits in (8, 16, 32, 64)]


@core.extern
def _put_word(pred, address, word, pe, _semantic=None):
    calls = {(_I32, _I64, w, _I32): (f"iris_xn_put{w.primitive_bitwidth}", _I32) for w in _WORDS}
    return core.extern_elementwise(
        "", "", [pred, address, word, pe], calls, is_pure=False, _semantic=_semantic
    )


@core.extern
def _get_word(pred, address, other, pe, _semantic=None):
    calls = {(_I32, _I64, w, _I32): (f"iris_xn_get{w.primitive_bitwidth}", w) for w in _WORDS}
    return core.extern_elementwise(
        "", "", [pred, address, other, pe], calls, is_pure=False, _semantic=_semantic
    )


@core.extern
def _amo_word(op, address, word, compare, pe, _semantic=None):
    calls = {(_I32, _I64, w, w, _I32): (f"iris_xn_amo{w.primitive_bitwidth}", w) for w in _WORDS[2:]}
    return core.extern_elementwise(
        "", "", [op, address, word, compare, pe], calls, is_pure=False, _semantic=_semantic
    )


@core.extern
def _transfer_block(name: core.constexpr, dest, source, nbytes, pe, _semantic=None):
    calls = {(_I64, _I64, _I64, _I32): (f"iris_xn_{name.value}_block", _I32)}
    return core.extern_elementwise(
        "", "", [dest, source, nbytes, pe], calls, is_pure=False, _semantic=_semantic
    )


@core.extern
def _quiet_all(_semantic=None):
    return core.extern_elementwise(
        "", "", [], {(): ("iris_xn_quiet", _I32)}, is_pure=False, _semantic=_semantic
    )


@triton.jit
def _as_word(x):
    BITS: tl.constexpr = x.dtype.primitive_bitwidth
    tl.static_assert(BITS >= 8, "the cross-node path moves whole bytes (no bool tensors)")
    if BITS == 8:
        word = x.to(tl.uint8, bitcast=True)
    elif BITS == 16:
        word = x.to(tl.uint16, bitcast=True)
    elif BITS == 32:
        word = x.to(tl.uint32, bitcast=True)
    else:
        word = x.to(tl.uint64, bitcast=True)
    return word


@triton.jit
def _predicate(mask):
    if mask is None:
        pred = tl.full([], 1, tl.int32)
    else:
        pred = mask.to(tl.int32)
    return pred


@triton.jit
def put(ptr, value, rank, heap_bases, mask=None):
    element = tl.cast(value, ptr.dtype.element_ty)
    _put_word(_predicate(mask), ptr.to(tl.int64), _as_word(element), tl.cast(rank, tl.int32))


@triton.jit
def get(ptr, rank, heap_bases, mask=None, other=None):
    ELEMENT: tl.constexpr = ptr.dtype.element_ty
    if other is None:
        fallback = tl.zeros([], ELEMENT)
    else:
        fallback = tl.cast(other, ELEMENT)
    word = _get_word(_predicate(mask), ptr.to(tl.int64), _as_word(fallback), tl.cast(rank, tl.int32))
    return word.to(ELEMENT, bitcast=True)


@triton.jit
def put_run(dest, source, nbytes, rank, heap_bases):
    _transfer_block("putmem", dest, source, nbytes, tl.cast(rank, tl.int32))


@triton.jit
def get_run(dest, source, nbytes, rank, heap_bases):
    _transfer_block("getmem", dest, source, nbytes, tl.cast(rank, tl.int32))


@triton.jit
def _combine(op: tl.constexpr, current, value):
    if op == "add":
        result = current + value
    elif op == "min":
        result = tl.minimum(current, value)
    else:
        result = tl.maximum(current, value)
    return result


@triton.jit
def _one_atomic(op: tl.constexpr, address, value, compare, pe):
    # One element at ``address`` on PE ``pe``; every thread gets the old value.
    word = _as_word(value)
    if _native(op, value.dtype):
        old = _amo_word(_amo_code(op), address, word, _as_word(compare), pe)
    else:
        tl.static_assert(op == "add" or op == "min" or op == "max", "cross-node atomic: unknown op " + op)
        # NVSHMEM has no float add and no min/max: compare-and-swap until no other
        # writer came between the read and the swap. Reading is a fetch-or of 0.
        zero = word ^ word
        current = _amo_word(_amo_code("or"), address, zero, zero, pe)
        seen = _amo_word(
            _amo_code("cas"),
            address,
            _as_word(_combine(op, current.to(value.dtype, bitcast=True), value)),
            current,
            pe,
        )
        while seen != current:
            current = seen
            desired = _as_word(_combine(op, current.to(value.dtype, bitcast=True), value))
            seen = _amo_word(_amo_code("cas"), address, desired, current, pe)
        old = current
    return old.to(value.dtype, bitcast=True)


@triton.jit
def _atomic(op: tl.constexpr, ptr, value, compare, pe, mask):
    ELEMENT: tl.constexpr = ptr.dtype.element_ty
    tl.static_assert(ELEMENT.primitive_bitwidth >= 32, "8- and 16-bit atomics cannot reach another node")
    value = tl.cast(value, ELEMENT)
    compare = tl.cast(compare, ELEMENT)
    if ptr.type.is_block():
        # One element after another, each a scalar atomic (see the module docstring).
        SHAPE: tl.constexpr = ptr.shape
        index = blocks.row_major_index(ptr)
        addresses = ptr.to(tl.int64)
        words = _as_word(tl.broadcast_to(value, SHAPE))
        compares = _as_word(tl.broadcast_to(compare, SHAPE))
        keep = tl.broadcast_to(_predicate(mask), SHAPE)
        olds = words ^ words
        for i in range(index.numel):
            picked = index == i
            address = tl.sum(tl.where(picked, addresses, 0))
            word = tl.sum(tl.where(picked, words, 0))
            expected = tl.sum(tl.where(picked, compares, 0))
            old = word ^ word
            if tl.sum(tl.where(picked, keep, 0)) != 0:
                old = _as_word(
                    _one_atomic(
                        op, address, word.to(ELEMENT, bitcast=True), expected.to(ELEMENT, bitcast=True), pe
                    )
                )
            olds = tl.where(picked, old, olds)
        result = olds.to(ELEMENT, bitcast=True)
    else:
        result = tl.zeros([], ELEMENT)
        if _predicate(mask) != 0:
            result = _one_atomic(op, ptr.to(tl.int64), value, compare, pe)
    return result


@triton.jit
def atomic(op: tl.constexpr, ptr, value, rank, heap_bases, mask=None):
    return _atomic(op, ptr, value, value, tl.cast(rank, tl.int32), mask)


@triton.jit
def cas(ptr, cmp, value, rank, heap_bases):
    return _atomic("cas", ptr, value, cmp, tl.cast(rank, tl.int32), None)


@triton.jit
def quiet():
    _quiet_all()


@triton.jit
def quiet_kernel():
    """Complete this rank's cross-node puts from the host's side (``ctx.barrier()`` launches it)."""
    _quiet_all()
