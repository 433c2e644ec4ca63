"""07 · tracing: record every remote op of every rank and open the result in ui.perfetto.dev.

Each rank computes a few tiles (a compute scope each) and pushes every finished
tile to its neighbour with a put and a signal; the neighbour waits for it. With
``ctx.tracing.enable()`` the unchanged kernel records puts, signals, waits and
scopes; ``export()`` writes every rank's events (``rank<N>.npz``) and aligns all
ranks' clocks onto rank 0's, and rank 0 writes a Perfetto trace, a Chrome JSON
trace and the report (why each rank waited, per-SM overlap and stalls, and where the
time went by call site: every event names the kernel line that issued it).

Run:  python -m iris.run -n 2 examples/07_tracing.py [output_dir]
Then: open output_dir/trace.pftrace in https://ui.perfetto.dev
"""

import os
import sys

import torch
import triton
import triton.language as tl

import iris
from iris_trace import analyze_trace, schema
from iris_trace.export import write_chrome_json, write_perfetto


@triton.jit
def compute_and_push(tiles, inbox, ready, num_tiles, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    right = (cur_rank + 1) % world_size
    for t in range(num_tiles):
        started = iris.trace_begin(heap_bases)
        x = tl.load(tiles + t * BLOCK + offsets)
        for _ in range(8):  # stand-in for real work on the tile
            x = x * 0.5 + 1.0
        tl.store(tiles + t * BLOCK + offsets, x)
        iris.trace_end(heap_bases, started, scope=0, pid_m=t)
        iris.put(tiles + t * BLOCK + offsets, inbox + t * BLOCK + offsets, cur_rank, right, heap_bases)
        iris.signal(ready, 1, cur_rank, right, heap_bases, op="add")
    iris.wait_until(ready, "ge", num_tiles, heap_bases=heap_bases)  # all of the left neighbour's tiles


def main(out_dir: str):
    ctx = iris.iris(heap_size=1 << 26)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    num_tiles, block = 8, 1024
    tiles = ctx.randn(num_tiles * block, generator=torch.Generator().manual_seed(rank))
    left = (rank - 1) % world
    expected_from_left = torch.randn(num_tiles * block, generator=torch.Generator().manual_seed(left))
    for _ in range(8):
        expected_from_left = expected_from_left * 0.5 + 1.0
    inbox = ctx.full((num_tiles * block,), float("nan"))
    ready = ctx.zeros(1, dtype=torch.int32)
    ctx.tracing.enable(max_events=1 << 16)
    ctx.tracing.name_scope(0, "tile compute")
    ctx.barrier()

    compute_and_push[(1,)](tiles, inbox, ready, num_tiles, rank, world, ctx.get_heap_bases(), BLOCK=block)
    ctx.barrier()
    torch.testing.assert_close(inbox.cpu(), expected_from_left, rtol=1e-6, atol=1e-6)

    trace = ctx.tracing.export(out_dir)  # rank<N>.npz per rank; the merged trace on rank 0
    if rank == 0:
        out_dir = trace.directory  # out_dir, unless another job is writing there
        write_perfetto(trace, os.path.join(out_dir, "trace.pftrace"))
        write_chrome_json(trace, os.path.join(out_dir, "trace.json"))
        report = analyze_trace(trace)
        report.to_json(os.path.join(out_dir, "report.json"))
        print(report.format_table())
        scopes = (trace.events["event_id"] == schema.SCOPE_BASE + 0).sum()  # scope 0: "tile compute"
        assert scopes == world * num_tiles, "every tile's compute scope is recorded"
        assert sum(trace.dropped) == 0
        # Every event names the line of compute_and_push that issued it (the report's
        # "by call site" table; the exports' call_site and launch args).
        lines = {trace.sites[site].line for site in trace.events["site"].tolist()}
        assert len(lines) == 4 and {site.kernel for site in trace.sites.values()} == {"compute_and_push"}
        print(f"rank 0: 07_tracing OK: {len(trace.events)} events, {world} ranks, in {out_dir}/trace.pftrace")
    ctx.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "iris_traces")
