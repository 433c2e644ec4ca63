"""00 · load: every rank reads its neighbour's buffer straight out of the neighbour's heap.

Run:  python -m iris.run -n 2 examples/00_load.py
"""

import torch
import triton
import triton.language as tl

import iris  # import before defining kernels: it picks the backend


@triton.jit
def load_kernel(source, result, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    # `source` is a pointer into *our* heap; iris.load reads the peer's copy of it.
    values = iris.load(source + offsets, cur_rank, peer, heap_bases, mask=mask)
    tl.store(result + offsets, values, mask=mask)


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = 10_000
    generator = torch.Generator().manual_seed(rank)
    source = ctx.zeros(n, dtype=torch.float32)
    source.copy_(torch.randn(n, generator=generator))
    result = ctx.full((n,), float("nan"))
    ctx.barrier()  # every rank's source is written before anyone reads it

    peer = (rank + 1) % world
    load_kernel[(triton.cdiv(n, 1024),)](source, result, n, rank, peer, ctx.get_heap_bases(), BLOCK=1024)
    ctx.barrier()

    expected = torch.randn(n, generator=torch.Generator().manual_seed(peer)).to(ctx.get_device())
    torch.testing.assert_close(result, expected, rtol=0, atol=0)
    ctx.info(f"loaded {n} floats from rank {peer}: OK")
    print(f"rank {rank}: 00_load OK")
    ctx.close()


if __name__ == "__main__":
    main()
