"""How soon a rank sees a peer's flag: the first flag of a launch against a later one.

The quick start's trace showed each rank's pushers seeing the peer's entry flag (the
first flag of the call) tens of microseconds after it was issued while they polled,
and later flags within a microsecond (docs/tracing.md, "Runs to look at"). This probe
isolates that: on every rank, program 0 raises flag 0 on the peer at once and flag 1
about 300 us later, while the last ``POLLERS`` programs (where the fused kernels keep
their pushers) wait for the peer's two flags; the other programs, and program 0 between
its flags, do nothing (``none``), stream a large buffer (``stream``) or feed tiles to
``tl.dot`` (``dot``), as a GEMM's programs would. Everything is traced. For each flag
and direction it prints how long after both the flag was issued and the pollers were
polling they saw it ("late"; a link's latency plus a poll, under a microsecond between
GPUs), and the launch skew: how much later the pollers began than the flag left.

    python -m iris.run -n 2 scripts/flag_latency_probe.py [--out probe.json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
import triton
import triton.language as tl

import iris
from iris_trace.events import EVENT_NAMES

EVENT_IDS = {name: event for event, name in EVENT_NAMES.items()}
SIGNAL, WAIT = EVENT_IDS["signal"], EVENT_IDS["wait_until"]
POLLERS = 16
BLOCK = 1024


@triton.jit
def _work(stream, pid, steps, WORK: tl.constexpr, STREAM: tl.constexpr, BLOCK: tl.constexpr):
    # What a GEMM's programs do to the memory system: stream loads, or tiles into tl.dot.
    if WORK == "stream":
        offsets = tl.arange(0, BLOCK)
        total = tl.zeros([BLOCK], tl.float32)
        for step in range(steps * 16):
            total += tl.load(stream + ((pid * steps * 16 + step) * BLOCK) % STREAM + offsets)
        tl.store(stream + (pid * BLOCK) % STREAM + offsets, total)
    elif WORK == "dot":
        rows, ks = tl.arange(0, 128), tl.arange(0, 64)
        acc = tl.zeros([128, 128], tl.float32)
        for step in range(steps):
            base = ((pid * steps + step) * 128 * 64) % STREAM
            a = tl.load(stream + base + rows[:, None] * 64 + ks[None, :]).to(tl.bfloat16)
            b = tl.load(stream + base + ks[:, None] * 128 + rows[None, :]).to(tl.bfloat16)
            acc = tl.dot(a, b, acc)
        tl.store(stream + (pid * 128 * 128) % STREAM + rows[:, None] * 128 + rows[None, :], acc)


@triton.jit
def probe(
    flags, stream, epoch, delay_steps, work_steps, cur_rank, world_size, heap_bases,
    POLLERS: tl.constexpr, WORK: tl.constexpr, BLOCK: tl.constexpr, STREAM: tl.constexpr,
):  # fmt: skip
    # Program 0 raises the flags, the last POLLERS programs wait for the peer's (as the
    # fused kernels' pushers do), the rest work.
    pid = tl.program_id(0)
    peer = (cur_rank + 1) % world_size
    if pid == 0:
        iris.signal(flags + cur_rank, epoch, cur_rank, peer, heap_bases)
        _work(stream, pid, work_steps, WORK, STREAM, BLOCK)
        offsets = tl.arange(0, BLOCK)
        x = tl.load(stream + offsets)
        for _ in range(delay_steps):  # flag 1 goes out later in the same launch
            x = x * 0.5 + 1.0
        tl.store(stream + offsets, x)
        iris.signal(flags + world_size + cur_rank, epoch, cur_rank, peer, heap_bases)
    elif pid >= tl.num_programs(0) - POLLERS:
        iris.wait_until(flags + peer, "ge", epoch, heap_bases=heap_bases)
        iris.wait_until(flags + world_size + peer, "ge", epoch, heap_bases=heap_bases)
    else:
        _work(stream, pid, work_steps, WORK, STREAM, BLOCK)


def flag_times(trace, flags_offset: int, world: int) -> list[dict]:
    """Per flag and direction: issue, first poll and seen times (ns, rank 0's clock)."""
    events = trace.events
    rows = []
    for flag in (0, 1):
        for source in range(world):
            address = flags_offset + 4 * (flag * world + source)
            sent = events[(events["event_id"] == SIGNAL) & (events["address"] == address)]
            waits = events[(events["event_id"] == WAIT) & (events["address"] == address)]
            if len(sent) != 1 or not len(waits):
                found = f"{len(sent)} signals, {len(waits)} waits traced"
                raise RuntimeError(f"flag {flag} from rank {source}: {found}")
            issued = int(sent["end_ns"][0])
            rows.append(
                {
                    "flag": flag,
                    "from": source,
                    "to": int(waits["cur_rank"][0]),
                    "issued_ns": issued,
                    "polling_since_ns": int(waits["start_ns"].min()),
                    "seen_ns": int(waits["end_ns"].min()),
                    "late_ns": int(waits["end_ns"].min()) - max(issued, int(waits["start_ns"].min())),
                    "skew_ns": int(waits["start_ns"].min()) - issued,
                }
            )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches per setting (default 3)")
    parser.add_argument("--out", help="write the rows as JSON here (rank 0)")
    args = parser.parse_args()
    # Under emulation (a check that the probe runs) everything is small; on GPUs the stream
    # (256 MiB, five times L2) keeps the other programs loading for a few hundred us, and
    # flag 1 leaves about 300 us after flag 0.
    emulated = iris.BACKEND != "cuda"
    stream_elements = 1 << 14 if emulated else 1 << 26
    ctx = iris.iris(heap_size=1 << 26 if emulated else 1 << 30)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if world != 2:
        raise SystemExit("flag_latency_probe runs at 2 ranks")
    flags = ctx.zeros(2 * world + 2, dtype=torch.int32)
    stream = ctx.randn(stream_elements + 128 * 128)
    programs = POLLERS + 4 if emulated else ctx.backend.multiprocessor_count(ctx.device)
    work_steps = 1 if emulated else 128
    settings = ("none", "stream", "dot")
    delay_steps = 10 if emulated else 1 << 16
    ctx.tracing.enable(max_events=1 << 14)
    results, epoch = [], 0
    offset = flags.data_ptr() - ctx.get_heap_bases()[rank].item()
    for work in settings:
        for repeat in range(args.repeats + 1):  # the first launch compiles
            epoch += 1
            ctx.barrier()
            ctx.device_barrier()
            ctx.tracing.reset()
            probe[(programs,)](
                flags, stream, epoch, delay_steps, work_steps, rank, world, ctx.get_heap_bases(),
                POLLERS=POLLERS, WORK=work, BLOCK=BLOCK, STREAM=stream_elements,
            )  # fmt: skip
            ctx.barrier()
            trace = ctx.tracing.collect()
            if rank == 0 and repeat > 0:
                rows = flag_times(trace, offset, world)
                results.append({"work": work, "repeat": repeat, "flags": rows})
                late = {(row["flag"], row["from"]): row["late_ns"] / 1e3 for row in rows}
                skew = {(row["flag"], row["from"]): row["skew_ns"] / 1e3 for row in rows}
                print(
                    f"{work:6} #{repeat}  late: flag 0  0->1 {late[0, 0]:6.2f}  1->0 {late[0, 1]:6.2f} us,"
                    f"  flag 1  0->1 {late[1, 0]:6.2f}  1->0 {late[1, 1]:6.2f} us;"
                    f"  skew at flag 0: 0->1 {skew[0, 0]:7.2f}  1->0 {skew[0, 1]:7.2f} us"
                )
    if rank == 0 and args.out:
        device = ctx.backend.device_name(ctx.device)
        with open(args.out, "w") as file:
            json.dump({"device": device, "pollers": POLLERS, "results": results}, file, indent=1)
    if rank == 0:
        first = [row["late_ns"] for run in results for row in run["flags"] if row["flag"] == 0]
        later = [row["late_ns"] for run in results for row in run["flags"] if row["flag"] == 1]
        medians = f"flag 0 {np.median(first) / 1e3:.2f} us, flag 1 {np.median(later) / 1e3:.2f} us"
        print(f"late, median over {len(first)} flags each: {medians}")
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
