"""02 · all_load: every rank gathers one slice from every rank (itself included) with iris.load.

Run:  python -m iris.run -n 4 examples/02_all_load.py
"""

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def all_load_kernel(source, gathered, n, cur_rank, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    owner = tl.program_id(1)  # one column of programs per rank
    mask = offsets < n
    values = iris.load(source + offsets, cur_rank, owner, heap_bases, mask=mask)
    tl.store(gathered + owner * n + offsets, values, mask=mask)


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = 4_096
    source = ctx.randint(0, 1 << 30, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(rank))
    gathered = ctx.full((world, n), -1, dtype=torch.int32)
    ctx.barrier()

    grid = (triton.cdiv(n, 512), world)
    all_load_kernel[grid](source, gathered, n, rank, ctx.get_heap_bases(), BLOCK=512)
    ctx.barrier()

    for owner in range(world):
        expected = torch.randint(
            0, 1 << 30, (n,), dtype=torch.int32, generator=torch.Generator().manual_seed(owner)
        )
        assert torch.equal(gathered[owner].cpu(), expected), f"slice from rank {owner} differs"
    print(f"rank {rank}: 02_all_load OK ({world} slices gathered)")
    ctx.close()


if __name__ == "__main__":
    main()
