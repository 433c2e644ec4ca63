"""How well the tracer aligns the GPUs' clocks: fitted offsets, drift, residuals, causality margins.

Rank 0 puts, then signals rank r; rank r waits and acknowledges; repeated ``--rounds``
times for every peer r. Once aligned, every wait must end after the signal that
released it started. The margin (wait end - signal start) is reported on the
aligned clock and on the raw per-GPU clocks, whose offsets are hundreds of
microseconds (../shared/HARDWARE.md), to show what the alignment buys.

    python -m iris.run -n 4 benchmarks/clock_alignment.py --out benchmarks/results/clock_alignment_h200x4.json
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
import triton
import triton.language as tl
from common import require_own_gpu, write_report

import iris
from iris_trace.events import EVENT_NAMES

SIGNAL = next(k for k, v in EVENT_NAMES.items() if v == "signal")
WAIT = next(k for k, v in EVENT_NAMES.items() if v == "wait_until")


@triton.jit
def exchange(data, flag, ack, rounds, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    for step in range(rounds):
        if cur_rank == 0:
            iris.wait_until(ack, "ge", step, heap_bases=heap_bases)
            iris.put(data + offsets, data + offsets, 0, peer, heap_bases)
            iris.signal(flag, step + 1, 0, peer, heap_bases)
        else:
            iris.wait_until(flag, "ge", step + 1, heap_bases=heap_bases)
            iris.signal(ack, step + 1, cur_rank, 0, heap_bases)


def margins(ev, peer, aligned_events=None):
    """wait end - signal start per round, for the exchange with ``peer``."""
    signals = ev[(ev["cur_rank"] == 0) & (ev["event_id"] == SIGNAL) & (ev["target_rank"] == peer)]
    waits = ev[(ev["cur_rank"] == peer) & (ev["event_id"] == WAIT)]
    signals, waits = np.sort(signals, order="value"), np.sort(waits, order="value")
    return (waits["end_ns"] - signals["start_ns"]).astype(np.int64)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.time()
    ctx = iris.iris(heap_size=1 << 30)
    require_own_gpu(ctx)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    data = ctx.randn(256)
    flag, ack = ctx.zeros(world, dtype=torch.int32), ctx.zeros(world, dtype=torch.int32)
    # Rank 0 records 3 events a round for every peer, possibly all on one SM.
    ctx.tracing.enable(max_events=4 * world * args.rounds * ctx.get_cu_count())
    for peer in range(1, world):
        ctx.barrier()
        if rank in (0, peer):
            exchange[(1,)](
                data, flag[peer:], ack[peer:], args.rounds, rank, peer, ctx.get_heap_bases(), BLOCK=256
            )
        ctx.barrier()
    raw = ctx.tracing.events()
    raw_all = [None] * world
    dist.all_gather_object(raw_all, raw)
    trace = ctx.tracing.collect()
    report = None
    if rank == 0:
        raw_events = np.concatenate(raw_all)
        peers = []
        for peer in range(1, world):
            aligned, unaligned = margins(trace.events, peer), margins(raw_events, peer)
            fit = trace.clock_fits[peer]
            peers.append(
                {
                    "peer": peer,
                    "rounds": int(len(aligned)),
                    "offset_us": fit.offset_ns / 1e3,
                    "drift_ppm": fit.drift * 1e6,
                    "residual_ns": fit.residual_ns,
                    "min_rtt_ns": fit.rtt_ns,
                    "aligned_margin_ns": {"min": int(aligned.min()), "median": int(np.median(aligned))},
                    "raw_margin_ns": {"min": int(unaligned.min()), "median": int(np.median(unaligned))},
                    "causality_violations_aligned": int((aligned <= 0).sum()),
                    "causality_violations_raw": int((unaligned <= 0).sum()),
                }
            )
        report = {"world_size": world, "rounds": args.rounds, "peers": peers, "dropped": trace.dropped}
        print(
            f"{'peer':>4} {'offset us':>10} {'drift ppm':>9} {'resid ns':>8} {'rtt ns':>7} "
            f"{'aligned min/med ns':>19} {'raw min/med ns':>17} {'violations al/raw':>17}"
        )
        for p in peers:
            a, r = p["aligned_margin_ns"], p["raw_margin_ns"]
            print(
                f"{p['peer']:>4} {p['offset_us']:10.2f} {p['drift_ppm']:9.2f} {p['residual_ns']:8.0f} "
                f"{p['min_rtt_ns']:7.0f} {a['min']:>9}/{a['median']:<9} {r['min']:>8}/{r['median']:<8} "
                f"{p['causality_violations_aligned']:>8}/{p['causality_violations_raw']}"
            )
        report["seconds"] = round(time.time() - started, 1)
    write_report(report or {}, args.out, world)
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
