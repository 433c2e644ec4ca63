"""Kernels several test modules share."""

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

import iris


@triton.jit
def ping_pong_rounds(data, flag, ack, rounds, cur_rank, heap_bases, BLOCK: tl.constexpr):
    # rank 0 puts then signals; rank 1 waits, then acknowledges so rank 0 may reuse the buffer.
    # Other ranks (at world sizes above 2) take no part.
    offsets = tl.arange(0, BLOCK)
    for step in range(rounds):
        if cur_rank == 0:
            iris.wait_until(ack, "ge", step, heap_bases=heap_bases)
            iris.put(data + offsets, data + offsets, 0, 1, heap_bases)
            iris.signal(flag, step + 1, 0, 1, heap_bases)
        elif cur_rank == 1:
            iris.wait_until(flag, "ge", step + 1, heap_bases=heap_bases)
            iris.signal(ack, step + 1, 1, 0, heap_bases)


@gluon.jit
def gluon_every_op(IrisDeviceCtx: gl.constexpr, context, buf, out, flags, BLOCK: gl.constexpr):
    # Through upstream's Gluon context, each op once with the right-hand neighbour (``peer``):
    # out[0] its buf (load), out[1] the left one's (it stores, puts into us: out[2]), out[3]
    # the right one's (get); flags[0..3]: an add, a max, a compare-and-swap and a signal
    # from the left one, which the wait then sees.
    ctx = IrisDeviceCtx.initialize(context)
    peer = (ctx.cur_rank + 1) % ctx.num_ranks
    offsets = gl.arange(0, BLOCK, layout=gl.BlockedLayout([1], [32], [4], [0]))
    gl.store(out + offsets, ctx.load(buf + offsets, peer))  # gluon site: load
    ctx.store(out + BLOCK + offsets, gl.load(buf + offsets), peer)  # gluon site: store
    ctx.put(buf + offsets, out + 2 * BLOCK + offsets, peer)  # gluon site: put
    ctx.get(buf + offsets, out + 3 * BLOCK + offsets, peer)  # gluon site: get
    ctx.atomic_add(flags, 1, peer)  # gluon site: atomic_add
    ctx.atomic_max(flags + 1, ctx.cur_rank + 1, peer)  # gluon site: atomic_max
    ctx.atomic_cas(flags + 2, 0, ctx.cur_rank + 1, peer)  # gluon site: atomic_cas
    ctx.signal(flags + 3, 1, peer)  # gluon site: signal
    ctx.wait_until(flags + 3, "eq", 1)  # gluon site: wait_until
