"""04 · atomic_add: all ranks increment counters on every rank at once; totals must be exact.

Run:  python -m iris.run -n 4 examples/04_atomic_add.py
"""

import torch
import triton
import triton.language as tl

import iris


@triton.jit
def atomic_add_kernel(counters, num_counters, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < num_counters
    for target in range(world_size):
        # Default sem/scope (acq_rel, sys) make the adds atomic across GPUs.
        iris.atomic_add(counters + offsets, 1, cur_rank, target, heap_bases, mask=mask)


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    num_counters, programs = 100, 8
    counters = ctx.zeros(num_counters, dtype=torch.int32)
    ctx.barrier()

    atomic_add_kernel[(programs,)](counters, num_counters, rank, world, ctx.get_heap_bases(), BLOCK=128)
    ctx.barrier()

    expected = torch.full((num_counters,), world * programs, dtype=torch.int32)
    assert torch.equal(counters.cpu(), expected), (
        f"counters {counters[:4].tolist()}... expected {world * programs}"
    )
    print(f"rank {rank}: 04_atomic_add OK (every counter is {world * programs})")
    ctx.close()


if __name__ == "__main__":
    main()
