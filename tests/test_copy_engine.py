"""ctx.copy_engine: puts into peers' heaps by copy engines, their ordering, and bad input."""

import pytest
import torch

import iris
from iris_trace.events import DMA_CU_BASE, DMA_PUT


def _column_block_body(rank, world_size):
    # Every rank puts its column block of a matrix into every peer's copy; the first
    # and last rows check the pitch arithmetic of a block that is not contiguous.
    rows, cols = 5, 3
    with iris.iris(1 << 20) as ctx:
        out = ctx.full((rows, world_size * cols), float("nan"))
        mine = out[:, rank * cols : (rank + 1) * cols]
        mine.copy_(torch.randn(rows, cols, generator=torch.Generator().manual_seed(rank)))
        ctx.barrier()
        ctx.copy_engine.fork()
        for peer in range(world_size):
            if peer != rank:
                ctx.copy_engine.put(mine, mine, peer)
        ctx.copy_engine.join()
        ctx.barrier()
        expected = torch.cat(
            [torch.randn(rows, cols, generator=torch.Generator().manual_seed(r)) for r in range(world_size)],
            dim=1,
        )
        return torch.equal(out.cpu(), expected)


def test_put_copies_a_column_block_into_every_peer(world):
    assert all(world.run(_column_block_body))


def _row_block_from_off_heap_body(rank, world_size):
    # A 1-D source anywhere on the device, into a 1-D slice of a symmetric tensor.
    with iris.iris(1 << 20) as ctx:
        out = ctx.full((world_size, 7), -1, dtype=torch.int32)
        source = torch.arange(7, dtype=torch.int32, device=ctx.get_device()) + 100 * rank
        ctx.barrier()
        ctx.copy_engine.fork()
        ctx.copy_engine.put(out[rank], source, (rank + 1) % world_size)
        ctx.copy_engine.join()
        ctx.barrier()
        sender = (rank - 1) % world_size
        return out[sender].cpu().tolist() == [100 * sender + i for i in range(7)]


def test_put_takes_an_off_heap_source(world):
    assert all(world.run(_row_block_from_off_heap_body))


def _bad_put_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        heap = ctx.zeros(4, 4)
        off_heap = torch.zeros(4, 4, device=ctx.get_device())
        cases = {
            "symmetric heap": lambda: ctx.copy_engine.put(off_heap, heap, 0),
            "is not in": lambda: ctx.copy_engine.put(heap, heap, world_size),
            "dst is float32": lambda: ctx.copy_engine.put(heap, heap[:2], 0),
            "unit column stride": lambda: ctx.copy_engine.put(heap.t(), heap.t(), 0),
        }
        for message, call in cases.items():
            with pytest.raises(ValueError, match=message):
                call()
        return True


def test_bad_puts_say_what_is_wrong(world):
    assert all(world.run(_bad_put_body))


def _traced_put_body(rank, world_size):
    # While tracing, every put is one dma_put event of the sender, on the lane of its
    # destination, with the bytes and heap offset of the block.
    with iris.iris(1 << 20) as ctx:
        out = ctx.zeros(world_size, 64)
        ctx.tracing.enable(max_events=1024)
        ctx.barrier()
        ctx.copy_engine.fork()
        for peer in range(world_size):
            if peer != rank:
                ctx.copy_engine.put(out[rank], out[rank], peer)
        ctx.copy_engine.join()
        ctx.barrier()
        events = ctx.tracing.events()
        ctx.tracing.disable()
        puts = events[events["event_id"] == DMA_PUT]
        return (
            sorted(puts["target_rank"].tolist()),
            sorted(puts["cu_id"].tolist()),
            set(puts["payload_bytes"].tolist()),
            set(puts["address"].tolist()) <= {ctx.heap.offset_of(out[rank])},
            bool((puts["end_ns"] >= puts["start_ns"]).all()),
        )


def test_traced_puts_are_dma_put_events_on_copy_engine_lanes(world):
    for rank, (targets, lanes, sizes, at_block, ordered) in enumerate(world.run(_traced_put_body)):
        peers = [p for p in range(world.world_size) if p != rank]
        assert targets == peers and lanes == [DMA_CU_BASE + p for p in peers]
        assert sizes == ({64 * 4} if peers else set()) and at_block and ordered
