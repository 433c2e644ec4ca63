"""``ctx.tracing.torch_profiler()``: PyTorch's profiler, its events put on the trace's clock.

The mechanism is in :mod:`iris_trace.torch_profile`: at the profile's start and end
a few one-thread marker kernels store the device clock, each launched inside a
``record_function`` range and waited for, so the profile holds them as kernels (or
ranges) whose times bound the offset between the profiler's clock and the device's.
When the profile ends, its Chrome trace is read into a compact table that the rank
file keeps beside the Iris events.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import torch

from iris_trace.torch_profile import MARKER_RANGE, MARKERS_PER_END, TorchProfile

from ...device.clock_sync import iris_clock_marker

#: Profiler options that hand the trace to a callback instead of keeping it: the markers
#: and the trace would then be in different places.
_REFUSED = ("schedule", "on_trace_ready")


@contextlib.contextmanager
def profile(tracing, **profiler_options):
    """Run ``torch.profiler.profile(**profiler_options)``; its events join ``tracing``'s next export.

    Yields the profiler (``prof.key_averages()`` and the rest work as usual). Not
    collective: each rank profiles what it runs. See :meth:`iris.host.tracing.core.Tracing.torch_profiler`.
    """
    tracing._require_buffers()
    if tracing._torch_profile is not None and not tracing._torch_profile_collected:
        raise RuntimeError(
            "iris: this rank's previous ctx.tracing.torch_profiler() profile has not been collected: "
            "call ctx.tracing.collect() or export() first (or reset() to drop it), so nothing is lost"
        )
    refused = [name for name in _REFUSED if profiler_options.get(name) is not None]
    if refused:
        raise ValueError(
            f"ctx.tracing.torch_profiler() takes no {' or '.join(refused)}: it keeps the whole profile "
            "for the trace; profile the steps you want inside it"
        )
    ctx = tracing._ctx
    device = ctx.get_device()
    stamps = torch.zeros(2 * MARKERS_PER_END, dtype=torch.int64, device=device)
    profiler = torch.profiler.profile(**profiler_options)
    with profiler:
        _mark(ctx, stamps, 0)
        yield profiler
        _mark(ctx, stamps, MARKERS_PER_END)
    tracing._torch_profile = TorchProfile.from_kineto(_chrome_trace(profiler), stamps.cpu().numpy())
    tracing._torch_profile_collected = False


def _mark(ctx, stamps: torch.Tensor, first: int) -> None:
    # Each marker waits for the previous: one kernel at a time, so each slice is its own.
    for index in range(first, first + MARKERS_PER_END):
        with torch.profiler.record_function(MARKER_RANGE):
            iris_clock_marker[(1,)](stamps, index, num_warps=1)
            ctx.backend.synchronize(ctx.get_device())


def _chrome_trace(profiler) -> dict:
    # The profiler writes its Chrome trace only to a file: a private temporary one.
    handle, path = tempfile.mkstemp(prefix="iris-torch-profile-", suffix=".json")
    os.close(handle)
    try:
        profiler.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    finally:
        os.unlink(path)
