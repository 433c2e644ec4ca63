"""05 · atomic_xchg: every rank swaps its id into one slot on rank 0; the swaps form one chain.

Each exchange returns the value it replaced, so the returned values plus the
final slot are exactly the initial value and every rank's id, each once.

Run:  python -m iris.run -n 4 examples/05_atomic_xchg.py
"""

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris


@triton.jit
def xchg_kernel(slot, replaced, cur_rank, heap_bases):
    old = iris.atomic_xchg(slot, cur_rank, cur_rank, 0, heap_bases)
    tl.store(replaced, old)


def main():
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    slot = ctx.full((1,), -1, dtype=torch.int32)
    replaced = ctx.full((1,), -2, dtype=torch.int32)
    ctx.barrier()

    xchg_kernel[(1,)](slot, replaced, rank, ctx.get_heap_bases())
    ctx.barrier()

    final = ctx.broadcast(int(slot.item()) if rank == 0 else None, src=0)
    olds = [None] * world
    dist.all_gather_object(olds, int(replaced.item()))
    assert sorted(olds + [final]) == [-1, *range(world)], f"chain broken: {olds} + final {final}"
    print(f"rank {rank}: 05_atomic_xchg OK (replaced {olds[rank]})")
    ctx.close()


if __name__ == "__main__":
    main()
