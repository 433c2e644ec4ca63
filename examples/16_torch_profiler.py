"""16 · one timeline with PyTorch's profiler: host ops, CUDA kernels and Iris's device ops together.

Each rank runs a training-like step under ``ctx.tracing.torch_profiler()``: a
matmul (cuBLAS on GPUs), then a Triton kernel that pushes its result to the next
rank with a put and a signal, the next rank waiting for it. The profiler records
the host side (the ops, the launches) and, on GPUs, every kernel; Iris records
the put, the signal and the wait from inside the kernel. ``export()`` puts both on
rank 0's clock, and rank 0 writes one Perfetto trace in which each rank has its
host threads and CUDA streams above its SMs, with arrows from each launch to its
kernel and from each signal to the wait it released. The example checks the
alignment: every rank's Iris events lie inside the profiler's slice of the kernel
that issued them (on GPUs) or of the host range that launched it (under emulation).

Run:  python -m iris.run -n 2 examples/16_torch_profiler.py [output_dir]
Then: open output_dir/trace.pftrace in https://ui.perfetto.dev, or look at output_dir/profile.png
"""

import os
import sys

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, record_function

import iris
from iris_trace.export import write_perfetto
from iris_trace.plot_profile import profile_timeline


@triton.jit
def push_to_next(src, inbox, ready, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    right = (cur_rank + 1) % world_size
    iris.put(src + offsets, inbox + offsets, cur_rank, right, heap_bases)
    iris.signal(ready, 1, cur_rank, right, heap_bases)
    iris.wait_until(ready, "ge", 1, heap_bases=heap_bases)  # the left neighbour's block arrived


def main(out_dir: str) -> int:
    ctx = iris.iris(heap_size=1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    gpu = iris.BACKEND == "cuda"
    x = ctx.full((64, 64), float(rank + 1))
    inbox, ready = ctx.zeros(64, dtype=torch.float32), ctx.zeros(1, dtype=torch.int32)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])

    ctx.tracing.enable(max_events=1 << 12)
    push_to_next[(1,)](x, inbox, ready, rank, world, ctx.get_heap_bases(), BLOCK=64)  # compiles
    ready.zero_()
    ctx.barrier()
    ctx.tracing.reset()
    with ctx.tracing.torch_profiler(activities=activities):
        with record_function("step"):
            y = x @ x  # every element: 64 * (rank + 1)^2
            push_to_next[(1,)](y, inbox, ready, rank, world, ctx.get_heap_bases(), BLOCK=64)
        ctx.barrier()

    left = (rank - 1) % world
    received_ok = bool((inbox == 64.0 * (left + 1) ** 2).all())
    trace = ctx.tracing.export(out_dir)
    status = 0 if received_ok else 1
    if rank == 0:
        write_perfetto(trace, os.path.join(trace.directory, "trace.pftrace"))
        profile_timeline(trace, os.path.join(trace.directory, "profile.png"),
                         title=f"iris.run -n {world} examples/16_torch_profiler.py")  # fmt: skip
        for r in range(world):
            profile, start, end = trace.torch_events(r)
            names = [profile.names[i] for i in profile.events["name"]]
            # The kernel's own slice on GPUs; the host range that ran it under emulation.
            holder = names.index("push_to_next") if "push_to_next" in names else names.index("step")
            mine = trace.events[trace.events["cur_rank"] == r]
            slack = profile.clock().uncertainty_ns
            inside = (mine["start_ns"] >= start[holder] - slack) & (mine["end_ns"] <= end[holder] + slack)
            print(f"rank {r}: {len(mine)} Iris events, {len(names)} profiler events on "
                  f"{len(profile.tracks)} tracks, clock within {slack / 1000:.1f} us, "
                  f"inside {names[holder]!r}: {int(inside.sum())}/{len(mine)}")  # fmt: skip
            status |= int(len(mine) != 3 or not inside.all())
        if status == 0:
            print(f"rank 0: 16_torch_profiler OK: one timeline in {trace.directory}/trace.pftrace")
    ctx.close()
    if not received_ok:
        print(f"rank {rank}: MISMATCH: the block from rank {left} did not arrive")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "iris_traces"))
