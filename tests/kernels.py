"""Kernels several test modules share."""

import triton
import triton.language as tl

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
