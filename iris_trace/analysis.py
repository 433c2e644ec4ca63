"""Where the time went: compute, communication, waits and stalls per SM and per rank.

Every length is in nanoseconds on the merged trace's aligned clock.

Definitions
-----------
* Categories, by ``event_id``: *compute* is a user scope (``event_id >= SCOPE_BASE``);
  *wait* is an op in ``WAIT_EVENTS`` (``wait_until`` and the library's named waits:
  ``device_barrier_wait``, ``collective_wait``, ``fused_op_wait``); *communication* is
  every other op.
* An event covers the half-open interval ``[start_ns, end_ns)``. An ``end_ns`` before its
  ``start_ns`` (rounding during clock alignment) is taken as ``start_ns``: zero length.
* window: ``[min start_ns, max end_ns]`` over the whole trace. ``window_ns`` is its length,
  the wall time of every SM.
* Per SM, keyed ``(cur_rank, cu_id)``: C, M and W are the unions of that SM's compute,
  communication and wait intervals. Taking unions counts two CTAs resident on one SM at
  the same time once.

  - ``compute_ns = |C|``, ``comm_ns = |M|``, ``wait_ns = |W|``
  - ``overlap_ns = |C ∩ M|``: compute while communication is in flight
  - ``stall_ns = |W minus C|``: waiting while nothing on that SM computes
  - ``busy_ns = |C ∪ M ∪ W|``, ``idle_ns = window_ns - busy_ns``
  - ``compute_events``, ``comm_events``, ``wait_events``: number of events of each category
  - ``bytes_moved``: sum of ``payload_bytes`` over communication events

  Only SMs with at least one event get a row. Copy-engine puts (``dma_put``, on lanes
  ``cu_id >= DMA_CU_BASE``) run on no SM: they get no SM row and count as the rank's
  communication below.
* Per rank (every rank in ``range(world_size)``): the same quantities, with C, M and W the
  unions over all SMs of the rank (so not sums of the SM rows), plus Holistic Trace
  Analysis's overlap ratio ``|C ∩ (M ∪ W)| / |M ∪ W|`` (0 when ``M ∪ W`` is empty), whose
  numerator and denominator are reported as ``compute_during_comm_ns`` and ``comm_or_wait_ns``.
* Overall: each per-rank quantity summed over ranks; ``overlap_ratio`` is the sum of the
  numerators over the sum of the denominators (0 when that is 0).
* Releaser of a wait: :mod:`iris_trace.matching`; why it waited (producer computing,
  in flight, late look): :mod:`iris_trace.attribution`, whose per-rank roll-up in words
  opens the report (``summary``), with the tile lifecycles and the critical path.
* Top stalls: the ``top`` longest wait events (duration ``end_ns - start_ns``), equal
  durations earliest ``start_ns`` first, then input order, each with its releaser, the
  releaser's producer step and the split of its time.
* Times in reports: ``start_ns`` of stalls and path steps count from the window start
  (``window_start_ns``, on rank 0's clock); addresses are heap offsets, written ``0x...``
  in every output (table, CSV, JSON).

Example:
    >>> from iris_trace.analysis import analyze
    >>> report = analyze(trace.events, trace.world_size, trace.scope_names)
    >>> print(report.format_table())
    >>> report.to_csv("analysis/")
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field

import numpy as np

from . import files
from .attribution import (
    PARTS,
    attribute_waits,
    critical_path,
    first_events,
    lifecycle_summary,
    seen_latency,
    summarize_waits,
    tile_lifecycles,
    wait_groups,
)
from .events import EVENT_DTYPE
from .intervals import Coverage
from .matching import COMM, COMPUTE, WAIT, categories, match_releasers, sm_index
from .sampling import estimate_totals
from .schema import DMA_CU_BASE, event_name
from .sites import UNKNOWN, launch_keys

_LENGTH_FIELDS = ("compute_ns", "comm_ns", "wait_ns", "overlap_ns", "stall_ns", "busy_ns", "idle_ns")
_COUNT_FIELDS = ("compute_events", "comm_events", "wait_events", "bytes_moved")
PER_SM_FIELDS = ("rank", "cu_id") + _LENGTH_FIELDS + _COUNT_FIELDS
_RATIO_FIELDS = ("compute_during_comm_ns", "comm_or_wait_ns", "overlap_ratio")
PER_RANK_FIELDS = ("rank",) + _LENGTH_FIELDS + _COUNT_FIELDS + _RATIO_FIELDS
OVERALL_FIELDS = _LENGTH_FIELDS + _COUNT_FIELDS + _RATIO_FIELDS
STALL_FIELDS = (
    "rank",
    "cu_id",
    "pid",
    "pid_m",
    "pid_n",
    "op",
    "site",
    "launch",
    "address",
    "start_ns",
    "duration_ns",
    "value",
    "releaser_rank",
    "releaser_cu_id",
    "releaser_op",
    "releaser_start_ns",
    "producer",
    "producer_end_ns",
    *PARTS,
)
#: Columns of ``wait_causes.csv``: the rows of :func:`~iris_trace.attribution.wait_groups`.
WAIT_CAUSE_FIELDS = (
    "rank", "op", "releaser_rank", "producer", "producer_tile", "waits", "wait_ns", "share", *PARTS,
)  # fmt: skip
SEEN_LATENCY_FIELDS = (
    "releaser_rank", "rank", "waits", "min_ns", "median_ns",
    "slowest_ns", "slowest_address", "slowest_waits", "slowest_is_first",
)  # fmt: skip
#: Columns of ``call_sites.csv``: where the time went, by the source line that issued the ops.
CALL_SITE_FIELDS = ("site", "ops", "events", "launches", "comm_ns", "wait_ns", "compute_ns", "bytes_moved")
#: What each column of the report means (``iris-trace report --help`` and the table's legend).
LEGEND = {
    "compute": "time inside compute scopes (trace_begin/trace_end, e.g. GEMM tiles)",
    "comm": "time inside RMA ops (load, store, put, get, atomics, signal)",
    "wait": "time inside waits (wait_until, device barrier, collective and fused-op waits)",
    "overlap": "compute on the SM while communication is in flight on it",
    "stall": "waiting while nothing on the SM computes",
    "idle": "window minus busy (no event at all)",
    "ratio": "HTA overlap ratio: compute during communication or waits / communication or waits",
    "at": "the traced op's call site: its kernel and source line (iris_trace.sites)",
    "launches": "how many kernel launches (each rank's its own) the call site's events came from",
    "released by": "the op that set the flag the wait saw (rank, SM, op, start from window start)",
    "release to seen": "wait end minus the release's issue time, for waits already polling then: the "
    "flag's way to the waiter plus one poll (a few us between GPUs over NVLink); a release seen 10 us "
    "or more later than the pair's fastest is named, with whether it was the releaser's first to that rank "
    "(NVLink links sleep after 50 ms without traffic, and a launch's first flag each way then arrives "
    "about 105 us late: docs/tracing.md)",
    "computing / not sent / in flight / late look": "the stall split (iris_trace.attribution): the "
    "producer still computing; the releaser not releasing yet (itself waiting, its rank not started, "
    "doing untraced work, or nothing traced released it); data and flag being sent, until the release "
    "was issued; the "
    "flag sent, not yet seen (its way to the waiter, the poll interval, or the waiter not running)",
}
#: The parts of a stall the longest-stalls table shows together as "not sent".
NOT_SENT_PARTS = ("releaser_waiting_ns", "not_started_ns", "not_released_ns", "unattributed_ns")
#: Shortest gap between two steps of the critical path that the table points out.
CRITICAL_PATH_GAP_NS = 1000
CRITICAL_PATH_GAP_WORDS = "with nothing traced on the path (host code, untraced work)"
#: Rows of the release-to-seen section of :meth:`Report.format_table` (JSON and CSV have all).
TABLE_LATENCY_ROWS = 12
#: A pair's slowest release is named in the table when it was seen this much later than
#: the pair's fastest wait: one flag held up, not a slow link.
SLOW_RELEASE_SPREAD_NS = 10_000
#: Rows of the per-SM section of :meth:`Report.format_table`.
TABLE_SM_ROWS = 20
#: How late a launch's first flag each way arrives when the NVLink links slept (50 ms or
#: more without traffic; 104-112 us to wake on H100s and H200s, docs/tracing.md "Links
#: that sleep"): a releaser's first release seen this late, and at least
#: FIRST_FLAG_MIN_EXTRA_NS later than its pair's fastest, gets a note in the report.
FIRST_FLAG_WAKE_NS = (80_000, 140_000)
FIRST_FLAG_MIN_EXTRA_NS = 50_000


def _stats(keys, n_keys, starts, ends, category, payload, window_ns) -> dict[str, np.ndarray]:
    """Every per-key quantity of the module docstring, as int64 arrays of length ``n_keys``."""
    member = category[:, None] == np.array([COMPUTE, COMM, WAIT])
    cover = Coverage(keys, starts, ends, member, n_keys)
    busy = cover.union((COMPUTE, COMM, WAIT))
    counts = [np.bincount(keys[category == c], minlength=n_keys).astype(np.int64) for c in range(3)]
    is_comm = category == COMM
    bytes_moved = np.zeros(n_keys, dtype=np.int64)
    np.add.at(bytes_moved, keys[is_comm], payload[is_comm])
    return {
        "compute_ns": cover.union((COMPUTE,)),
        "comm_ns": cover.union((COMM,)),
        "wait_ns": cover.union((WAIT,)),
        "overlap_ns": cover.intersection((COMPUTE,), (COMM,)),
        "stall_ns": cover.difference((WAIT,), (COMPUTE,)),
        "busy_ns": busy,
        "idle_ns": window_ns - busy,
        "compute_events": counts[COMPUTE],
        "comm_events": counts[COMM],
        "wait_events": counts[WAIT],
        "bytes_moved": bytes_moved,
        "compute_during_comm_ns": cover.intersection((COMPUTE,), (COMM, WAIT)),
        "comm_or_wait_ns": cover.union((COMM, WAIT)),
    }


def _ratio(numerator: int, denominator: int) -> float:
    return float(numerator) / float(denominator) if denominator else 0.0


#: The files :meth:`Report.to_csv` writes, in its order.
CSV_FILES = (
    "per_sm.csv", "per_rank.csv", "top_stalls.csv", "wait_causes.csv", "seen_latency.csv", "call_sites.csv",
)  # fmt: skip
#: Rows of the by-call-site section of :meth:`Report.format_table` (JSON and CSV have all).
TABLE_SITE_ROWS = 12


@dataclass
class Report:
    """What :func:`analyze` found; every list row is a plain dict of Python numbers (None where absent)."""

    world_size: int
    window_start_ns: int
    window_ns: int
    per_sm: list[dict] = field(default_factory=list)
    per_rank: list[dict] = field(default_factory=list)
    overall: dict = field(default_factory=dict)
    top_stalls: list[dict] = field(default_factory=list)
    #: Per rank, where most of its wait time went, in words (the report's first lines).
    summary: list[str] = field(default_factory=list)
    #: Wait time per (waiting rank, wait op, releasing rank, producer step), longest first.
    wait_causes: list[dict] = field(default_factory=list)
    #: Per rank: median and p99 of the tile lifecycle spans (``iris_trace.attribution``).
    tile_lifecycle: dict = field(default_factory=dict)
    #: Per (releasing rank, waiting rank): how soon an issued release was seen (``seen_latency``).
    seen_latency: list[dict] = field(default_factory=list)
    #: The chain of events that set the window's end, earliest first.
    critical_path: list[dict] = field(default_factory=list)
    #: What to keep in mind reading the numbers (emulated timings, shared clocks, drops).
    notes: list[str] = field(default_factory=list)
    #: A sampled trace's period and estimated totals per rank (``iris_trace.sampling``); empty if unsampled.
    sampling: dict = field(default_factory=dict)
    #: Per call site (kernel and source line), its ops' time and bytes, longest first.
    call_sites: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Everything as JSON-ready builtins (addresses as ``0x...`` strings).

        Example:
            >>> report.to_dict()["overall"]["stall_ns"]
        """
        return {
            "world_size": self.world_size,
            "window_start_ns": self.window_start_ns,
            "window_ns": self.window_ns,
            "notes": list(self.notes),
            "summary": list(self.summary),
            "overall": dict(self.overall),
            "per_rank": [dict(row) for row in self.per_rank],
            "per_sm": [dict(row) for row in self.per_sm],
            "top_stalls": [_hex_address(row) for row in self.top_stalls],
            "wait_causes": [dict(row) for row in self.wait_causes],
            "tile_lifecycle": {str(rank): stats for rank, stats in self.tile_lifecycle.items()},
            "seen_latency": [dict(row) for row in self.seen_latency],
            "critical_path": [_hex_address(row) for row in self.critical_path],
            "sampling": {k: (list(v) if isinstance(v, list) else v) for k, v in self.sampling.items()},
            "call_sites": [dict(row) for row in self.call_sites],
            "legend": dict(LEGEND),
        }

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON text, also written to ``path`` when given.

        Example:
            >>> report.to_json("analysis/report.json")
        """
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with files.replace_atomically(path, "w") as f:
                f.write(text + "\n")
        return text

    def to_csv(self, directory: str) -> list[str]:
        """Write the tables as CSV (:data:`CSV_FILES`: per_sm, per_rank, top_stalls, wait_causes,
        seen_latency, call_sites).

        Returns their paths; None is written as an empty cell, addresses as ``0x...``.

        Example:
            >>> paths = report.to_csv("analysis/")
        """
        os.makedirs(directory, exist_ok=True)
        paths = []
        tables = (
            (PER_SM_FIELDS, self.per_sm),
            (PER_RANK_FIELDS, self.per_rank),
            (STALL_FIELDS, [_hex_address(r) for r in self.top_stalls]),
            (WAIT_CAUSE_FIELDS, self.wait_causes),
            (SEEN_LATENCY_FIELDS, self.seen_latency),
            (CALL_SITE_FIELDS, self.call_sites),
        )
        for name, (fields, rows) in zip(CSV_FILES, tables):
            path = os.path.join(directory, name)
            with files.replace_atomically(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
            paths.append(path)
        return paths

    def format_table(self) -> str:
        """Fixed-width text: notes, the summary in words, per rank, the SMs that stalled
        longest, the longest stalls with their causes, the critical path and a legend.

        Lengths are microseconds with one decimal; start times count from the window start.

        Example:
            >>> print(report.format_table())
        """
        us = _microseconds
        lines = [f"note: {note}" for note in self.notes]
        lines += [
            f"window {us(self.window_ns)} us, {self.world_size} rank(s), "
            f"{len(self.per_sm)} SM(s) with events; times in us from the window start",
            "",
        ]
        if self.summary:
            lines += ["why ranks waited", *[f"  {line}" for line in self.summary], ""]
        if self.seen_latency:
            shown = self.seen_latency
            heading = "release to seen, for waits already polling when the release was issued"
            if len(shown) > TABLE_LATENCY_ROWS:
                shown = sorted(shown, key=lambda r: -r["median_ns"])[:TABLE_LATENCY_ROWS]
                heading += f" (the {len(shown)} slowest of {len(self.seen_latency)} pairs by median)"
            lines.append(heading)
            for row in shown:
                line = (
                    f"  rank {row['releaser_rank']} -> rank {row['rank']}: {row['waits']} "
                    f"wait{'s' if row['waits'] != 1 else ''}, "
                    f"min {us(row['min_ns'])} us, median {us(row['median_ns'])} us"
                )
                if row["slowest_ns"] - row["min_ns"] >= SLOW_RELEASE_SPREAD_NS:
                    waits = row["slowest_waits"]
                    first = f"; rank {row['releaser_rank']}'s first release to rank {row['rank']}"
                    first = first if row["slowest_is_first"] else ""
                    line += (
                        f"; slowest release {us(row['slowest_ns'])} us ({hex(row['slowest_address'])}, "
                        f"seen by {waits} wait{'s' if waits != 1 else ''}{first})"
                    )
                lines.append(line)
            lines.append("")
        if self.sampling:
            lines.append(
                f"estimated totals over every program (one program in {self.sampling['period']} recorded; "
                "bound: two standard errors)"
            )
            rows = [
                [r["rank"], r["quantity"], f"{r['recorded']:.0f}", f"{r['estimate']:.0f} ± {r['bound']:.0f}"]
                for r in self.sampling["estimates"]
            ]
            lines += [*_fixed_width(["rank", "quantity", "recorded", "estimate"], rows), ""]
        lines.append("per rank")
        headers = ["rank", "compute", "comm", "wait", "overlap", "stall", "idle", "ratio", "bytes"]
        rows = []
        for row in [*self.per_rank, {**self.overall, "rank": "all"}]:
            lengths = [us(row[k]) for k in ("compute_ns", "comm_ns", "wait_ns", "overlap_ns", "stall_ns")]
            rows.append(
                [row["rank"], *lengths, us(row["idle_ns"]), f"{row['overlap_ratio']:.3f}", row["bytes_moved"]]
            )
        lines += _fixed_width(headers, rows)

        by_stall = sorted(self.per_sm, key=lambda r: (-r["stall_ns"], r["rank"], r["cu_id"]))
        shown = min(TABLE_SM_ROWS, len(by_stall))
        lines += ["", f"per SM, longest stall first ({shown} of {len(self.per_sm)} SMs)"]
        headers = ["rank", "sm", "compute", "comm", "wait", "overlap", "stall", "idle", "bytes"]
        rows = [
            [r["rank"], r["cu_id"]]
            + [us(r[k]) for k in ("compute_ns", "comm_ns", "wait_ns", "overlap_ns", "stall_ns", "idle_ns")]
            + [r["bytes_moved"]]
            for r in by_stall[:shown]
        ]
        lines += _fixed_width(headers, rows)

        if self.call_sites:
            shown = min(TABLE_SITE_ROWS, len(self.call_sites))
            lines += ["", f"by call site, longest first ({shown} of {len(self.call_sites)})"]
            headers = ["at", "ops", "events", "launches", "comm", "wait", "compute", "bytes"]
            rows = [
                [r["site"], r["ops"], r["events"], r["launches"]]
                + [us(r[k]) for k in ("comm_ns", "wait_ns", "compute_ns")]
                + [r["bytes_moved"]]
                for r in self.call_sites[:shown]
            ]
            lines += _fixed_width(headers, rows)

        lines += ["", f"longest stalls ({len(self.top_stalls)})"]
        headers = ["rank", "sm", "pid", "tile", "op", "at", "address", "start", "duration"]
        headers += ["computing", "not sent", "in flight", "late look", "released by"]
        rows = []
        for s in self.top_stalls:
            if s["releaser_rank"] is None:
                releaser = "-"
            else:
                releaser = (
                    f"rank {s['releaser_rank']} sm {s['releaser_cu_id']} {s['releaser_op']} at "
                    f"{us(s['releaser_start_ns'])}"
                )
                if s["producer"] is not None:
                    releaser += f" after {s['producer']} ended at {us(s['producer_end_ns'])}"
            rows.append(
                [
                    s["rank"],
                    s["cu_id"],
                    s["pid"],
                    f"{s['pid_m']},{s['pid_n']}",
                    s["op"],
                    s["site"] or "-",
                    f"{s['address']:#x}",
                    us(s["start_ns"]),
                    us(s["duration_ns"]),
                    us(s["computing_ns"]),
                    us(sum(s[part] for part in NOT_SENT_PARTS)),
                    us(s["in_flight_ns"]),
                    us(s["late_look_ns"]),
                    releaser,
                ]
            )
        lines += _fixed_width(headers, rows)
        if self.critical_path:
            lines += ["", "critical path (what set the end of the window)"]
            previous_end = None
            for step in self.critical_path:
                gap = step["start_ns"] - previous_end if previous_end is not None else 0
                if gap >= CRITICAL_PATH_GAP_NS:
                    lines.append(f"    ... {us(gap)} us {CRITICAL_PATH_GAP_WORDS}")
                tile = f" ({step['pid_m']},{step['pid_n']})" if step["pid_m"] >= 0 else ""
                if tile and not step["op"].endswith("tile"):
                    tile = " tile" + tile
                at = f" at {step['site']}" if step["site"] else ""
                lines.append(
                    f"  rank {step['rank']} SM {step['cu_id']}: {step['op']}{tile}{at} "
                    f"{us(step['start_ns'])}-{us(step['end_ns'])}"
                )
                previous_end = step["end_ns"]
        lines += ["", "columns"] + [f"  {name}: {meaning}" for name, meaning in LEGEND.items()]
        return "\n".join(lines)


def _hex_address(row: dict) -> dict:
    out = dict(row)
    if isinstance(out.get("address"), int):
        out["address"] = f"{out['address']:#x}"
    return out


def _microseconds(ns: int) -> str:
    return f"{ns / 1000:.1f}"


def _fixed_width(headers: list[str], rows: list[list]) -> list[str]:
    """Right-aligned columns except the last (free text), two spaces apart."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        parts = [c.rjust(w) for c, w in zip(row[:-1], widths)] + [row[-1]]
        lines.append("  ".join(parts).rstrip())
    return lines


def _event_row(event, origin: int, scope_names, where: tuple[str | None, str | None] = (None, None)) -> dict:
    # ``where``: the event's call site and launch labels (None where not known).
    return {
        "rank": int(event["cur_rank"]),
        "cu_id": int(event["cu_id"]),
        "pid": int(event["pid"]),
        "pid_m": int(event["pid_m"]),
        "pid_n": int(event["pid_n"]),
        "op": event_name(int(event["event_id"]), scope_names),
        "address": int(event["address"]),
        "start_ns": int(event["start_ns"]) - origin,
        "end_ns": max(int(event["end_ns"]), int(event["start_ns"])) - origin,
        "site": where[0],
        "launch": where[1],
    }


def _top_stalls(events, starts, ends, causes, scope_names, top, origin, where) -> list[dict]:
    waits = causes["index"]
    duration = ends[waits] - starts[waits]
    # lexsort: longest first, then earliest start, then input order.
    chosen = np.lexsort((waits, starts[waits], -duration))[: max(top, 0)]
    rows = []
    for row_index in chosen:
        i = int(waits[row_index])
        event = events[i]
        row = _event_row(event, origin, scope_names, where(i))
        del row["end_ns"]
        row.update(
            {
                "duration_ns": int(ends[i] - starts[i]),
                "value": int(event["value"]),
                "releaser_rank": None,
                "releaser_cu_id": None,
                "releaser_op": None,
                "releaser_start_ns": None,
                "producer": None,
                "producer_end_ns": None,
                **{name: int(causes[name][row_index]) for name in PARTS},
            }
        )
        source = int(causes["releaser"][row_index])
        if source >= 0:
            released_by = events[source]
            row["releaser_rank"] = int(released_by["cur_rank"])
            row["releaser_cu_id"] = int(released_by["cu_id"])
            row["releaser_op"] = event_name(int(released_by["event_id"]), scope_names)
            row["releaser_start_ns"] = int(released_by["start_ns"]) - origin
        step = int(causes["producer"][row_index])
        if step >= 0:
            row["producer"] = event_name(int(events[step]["event_id"]), scope_names)
            if events[step]["pid_m"] >= 0:
                row["producer"] += f" ({int(events[step]['pid_m'])},{int(events[step]['pid_n'])})"
            row["producer_end_ns"] = int(ends[step]) - origin
        rows.append(row)
    return rows


def analyze(
    events: np.ndarray,
    world_size: int,
    scope_names: dict[int, str] | None = None,
    top: int = 10,
    notes: list[str] | None = None,
    releaser: np.ndarray | None = None,
    causes: dict[str, np.ndarray] | None = None,
    sample_period: int = 1,
    origins: tuple[np.ndarray, np.ndarray, list[str]] | None = None,
) -> Report:
    """Compute, communication, overlap, stall and idle time per SM, per rank and overall,
    why ranks waited, and where (by call site) the time went.

    Definitions are in the module docstring. ``events`` is an ``EVENT_DTYPE`` array on one
    clock (``Trace.events``), in any order; ``notes`` go to the top of the report
    (:func:`analyze_trace` fills them from the trace's metadata). ``releaser`` is
    :func:`~iris_trace.matching.match_releasers` of ``events`` where the caller has it
    (``Trace.releasers``), and ``causes`` :func:`~iris_trace.attribution.attribute_waits`
    of them (``Trace.wait_causes``); each is computed here otherwise. ``sample_period`` > 1
    (``Trace.sample_period``: one program in that many recorded) adds the estimated totals
    of :func:`~iris_trace.sampling.estimate_totals` and a note. ``origins`` is
    :func:`~iris_trace.sites.origins` of ``events`` (``Trace.origins``): with it the stalls
    and the critical path name their call sites, and the report has a by-call-site table.

    Example:
        >>> report = analyze(trace.events, trace.world_size, trace.scope_names, top=5)
        >>> report.per_rank[1]["stall_ns"], report.overall["overlap_ratio"]
        >>> report.top_stalls[0]["releaser_rank"], report.summary[0]
    """
    events = np.asarray(events)
    if events.dtype != EVENT_DTYPE:
        raise TypeError(f"events have dtype {events.dtype}, expected iris_trace.events.EVENT_DTYPE")
    if releaser is not None and len(releaser) != len(events):
        raise ValueError(f"releaser has {len(releaser)} entries for {len(events)} events")
    ranks = events["cur_rank"].astype(np.int64)
    outside = (ranks < 0) | (ranks >= world_size)
    if outside.any():
        raise ValueError(
            f"events from rank(s) {sorted(set(ranks[outside].tolist()))} in a world of {world_size}"
        )
    starts = events["start_ns"].astype(np.int64)
    ends = np.maximum(events["end_ns"].astype(np.int64), starts)
    category = categories(events["event_id"])
    payload = events["payload_bytes"].astype(np.int64)
    window_start = int(starts.min()) if len(events) else 0
    window_ns = int(ends.max()) - window_start if len(events) else 0

    on_sm = events["cu_id"].astype(np.int64) < DMA_CU_BASE
    sm_rows, sm_keys = sm_index(events[on_sm])
    sm_stats = _stats(
        sm_keys, len(sm_rows), starts[on_sm], ends[on_sm], category[on_sm], payload[on_sm], window_ns
    )
    per_sm = [
        {"rank": int(rank), "cu_id": int(cu_id), **{k: int(sm_stats[k][i]) for k in PER_SM_FIELDS[2:]}}
        for i, (rank, cu_id) in enumerate(sm_rows)
    ]

    rank_stats = _stats(ranks, world_size, starts, ends, category, payload, window_ns)
    per_rank = []
    for rank in range(world_size):
        row = {"rank": rank, **{k: int(rank_stats[k][rank]) for k in PER_RANK_FIELDS[1:-1]}}
        row["overlap_ratio"] = _ratio(row["compute_during_comm_ns"], row["comm_or_wait_ns"])
        per_rank.append(row)

    overall = {k: sum(row[k] for row in per_rank) for k in OVERALL_FIELDS[:-1]}
    overall["overlap_ratio"] = _ratio(overall["compute_during_comm_ns"], overall["comm_or_wait_ns"])

    if releaser is None:
        releaser = match_releasers(events)  # one matching serves the three analyses below
    if causes is None:
        causes = attribute_waits(events, releaser)
    groups = wait_groups(events, causes, scope_names)
    lifecycle = lifecycle_summary(tile_lifecycles(events, releaser))
    path = critical_path(events, releaser)
    where = _where(origins)
    return Report(
        world_size=world_size,
        window_start_ns=window_start,
        window_ns=window_ns,
        per_sm=per_sm,
        per_rank=per_rank,
        overall=overall,
        top_stalls=_top_stalls(events, starts, ends, causes, scope_names, top, window_start, where),
        summary=summarize_waits(groups, world_size, lifecycle, first_events(events)),
        wait_causes=groups,
        tile_lifecycle=lifecycle,
        seen_latency=seen_latency(events, causes),
        critical_path=[_event_row(events[i], window_start, scope_names, where(i)) for i in path],
        notes=list(notes or []) + _sampling_notes(sample_period),
        sampling=(
            {"period": sample_period, "estimates": estimate_totals(events, world_size, sample_period)}
            if sample_period > 1
            else {}
        ),
        call_sites=[]
        if origins is None
        else _by_call_site(events, starts, ends, category, payload, origins, scope_names),
    )


def _where(origins):
    # Event index -> its (call site, launch) labels, None where not known.
    if origins is None:
        return lambda i: (None, None)
    site_at, launch_at, labels = origins

    def known(label: str) -> str | None:
        return None if label == UNKNOWN else label

    return lambda i: (known(labels[site_at[i]]), known(labels[launch_at[i]]))


def _by_call_site(events, starts, ends, category, payload, origins, scope_names) -> list[dict]:
    # Per call site label: its ops, events, launches, time per category and bytes.
    site_at, _, labels = origins
    if not len(events) or not (site_at != labels.index(UNKNOWN)).any():
        return []
    sites, inverse = np.unique(site_at, return_inverse=True)
    inverse = inverse.reshape(-1)
    n = len(sites)
    duration = (ends - starts).astype(np.float64)
    time = {c: np.bincount(inverse, np.where(category == c, duration, 0), n) for c in (COMM, WAIT, COMPUTE)}
    counts = np.bincount(inverse, minlength=n)
    moved = np.bincount(inverse, payload.astype(np.float64), n)
    # A launch per rank: each rank's launch of a step is one of them.
    _, launch = launch_keys(events)
    launches = np.bincount(np.unique(np.stack([inverse, launch]), axis=1)[0], minlength=n)
    ops: list[set[str]] = [set() for _ in range(n)]
    for k, event_id in np.unique(np.stack([inverse, events["event_id"].astype(np.int64)]), axis=1).T.tolist():
        ops[k].add(event_name(event_id, scope_names))
    rows = []
    for k, site in enumerate(sites.tolist()):
        rows.append(
            {
                "site": labels[site],
                "ops": ",".join(sorted(ops[k])),
                "events": int(counts[k]),
                "launches": int(launches[k]),
                "comm_ns": int(time[COMM][k]),
                "wait_ns": int(time[WAIT][k]),
                "compute_ns": int(time[COMPUTE][k]),
                "bytes_moved": int(moved[k]),
            }
        )
    return sorted(rows, key=lambda r: (-(r["comm_ns"] + r["wait_ns"] + r["compute_ns"]), r["site"]))


def _sampling_notes(period: int) -> list[str]:
    if period <= 1:
        return []
    return [
        f"one program in {period} recorded (ctx.tracing.enable(sample=...)): the per-rank and per-SM "
        "times, stalls and paths are those of the recorded programs; estimated totals over every "
        "program, with their bounds, are under 'estimated totals'"
    ]


def trace_notes(trace) -> list[str]:
    """What a reader of ``trace``'s numbers must know: emulated timings, shared clocks, drops.

    Example:
        >>> trace_notes(Trace.from_files(files))
        ['timings are the Triton interpreter's on the CPU (emulation backend), not a GPU's: ...']
    """
    notes = []
    if _emulated(trace):
        notes.append(
            "timings are the Triton interpreter's on the CPU (emulation backend), not a GPU's: "
            "programs of a launch run one after another and every op costs microseconds, so "
            "overlap is near zero and most time is idle; read the order of events, not their lengths"
        )
    shared = [fit for fit in trace.clock_fits[1:] if fit.shared_clock]
    if shared:
        notes.append(
            f"{len(shared) + 1} ranks read one clock (the same GPU or host): no offset was fitted for them"
        )
    if sum(trace.dropped):
        notes.append(f"{sum(trace.dropped)} events were dropped (per rank {trace.dropped}): raise max_events")
    for site in getattr(trace, "shared_sites", []):
        named = trace.sites.get(site)
        notes.append(
            f"call site id {site} is the hash of two source lines (ids have 24 bits): its events say "
            f"{named.label if named else 'unknown'}, which may be the other line of its kernel"
        )
    return notes


def _emulated(trace) -> bool:
    return any(r.device.startswith("emulated") for r in trace.ranks)


def first_flag_notes(seen_latency: list[dict]) -> list[str]:
    """Notes for releases that fit a launch's delayed first flag (``seen_latency`` rows).

    A releaser's first release to a rank, seen within :data:`FIRST_FLAG_WAKE_NS` of its
    issue and at least :data:`FIRST_FLAG_MIN_EXTRA_NS` later than the pair's fastest, is
    what a flag meets when the NVLink links it crosses slept (no traffic for 50 ms or
    more) and had to wake (measured by a probe; docs/tracing.md, "Links that sleep"): not the
    program's doing, and ``Iris.wake_links`` before the call avoids it.

    Example:
        >>> first_flag_notes(report.seen_latency)
        ["rank 0's first release to rank 1 was seen 105.2 us after its issue: ..."]
    """
    low, high = FIRST_FLAG_WAKE_NS
    notes = []
    for row in seen_latency:
        slowest = row["slowest_ns"]
        stands_out = slowest - row["min_ns"] >= FIRST_FLAG_MIN_EXTRA_NS
        if row["slowest_is_first"] and low <= slowest <= high and stands_out:
            notes.append(
                f"rank {row['releaser_rank']}'s first release to rank {row['rank']} was seen "
                f"{slowest / 1e3:.1f} us after its issue: NVLink links sleep after 50 ms without "
                "traffic (compiling, host work, a pause), and a launch's first flag each way then waits "
                "about 105 us for them to wake, whatever the kernel does; ctx.wake_links() right before "
                "the call wakes them (docs/tracing.md, 'Links that sleep')"
            )
    return notes


def analyze_trace(trace, top: int = 10) -> Report:
    """:func:`analyze` of a merged :class:`~iris_trace.trace.Trace`, with its :func:`trace_notes`
    (and, for GPU traces with a GPU per rank, :func:`first_flag_notes`).

    Example:
        >>> print(analyze_trace(Trace.from_files(files)).format_table())
    """
    report = analyze(
        trace.events,
        trace.world_size,
        trace.scope_names,
        top=top,
        notes=trace_notes(trace),
        releaser=trace.releasers,
        causes=trace.wait_causes,
        sample_period=trace.sample_period,
        origins=trace.origins,
    )
    # Where ranks share a GPU (or run emulated) a late flag is a turn, not the first-flag delay.
    if not trace.shares_a_clock and not _emulated(trace):
        report.notes.extend(first_flag_notes(report.seen_latency))
    return report
