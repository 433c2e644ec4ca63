"""The picture of one timeline: each rank's host threads, CUDA streams and SMs, from launch to the last op.

:func:`profile_timeline` draws a trace that carries PyTorch profiler events
(``ctx.tracing.torch_profiler()``): per rank, a row per host thread and CUDA stream
that has a slice in the window, then a row per SM with Iris events, all on rank 0's
clock. Slices are bars, named where they are wide enough; a grey arrow goes from each
launch (``cudaLaunchKernel``) to its kernel and a black one from each Iris signal to
the wait it released. The window is where the Iris events are, widened to the
launches of the kernels they ran in, unless given.
"""

from __future__ import annotations

import numpy as np

from . import files
from .events import event_name, lane_name
from .matching import COMM, COMPUTE, WAIT, categories
from .plot import COLOURS, _time_unit

#: Colour of the profiler's slices: host (grey-blue) and GPU (green).
HOST_COLOUR, DEVICE_COLOUR = (0.55, 0.62, 0.72), (0.30, 0.62, 0.38)
#: Rows named after profiler bookkeeping, not the program.
_SKIPPED_TRACKS = ("host · thread PyTorch Profiler",)


def profile_timeline(
    trace, path: str, window: tuple[int, int] | None = None, title: str | None = None
) -> str:
    """Write the PNG described in the module docstring; returns ``path`` (needs matplotlib).

    Example:
        >>> profile_timeline(ctx.tracing.export("traces/"), "traces/profile.png")
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    profiles = {r: found for r in range(trace.world_size) if (found := trace.torch_events(r)) is not None}
    if not profiles:
        raise ValueError("the trace holds no PyTorch profile (take one with ctx.tracing.torch_profiler())")
    lo, hi = window or _window(trace, profiles)
    scale, unit = _time_unit(hi - lo)
    rows = []  # (label, bars: [(start, end, colour, name)])
    kinds = categories(trace.events["event_id"])
    colour_of = {COMPUTE: COLOURS[0], COMM: COLOURS[1], WAIT: COLOURS[2]}
    where = {}  # (rank, row kind, key) -> row index, for arrows
    for rank in range(trace.world_size):
        if rank in profiles:
            profile, start, end = profiles[rank]
            for track, name in enumerate(profile.tracks):
                pick = np.flatnonzero((profile.events["track"] == track) & (end >= lo) & (start <= hi))
                if not len(pick) or name in _SKIPPED_TRACKS:
                    continue
                colour = DEVICE_COLOUR if profile.events["device_side"][pick[0]] else HOST_COLOUR
                bars = [(start[i], end[i], colour, profile.names[profile.events["name"][i]]) for i in pick]
                for i in pick:
                    where[(rank, "torch", int(i))] = len(rows)
                rows.append((f"rank {rank} · {name}", bars))
        mine = np.flatnonzero((trace.events["cur_rank"] == rank) & (trace.events["end_ns"] >= lo))
        mine = mine[trace.events["start_ns"][mine] <= hi]
        for cu in np.unique(trace.events["cu_id"][mine]).tolist():
            pick = mine[trace.events["cu_id"][mine] == cu]
            bars = [
                (
                    trace.events["start_ns"][i],
                    trace.events["end_ns"][i],
                    colour_of.get(kinds[i], COLOURS[1]),
                    event_name(int(trace.events["event_id"][i]), trace.scope_names),
                )
                for i in pick
            ]
            for i in pick:
                where[(rank, "iris", int(i))] = len(rows)
            rows.append((f"rank {rank} · {lane_name(cu)}", bars))

    figure = Figure(figsize=(14, 1.2 + 0.42 * len(rows)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for y, (_, bars) in enumerate(rows):
        for begin, finish, colour, name in bars:
            left, width = (begin - lo) / scale, max((finish - begin) / scale, (hi - lo) / scale / 1500)
            axes.broken_barh(
                [(left, width)], (y - 0.38, 0.76), facecolors=[colour], edgecolor="white", lw=0.3
            )
            if width > (hi - lo) / scale / 14:
                axes.text(left + width / 2, y, name[:40], ha="center", va="center", fontsize=7, clip_on=True)
    for rank, (profile, start, end) in profiles.items():
        for launch, activity in zip(*(x.tolist() for x in profile.launches())):
            a, b = where.get((rank, "torch", launch)), where.get((rank, "torch", activity))
            if a is not None and b is not None:
                _arrow(axes, (end[launch] - lo) / scale, a, (start[activity] - lo) / scale, b, "0.45")
    releasers = trace.releasers
    for wait in np.flatnonzero(releasers >= 0).tolist():
        source = int(releasers[wait])
        a = where.get((int(trace.events["cur_rank"][source]), "iris", source))
        b = where.get((int(trace.events["cur_rank"][wait]), "iris", wait))
        if a is not None and b is not None:
            _arrow(
                axes, (trace.events["start_ns"][source] - lo) / scale, a,
                (trace.events["end_ns"][wait] - lo) / scale, b, "black",
            )  # fmt: skip
    legend = [
        Patch(color=HOST_COLOUR, label="host (profiler)"),
        Patch(color=DEVICE_COLOUR, label="GPU kernel or copy (profiler)"),
        Patch(color=COLOURS[0], label="Iris compute scope"),
        Patch(color=COLOURS[1], label="Iris RMA op"),
        Patch(color=COLOURS[2], label="Iris wait"),
    ]
    axes.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.3 / max(len(rows), 1) - 0.12),
                ncol=5, fontsize=8, frameon=False)  # fmt: skip
    axes.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=8)
    axes.set_ylim(len(rows) - 0.5, -0.5)
    axes.set_xlim(0, (hi - lo) / scale)
    axes.set_xlabel(f"time ({unit}) on rank 0's clock")
    axes.grid(axis="x", alpha=0.3)
    heading = (
        "PyTorch profiler and Iris on one clock: grey arrow launch -> kernel, black arrow signal -> wait"
    )
    axes.set_title(f"{title}\n{heading}" if title else heading, fontsize=10)
    with files.replace_atomically(path) as handle:
        figure.savefig(handle, format="png", dpi=110)
    return path


def _window(trace, profiles) -> tuple[int, int]:
    # The Iris events' span, widened to the launches of the kernels that hold them.
    events = trace.events
    if not len(events):
        starts = [int(s.min()) for _, s, _ in profiles.values() if len(s)]
        ends = [int(e.max()) for _, _, e in profiles.values() if len(e)]
        return min(starts, default=0), max(ends, default=1)
    lo, hi = int(events["start_ns"].min()), int(events["end_ns"].max())
    for profile, start, end in profiles.values():
        launch, activity = profile.launches()
        holds = (start[activity] <= hi) & (end[activity] >= lo)
        if holds.any():
            lo = min(lo, int(start[launch[holds]].min()))
            hi = max(hi, int(end[activity[holds]].max()))
    margin = max((hi - lo) // 20, 1)
    return lo - margin, hi + margin


def _arrow(axes, x0, y0, x1, y1, colour) -> None:
    axes.annotate(
        "", xy=(x1, y1), xytext=(x0, y0), arrowprops={"arrowstyle": "->", "color": colour, "lw": 0.9}
    )
