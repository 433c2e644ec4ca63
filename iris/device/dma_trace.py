"""The two one-thread kernels that put copy-engine puts into traces.

A copy engine cannot write a trace record, so while tracing is enabled
``iris.host.copy_engine`` brackets each put on its lane: :func:`dma_start_kernel` stamps
the time just before the copy, :func:`dma_record_kernel` runs right after it (the
lane runs them in order) and records a ``dma_put`` event from that stamp to now.
"""

import triton
import triton.language as tl

from . import intrinsics as hw
from . import tracing


@triton.jit
def dma_start_kernel(stamps, lane):
    """``stamps[lane]`` = now: the start of the put queued next on ``lane``.

    Example:
        >>> dma_start_kernel[(1,)](stamps, peer)
    """
    tl.store(stamps + lane, hw.timer_ns())


@triton.jit
def dma_record_kernel(heap_bases, stamps, lane, target_rank, offset, nbytes):
    """Record the put that started at ``stamps[lane]`` (``nbytes`` to ``target_rank``'s ``offset``).

    Example:
        >>> dma_record_kernel[(1,)](ctx.get_heap_bases(), stamps, peer, peer, offset, nbytes)
    """
    tracing.record_dma(heap_bases, tl.load(stamps + lane), target_rank, offset, nbytes)
