"""The picture that answers: what every SM of every rank did over time, and where it stalled.

:func:`state_fractions` cuts the trace window into bins and gives, for every
``(rank, SM)`` with events, the fraction of each bin the SM spent in each *state*,
one state at a time by priority:

* computing: inside a compute scope (``trace_begin``/``trace_end``: a GEMM tile);
* communicating: inside an RMA op and no compute scope;
* waiting: inside a wait (``wait_until``, the device barrier's, a collective's) and
  neither of the above: the stall of :mod:`iris_trace.analysis`;
* idle: no event at all.

:func:`timeline` draws them as one row per SM (or per group of consecutive SMs of a
rank when there are more rows than fit, said in the axis label), ranks separated and
labelled, each state its own colour mixed by its fraction, time in µs or ms with the
bin width stated, and the longest stalls outlined and numbered with what released them.
Below it, the whole run per rank: the overlap ratio (Holistic Trace Analysis's, per bin)
and the bytes moved (GB/s, by the bin each data op ends in), each left out with a note
where it would be flat or, for GB/s under emulation, not a GPU's. :func:`binned_fractions`
is the older two-matrix view (stalled and overlapped fraction per SM).
"""

from __future__ import annotations

import os
import textwrap

import numpy as np

from . import files
from .analysis import analyze
from .attribution import step_held_up
from .events import EVENT_DTYPE
from .intervals import Coverage
from .matching import COMM, COMPUTE, WAIT, categories, sm_index
from .schema import DMA_CU_BASE

STATES = ("computing", "communicating", "waiting", "idle")
#: RGB of each state (idle is near white, so busy SMs stand out).
COLOURS = np.array(
    [
        [0.23, 0.46, 0.69],  # computing: blue
        [0.94, 0.53, 0.21],  # communicating: orange
        [0.80, 0.15, 0.15],  # waiting: red
        [0.96, 0.96, 0.96],  # idle: light grey
    ]
)
#: Most rows :func:`timeline` draws; SMs of a rank are grouped to stay under it.
MAX_ROWS = 128
#: Stalls numbered on the picture.
MARKED_STALLS = 5


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


def _prepare(events: np.ndarray, bins: int):
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    events = np.asarray(events)
    if events.dtype != EVENT_DTYPE:
        raise TypeError(f"events have dtype {events.dtype}, expected iris_trace.events.EVENT_DTYPE")
    starts = events["start_ns"].astype(np.int64)
    ends = np.maximum(events["end_ns"].astype(np.int64), starts)
    edges = (
        np.linspace(float(starts.min()), float(ends.max()), bins + 1) if len(events) else np.zeros(bins + 1)
    )
    return events, starts, ends, edges


def _fractions(cover: Coverage, pieces_per_state, n_rows: int, edges: np.ndarray) -> list[np.ndarray]:
    widths = np.diff(edges)
    out = []
    for pieces in pieces_per_state:
        lengths = _bin_lengths(
            cover.key[pieces],
            cover.start[pieces].astype(np.float64),
            cover.end[pieces].astype(np.float64),
            n_rows,
            edges,
        )
        out.append(np.divide(lengths, widths, out=np.zeros_like(lengths), where=widths > 0))
    return out


def state_fractions(events: np.ndarray, bins: int = 200):
    """Fraction of each time bin every SM spent in each of :data:`STATES` (module docstring).

    Returns ``(rows, edges, fractions)``: ``rows`` an int64 ``(n, 2)`` array of
    ``(cur_rank, cu_id)`` (sorted; SMs with events; copy-engine lanes left out), ``edges``
    the ``bins + 1`` bin edges splitting the window evenly, and ``fractions`` float64
    ``(n, bins, 4)`` in ``[0, 1]``, summing to 1 in every bin of positive width.

    Example:
        >>> rows, edges, fractions = state_fractions(trace.events, bins=100)
        >>> fractions[..., STATES.index("waiting")].sum(axis=1).argmax()   # the SM that stalled most
    """
    events, starts, ends, edges = _prepare(events, bins)
    on_sm = events["cu_id"].astype(np.int64) < DMA_CU_BASE
    events, starts, ends = events[on_sm], starts[on_sm], ends[on_sm]
    if len(events) == 0:
        return np.zeros((0, 2), dtype=np.int64), edges, np.zeros((0, bins, len(STATES)))
    rows, keys = sm_index(events)
    category = categories(events["event_id"])
    cover = Coverage(keys, starts, ends, category[:, None] == np.array([COMPUTE, COMM, WAIT]), len(rows))
    computing = cover.covered[:, COMPUTE]
    communicating = cover.covered[:, COMM] & ~computing
    waiting = cover.covered[:, WAIT] & ~computing & ~communicating
    busy = _fractions(cover, (computing, communicating, waiting), len(rows), edges)
    idle = np.clip(1.0 - busy[0] - busy[1] - busy[2], 0.0, 1.0)
    fractions = np.stack([*busy, idle], axis=-1)
    fractions[:, np.diff(edges) <= 0, :] = 0.0
    return rows, edges, fractions


def binned_fractions(events: np.ndarray, bins: int = 200):
    """Stalled and overlapping fraction of each time bin, per SM.

    Returns ``(rows, edges, stall, overlap)``: ``rows`` an int64 ``(n, 2)`` array of
    ``(cur_rank, cu_id)`` (sorted; SMs with at least one event), ``edges`` the ``bins + 1``
    float64 bin edges splitting the window ``[min start_ns, max end_ns]`` evenly, and
    ``stall`` / ``overlap`` float64 ``(n, bins)`` fractions in ``[0, 1]``: waiting with no
    compute on the SM, and computing while communication is in flight on it.

    Example:
        >>> rows, edges, stall, overlap = binned_fractions(trace.events, bins=100)
        >>> rank, sm = rows[stall.sum(axis=1).argmax()]     # the SM that stalled most
    """
    events, starts, ends, edges = _prepare(events, bins)
    if len(events) == 0:
        empty = np.zeros((0, bins))
        return np.zeros((0, 2), dtype=np.int64), edges, empty, empty.copy()
    rows, keys = sm_index(events)
    category = categories(events["event_id"])
    cover = Coverage(keys, starts, ends, category[:, None] == np.array([COMPUTE, COMM, WAIT]), len(rows))
    stalled = cover.covered[:, WAIT] & ~cover.covered[:, COMPUTE]
    overlapping = cover.covered[:, COMPUTE] & cover.covered[:, COMM]
    stall, overlap = _fractions(cover, (stalled, overlapping), len(rows), edges)
    return rows, edges, stall, overlap


def rank_overview(events: np.ndarray, world_size: int, bins: int = 200):
    """Per rank and bin: the overlap ratio and the bytes moved.

    Returns ``(edges, ratio, moved)``: ``ratio`` float64 ``(world_size, bins)``, Holistic
    Trace Analysis's ``|C ∩ (M ∪ W)| / |M ∪ W|`` over the rank's SMs in each bin (NaN where
    the rank neither communicates nor waits), and ``moved`` the payload bytes of the
    rank's data ops that end in each bin.

    Example:
        >>> edges, ratio, moved = rank_overview(trace.events, trace.world_size)
        >>> moved[0].sum()   # bytes rank 0 moved
    """
    events, starts, ends, edges = _prepare(events, bins)
    ratio = np.full((world_size, bins), np.nan)
    moved = np.zeros((world_size, bins))
    if len(events) == 0:
        return edges, ratio, moved
    ranks = events["cur_rank"].astype(np.int64)
    category = categories(events["event_id"])
    cover = Coverage(ranks, starts, ends, category[:, None] == np.array([COMPUTE, COMM, WAIT]), world_size)
    comm_or_wait = cover.covered[:, COMM] | cover.covered[:, WAIT]
    during = comm_or_wait & cover.covered[:, COMPUTE]
    numerator, denominator = _fractions(cover, (during, comm_or_wait), world_size, edges)
    np.divide(numerator, denominator, out=ratio, where=denominator > 0)
    data = category == COMM
    bin_of = np.clip(np.searchsorted(edges, ends[data], side="right") - 1, 0, bins - 1)
    np.add.at(moved, (ranks[data], bin_of), events["payload_bytes"][data].astype(np.float64))
    return edges, ratio, moved


def _group_rows(rows: np.ndarray, fractions: np.ndarray, max_rows: int):
    """Average consecutive SMs of each rank into groups so that at most ``max_rows`` remain.

    Returns ``(labels, rank_of_row, fractions, group)`` where ``group`` is the SMs per row.
    """
    ranks = np.unique(rows[:, 0]) if len(rows) else np.zeros(0, dtype=np.int64)
    per_rank = max(1, max_rows // max(len(ranks), 1))
    largest = max((int((rows[:, 0] == r).sum()) for r in ranks), default=1)
    group = max(1, -(-largest // per_rank))
    labels, owner, grouped = [], [], []
    for rank in ranks:
        mine = np.flatnonzero(rows[:, 0] == rank)
        for lo in range(0, len(mine), group):
            chunk = mine[lo : lo + group]
            first, last = int(rows[chunk[0], 1]), int(rows[chunk[-1], 1])
            labels.append(f"r{rank} sm{first}" if group == 1 else f"r{rank} sm{first}-{last}")
            owner.append(int(rank))
            grouped.append(fractions[chunk].mean(axis=0))
    shape = (0,) + fractions.shape[1:]
    return labels, np.array(owner), np.stack(grouped) if grouped else np.zeros(shape), group


def _time_unit(span_ns: float) -> tuple[float, str]:
    return (1e6, "ms") if span_ns >= 5e6 else (1e3, "µs")


def timeline(
    events: np.ndarray,
    path: str,
    world_size: int | None = None,
    bins: int = 300,
    title: str | None = None,
    scope_names: dict[int, str] | None = None,
    notes: list[str] | None = None,
    max_rows: int = MAX_ROWS,
    report=None,
    emulated: bool = False,
) -> str:
    """Write the PNG described in the module docstring; returns ``path`` (needs matplotlib).

    ``report``: the :class:`~iris_trace.analysis.Report` of these events when the caller
    has one (its longest stalls are the ones marked); without it they are analysed here.
    ``emulated``: the times are the interpreter's (the emulation backend), so the GB/s
    panel, which would show the host's copy rate, is left out. A panel whose values do
    not change over the run (the overlap ratio of a run that never overlaps) is left
    out too; the heading says which and why.

    Example:
        >>> timeline(trace.events, "stalls.png", trace.world_size, title="gemm + all-scatter")
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as exc:
        raise ImportError("the timeline needs matplotlib: pip install matplotlib") from exc

    events = np.asarray(events)
    if world_size is None:
        world_size = int(events["cur_rank"].max()) + 1 if len(events) else 1
    rows, edges, fractions = state_fractions(events, bins)
    labels, owner, grouped, group = _group_rows(rows, fractions, max_rows)
    origin = edges[0]
    scale, unit = _time_unit(edges[-1] - origin)
    span = (edges[-1] - origin) / scale or 1.0
    bin_width = (edges[1] - edges[0]) / scale if len(edges) > 1 else 0.0
    overview_edges, ratio, moved = rank_overview(events, world_size, bins)
    panels, left_out = _overview_panels(ratio, moved, emulated)

    n_rows = max(len(labels), 1)
    heights = [max(3.0, 0.09 * n_rows)] + [1.0] * len(panels) + [0.8]
    figure = Figure(figsize=(14, 3.5 + sum(heights[1:]) + min(0.09 * n_rows, 12.0)), layout="constrained")
    FigureCanvasAgg(figure)  # a bare Agg figure leaves pyplot's global state alone
    axes = figure.subplots(len(heights), 1, height_ratios=heights, squeeze=False)[:, 0]
    for panel in axes[1:-1]:
        panel.sharex(axes[0])

    image = grouped @ COLOURS if len(labels) else np.ones((1, bins, 3))
    axes[0].imshow(
        np.clip(image, 0, 1),
        aspect="auto",
        interpolation="nearest",
        extent=(0.0, span, n_rows - 0.5, -0.5),
    )
    step = max(1, n_rows // 48)
    axes[0].set_yticks(range(0, n_rows, step))
    axes[0].set_yticklabels(labels[::step], fontsize=7)
    for boundary in np.flatnonzero(np.diff(owner)) if len(owner) else []:
        axes[0].axhline(boundary + 0.5, color="black", linewidth=1.2)
    grouping = f", SMs in groups of {group}" if group > 1 else ""
    axes[0].set_ylabel(f"rank / SM{grouping}")
    # Above the picture, never on it; each cell mixes its states' colours by their share of
    # the bin, so two mixtures stand for the pale and blended shades.
    handles = [Patch(color=COLOURS[i], label=name) for i, name in enumerate(STATES)]
    handles += [
        Patch(color=(COLOURS[0] + COLOURS[3]) / 2, label="half computing, half idle"),
        Patch(color=(COLOURS[1] + COLOURS[2]) / 2, label="half communicating, half waiting"),
    ]
    axes[0].legend(
        handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), fontsize=8, ncols=6, frameon=False,
        title="each cell: the states of its SM in its bin, colours mixed by time", title_fontsize=8,
    )  # fmt: skip

    if report is None and len(events):
        report = analyze(events, world_size, scope_names, top=MARKED_STALLS)
    captions, marked = [], {}
    for number, stall in enumerate(report.top_stalls[:MARKED_STALLS] if report else [], start=1):
        grouped_row = _grouped_row(labels, stall["rank"], stall["cu_id"], rows, group)
        if grouped_row is None:
            continue
        start = (stall["start_ns"] + report.window_start_ns - origin) / scale
        width = stall["duration_ns"] / scale
        # An outline around the stall: the stall stays visible inside it.
        axes[0].add_patch(
            Rectangle((start, grouped_row - 0.5), width, 1.0, fill=False, edgecolor="black", linewidth=1.0)
        )
        # The number in the margin right of its row (stalls of one row side by side, in
        # order), so that no number covers a cell.
        on_row = marked.setdefault(grouped_row, 0)
        marked[grouped_row] += 1
        axes[0].annotate(
            str(number),
            (1.0, grouped_row),
            xycoords=("axes fraction", "data"),
            xytext=(8 + 16 * on_row, 0),
            textcoords="offset points",
            fontsize=8,
            fontweight="bold",
            ha="left",
            va="center",
            bbox={"boxstyle": "circle,pad=0.2", "facecolor": "white", "edgecolor": "black"},
            annotation_clip=False,
        )
        released = (
            f"released by rank {stall['releaser_rank']} SM {stall['releaser_cu_id']} {stall['releaser_op']}"
            if stall["releaser_rank"] is not None
            else "released by nothing traced"
        )
        if stall["producer"] and step_held_up(stall):
            released += f" after {stall['producer']}"  # named only where it held the wait up
        at = f" at {stall['site']}" if stall.get("site") else ""  # its call site, where known
        captions.append(
            f"{number}: rank {stall['rank']} SM {stall['cu_id']} {stall['op']}{at} "
            f"{stall['duration_ns'] / scale:.3g} {unit}, {released}"
        )

    centres = ((overview_edges[:-1] + overview_edges[1:]) / 2 - origin) / scale
    width_s = np.diff(overview_edges) / 1e9
    rates = np.divide(moved, width_s, out=np.zeros_like(moved), where=width_s > 0) / 1e9
    for panel, name in zip(axes[1:-1], panels):
        for rank in range(world_size):
            values = ratio[rank] if name == "overlap ratio" else rates[rank]
            panel.plot(centres, values, linewidth=1, label=f"rank {rank}")
        panel.set_ylabel(name)
        if name == "overlap ratio":
            panel.set_ylim(-0.05, 1.05)
        if world_size <= 8:
            panel.legend(fontsize=7, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=8, frameon=False)
    axes[-2].set_xlabel(f"time since the window start ({unit}); bins of {bin_width:.3g} {unit}")
    axes[0].set_xlim(0.0, span)

    heading = [title] if title else []
    heading.append(f"{world_size} rank(s), {len(rows)} SM(s) with events, window {span:.4g} {unit}")
    heading += [textwrap.fill(f"NOTE: {note}", 170) for note in [*(notes or []), *left_out]]
    figure.suptitle("\n".join(heading), fontsize=9, horizontalalignment="left", x=0.01)
    axes[-1].axis("off")
    heading_line = "longest stalls (outlined above, numbered right of their row):"
    lines = [heading_line, *captions] if captions else ["no waits"]
    axes[-1].text(0.0, 1.0, "\n".join(textwrap.shorten(c, 200) for c in lines), fontsize=8, va="top")
    with files.replacing(path) as partial:
        figure.savefig(partial, dpi=100, format=_image_format(path))
    return path


def _overview_panels(ratio: np.ndarray, moved: np.ndarray, emulated: bool) -> tuple[list[str], list[str]]:
    """The per-rank panels worth drawing under the picture, and a note for each left out."""
    panels, left_out = [], []
    defined = ratio[np.isfinite(ratio)]
    if len(defined) and defined.max() - defined.min() > 1e-6:
        panels.append("overlap ratio")
    elif len(defined):
        left_out.append(f"overlap ratio not drawn: it is {defined[0]:.2g} throughout the run")
    else:
        left_out.append("overlap ratio not drawn: no rank communicated or waited")
    if emulated:
        left_out.append("GB/s not drawn: the times are the interpreter's (emulation), not a GPU's")
    elif moved.any():
        panels.append("GB/s moved")
    else:
        left_out.append("GB/s not drawn: no data op moved bytes")
    return panels, left_out


def _image_format(path: str) -> str:
    """The picture's format from its name (``timeline.svg`` -> ``svg``), PNG where the name says none."""
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    return suffix or "png"


def _grouped_row(labels, rank: int, sm: int, rows: np.ndarray, group: int):
    """Row of ``labels`` that shows ``(rank, sm)``, or None."""
    mine = np.flatnonzero(rows[:, 0] == rank)
    where = np.flatnonzero(rows[mine, 1] == sm)
    if len(where) == 0:
        return None
    before = sum(-(-int((rows[:, 0] == r).sum()) // group) for r in np.unique(rows[:, 0]) if r < rank)
    return before + int(where[0]) // group


def stall_heatmap(events: np.ndarray, path: str, bins: int = 200, title: str | None = None) -> str:
    """The state :func:`timeline` (kept under its old name). Returns ``path``.

    Example:
        >>> stall_heatmap(trace.events, "analysis/stalls.png", bins=300, title="gemm + all-scatter")
    """
    return timeline(events, path, bins=bins, title=title)
