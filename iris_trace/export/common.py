"""What every export shows: the event fields as arguments, the run's facts, the bytes-moved counter.

Shared by the Perfetto and the Chrome JSON writers, so both files carry the same
arguments under the same names, the same metadata, and the same counter samples.
"""

from __future__ import annotations

import numpy as np

from ..attribution import PARTS
from ..events import RELEASE_EVENTS
from ..trace import Trace

#: Debug-annotation name ids (interned) and the event field each one shows.
ARGS = {
    1: "target_rank",
    2: "payload_bytes",
    3: "address",
    4: "pid",
    5: "pid_m",
    6: "pid_n",
    7: "op_index",
    8: "value",
    9: "cu_id",
    10: "path",  # 0: through a mapped pointer (same node), 1: the cross-node path
}
#: Debug-annotation name ids of a released wait's split (``Trace.wait_causes``), after ARGS's:
#: why it waited, shown on the wait itself.
WAIT_ARGS = {11 + i: part for i, part in enumerate(p for p in PARTS if p != "unattributed_ns")}
#: Debug-annotation name ids of an event's origin, after WAIT_ARGS's: its call site (kernel
#: and source line) and its launch (kernel, index, grid), as labels (``Trace.origins``).
ORIGIN_ARGS = {max(WAIT_ARGS) + 1: "call_site", max(WAIT_ARGS) + 2: "launch"}
#: Bins of the bytes-moved counter over the whole trace.
COUNTER_BINS = 1000
#: Events read at a time by the counter pass (about 4 MiB of records): its work per slice is
#: per rank and bin, so more events at a time than the slice writers' passes.
COUNTER_SLICE_EVENTS = 1 << 16


def profiles_and_base(trace: Trace) -> tuple[list, int]:
    """Each profiled rank's ``(rank, Trace.torch_events(rank))``, and the time the export counts from.

    The base is the earliest start of an Iris event or a profiler slice, so no timestamp
    of either goes below zero.

    Example:
        >>> profiles, base = profiles_and_base(trace)
    """
    events = trace.events
    profiles = [(r, found) for r in range(trace.world_size) if (found := trace.torch_events(r)) is not None]
    starts = [int(events["start_ns"].min())] if len(events) else []
    starts += [int(start.min()) for _, (_, start, _) in profiles if len(start)]
    return profiles, min(starts, default=0)


def trace_metadata(trace: Trace, base: int) -> dict:
    """What every export records about the run, as one JSON-able dict.

    ``base`` is the time origin the file's timestamps count from.

    Example:
        >>> trace_metadata(trace, base=int(trace.events["start_ns"].min()))["clock_residual_ns"]
        [0.0, 412.5]
    """
    return {
        "world_size": trace.world_size,
        "events": int(len(trace.events)),
        "dropped_events_per_rank": trace.dropped,
        "devices": [r.device for r in trace.ranks],
        "clock_offsets_ns": [round(f.offset_ns, 1) for f in trace.clock_fits],
        "clock_drift_ppm": [round(f.drift * 1e6, 3) for f in trace.clock_fits],
        "clock_residual_ns": [round(f.residual_ns, 1) for f in trace.clock_fits],
        "clock_min_rtt_ns": [round(f.rtt_ns, 1) for f in trace.clock_fits],
        "time_base_ns": base,
        "command": trace.ranks[0].command,
    }


def counter_rows(trace: Trace, events: np.ndarray, base: int):
    """Per-rank GB/s of payload moved in COUNTER_BINS bins, one sample where the rate changes.

    Returns (times relative to ``base``, ranks, values).

    Example:
        >>> times, ranks, gbps = counter_rows(trace, trace.events, base)
    """
    if len(events) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    start, stop = int(events["start_ns"].min()), int(events["end_ns"].max()) + 1
    edges = np.linspace(start, stop, COUNTER_BINS + 1)
    width_s = (edges[1] - edges[0]) / 1e9
    moving_ids = sorted(RELEASE_EVENTS | {1, 3})
    totals = [0] * trace.world_size
    for lo in range(0, len(events), COUNTER_SLICE_EVENTS):
        part = events[lo : lo + COUNTER_SLICE_EVENTS]
        # The moving events' records in one pass (reading single fields by index is several
        # times slower), then grouped by rank with a stable sort, keeping their time order.
        moving = part.take(np.flatnonzero(np.isin(part["event_id"], moving_ids)))
        by_rank = np.argsort(moving["cur_rank"], kind="stable")
        ranks, starts, payload = (
            np.ascontiguousarray(moving[f])[by_rank] for f in ("cur_rank", "start_ns", "payload_bytes")
        )
        bounds = np.searchsorted(ranks, np.arange(trace.world_size + 1), side="left")
        for rank in range(trace.world_size):
            mine = slice(bounds[rank], bounds[rank + 1])
            totals[rank] = totals[rank] + _histogram(starts[mine], edges, payload[mine])
    times, tracks, values = [], [], []
    for rank in range(trace.world_size):
        rate = np.broadcast_to(totals[rank] / width_s / 1e9, (COUNTER_BINS,))
        # A counter holds its value until the next sample: keep only the bins where it changes.
        changes = np.flatnonzero(np.concatenate(([True], rate[1:] != rate[:-1])))
        times.append(edges[:-1].astype(np.int64)[changes] - base)
        tracks.append(np.full(len(changes), rank, dtype=np.int64))
        values.append(rate[changes])
    return np.concatenate(times), np.concatenate(tracks), np.concatenate(values)


def _histogram(values: np.ndarray, edges: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``np.histogram(values, edges, weights=weights)[0]``, without its sort when ``values`` are sorted.

    The same arithmetic as numpy's: differences of the cumulative weights at each edge, the
    last bin closed on the right.
    """
    if not np.all(values[1:] >= values[:-1]):
        return np.histogram(values, bins=edges, weights=weights)[0]
    cumulative = np.concatenate((np.zeros(1, weights.dtype), np.cumsum(weights)))
    at_edges = np.concatenate(
        (values.searchsorted(edges[:-1], "left"), values.searchsorted(edges[-1:], "right"))
    )
    return np.diff(cumulative[at_edges])


def wait_split(trace: Trace, waits: np.ndarray) -> dict[str, np.ndarray]:
    """The split (:data:`WAIT_ARGS`) of the waits at the sorted event indices ``waits``, which have releasers.

    Example:
        >>> split = wait_split(trace, np.flatnonzero(trace.releasers >= 0))
        >>> split["computing_ns"][0]   # ns of the first released wait spent on its producer computing
    """
    causes = trace.wait_causes
    at = np.searchsorted(causes["index"], waits)
    return {part: causes[part][at] for part in WAIT_ARGS.values()}
