"""Timing shared by the multi-rank benchmarks: same iterations everywhere, max over ranks."""

from __future__ import annotations

import json
import platform
import sys

import torch
import torch.distributed as dist
import triton


def time_loop(ctx, fn, iters: int, warmup: int = 5) -> float:
    """Seconds per call of ``fn``: warm-up, barrier, CUDA events around ``iters`` calls; max over ranks."""
    for _ in range(warmup):
        fn()
    ctx.barrier()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(stop) / 1e3 / iters
    ctx.barrier()
    times = [None] * ctx.get_num_ranks()
    dist.all_gather_object(times, seconds)
    return max(times)


def all_ranks_agree(ok: bool) -> bool:
    """True only if ``ok`` is true on every rank."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok))
    return all(flags)


def write_report(report: dict, path: str | None, world_size: int) -> None:
    """Add the command, device and versions to ``report`` and write it as JSON (rank 0)."""
    if dist.get_rank() != 0:
        return
    report.update(
        {
            "command": f"python -m iris.run -n {world_size} " + " ".join(sys.argv),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "emulated (CPU)",
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        }
    )
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
