"""The cross-node path under emulation: NVSHMEM's completion rule, run on mapped heaps.

Every rank's heap is mapped in every process of the host, so the data can be
reached directly; what the model keeps is the rule a program could get wrong: a
cross-node put is not written until the issuing rank's next ``quiet``
(``iris.backends.emulated.RemoteWrites``). Gets and atomics act on the target's
memory at once, as NVSHMEM's blocking gets and fetching atomics do.
"""

from __future__ import annotations

import ctypes

import numpy as np
import triton
import triton.language as tl

from ..backends.emulated import RemoteWrites
from . import atomic_ops, layout
from ._intrinsics_emulated import _scalar
from ._intrinsics_emulated import _values as _array


@triton.jit
def _distance(rank, heap_bases):
    # Bytes from this rank's heap to ``rank``'s as mapped here: only the emulation maps
    # another node's heap.
    return layout.heap_base(heap_bases, rank) - layout.heap_base(heap_bases, layout.cur_rank(heap_bases))


@triton.jit
def _mapped(ptr, rank, heap_bases):
    # The target's copy of the object at ``ptr``.
    ELEMENT_BYTES: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    return ptr + _distance(rank, heap_bases) // ELEMENT_BYTES


def _defer(remote, value, mask):
    addresses = _array(remote).astype(np.uint64)
    data = np.broadcast_to(_array(value), addresses.shape)
    keep = np.ones(addresses.shape, bool) if mask is None else np.broadcast_to(_array(mask), addresses.shape)
    rows = np.ascontiguousarray(data).reshape(-1).view(np.uint8).reshape(addresses.size, -1)
    keep = keep.reshape(-1)
    RemoteWrites.defer(addresses.reshape(-1)[keep], [row.tobytes() for row in rows[keep]])


@triton.jit
def put(ptr, value, rank, heap_bases, mask=None):
    remote = _mapped(ptr, rank, heap_bases)
    _defer(remote, tl.cast(value, ptr.dtype.element_ty) + tl.zeros(remote.shape, ptr.dtype.element_ty), mask)


def _defer_run(remote, source, nbytes):
    # The source is read now, as NVSHMEM's blocking put has read it when it returns.
    RemoteWrites.defer([_scalar(remote)], [ctypes.string_at(_scalar(source), _scalar(nbytes))])


def _copy_run(dest, remote, nbytes):
    ctypes.memmove(_scalar(dest), _scalar(remote), _scalar(nbytes))


@triton.jit
def put_run(dest, source, nbytes, rank, heap_bases):
    _defer_run(dest + _distance(rank, heap_bases), source, nbytes)


@triton.jit
def get_run(dest, source, nbytes, rank, heap_bases):
    _copy_run(dest, source + _distance(rank, heap_bases), nbytes)


@triton.jit
def get(ptr, rank, heap_bases, mask=None, other=None):
    return tl.load(_mapped(ptr, rank, heap_bases), mask=mask, other=other, volatile=True)


@triton.jit
def atomic(op: tl.constexpr, ptr, value, rank, heap_bases, mask=None):
    return atomic_ops.apply(op, _mapped(ptr, rank, heap_bases), value, mask, "relaxed", "sys")


@triton.jit
def cas(ptr, cmp, value, rank, heap_bases):
    return tl.atomic_cas(_mapped(ptr, rank, heap_bases), cmp, value, sem="relaxed", scope="sys")


def quiet():
    RemoteWrites.complete()
