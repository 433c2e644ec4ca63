"""13 · the showcase: workgroup-specialised GEMM + all-scatter, traced on every rank.

The problem of examples 09 to 12 (C = A x B, B sharded by columns, every rank
ends with all of C), run by the workgroup-specialised kernel with tracing on:
every GEMM tile is a compute slice, every tile's push to a peer, flag signal and flag wait an
event, on every SM of every rank. Every rank's events go to output_dir/rank<N>.npz
(for the iris-trace command line); rank 0 merges them onto one clock and writes a
Perfetto trace, a Chrome JSON trace, the report (why each rank waited, per-SM
overlap and stalls) and the per-SM timeline picture, and prints the report. Full
size on GPUs (M = N = K = 8192), small under emulation.

Run:  python -m iris.run -n 2 examples/13_traced_gemm_all_scatter.py [output_dir]
Then: open output_dir/trace.pftrace (default iris_traces/) in https://ui.perfetto.dev,
      look at output_dir/timeline.png, or iris-trace report output_dir/rank*.npz
"""

import os
import sys

import torch

import iris
from iris.ops.gemm import SCOPE_GEMM
from iris_trace import analyze_trace, schema
from iris_trace.export import write_chrome_json, write_perfetto
from iris_trace.plot import timeline

GEMM_SCOPE = schema.SCOPE_BASE + int(SCOPE_GEMM)  # event id of the ops' "gemm tile" compute scope


def main(out_dir: str) -> int:
    gpu = iris.BACKEND == "cuda"
    ctx = iris.iris(heap_size=1 << 30 if gpu else 1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, K, n = (8192, 8192, 8192 // world) if gpu else (40, 40, 48)
    a = ctx.randn(M, K, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    b = ctx.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + rank))
    c = ctx.full((M, world * n), float("nan"), dtype=torch.bfloat16)
    config = ctx.ops.default_config(M, n, K).replace(variant="workgroup_specialized")

    ctx.tracing.enable(max_events=1 << 20 if gpu else 1 << 14)
    ctx.ops.matmul_all_gather(c, a, b, dim=1, config=config)  # compiles the traced kernel
    ctx.wake_links()  # compiled here too: a rank compiling below would start the call late
    ctx.barrier()
    # NVLink links sleep after 50 ms without traffic (a rank may have compiled that long)
    # and the first access over each waits ~105 us for it to wake: wake them right before
    # the call, so that the trace shows the kernel rather than the links.
    ctx.wake_links()
    # Ranks leave a host barrier hundreds of microseconds apart; a device barrier queued
    # just before the call starts every GPU on it within microseconds of the others.
    ctx.device_barrier()
    ctx.tracing.reset()  # stream-ordered: keeps only the steady-state call in the trace
    ctx.ops.matmul_all_gather(c, a, b, dim=1, config=config)
    ctx.barrier()

    b_all = [
        torch.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + r))
        for r in range(world)
    ]
    expected = a.float() @ torch.cat(b_all, dim=1).to(a.device).float()
    error = ((c.float() - expected).norm() / expected.norm()).item()

    trace = ctx.tracing.export(out_dir)  # rank<N>.npz per rank; the merged trace on rank 0
    status = 0
    if rank == 0:
        out_dir = trace.directory  # out_dir, unless another job is writing there
        write_perfetto(trace, os.path.join(out_dir, "trace.pftrace"))
        write_chrome_json(trace, os.path.join(out_dir, "trace.json"))
        report = analyze_trace(trace)
        report.to_json(os.path.join(out_dir, "report.json"))
        command = f"iris.run -n {world} examples/13_traced_gemm_all_scatter.py ({M}x{world * n}x{K})"
        timeline(trace.events, os.path.join(out_dir, "timeline.png"), world, title=command,
                 scope_names=trace.scope_names, notes=report.notes, report=report,
                 emulated=trace.emulated)  # fmt: skip
        print(report.format_table())
        tiles = -(-M // config.block_m) * -(-n // config.block_n)
        scopes = int((trace.events["event_id"] == GEMM_SCOPE).sum())
        if scopes != world * tiles or sum(trace.dropped) != 0:
            print(f"rank 0: expected {world * tiles} gemm tiles and no drops, got {scopes}, {trace.dropped}")
            status = 1
        else:
            print(f"rank 0: 13_traced_gemm_all_scatter OK: {len(trace.events)} events, {world} ranks, "
                  f"{scopes} gemm tiles, relative error {error:.1e}, in {out_dir}/")  # fmt: skip
    ctx.close()
    if error > 1e-2:
        print(f"rank {rank}: MISMATCH: relative error {error:.2e}")
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "iris_traces"))
