"""15 · why ranks wait: a trace names the tile that held every other rank up.

Rank 0 produces tiles and pushes each to every peer with a put and a flag; the
peers wait for each flag, then sum the tile. One tile (``SLOW_TILE``) takes far
more work than the others, so the peers wait on it. With tracing on, the report
attributes every wait to the op that released it and splits the wait: the
producer still computing, the releaser not releasing yet, data in flight, or a
flag that arrived while the waiter looked elsewhere. This example checks that
the report finds the cause it built in: the peers' longest waits are released by
rank 0 while its ``tile compute`` scope of tile ``SLOW_TILE`` was still running.

Run:  python -m iris.run -n 2 examples/15_why_ranks_wait.py
"""

import torch
import triton
import triton.language as tl

import iris
from iris_trace import analyze_trace
from iris_trace.attribution import PARTS

NUM_TILES, BLOCK, SLOW_TILE = 4, 1024, 2


@triton.jit
def produce_or_consume(
    tiles, inbox, flags, sums, num_tiles, slow_tile, slow_steps, cur_rank, world_size, heap_bases,
    BLOCK: tl.constexpr,
):  # fmt: skip
    offsets = tl.arange(0, BLOCK)
    if cur_rank == 0:  # the producer
        for t in range(num_tiles):
            started = iris.trace_begin(heap_bases)
            x = tl.load(tiles + t * BLOCK + offsets)
            steps = tl.where(t == slow_tile, slow_steps, 2)
            for _ in range(steps):  # stand-in for a tile's work; the slow tile has far more
                x = x * 0.5 + 1.0
            tl.store(tiles + t * BLOCK + offsets, x)
            iris.trace_end(heap_bases, started, scope=0, pid_m=t)
            for peer in range(1, world_size):
                iris.put(tiles + t * BLOCK + offsets, inbox + t * BLOCK + offsets, cur_rank, peer, heap_bases)
                iris.signal(flags + t, 1, cur_rank, peer, heap_bases, op="set", pid_m=t)
    else:  # a consumer: each tile once its flag is set
        for t in range(num_tiles):
            iris.wait_until(flags + t, "eq", 1, heap_bases=heap_bases, pid_m=t)
            tl.store(sums + t, tl.sum(tl.load(inbox + t * BLOCK + offsets)))


def main() -> int:
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    # The slow tile must outlast whatever else delays a peer: under emulation every op costs
    # the interpreter milliseconds, and ranks sharing a GPU take turns of about 2 ms (a
    # producer that finishes within its turn leaves its peers nothing to wait for).
    if iris.BACKEND != "cuda":
        slow_steps = 2000
    else:
        slow_steps = 1 << 22 if ctx.gpu_shared else 1 << 16
    tiles = ctx.zeros(NUM_TILES * BLOCK)
    inbox = ctx.zeros(NUM_TILES * BLOCK)
    flags = ctx.zeros(NUM_TILES, dtype=torch.int32)
    sums = ctx.zeros(NUM_TILES)
    ctx.tracing.enable(max_events=1 << 14)
    ctx.tracing.name_scope(0, "tile compute")

    def run():
        tiles.copy_(torch.randn(NUM_TILES * BLOCK, generator=torch.Generator().manual_seed(0)))
        inbox.fill_(float("nan"))
        flags.zero_()
        sums.fill_(float("nan"))
        ctx.barrier()
        ctx.wake_links()  # links asleep after a pause would delay the first flag by ~105 us
        # Ranks leave a host barrier at different times; a device barrier just before the
        # launch brings their starts within tens of microseconds (the launches still leave
        # the hosts apart), far less than the slow tile, so the waits show the tile.
        ctx.device_barrier()
        ctx.tracing.reset()  # stream-ordered: the trace keeps only this launch
        produce_or_consume[(1,)](
            tiles, inbox, flags, sums, NUM_TILES, SLOW_TILE, slow_steps, rank, world, ctx.get_heap_bases(),
            BLOCK=BLOCK,
        )  # fmt: skip
        ctx.barrier()

    run()  # the first launch compiles the traced kernel
    run()

    # Every tile a consumer summed is the producer's after its steps: x -> x / 2 + 1, n times,
    # is 2 + (x - 2) / 2^n.
    start = torch.randn(NUM_TILES, BLOCK, generator=torch.Generator().manual_seed(0)).double()
    steps = torch.tensor([slow_steps if t == SLOW_TILE else 2 for t in range(NUM_TILES)], dtype=torch.float64)
    expected = 2 + (start - 2) * torch.pow(0.5, steps)[:, None]
    if rank != 0:
        torch.testing.assert_close(sums.cpu().double(), expected.sum(dim=1), rtol=1e-4, atol=1e-2)

    trace = ctx.tracing.collect()  # the merged trace on rank 0, None elsewhere
    status = 0
    if rank == 0:
        report = analyze_trace(trace)
        print("\n".join(report.summary))
        for peer in range(1, world):
            # The peer's largest group of waits: who released them, and what held the release up.
            top = next(group for group in report.wait_causes if group["rank"] == peer)
            cause = max(PARTS, key=lambda part: top[part])  # the largest part of that wait time
            found = (top["releaser_rank"], top["producer"], top["producer_tile"], cause)
            if found != (0, "tile compute", f"({SLOW_TILE})", "computing_ns"):
                print(f"rank {peer}'s waits were not put on rank 0's slow tile still computing: {top}")
                status = 1
        if status == 0:
            print(f"rank 0: 15_why_ranks_wait OK: every peer waited for rank 0's tile {SLOW_TILE} to finish")
    ctx.close()
    return status


if __name__ == "__main__":
    raise SystemExit(main())
