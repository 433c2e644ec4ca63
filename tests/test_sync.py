"""Ordering: signal/wait_until message passing, device barriers, host barriers, broadcast."""

import numpy as np
import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris

ROUNDS, N = 40, 256


@triton.jit
def ring_kernel(
    outbox, inbox, received, ready, ack, rounds, n, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr
):
    # Every rank is both producer (to the next rank) and consumer (of the previous one).
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    nxt = (cur_rank + 1) % world_size
    prv = (cur_rank + world_size - 1) % world_size
    for step in range(rounds):
        iris.wait_until(ack, "ge", step)
        iris.put(outbox + step * n + offsets, inbox + offsets, cur_rank, nxt, heap_bases, mask=mask)
        iris.signal(ready, 1, cur_rank, nxt, heap_bases, op="add")
        iris.wait_until(ready, "ge", step + 1)
        tl.store(received + step * n + offsets, tl.load(inbox + offsets, mask=mask), mask=mask)
        iris.signal(ack, step + 1, cur_rank, prv, heap_bases)


@triton.jit
def context_ring_kernel(
    context,
    outbox,
    inbox,
    received,
    ready,
    ack,
    rounds,
    n,
    rank: tl.constexpr,
    world_size: tl.constexpr,
    BLOCK: tl.constexpr,
):
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    nxt = (rank + 1) % world_size
    prv = (rank + world_size - 1) % world_size
    for step in range(rounds):
        ctx.wait_until(ack, "ge", step)
        ctx.put(outbox + step * n + offsets, inbox + offsets, nxt, mask=mask)
        ctx.signal(ready, step + 1, nxt)
        ctx.wait_until(ready, "ge", step + 1)
        tl.store(received + step * n + offsets, tl.load(inbox + offsets, mask=mask), mask=mask)
        ctx.signal(ack, step + 1, prv)


@triton.jit
def stamp_kernel(slots, value, cur_rank, world_size, heap_bases):
    for target in range(world_size):
        iris.store(slots + cur_rank, value, cur_rank, target, heap_bases)


def _ring_body(rank, world_size, use_context):
    with iris.iris(1 << 22) as ctx:
        outbox = ctx.randn(ROUNDS, N, generator=torch.Generator().manual_seed(rank))
        received = ctx.full((ROUNDS, N), float("nan"))
        inbox = ctx.zeros(N)
        ready = ctx.zeros(1, dtype=torch.int32)
        ack = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        if use_context:
            context_ring_kernel[(1,)](
                ctx.get_device_context(),
                outbox,
                inbox,
                received,
                ready,
                ack,
                ROUNDS,
                N,
                rank=rank,
                world_size=world_size,
                BLOCK=N,
            )
        else:
            ring_kernel[(1,)](
                outbox,
                inbox,
                received,
                ready,
                ack,
                ROUNDS,
                N,
                rank,
                world_size,
                ctx.get_heap_bases(),
                BLOCK=N,
            )
        ctx.barrier()
        previous = (rank - 1) % world_size
        expected = torch.randn(ROUNDS, N, generator=torch.Generator().manual_seed(previous))
        assert torch.equal(received.cpu(), expected), "a round received stale or torn data"


def _device_barrier_body(rank, world_size, rounds):
    with iris.iris(1 << 20) as ctx:
        slots = ctx.full((world_size,), -1, dtype=torch.int32)
        ctx.barrier()
        for step in range(rounds):
            stamp_kernel[(1,)](slots, step, rank, world_size, ctx.get_heap_bases())
            ctx.device_barrier()
            assert slots.cpu().tolist() == [step] * world_size, f"round {step}: {slots.tolist()}"
            ctx.device_barrier()  # nobody stamps round step+1 before everyone has checked round step


def _group_barrier_body(rank, world_size):
    evens = dist.new_group([r for r in range(world_size) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world_size) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    with iris.iris(1 << 20) as ctx:
        for _ in range(3):
            ctx.device_barrier(group=mine)
            ctx.barrier(group=mine)
        ctx.device_barrier()


def _broadcast_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        src = world_size - 1
        scalar = ctx.broadcast(42 if rank == src else None, src=src)
        text = ctx.broadcast({"a": [1, 2]} if rank == src else None, src=src)
        tensor = ctx.broadcast(torch.arange(6).reshape(2, 3) if rank == src else None, src=src)
        assert scalar == 42 and text == {"a": [1, 2]}
        assert tensor.tolist() == [[0, 1, 2], [3, 4, 5]] and tensor.shape == (2, 3)


def _wake_links_body(rank, world_size):
    from iris.device.wake import LINE_BYTES, LINES, wake_links_kernel

    with iris.iris(1 << 20) as ctx:
        words = ctx.zeros(LINES * LINE_BYTES // 4, dtype=torch.int32)  # the heap's first 128 KiB
        assert ctx.heap.offset_of(words) == 0
        words.copy_(torch.arange(words.numel(), dtype=torch.int32) + 1000 * rank)
        ctx.barrier()
        ctx.wake_links()
        ctx.wake_links()  # the second call replays the prepared launch
        ctx.barrier()
        assert torch.equal(words.cpu(), torch.arange(words.numel(), dtype=torch.int32) + 1000 * rank)
        # The kernel reads a word of each line of every peer asked for: their exclusive or tells.
        peers = [r for r in range(world_size) if r != rank and ctx.node_of(r) == ctx.node_of(rank)]
        if peers:
            folded = torch.full((len(peers),), -1, dtype=torch.int32, device=ctx.device)
            heap = ctx.heap.leading(LINES * LINE_BYTES, torch.int32)
            wake_links_kernel[(len(peers),)](
                heap, LINES, torch.tensor(peers, dtype=torch.int32, device=ctx.device), folded, rank,
                ctx.get_heap_bases(), LINES=LINES,
            )  # fmt: skip
            lines = np.arange(LINES, dtype=np.int32) * (LINE_BYTES // 4)
            expected = [int(np.bitwise_xor.reduce(lines + 1000 * peer)) for peer in peers]
            assert folded.cpu().tolist() == expected
        ctx.barrier()


def _wake_links_untraced_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        ctx.tracing.enable(max_events=1 << 10)
        ctx.barrier()
        ctx.wake_links()
        ctx.barrier()
        assert len(ctx.tracing.events()) == 0
        ctx.tracing.disable()


def test_signal_wait_until_orders_data_over_many_rounds(world):
    world.run(_ring_body, False)


def test_device_context_ring_orders_data(world):
    world.run(_ring_body, True)


def test_device_barrier_orders_kernels_across_ranks(world):
    world.run(_device_barrier_body, 10)


def test_wake_links_reads_every_peer_of_the_node_and_changes_nothing(world):
    world.run(_wake_links_body)


def test_wake_links_records_nothing_while_tracing(world):
    world.run(_wake_links_untraced_body)


def test_group_barriers_only_wait_for_members(multi_world):
    multi_world.run(_group_barrier_body)


def test_broadcast_scalars_objects_and_tensors(world):
    world.run(_broadcast_body)
