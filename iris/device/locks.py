"""Locks on a peer's heap: test and test-and-set, with a wait that is traced and times out.

The spinlock all-reduce (:mod:`iris.ccl.all_reduce`) and ``DeviceContext``'s tile
collectives (:mod:`iris.device.tile_collectives`) take a lock in the owner's heap before
a read-modify-write of its data, and release it after. :mod:`iris.ccl.device` re-exports
both for users' kernels.

Example:
    >>> acquire_lock(lock, cur_rank, peer, heap_bases, "my_kernel")
    >>> ...  # read-modify-write peer's data
    >>> release_lock(lock, cur_rank, peer, heap_bases)
"""

import triton
import triton.language as tl

from . import rma

#: Lock states (:func:`acquire_lock`, :func:`release_lock`).
_FREE: tl.constexpr = tl.constexpr(0)
_HELD: tl.constexpr = tl.constexpr(1)


@triton.jit
def acquire_lock(lock, cur_rank, owner, heap_bases, op: tl.constexpr):
    """Take the int32 ``lock`` (free 0, held 1) in ``owner``'s heap; an acquire at system scope.

    Test and test-and-set: one compare-and-swap, and while the lock is held a wait
    until it looks free, which is traced, timed and in the flight recorder like every
    wait (``op`` names the caller in reports), so a lock never released times out.

    Example:
        >>> acquire_lock(lock, cur_rank, peer, heap_bases, "iris.ccl.all_reduce")
        >>> ...  # read-modify-write peer's data
        >>> release_lock(lock, cur_rank, peer, heap_bases)
    """
    # One compare-and-swap site: with two (before the loop and in it) the compiler merges
    # their flight-record code into a loop with two entries, and the CTA barriers in it
    # then stop matching on GPUs (a wait later in the kernel hung until its timeout).
    old = tl.cast(_HELD, tl.int32)
    while old != _FREE:
        old = rma.atomic_cas(lock, _FREE, _HELD, cur_rank, owner, heap_bases, sem="acquire", scope="sys")
        if old != _FREE:
            rma.wait_until(lock, "eq", _FREE, heap_bases=heap_bases, op=op, from_rank=owner)


@triton.jit
def release_lock(lock, cur_rank, owner, heap_bases):
    """Free ``lock`` in ``owner``'s heap once every thread's writes are done (a release, system scope).

    Example:
        >>> release_lock(lock, cur_rank, peer, heap_bases)
    """
    rma.signal(lock, _FREE, cur_rank, owner, heap_bases, op="set")
