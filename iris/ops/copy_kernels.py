"""The small kernels around the copy-engine variants of ``ctx.ops`` (``variant="copy_engine"``).

In those variants cuBLAS computes on every SM while the GPU's copy engines move
finished blocks between heaps (:mod:`iris.host.copy_engine`). What still needs a kernel
is the synchronisation the copies cannot do themselves, and the final sum of a
reduce-scatter:

* :func:`enter_call_kernel`: before its first copy into peers' memory, a rank waits
  until every peer has entered the call (``entry`` flags holding the call's epoch,
  as in :mod:`iris.ops.all_scatter`), so it never overwrites a buffer that a slower
  peer still reads from the previous call.
* :func:`announce_landed_kernel`: launched on a copy lane after the puts into
  ``to_rank``; sets ``landed[cur_rank] = epoch`` there (release).
* :func:`wait_landed_kernel`: waits until ``from_rank`` (or every peer) announced.
* :func:`sum_landed_kernel`: ``out = sum over slots of landing[slot]`` in fp32.

Flags hold epochs, which only grow, so no flag is ever reset (CUDA graphs replay).
"""

import triton
import triton.language as tl

from ..device import rma
from .all_scatter import announce_entry, wait_for_peers


@triton.jit
def enter_call_kernel(entry, epoch_ptr, cur_rank, world_size, heap_bases):
    """Announce this call to every peer and wait until every peer has announced it.

    Example:
        >>> enter_call_kernel[(1,)](entry, epoch, rank, world, ctx.get_heap_bases())
    """
    epoch = tl.load(epoch_ptr)
    announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
    wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)


@triton.jit
def announce_landed_kernel(landed, epoch_ptr, cur_rank, to_rank, heap_bases):
    """Tell ``to_rank`` that this rank's puts of the current call have landed there.

    Example:
        >>> ctx.copy_engine.then(peer, lambda: announce_landed_kernel[(1,)](landed, epoch, rank, peer, bases))
    """
    rma.signal(landed + cur_rank, tl.load(epoch_ptr), cur_rank, to_rank, heap_bases, op="set")


@triton.jit
def wait_landed_kernel(
    landed, epoch_ptr, from_rank, cur_rank, world_size, heap_bases, EVERY_PEER: tl.constexpr
):
    """Wait until ``from_rank`` (with ``EVERY_PEER``: every other rank) announced its puts.

    Example:
        >>> wait_landed_kernel[(1,)](landed, epoch, peer, rank, world, bases, EVERY_PEER=False)
    """
    epoch = tl.load(epoch_ptr)
    if EVERY_PEER:
        for i in range(1, world_size):
            peer = (cur_rank + i) % world_size
            rma.wait_until(landed + peer, "ge", epoch, heap_bases=heap_bases, op="iris.ops.copy_engine")
    else:
        rma.wait_until(landed + from_rank, "ge", epoch, heap_bases=heap_bases, op="iris.ops.copy_engine")


@triton.jit
def sum_landed_kernel(
    out,
    landing,
    rows,
    cols,
    stride_om,
    stride_on,
    slots,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``out[i, j] = sum over s of landing[s, i, j]`` (``landing`` contiguous ``(slots, rows, cols)``).

    Summed in fp32, slot 0 first, so every rank's result has the same rounding.

    Example:
        >>> grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
        >>> sum_landed_kernel[grid](out, landing, M, N, *out.stride(), world, 64, 64)
    """
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < cols)
    local = offs_m[:, None] * cols + offs_n[None, :]
    total = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for s in range(slots):
        total += tl.load(landing + s * rows * cols + local, mask=mask).to(tl.float32)
    target = out + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(target, total.to(out.dtype.element_ty), mask=mask)
