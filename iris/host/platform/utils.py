"""Upstream's platform helpers: ``iris.do_bench`` (its timing loop for a multi-rank call),
``iris.get_device_id_for_rank`` and ``iris.is_simulation_env``."""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence

import torch

from ... import _env, config
from ...backends import make_backend

#: Bytes written between repetitions so no repetition finds the last one's data in L2 (50 MiB on an H200).
CACHE_FLUSH_BYTES = 256 << 20
_SUMMARIES = {"mean": statistics.mean, "median": statistics.median, "min": min, "max": max, "all": list}


def do_bench(
    fn: Callable[[], object],
    barrier_fn: Callable[[], object] = lambda: None,
    preamble_fn: Callable[[], object] = lambda: None,
    n_warmup: int = 25,
    n_repeat: int = 100,
    quantiles: Sequence[float] | None = None,
    return_mode: str = "mean",
):
    """Time ``fn`` on the current stream, in milliseconds, as upstream's ``iris.do_bench``.

    Each repetition runs ``barrier_fn`` (all ranks in step), ``preamble_fn`` (resets
    ``fn``'s inputs, untimed), overwrites a 256 MiB buffer (a cold cache), runs
    ``barrier_fn`` again and times ``fn`` alone between two events. ``n_warmup``
    untimed repetitions come first.

    Args:
        fn: the call to time.
        barrier_fn: brings every rank to the same point (``ctx.barrier``); none by default.
        preamble_fn: run before each repetition, outside the timing.
        n_warmup: untimed repetitions.
        n_repeat: timed repetitions.
        quantiles: return these quantiles (0 to 1) of the times instead of ``return_mode``.
        return_mode: ``"mean"``, ``"median"``, ``"min"``, ``"max"`` or ``"all"`` (the list).

    Returns:
        The summary in ms (a list for ``"all"`` or several quantiles).

    Example:
        >>> ms = iris.do_bench(lambda: ctx.ccl.all_reduce(out, inp), barrier_fn=ctx.barrier)
    """
    if return_mode not in _SUMMARIES:
        raise ValueError(f"iris: do_bench return_mode is one of {sorted(_SUMMARIES)}, not {return_mode!r}")
    if n_repeat < 1 or n_warmup < 0:
        raise ValueError(f"iris: do_bench needs n_repeat >= 1, n_warmup >= 0; not {n_repeat}, {n_warmup}")
    if quantiles is not None and not all(0 <= q <= 1 for q in quantiles):
        raise ValueError(f"iris: do_bench quantiles must lie in [0, 1], got {list(quantiles)}")
    backend = make_backend(config.BACKEND)
    device = backend.current_device()
    barrier_fn()
    preamble_fn()
    fn()
    barrier_fn()
    cache = torch.empty(CACHE_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    starts = [backend.timing_event() for _ in range(n_repeat)]
    ends = [backend.timing_event() for _ in range(n_repeat)]
    for repetition in range(n_warmup + n_repeat):
        barrier_fn()
        preamble_fn()
        cache.zero_()
        barrier_fn()
        timed = repetition - n_warmup
        if timed >= 0:
            starts[timed].record()
        fn()
        if timed >= 0:
            ends[timed].record()
    barrier_fn()
    backend.synchronize(device)
    times = [start.elapsed_time(end) for start, end in zip(starts, ends)]
    if quantiles is not None:
        picked = [_quantile(sorted(times), q) for q in quantiles]
        return picked[0] if len(picked) == 1 else picked
    return _SUMMARIES[return_mode](times)


def _quantile(ordered: list[float], q: float) -> float:
    point = q * (len(ordered) - 1)
    low = int(point)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (point - low)


def is_simulation_env() -> bool:
    """Whether ``IRIS_SIMULATION`` is ``1``, ``true`` or ``yes`` (upstream's pre-silicon switch).

    Read for upstream's programs, which may size their work by it; it changes nothing in
    this package (the emulation backend is chosen by ``IRIS_BACKEND``).

    Example:
        >>> iris.is_simulation_env()
        False
    """
    return os.environ.get("IRIS_SIMULATION", "").strip().lower() in ("1", "true", "yes")


def get_device_id_for_rank(local_rank: int) -> int:
    """The device index for a host's rank ``local_rank``, as upstream's helper gives it.

    ``local_rank`` itself, or, where ranks share devices (``IRIS_RANKS_PER_GPU`` above 1,
    or upstream's ``IRIS_SIMULATION``), ``local_rank`` modulo the devices visible (0 where
    none is), the device this package's contexts pick for that rank.

    Example:
        >>> torch.cuda.set_device(iris.get_device_id_for_rank(int(os.environ["LOCAL_RANK"])))
    """
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"iris: local_rank must be a non-negative int, got {local_rank!r}")
    if not (is_simulation_env() or _env.ranks_per_gpu() > 1):
        return local_rank
    count = make_backend(config.BACKEND).device_count()
    return local_rank % count if count else 0
