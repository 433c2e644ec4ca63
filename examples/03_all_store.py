"""03 · all_store: every rank writes its slice into every rank's heap, so all end up with everything.

Run:  python -m iris.run -n 4 examples/03_all_store.py
"""

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def all_store_kernel(mine, everyone, n, cur_rank, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    target = tl.program_id(1)
    mask = offsets < n
    values = tl.load(mine + offsets, mask=mask)
    iris.store(everyone + cur_rank * n + offsets, values, cur_rank, target, heap_bases, mask=mask)


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = 3_000
    mine = ctx.randn(n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(100 + rank))
    everyone = ctx.full((world, n), float("nan"), dtype=torch.bfloat16)
    ctx.barrier()

    all_store_kernel[(triton.cdiv(n, 1024), world)](mine, everyone, n, rank, ctx.get_heap_bases(), BLOCK=1024)
    ctx.barrier()

    for writer in range(world):
        expected = torch.randn(n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(100 + writer))
        assert torch.equal(everyone[writer].cpu(), expected), f"row written by rank {writer} differs"
    print(f"rank {rank}: 03_all_store OK")
    ctx.close()


if __name__ == "__main__":
    main()
