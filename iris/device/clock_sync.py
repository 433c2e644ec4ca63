"""Ping-pong kernels that measure one GPU's %globaltimer against another's.

The reference rank stamps t0 and raises a flag on the peer; the peer, spinning
on its own memory, stamps t1 when it sees the flag and t2 just before raising a
flag back; the reference stamps t3 when it sees that. With symmetric links,
``offset = ((t1 - t0) + (t2 - t3)) / 2`` is the peer clock minus the reference
clock and ``(t3 - t0) - (t2 - t1)`` the round trip (see ``iris_trace.clock``).
"""

import triton
import triton.language as tl

from . import crossnode, layout, rma
from . import intrinsics as hw


@triton.jit
def _raise_flag(flag, value, cur_rank, peer, heap_bases):
    # rma.signal without its flight-recorder entry: recording between the two stamps of
    # one side only would make the paths asymmetric and bias the measured offset.
    tl.debug_barrier()
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, cur_rank, peer):
        crossnode.atomic("xchg", flag, value, peer, heap_bases)
    else:
        remote = rma.translate(flag, cur_rank, peer, heap_bases)
        tl.atomic_xchg(remote, value, sem="release", scope="sys")


@triton.jit
def ping_kernel(ping, pong, stamps, rounds, cur_rank, peer, heap_bases):
    for k in range(rounds):
        t0 = hw.timer_ns()
        _raise_flag(ping, k + 1, cur_rank, peer, heap_bases)
        rma.wait_until(pong, "ge", k + 1)
        t3 = hw.timer_ns()
        tl.store(stamps + 4 * k + 0, t0)
        tl.store(stamps + 4 * k + 3, t3)


@triton.jit
def pong_kernel(ping, pong, stamps, rounds, cur_rank, reference, heap_bases):
    for k in range(rounds):
        rma.wait_until(ping, "ge", k + 1)
        t1 = hw.timer_ns()
        t2 = hw.timer_ns()
        _raise_flag(pong, k + 1, cur_rank, reference, heap_bases)
        tl.store(stamps + 4 * k + 1, t1)
        tl.store(stamps + 4 * k + 2, t2)


@triton.jit
def iris_clock_marker(stamps, index):
    """Store this GPU's clock at ``stamps[index]``: a marker a profiler sees as a kernel.

    ``ctx.tracing.torch_profiler()`` launches it at a profile's start and end; the time it
    reads lies inside the kernel's slice in the profile, which aligns the two clocks
    (``iris_trace.torch_profile``). The name is what the profiler lists.

    Example:
        >>> iris_clock_marker[(1,)](stamps, 3, num_warps=1)
    """
    tl.store(stamps + index, hw.timer_ns())
