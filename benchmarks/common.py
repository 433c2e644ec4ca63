"""Timing and reports shared by the benchmarks: same iterations everywhere, max over ranks.

Every helper also serves a single-process benchmark on one GPU (``ctx=None``, no
process group): then there is no barrier and no rank to take the max over.
"""

from __future__ import annotations

import json
import os
import platform
import sys

import torch
import torch.distributed as dist
import triton


def require_own_gpu(ctx) -> None:
    """Stop with a clear message when ranks share a GPU (``IRIS_RANKS_PER_GPU``).

    Kernels of ranks on one GPU take turns (time slicing), so a timing there says
    nothing about the library; ``benchmarks/shared_gpu.py`` measures that cost itself.

    Example:
        >>> ctx = iris.iris(1 << 30)
        >>> require_own_gpu(ctx)
    """
    if ctx is not None and ctx.gpu_shared:
        raise SystemExit(
            f"{sys.argv[0]}: ranks share a GPU (IRIS_RANKS_PER_GPU); their kernels take turns, so "
            "timings would mean nothing. Run with one rank per GPU."
        )


def time_loop(ctx, fn, iters: int, warmup: int = 5, align: bool = False, shared_ok: bool = False) -> float:
    """Seconds per call of ``fn``: warm-up, barrier, CUDA events around ``iters`` calls; max over ranks.

    ``ctx=None``: one process, no barriers, this GPU's time.

    ``align`` (for collectives): one more call between the barrier and the start
    event. Ranks leave a host barrier tens of microseconds apart, and the first
    timed collective would make the earliest rank wait that long; after the
    aligning call every GPU starts its clock within a few microseconds of the others.
    ``shared_ok``: time even when ranks share a GPU (only to measure what sharing costs).
    """
    if not shared_ok:
        require_own_gpu(ctx)
    for _ in range(warmup):
        fn()
    if ctx is not None:
        ctx.barrier()
    if align:
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(stop) / 1e3 / iters
    if ctx is None:
        return seconds
    ctx.barrier()
    times = [None] * ctx.get_num_ranks()
    dist.all_gather_object(times, seconds)
    return max(times)


def median_of_trials(ctx, fn, iters: int, trials: int, warmup: int = 5) -> tuple[float, list[float]]:
    """``time_loop`` (aligned) ``trials`` times; (median, every trial). Each trial is a max over ranks.

    Short runs of microsecond calls move with clocks and host jitter; the median of
    a few fixed-length trials is steadier than one trial.
    """
    times = [time_loop(ctx, fn, iters, warmup, align=True) for _ in range(trials)]
    return sorted(times)[len(times) // 2], times


def parse_configs(text: str) -> list[dict]:
    """``"comm_sms=32,block_size=8192;num_warps=4"`` -> one dict of config fields per item."""
    configs = []
    for item in filter(None, text.split(";")):
        fields = {}
        for pair in item.split(","):
            key, value = pair.split("=")
            fields[key.strip()] = int(value) if value.strip().lstrip("-").isdigit() else value.strip()
        configs.append(fields)
    return configs


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"4096,2048,8192;1024,1024,1024"`` -> ``[(4096, 2048, 8192), (1024, 1024, 1024)]``."""
    shapes = []
    for item in text.split(";"):
        m, n, k = (int(x) for x in item.split(","))
        shapes.append((m, n, k))
    return shapes


def relative_error(got, expected) -> float:
    """``|got - expected| / |expected|`` in fp32 (Frobenius norms)."""
    return ((got.float() - expected.float()).norm() / expected.float().norm()).item()


def all_ranks_agree(ok: bool) -> bool:
    """True only if ``ok`` is true on every rank."""
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(ok))
    return all(flags)


#: Settings that change what a benchmark compiles or which path its ops take: kept in the command.
_SETTINGS = (
    "IRIS_RANKS_PER_NODE",
    "IRIS_CROSS_NODE_ALWAYS",
    "IRIS_RANKS_PER_GPU",
    "IRIS_FLIGHT",
    "IRIS_FLIGHT_ENTRIES",
    "IRIS_DEBUG",
    "IRIS_WAIT_TIMEOUT",
)


def _machine(world_size: int | None) -> str:
    # Which of the host's GPUs ran: a 2-rank result from a 4-GPU machine says so.
    if not torch.cuda.is_available():
        return f"{os.cpu_count()} CPU cores"
    ranks, gpus = world_size or 1, torch.cuda.device_count()
    placement = "one rank per GPU" if ranks <= gpus else f"{ranks} ranks sharing {gpus} GPU(s)"
    return f"{ranks} rank(s), {gpus} x {torch.cuda.get_device_name()} visible, {placement}"


def write_report(report: dict, path: str | None, world_size: int | None) -> None:
    """Add the command, device, machine and versions to ``report`` and write it as JSON (rank 0).

    ``world_size=None``: a single-process benchmark, run with plain ``python``.
    """
    if world_size is not None and dist.get_rank() != 0:
        return
    launcher = "python" if world_size is None else f"python -m iris.run -n {world_size}"
    settings = "".join(f"{name}={os.environ[name]} " for name in _SETTINGS if os.environ.get(name))
    report.update(
        {
            "command": f"{settings}{launcher} " + " ".join(sys.argv),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "emulated (CPU)",
            "machine": report.get("machine") or _machine(world_size),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
        }
    )
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2)
