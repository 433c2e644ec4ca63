"""How fast merged traces become Perfetto protobuf and Chrome JSON, and how much memory it takes.

A synthetic trace shaped like a real one (ranks x SMs x programs, puts, signals,
waits, compute scopes) is exported; reported are events per second for each
writer and the peak resident memory beside the trace's own size. Runs on one
CPU core (no GPU involved).

    python benchmarks/export_speed.py --events 1000000 --out benchmarks/results/export_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import tempfile
import time

import numpy as np

from iris_trace.events import EVENT_DTYPE
from iris_trace.export.chrome import write_chrome_json
from iris_trace.export.perfetto import write_perfetto
from iris_trace.trace import RankTrace, Trace


def synthetic_trace(total_events: int, world: int = 4, sms: int = 132, seed: int = 0) -> Trace:
    """Programs of 8 events (scope, put, signal, wait ...) laid back to back on each SM."""
    rng = np.random.default_rng(seed)
    per_rank = total_events // world
    ranks = []
    for rank in range(world):
        events = np.zeros(per_rank, EVENT_DTYPE)
        index = np.arange(per_rank)
        program, step = divmod(index, 8)
        events["event_id"] = np.choose(step % 4, [64, 4, 15, 16])
        events["cur_rank"] = rank
        events["target_rank"] = np.where(events["event_id"] == 64, -1, (rank + 1) % world)
        events["cu_id"] = program % sms
        events["pid"] = program
        events["pid_m"], events["pid_n"] = program // 32, program % 32
        events["op_index"] = index
        base = (program // sms) * 10_000 + rng.integers(0, 50, per_rank)
        events["start_ns"] = base + step * 1_000
        events["end_ns"] = events["start_ns"] + np.where(step % 4 == 0, 900, 400)
        events["address"] = (program % 64) * 256
        events["payload_bytes"] = 16384
        events["value"] = step
        sync = np.zeros((world, 4, 4), np.int64)
        ranks.append(RankTrace(rank, world, events, sync, sync, device="synthetic"))
    return Trace(ranks)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--skip-json", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, as the goal states
    trace = synthetic_trace(args.events)
    n = len(trace.events)
    report = {"events": n, "trace_mib": trace.events.nbytes / 2**20, "rss_before_mib": peak_rss_mib()}
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        stats = write_perfetto(trace, os.path.join(tmp, "t.pftrace"))
        seconds = time.perf_counter() - started
        report["perfetto"] = {
            "seconds": seconds,
            "events_per_second": n / seconds,
            "flows": stats["flows"],
            "file_mib": os.path.getsize(os.path.join(tmp, "t.pftrace")) / 2**20,
            "peak_rss_mib": peak_rss_mib(),
        }
        if not args.skip_json:
            # A trace of its own, so the JSON writer also pays for the lanes and releasers
            # that the first writer computed (a Trace keeps them once computed).
            trace = Trace(trace.ranks)
            started = time.perf_counter()
            write_chrome_json(trace, os.path.join(tmp, "t.json"))
            seconds = time.perf_counter() - started
            report["chrome_json"] = {
                "seconds": seconds,
                "events_per_second": n / seconds,
                "file_mib": os.path.getsize(os.path.join(tmp, "t.json")) / 2**20,
                "peak_rss_mib": peak_rss_mib(),
            }
    report.update(
        {
            "command": "python " + " ".join(sys.argv),
            "python": platform.python_version(),
            "machine": platform.processor() or platform.machine(),
            "numpy": np.__version__,
        }
    )
    print(json.dumps(report, indent=2))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
