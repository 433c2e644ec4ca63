"""``allocator_type="vmem"``: a heap with room after it, into which ``as_symmetric`` maps memory
allocated outside it (``iris/backends/cuda_vmm.py`` on GPUs, ``emulated_vmm.py`` under emulation)."""

import gc
import weakref

import pytest
import torch
import triton
import triton.language as tl
from conftest import get_pool

import iris

#: Outside memory a vmem heap can map: PyTorch's expandable segments on GPUs; under emulation,
#: CPU tensors in shared memory (``share_memory_()``).
SHAREABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"} if iris.BACKEND == "cuda" else {}


@triton.jit
def read_peer_kernel(src, out, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out + offsets, iris.load(src + offsets, cur_rank, peer, heap_bases, mask=mask), mask=mask)


def _read_peer(ctx, shared, peer):
    out = ctx.full(shared.shape, float("nan"), dtype=shared.dtype)
    n = shared.numel()
    grid = (triton.cdiv(n, 1024),)
    read_peer_kernel[grid](shared, out, n, ctx.get_rank(), peer, ctx.get_heap_bases(), BLOCK=1024)
    ctx.barrier()
    return out


def _drawn(numel, seed, device):
    generator = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(numel, device=device, generator=generator)


def _shareable(numel, seed, device):
    tensor = _drawn(numel, seed, device)
    return tensor.share_memory_() if tensor.device.type == "cpu" else tensor


def _outside_memory_refused_body(rank, world_size):
    with iris.iris(1 << 20, allocator_type="vmem") as ctx:
        on_heap = ctx.zeros(8)
        assert ctx.as_symmetric(on_heap) is on_heap
        assert ctx.heap.allocator.get_base_address() == ctx.heap.base  # upstream's name
        private = torch.zeros(8, device=ctx.get_device())  # the default allocator's memory
        with pytest.raises(RuntimeError) as caught:
            ctx.as_symmetric(private)
        message = str(caught.value)
        assert "\n" not in message and message.startswith("iris: as_symmetric on rank 0")
        assert ("expandable_segments:True" if iris.BACKEND == "cuda" else "share_memory_()") in message
        ctx.barrier()


def test_memory_a_vmem_heap_cannot_map_is_refused_in_one_line(world):
    world.run(_outside_memory_refused_body)


def _default_heap_refuses_at_once_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        if rank == 0:  # the others do not call: the default heap asks no one
            with pytest.raises(
                RuntimeError, match="allocator_type='vmem'|cannot map memory allocated outside"
            ):
                ctx.as_symmetric(torch.zeros(8, device=ctx.get_device()))
        ctx.barrier()


def test_the_default_heap_refuses_outside_memory_without_asking_the_other_ranks(world):
    world.run(_default_heap_refuses_at_once_body)


def _take_in_body(rank, world_size):
    # A small tensor, then a larger one: on GPUs 48 MiB, spread over three of PyTorch's 20 MiB
    # segments, all of which are mapped, so the window after the heap (the heap's size) needs 60.
    heap_size, sizes = (1 << 27, (1000, 12 << 20)) if iris.BACKEND == "cuda" else (1 << 22, (1000, 20000))
    with iris.iris(heap_size, allocator_type="vmem") as ctx:
        peer, device = (rank + 1) % world_size, ctx.get_device()
        kept = []
        # ``outside`` is dropped when the loop moves on: the heap keeps its memory from being
        # handed out again by PyTorch, or the last check below reads whatever reused it.
        for index, numel in enumerate(sizes):
            outside = _shareable(numel, 100 * rank + index, device)
            shared = ctx.as_symmetric(outside)
            kept.append(shared)
            assert shared.shape == outside.shape and ctx.is_symmetric(shared)
            assert ctx.as_symmetric(shared) is shared
            assert torch.equal(shared, outside)  # the same memory, at a second address
            shared[:10] = float(rank)  # writes through the heap are the tensor's
            ctx.barrier()
            assert torch.equal(outside[:10].cpu(), torch.full((10,), float(rank)))
            expected = _drawn(numel, 100 * peer + index, device)
            expected[:10] = float(peer)
            assert torch.equal(_read_peer(ctx, shared, peer), expected)
        # The first tensor taken in is still reached after the second.
        assert torch.equal(_read_peer(ctx, kept[0], peer)[:10].cpu(), torch.full((10,), float(peer)))


def _taken_in_again_body(rank, world_size):
    with iris.iris(1 << 22, allocator_type="vmem") as ctx:
        peer, device = (rank + 1) % world_size, ctx.get_device()
        outside = _shareable(4096, rank, device)
        shared = ctx.as_symmetric(outside)
        used = ctx.heap.addressable
        again, part = ctx.as_symmetric(outside), ctx.as_symmetric(outside[1024:2048])
        assert again.data_ptr() == shared.data_ptr() and part.data_ptr() == shared.data_ptr() + 4096
        assert ctx.heap.addressable == used  # nothing mapped again
        assert torch.equal(_read_peer(ctx, part, peer), _drawn(4096, peer, device)[1024:2048])
        # Where the ranks disagree (rank 0 passes its tensor again, the others new ones), all map anew.
        other = outside if rank == 0 else _shareable(4096, 50 + rank, device)
        fresh = ctx.as_symmetric(other)
        assert ctx.heap.addressable > used and fresh.data_ptr() != shared.data_ptr()
        assert torch.equal(
            _read_peer(ctx, fresh, peer), _drawn(4096, peer if peer == 0 else 50 + peer, device)
        )


def test_memory_taken_in_again_keeps_its_place_when_every_rank_has_it():
    get_pool(2, **SHAREABLE).run(_taken_in_again_body)


def _kept_alive_body(rank, world_size):
    ctx = iris.iris(1 << 22, allocator_type="vmem")
    outside = _shareable(1000, rank, ctx.get_device())
    original = weakref.ref(outside)
    ctx.as_symmetric(outside)
    del outside
    gc.collect()
    assert original() is not None  # held by the heap while it lives
    ctx.barrier()
    ctx.close()
    gc.collect()
    assert original() is None


def test_the_heap_keeps_a_tensor_taken_in_alive_until_it_closes():
    get_pool(2, **SHAREABLE).run(_kept_alive_body)


@pytest.mark.parametrize("debug", ["0", "1"], ids=["plain", "IRIS_DEBUG"])
def test_as_symmetric_maps_outside_memory_that_peers_then_read(debug):
    # IRIS_DEBUG checks every pointer against the heap's bounds: they reach the memory taken in.
    get_pool(2, IRIS_DEBUG=debug, **SHAREABLE).run(_take_in_body)


def _window_full_body(rank, world_size):
    with iris.iris(1 << 16, allocator_type="vmem") as ctx:
        too_big = _shareable(1 << 20, rank, ctx.get_device())  # 4 MiB past a 64 KiB heap
        with pytest.raises(MemoryError, match="kept for outside memory"):
            ctx.as_symmetric(too_big)
        ctx.barrier()


def test_outside_memory_larger_than_the_room_after_the_heap_is_refused():
    get_pool(2, **SHAREABLE).run(_window_full_body)


class _FakeDriver:
    """What ``cuda_vmm`` asks of the driver to find a range's allocations: which allocation
    backs each 2 MiB page, laid out as PyTorch's expandable segments (20 MiB each), and the
    one mapping that holds an address, as ``cuMemGetAddressRange`` gives it for mapped memory."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_INVALID_VALUE = 1

    def __init__(self, backing):
        self.backing, self.held = backing, 0

    def cuMemRetainAllocationHandle(self, address):
        handle = self.backing.get(address // PAGE * PAGE)
        if handle is None:
            return self.CUresult.CUDA_ERROR_INVALID_VALUE, None
        self.held += 1
        return self.CUresult.CUDA_SUCCESS, handle

    def cuMemRelease(self, handle):
        self.held -= 1
        return (self.CUresult.CUDA_SUCCESS,)

    def cuMemGetAddressRange(self, address):
        handle = self.backing.get(address // PAGE * PAGE)
        pages = sorted(page for page, other in self.backing.items() if other == handle)
        return self.CUresult.CUDA_SUCCESS, pages[0], pages[-1] + PAGE - pages[0]


PAGE = 2 << 20


def test_the_allocations_behind_a_range_are_found_whole(monkeypatch):
    from iris.backends import cuda_vmm

    base = 0x7F0000000000
    # Three 20 MiB segments back to back, then an unmapped gap, then a fourth.
    backing = {base + page * PAGE: 1 + page // 10 for page in range(30)}
    backing.update({base + page * PAGE: 9 for page in range(40, 50)})
    driver = _FakeDriver(backing)
    monkeypatch.setattr(cuda_vmm, "_driver", lambda: driver)
    segment = 10 * PAGE
    # A tensor from the middle of the first segment into the third: all three, each whole.
    found = cuda_vmm._allocations(base + 3 * PAGE + 100, 2 * segment)
    assert found == [(base, segment), (base + segment, segment), (base + 2 * segment, segment)]
    # Inside one segment: that segment, whole.
    assert cuda_vmm._allocations(base + segment + 5, 8) == [(base + segment, segment)]
    # Running into the gap: no handle for a page of the range, nothing to map.
    assert cuda_vmm._allocations(base + 2 * segment, segment + 1) is None
    assert driver.held == 0  # every handle retained on the way was released
