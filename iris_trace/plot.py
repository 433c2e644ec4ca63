"""Stall and overlap over time, one row per SM.

:func:`binned_fractions` computes, for every ``(cur_rank, cu_id)`` with events and every
time bin of the trace window, the fraction of the bin the SM spent

* stalled: inside a wait and outside every compute scope (``W minus C`` of
  :mod:`iris_trace.analysis`), and
* overlapping: inside a compute scope while communication is in flight (``C ∩ M``).

:func:`stall_heatmap` draws both matrices (needs matplotlib).
"""

from __future__ import annotations

import numpy as np

from .analysis import COMM, COMPUTE, WAIT, _Coverage, categories, sm_index
from .events import EVENT_DTYPE


def _bin_lengths(keys, starts, ends, n_rows: int, edges: np.ndarray) -> np.ndarray:
    """Length of the pieces ``[starts, ends)`` of row ``keys`` falling in each bin, ``(n_rows, bins)``.

    A piece spanning several bins is cut at the bin edges; since one row's pieces are disjoint,
    the cuts number at most ``n_rows * bins`` beyond the pieces themselves.
    """
    bins = len(edges) - 1
    total = np.zeros((n_rows, bins), dtype=np.float64)
    if len(starts) == 0:
        return total
    first = np.clip(np.searchsorted(edges, starts, side="right") - 1, 0, bins - 1)
    last = np.clip(np.searchsorted(edges, ends, side="left") - 1, first, bins - 1)
    count = last - first + 1
    piece = np.repeat(np.arange(len(starts)), count)
    bin_index = first[piece] + np.arange(len(piece)) - np.repeat(np.cumsum(count) - count, count)
    low = np.maximum(starts[piece], edges[bin_index])
    high = np.minimum(ends[piece], edges[bin_index + 1])
    np.add.at(total, (keys[piece], bin_index), np.maximum(high - low, 0.0))
    return total


def binned_fractions(events: np.ndarray, bins: int = 200):
    """Stalled and overlapping fraction of each time bin, per SM.

    Returns ``(rows, edges, stall, overlap)``: ``rows`` an int64 ``(n, 2)`` array of
    ``(cur_rank, cu_id)`` (sorted; SMs with at least one event), ``edges`` the ``bins + 1``
    float64 bin edges splitting the window ``[min start_ns, max end_ns]`` evenly, and
    ``stall`` / ``overlap`` float64 ``(n, bins)`` fractions in ``[0, 1]`` (0 for a window of
    zero length).

    Example:
        >>> rows, edges, stall, overlap = binned_fractions(trace.events, bins=100)
        >>> rank, sm = rows[stall.sum(axis=1).argmax()]     # the SM that stalled most
    """
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    events = np.asarray(events)
    if events.dtype != EVENT_DTYPE:
        raise TypeError(f"events have dtype {events.dtype}, expected iris_trace.events.EVENT_DTYPE")
    starts = events["start_ns"].astype(np.int64)
    ends = np.maximum(events["end_ns"].astype(np.int64), starts)
    if len(events) == 0:
        empty = np.zeros((0, bins))
        return np.zeros((0, 2), dtype=np.int64), np.zeros(bins + 1), empty, empty.copy()
    edges = np.linspace(float(starts.min()), float(ends.max()), bins + 1)

    rows, keys = sm_index(events)
    category = categories(events["event_id"])
    member = category[:, None] == np.array([COMPUTE, COMM, WAIT])
    cover = _Coverage(keys, starts, ends, member, len(rows))
    stalled = cover.covered[:, WAIT] & ~cover.covered[:, COMPUTE]
    overlapping = cover.covered[:, COMPUTE] & cover.covered[:, COMM]

    widths = np.diff(edges)
    fractions = []
    for pieces in (stalled, overlapping):
        lengths = _bin_lengths(
            cover.key[pieces],
            cover.start[pieces].astype(np.float64),
            cover.end[pieces].astype(np.float64),
            len(rows),
            edges,
        )
        fractions.append(np.divide(lengths, widths, out=np.zeros_like(lengths), where=widths > 0))
    return rows, edges, fractions[0], fractions[1]


def stall_heatmap(events: np.ndarray, path: str, bins: int = 200, title: str | None = None) -> str:
    """Write a PNG of :func:`binned_fractions`: stalled fraction on top, overlapped compute below.

    One row per ``(rank, SM)`` with events; x is time since the window start in microseconds.
    Returns ``path``.

    Example:
        >>> stall_heatmap(trace.events, "analysis/stalls.png", bins=300, title="gemm + all-scatter")
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("stall_heatmap needs matplotlib: pip install matplotlib") from exc

    rows, edges, stall, overlap = binned_fractions(events, bins)
    n_rows = max(len(rows), 1)
    span_us = (edges[-1] - edges[0]) / 1000.0 if len(rows) else 0.0
    extent = (0.0, span_us if span_us > 0 else 1.0, n_rows - 0.5, -0.5)
    height = min(2.0 + 0.3 * n_rows, 24.0)
    # A bare Agg figure leaves pyplot's global backend and figure list alone.
    figure = Figure(figsize=(12, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 1, sharex=True)
    panels = (
        (stall, "stalled: waiting, no compute on the SM", "Reds"),
        (overlap, "compute overlapped with communication", "Greens"),
    )
    # At most ~40 labelled rows keeps the labels legible on large GPUs.
    ticks = np.unique(np.linspace(0, n_rows - 1, min(n_rows, 40)).round().astype(int))
    labels = [f"r{rows[i, 0]} sm{rows[i, 1]}" for i in ticks] if len(rows) else []
    for axis, (matrix, name, colours) in zip(axes, panels):
        shown = matrix if len(rows) else np.zeros((1, bins))
        image = axis.imshow(
            shown, aspect="auto", interpolation="nearest", cmap=colours, vmin=0.0, vmax=1.0, extent=extent
        )
        axis.set_title(name)
        axis.set_ylabel("rank / SM")
        axis.set_yticks(ticks if len(rows) else [])
        axis.set_yticklabels(labels, fontsize=7)
        figure.colorbar(image, ax=axis, label="fraction of bin")
    axes[-1].set_xlabel("time since window start (us)")
    if title:
        figure.suptitle(title)
    figure.savefig(path, dpi=100)
    return path
