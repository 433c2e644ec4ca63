"""How soon a rank sees a peer's flag: the first flag of a launch against a later one.

The quick start's trace showed each rank's pushers seeing the peer's entry flag (the
first flag of the call) tens of microseconds after it was issued while they polled,
and later flags within a microsecond (docs/tracing.md, "Links that sleep"). This probe
isolates that: on every rank, program 0 raises flag 0 on the peer at once and flag 1
about 300 us later, while the last ``POLLERS`` programs (where the fused kernels keep
their pushers) wait for the peer's two flags; the other programs, and program 0 between
its flags, do nothing (``none``), stream a large buffer (``stream``) or feed tiles to
``tl.dot`` (``dot``), as a GEMM's programs would. Everything is traced (unless
``--untraced``). For each flag
and direction it prints how long after both the flag was issued and the pollers were
polling they saw it ("late"; a link's latency plus a poll, under a microsecond between
GPUs), and the launch skew: how much later the pollers began than the flag left.

On GPUs the last poller echoes flag 0 back and program 0 waits for the echo, so each
rank also times flag 0's round trip on its own clocks, by %globaltimer (the trace's
clock) and by %clock64 (the SM's cycles): a flag that is really late shows in the round
trip by both; one that does not is an artifact of the clocks or of aligning two GPUs'
clocks. ``--untraced`` runs the same launches with tracing off and reports only the
round trips; ``--idle-ms`` pauses before each launch: GPUs idle, or with ``--busy`` every
SM of both GPUs spinning on its own clock (the GPUs busy, the link between them idle).
``--warm-lines N`` then reads N lines of the peer's memory twice, all at once, from one
program just before the probe, 2 MiB past its flags (``--warm-flags``: the line that
holds the flags), timing each pass: the first pass after a pause takes about as long as
a late flag, the second a link's latency; whether the probe's flags then come on time
says how far one access wakes the way to the peer. ``--wake`` calls ``ctx.wake_links()``
(the library's answer: a read of every line of the peer's first 128 KiB) after the pause
(``--wake-only R``: on rank R alone).

    python -m iris.run -n 2 scripts/flag_latency_probe.py [--untraced] [--idle-ms 5] [--busy]
        [--warm-lines 64 | --warm-flags] [--wake] [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import triton
import triton.language as tl

import iris
from iris.device import intrinsics as hw
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
def _clocks():
    # (%globaltimer, %clock64): the trace's clock and the SM's cycle counter, read together.
    return tl.inline_asm_elementwise(
        "mov.u64 $0, %globaltimer;\n\tmov.u64 $1, %clock64;",
        "=l,=l",
        [],
        dtype=(tl.int64, tl.int64),
        is_pure=False,
        pack=1,
    )


@triton.jit
def busy(duration_ns):
    # Every program spins on its SM's clock for duration_ns: the GPU busy, no memory traffic.
    start, _ = _clocks()
    now = start
    while now - start < duration_ns:
        now, _ = _clocks()


@triton.jit
def warm(target, reads, cur_rank, heap_bases, LINES: tl.constexpr):
    # Reads LINES 128-byte lines of the peer's memory from ``target`` on, all at once, twice,
    # each time from issue to every value in hand (the loop's exit depends on the values;
    # the memory holds non-negative numbers).
    remote = iris.translate(target, cur_rank, 1 - cur_rank, heap_bases) + tl.arange(0, LINES) * 32
    start, _ = _clocks()
    seen = tl.min(tl.load(remote, volatile=True), axis=0)
    while seen < 0:
        seen = tl.min(tl.load(remote, volatile=True), axis=0)
    first, _ = _clocks()
    seen = tl.min(tl.load(remote, volatile=True), axis=0)
    while seen < 0:
        seen = tl.min(tl.load(remote, volatile=True), axis=0)
    second, _ = _clocks()
    tl.store(reads + 0, first - start)
    tl.store(reads + 1, second - first)


@triton.jit
def probe(
    flags, stream, stamps, epoch, delay_steps, work_steps, cur_rank, world_size, heap_bases,
    POLLERS: tl.constexpr, WORK: tl.constexpr, BLOCK: tl.constexpr, STREAM: tl.constexpr, ECHO: tl.constexpr,
):  # fmt: skip
    # Program 0 raises the flags, the last POLLERS programs wait for the peer's (as the
    # fused kernels' pushers do), the rest work.
    # With ECHO the last poller echoes flag 0 back (flags[2 * world_size + r]) and program 0
    # waits for the echo: a round trip on one rank's clock. Not under emulation, where a
    # launch's programs run in order and program 0 cannot wait for a later one.
    pid = tl.program_id(0)
    peer = (cur_rank + 1) % world_size
    # ``stamps`` gets both clocks at flag 0's issue (0, 1), at its echo (2, 3) and after the
    # delay loop (4, 5), so that the round trip can be timed by the SM's cycle counter too;
    # the echoing poller adds 6-9 (round_trip).
    if pid == 0:
        if ECHO:
            timer, cycles = _clocks()
            tl.store(stamps + 0, timer)
            tl.store(stamps + 1, cycles)
        iris.signal(flags + cur_rank, epoch, cur_rank, peer, heap_bases)
        if ECHO:
            iris.wait_until(flags + 2 * world_size + peer, "ge", epoch, heap_bases=heap_bases)
            timer, cycles = _clocks()
            tl.store(stamps + 2, timer)
            tl.store(stamps + 3, cycles)
        _work(stream, pid, work_steps, WORK, STREAM, BLOCK)
        offsets = tl.arange(0, BLOCK)
        x = tl.load(stream + offsets)
        for _ in range(delay_steps):  # flag 1 goes out later in the same launch
            x = x * 0.5 + 1.0
        tl.store(stream + offsets, x)
        if ECHO:
            timer, cycles = _clocks()
            tl.store(stamps + 4, timer)
            tl.store(stamps + 5, cycles)
        iris.signal(flags + world_size + cur_rank, epoch, cur_rank, peer, heap_bases)
    elif pid >= tl.num_programs(0) - POLLERS:
        if ECHO and pid == tl.num_programs(0) - 1:
            # The echoing poller spins by hand to stamp its first poll, the poll that saw the
            # flag and the echo, and to count its polls (1: the flag was there before it looked).
            first, _ = _clocks()
            polls = 1
            seen = hw.load_acquire(flags + peer, "sys")
            while seen < epoch:
                polls += 1
                seen = hw.load_acquire(flags + peer, "sys")
            noticed, _ = _clocks()
            iris.signal(flags + 2 * world_size + cur_rank, epoch, cur_rank, peer, heap_bases)
            echoed, _ = _clocks()
            tl.store(stamps + 6, first)
            tl.store(stamps + 7, noticed)
            tl.store(stamps + 8, echoed)
            tl.store(stamps + 9, polls.to(tl.int64))
        else:
            iris.wait_until(flags + peer, "ge", epoch, heap_bases=heap_bases)
        iris.wait_until(flags + world_size + peer, "ge", epoch, heap_bases=heap_bases)
    else:
        _work(stream, pid, work_steps, WORK, STREAM, BLOCK)


def flag_times(trace, flags_offset: int, world: int, echo: bool) -> list[dict]:
    """Per flag and direction: issue, first poll and seen times (ns, rank 0's clock).

    With ``echo``, flag 2 is the echo of flag 0, and each flag 0 row also has
    ``round_trip_ns``, from the flag's issue to its echo seen by the sender, less the
    time the peer held the flag before echoing it (seen to echo issued): each of the two
    differences is on one rank's clock, so no clock alignment enters it.
    """
    events = trace.events
    rows = []
    for flag in (0, 1, 2) if echo else (0, 1):
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
    for row in rows:
        if echo and row["flag"] == 0:
            back = next(r for r in rows if r["flag"] == 2 and r["from"] == row["to"])
            held = back["issued_ns"] - row["seen_ns"]
            row["round_trip_ns"] = back["seen_ns"] - row["issued_ns"] - held
    return rows


def round_trip(sender: list[int], peer: list[int]) -> dict:
    """Flag 0's round trip from the two ranks' ``stamps`` (ns; one rank's clock per difference).

    ``round_trip_ns`` is issue to echo seen by %globaltimer, ``round_trip_clock64_ns`` the
    same by %clock64 at the SM's rate over the delay loop; ``both_ways_ns`` takes away the
    peer's hold (flag seen to echo issued): the time the flag and its echo travelled,
    when ``peer_polls`` > 1 (else the peer began polling after the flag had come, and the
    figure includes that wait).
    """
    ghz = (sender[5] - sender[3]) / max(1, sender[4] - sender[2])
    trip = sender[2] - sender[0]
    return {
        "round_trip_ns": trip,
        "round_trip_clock64_ns": round((sender[3] - sender[1]) / ghz),
        "sm_ghz": round(ghz, 3),
        "both_ways_ns": trip - (peer[8] - peer[7]),
        "peer_polls": peer[9],
    }


def _describe(trips: list[dict]) -> str:
    parts = []
    for sender, trip in enumerate(trips):
        by_timer, by_cycles = trip["round_trip_ns"] / 1e3, trip["round_trip_clock64_ns"] / 1e3
        both_ways = trip["both_ways_ns"] / 1e3
        text = f"from {sender} {by_timer:7.2f} / {by_cycles:7.2f} us, both ways {both_ways:7.2f} us"
        parts.append(text + ("" if trip["peer_polls"] > 1 else " (the peer looked after it came)"))
    return "flag 0's round trip by %globaltimer / %clock64: " + ";  ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches per setting (default 3)")
    parser.add_argument("--idle-ms", type=float, default=0.0, help="GPUs idle this long before each launch")
    parser.add_argument("--busy", action="store_true", help="spin every SM through the pause, not idle")
    parser.add_argument(
        "--warm-lines",
        type=int,
        default=0,
        help="time reads of this many lines of the peer before each launch",
    )
    parser.add_argument("--warm-flags", action="store_true", help="--warm-lines 1 on the flags' own line")
    parser.add_argument("--wake", action="store_true", help="ctx.wake_links() after the pause")
    parser.add_argument("--wake-only", type=int, help="--wake on this rank alone")
    parser.add_argument(
        "--untraced", action="store_true", help="tracing off: flag 0's round trip by the clocks only"
    )
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
    flags = ctx.zeros(3 * world, dtype=torch.int32)
    stamps = torch.zeros(10, dtype=torch.int64, device=ctx.device)
    if args.warm_flags:
        args.warm_lines = 1
    if args.warm_lines & (args.warm_lines - 1):
        raise SystemExit("--warm-lines takes a power of two")
    scratch = ctx.zeros(1 << 20, dtype=torch.int32)  # what --warm-lines reads on the peer: 4 MiB
    warm_target = flags if args.warm_flags else scratch[1 << 19 :]
    reads = torch.zeros(2, dtype=torch.int64, device=ctx.device)
    stream = ctx.randn(stream_elements + 128 * 128)
    programs = POLLERS + 4 if emulated else ctx.backend.multiprocessor_count(ctx.device)
    work_steps = 1 if emulated else 128
    settings = ("none", "stream", "dot")
    delay_steps = 10 if emulated else 1 << 16
    if (args.untraced or args.busy or args.warm_lines) and emulated:
        raise SystemExit("--untraced, --busy and --warm-lines read the GPU's clocks: use IRIS_BACKEND=cuda")
    if not args.untraced:
        ctx.tracing.enable(max_events=1 << 14)
    results, clocks, epoch = [], [], 0
    offset = flags.data_ptr() - ctx.get_heap_bases()[rank].item()
    for work in settings:
        for repeat in range(args.repeats + 1):  # the first launch compiles
            epoch += 1
            ctx.barrier()
            ctx.device_barrier()
            if not args.untraced:
                ctx.tracing.reset()
            ctx.backend.synchronize(ctx.device)
            if args.busy:  # the SMs spin, the link stays idle
                busy[(programs,)](int(args.idle_ms * 1e6))
            else:
                time.sleep(args.idle_ms / 1e3)  # links and SMs idle, as between a program's steps
            if args.wake if args.wake_only is None else rank == args.wake_only:
                ctx.wake_links()
            if args.warm_lines:
                warm[(1,)](warm_target, reads, rank, ctx.get_heap_bases(), LINES=args.warm_lines)
            probe[(programs,)](
                flags, stream, stamps, epoch, delay_steps, work_steps, rank, world, ctx.get_heap_bases(),
                POLLERS=POLLERS, WORK=work, BLOCK=BLOCK, STREAM=stream_elements, ECHO=not emulated,
            )  # fmt: skip
            ctx.barrier()
            if not emulated and repeat > 0:
                both = [None] * world
                torch.distributed.all_gather_object(both, stamps.tolist())
                trips = [round_trip(both[r], both[(r + 1) % world]) for r in range(world)]
                entry = {"work": work, "repeat": repeat, "stamps": both, "round_trips": trips}
                warmed = ""
                if args.warm_lines:
                    entry["warm_reads_ns"] = [None] * world
                    torch.distributed.all_gather_object(entry["warm_reads_ns"], reads.tolist())
                    warmed = "; warm reads " + ", ".join(
                        f"{r}: {first / 1e3:.2f} then {second / 1e3:.2f} us"
                        for r, (first, second) in enumerate(entry["warm_reads_ns"])
                    )
                clocks.append(entry)
                if rank == 0:
                    print(f"{work:6} #{repeat}  {_describe(trips)}{warmed}", flush=True)
            if args.untraced:
                continue
            trace = ctx.tracing.collect()
            if rank == 0 and repeat > 0:
                rows = flag_times(trace, offset, world, echo=not emulated)
                results.append({"work": work, "repeat": repeat, "flags": rows})
                late = {(row["flag"], row["from"]): row["late_ns"] / 1e3 for row in rows}
                skew = {(row["flag"], row["from"]): row["skew_ns"] / 1e3 for row in rows}
                echoed = ""
                if not emulated:
                    trip = {row["from"]: row["round_trip_ns"] / 1e3 for row in rows if row["flag"] == 0}
                    echoed = (
                        f"  echo 1->0 {late[2, 1]:6.2f}  0->1 {late[2, 0]:6.2f} us;"
                        f"  flag 0's round trip less hold: from 0 {trip[0]:7.2f}  from 1 {trip[1]:7.2f} us;"
                    )
                print(
                    f"{work:6} #{repeat}  late: flag 0  0->1 {late[0, 0]:6.2f}  1->0 {late[0, 1]:6.2f} us,"
                    f"  flag 1  0->1 {late[1, 0]:6.2f}  1->0 {late[1, 1]:6.2f} us;{echoed}"
                    f"  skew at flag 0: 0->1 {skew[0, 0]:7.2f}  1->0 {skew[0, 1]:7.2f} us"
                )
    if rank == 0 and args.out:
        device = ctx.backend.device_name(ctx.device)
        with open(args.out, "w") as file:
            report = {"device": device, "pollers": POLLERS, "idle_ms": args.idle_ms}
            report.update(busy=args.busy, warm_lines=args.warm_lines, warm_flags=args.warm_flags)
            report["wake"] = args.wake if args.wake_only is None else f"rank {args.wake_only} only"
            report["traced"] = not args.untraced
            # Per launch, each rank's ``stamps`` (probe) and flag 0's round trips (round_trip).
            report.update(results=results, clocks=clocks)
            json.dump(report, file, indent=1)
    if rank == 0 and results:
        first = [row["late_ns"] for run in results for row in run["flags"] if row["flag"] == 0]
        later = [row["late_ns"] for run in results for row in run["flags"] if row["flag"] == 1]
        medians = f"flag 0 {np.median(first) / 1e3:.2f} us, flag 1 {np.median(later) / 1e3:.2f} us"
        print(f"late, median over {len(first)} flags each: {medians}")
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
