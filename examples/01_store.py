"""01 · store: every rank writes a block of values into its neighbour's heap.

Run:  python -m iris.run -n 2 examples/01_store.py
"""

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def store_kernel(target, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    values = offsets.to(tl.float32) * 0.5 + cur_rank
    iris.store(target + offsets, values, cur_rank, peer, heap_bases, mask=mask)


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = 10_000
    target = ctx.full((n,), float("nan"))
    ctx.barrier()

    peer = (rank + 1) % world
    store_kernel[(triton.cdiv(n, 1024),)](target, n, rank, peer, ctx.get_heap_bases(), BLOCK=1024)
    ctx.barrier()  # our neighbour's stores into our heap are complete

    writer = (rank - 1) % world
    expected = torch.arange(n, dtype=torch.float32, device=ctx.get_device()) * 0.5 + writer
    torch.testing.assert_close(target, expected, rtol=0, atol=0)
    print(f"rank {rank}: 01_store OK (rank {writer} wrote {n} floats into our heap)")
    ctx.close()


if __name__ == "__main__":
    main()
