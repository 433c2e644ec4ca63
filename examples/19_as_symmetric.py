"""19 · as_symmetric: share a tensor that already exists with every peer, without copying it.

Weights loaded by PyTorch, or a buffer another library made, live outside the symmetric
heap. A context made with ``allocator_type="vmem"`` keeps room after its heap, and
``ctx.as_symmetric(t)`` maps ``t``'s own memory there, at the same offset on every rank:
kernels then reach it on any peer as they reach heap tensors, and writes through either
tensor are seen by both. On GPUs the memory must come from CUDA's virtual-memory calls,
which PyTorch's expandable segments use (set below, before CUDA starts); under emulation
it is a CPU tensor in shared memory.

Run:  python -m iris.run -n 2 examples/19_as_symmetric.py
"""

import os

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # before CUDA starts

import torch
import triton
import triton.language as tl

import iris  # import before defining kernels: it picks the backend


@triton.jit
def add_neighbour_kernel(weights, out, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    mine = tl.load(weights + offsets, mask=mask)
    # `weights` was never allocated on the heap: as_symmetric made it reachable like heap memory.
    theirs = iris.load(weights + offsets, cur_rank, peer, heap_bases, mask=mask)
    tl.store(out + offsets, mine + theirs, mask=mask)


def own_weights(rank: int, n: int, device: torch.device) -> torch.Tensor:
    """This rank's weights, made by PyTorch as a model's would be (not on the heap)."""
    weights = torch.randn(n, generator=torch.Generator().manual_seed(rank)).to(device)
    return weights.share_memory_() if weights.device.type == "cpu" else weights


def main():
    ctx = iris.iris(heap_size=1 << 26, allocator_type="vmem")
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = 100_000
    weights = own_weights(rank, n, ctx.get_device())
    shared = ctx.as_symmetric(weights)  # collective: every rank calls it, in the same order
    assert ctx.is_symmetric(shared) and not ctx.is_symmetric(weights)
    out = ctx.full((n,), float("nan"))
    ctx.barrier()

    peer = (rank + 1) % world
    add_neighbour_kernel[(triton.cdiv(n, 1024),)](
        shared, out, n, rank, peer, ctx.get_heap_bases(), BLOCK=1024
    )
    ctx.barrier()
    expected = weights + own_weights(peer, n, ctx.get_device())
    torch.testing.assert_close(out, expected, rtol=0, atol=0)

    weights.mul_(2)  # one memory: the heap's view sees the change
    assert torch.equal(shared, weights)
    print(f"rank {rank}: added rank {peer}'s weights, read in place: 19_as_symmetric OK")
    ctx.close()


if __name__ == "__main__":
    main()
