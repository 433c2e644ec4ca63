"""``allocator_type="vmem"``: upstream's allocator name, and on GPUs a virtual-memory heap into
which ``as_symmetric`` maps memory allocated outside it (``iris/backends/cuda_vmm.py``)."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import get_pool

import iris

on_gpus = pytest.mark.skipif(iris.BACKEND != "cuda", reason="CUDA virtual memory: GPUs only")
#: PyTorch's expandable segments are CUDA virtual memory, which the heap can map.
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@triton.jit
def read_peer_kernel(src, out, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, iris.load(src + offsets, cur_rank, peer, heap_bases, mask=mask), mask=mask)


def _read_peer(ctx, shared, peer):
    out = ctx.full(shared.shape, float("nan"), dtype=shared.dtype)
    n = shared.numel()
    read_peer_kernel[(triton.cdiv(n, 1024),)](
        shared, out, n, ctx.get_rank(), peer, ctx.get_heap_bases(), BLOCK=1024
    )
    torch.cuda.synchronize()
    return out


def _outside_memory_refused_body(rank, world_size):
    with iris.iris(1 << 20, allocator_type="vmem") as ctx:
        on_heap = ctx.zeros(8)
        assert ctx.as_symmetric(on_heap) is on_heap
        outside = torch.zeros(8, device=ctx.get_device())  # the default allocator's memory
        with pytest.raises(RuntimeError) as caught:
            ctx.as_symmetric(outside)
        message = str(caught.value)
        assert "\n" not in message and message.startswith("iris: as_symmetric")
        if iris.BACKEND == "cuda":
            assert "expandable_segments:True" in message and "empty_like" in message
        ctx.barrier()


def test_memory_a_vmem_heap_cannot_map_is_refused_in_one_line(world):
    world.run(_outside_memory_refused_body)


def _vmem_heap_body(rank, world_size):
    with iris.iris(1 << 24, allocator_type="vmem") as ctx:
        peer = (rank + 1) % world_size
        mine = ctx.full((4096,), float(rank), dtype=torch.float32)
        ctx.barrier()
        assert torch.equal(_read_peer(ctx, mine, peer), torch.full_like(mine, float(peer)))
        ctx.barrier()


@on_gpus
def test_a_vmem_heap_is_reached_by_peers():
    get_pool(2).run(_vmem_heap_body)


def _drawn(numel, seed, device):
    return torch.randn(numel, device=device, generator=torch.Generator(device=device).manual_seed(seed))


def _take_in_body(rank, world_size):
    with iris.iris(1 << 24, allocator_type="vmem") as ctx:
        peer, device = (rank + 1) % world_size, ctx.get_device()
        # A small tensor, then one of 48 MiB that spans several of PyTorch's 20 MiB segments.
        for index, numel in enumerate((1000, 12 << 20)):
            outside = _drawn(numel, 100 * rank + index, device)
            shared = ctx.as_symmetric(outside)
            assert shared.shape == outside.shape and ctx.is_symmetric(shared)
            assert ctx.as_symmetric(shared) is shared
            assert torch.equal(shared, outside)  # the same memory, at a second address
            shared[:10] = float(rank)  # writes through the heap are the tensor's
            torch.cuda.synchronize()
            assert torch.equal(outside[:10].cpu(), torch.full((10,), float(rank)))
            ctx.barrier()
            expected = _drawn(numel, 100 * peer + index, device)
            expected[:10] = float(peer)
            assert torch.equal(_read_peer(ctx, shared, peer), expected)
            ctx.barrier()


@on_gpus
def test_as_symmetric_maps_outside_memory_that_peers_then_read():
    get_pool(2, **EXPANDABLE).run(_take_in_body)
