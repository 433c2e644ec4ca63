"""A device-side barrier across ranks, with no host involvement (CUDA-graph capturable).

Each rank keeps, on its own heap, one arrival counter per peer. Arriving means
adding 1 to *my* counter on every member's heap; my own copy's new value is the
epoch, and the barrier is passed once every member's counter on my heap has
reached it. The counters only grow, so no host-side epoch is ever needed.

Its waits carry ``op="iris.device_barrier"``, so a barrier some member never
reaches times out (``Iris.set_wait_timeout``) with a report naming that member.
"""

import triton
import triton.language as tl

from . import rma


@triton.jit
def device_barrier_kernel(arrivals, heap_bases, member_ranks, num_members, cur_rank):
    epoch = tl.full([], 0, tl.int64)
    for i in range(num_members):
        peer = tl.load(member_ranks + i)
        previous = rma.atomic_add(arrivals + cur_rank, 1, cur_rank, peer, heap_bases, sem="release")
        epoch = tl.where(peer == cur_rank, previous + 1, epoch)
    for i in range(num_members):
        peer = tl.load(member_ranks + i)
        rma.wait_until(arrivals + peer, "ge", epoch, heap_bases=heap_bases, op="iris.device_barrier")
