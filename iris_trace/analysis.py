"""Where the time went: compute, communication, waits and stalls per SM and per rank.

Every length is in nanoseconds on the merged trace's aligned clock.

Definitions
-----------
* Categories, by ``event_id``: *compute* is a user scope (``event_id >= SCOPE_BASE``);
  *wait* is an op in ``WAIT_EVENTS`` (``wait_until``); *communication* is every other op.
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
* Releaser of a wait: among the release events (``RELEASE_EVENTS``, issued on any rank,
  this one included) with ``target_rank`` equal to the waiter's ``cur_rank``, ``address``
  equal to the waiter's ``address`` and ``start_ns <= `` the waiter's ``end_ns``, the one
  with the latest ``start_ns``; if any of them is a signal or an atomic whose ``value``
  equals the waiter's ``value``, the latest of those instead. Equal ``start_ns`` go to the
  event later in the input array. None when nothing matches.
* Top stalls: the ``top`` longest wait events (duration ``end_ns - start_ns``), equal
  durations earliest ``start_ns`` first, then input order.

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

from .events import DMA_CU_BASE, EVENT_DTYPE, EVENT_NAMES, RELEASE_EVENTS, SCOPE_BASE, WAIT_EVENTS, event_name
from .lanes import stable_order

COMPUTE, COMM, WAIT = 0, 1, 2
#: Releases whose ``value`` says what they set, so a waiter's ``value`` can pick among them.
VALUED_RELEASES = frozenset(
    event_id
    for event_id, name in EVENT_NAMES.items()
    if event_id in RELEASE_EVENTS and (name == "signal" or name.startswith("atomic_"))
)

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
    "address",
    "start_ns",
    "duration_ns",
    "value",
    "releaser_rank",
    "releaser_cu_id",
    "releaser_op",
    "releaser_start_ns",
)
#: Rows of the per-SM section of :meth:`Report.format_table`.
TABLE_SM_ROWS = 20


def categories(event_ids: np.ndarray) -> np.ndarray:
    """``COMPUTE``, ``COMM`` or ``WAIT`` for every event id.

    Example:
        >>> categories(np.array([4, 16, 64]))
        array([1, 2, 0], dtype=int8)
    """
    event_ids = np.asarray(event_ids)
    category = np.full(event_ids.shape, COMM, dtype=np.int8)
    category[np.isin(event_ids, list(WAIT_EVENTS))] = WAIT
    category[event_ids >= SCOPE_BASE] = COMPUTE
    return category


def _order_by_key_then_time(keys: np.ndarray, times: np.ndarray, n_keys: int) -> np.ndarray:
    """Stable sort order by (key, time), for keys in ``[0, n_keys)``.

    Shifting each key's times into its own range lets one argsort do what lexsort does in
    about a fifth of the time; lexsort remains for spans that would overflow int64.
    """
    if len(times) == 0:
        return np.zeros(0, dtype=np.int64)
    first = int(times.min())
    span = int(times.max()) - first + 1
    if n_keys * span >= 2**62:
        return np.lexsort((times, keys))
    return np.argsort(keys * span + (times - first), kind="stable")


class _Coverage:
    """Every key's timeline cut at each interval boundary, with the interval sets covering each piece.

    One sort answers every union, intersection and difference of the sets per key, which is
    what keeps concurrent CTAs on one SM from being counted twice.

    Args:
        keys: int array, each interval's key in ``[0, n_keys)``.
        starts, ends: int64 interval bounds (``ends >= starts``).
        member: bool ``(n, n_sets)``, which sets each interval belongs to (possibly several).
        n_keys: number of keys.

    After construction ``key``, ``start``, ``end`` and ``length`` describe the pieces of positive
    length, and ``covered[i, s]`` says whether set ``s`` covers piece ``i``.
    """

    def __init__(self, keys, starts, ends, member: np.ndarray, n_keys: int):
        self.n_keys = n_keys
        member = np.asarray(member, dtype=bool)
        times = np.concatenate([starts, ends]).astype(np.int64)
        boundary_keys = np.concatenate([keys, keys]).astype(np.int64)
        steps = np.concatenate([member, member]).astype(np.int32)
        steps[len(starts) :] *= -1
        order = _order_by_key_then_time(boundary_keys, times, n_keys)
        times, boundary_keys = times[order], boundary_keys[order]
        # Depth after each boundary; each key's steps sum to zero, so it is 0 between keys.
        depth = np.cumsum(steps[order], axis=0)
        keep = (boundary_keys[1:] == boundary_keys[:-1]) & (times[1:] > times[:-1])
        self.key = boundary_keys[:-1][keep]
        self.start = times[:-1][keep]
        self.end = times[1:][keep]
        self.length = self.end - self.start
        self.covered = depth[:-1][keep] > 0

    def _any(self, sets) -> np.ndarray:
        return self.covered[:, list(sets)].any(axis=1)

    def _length_per_key(self, pieces: np.ndarray) -> np.ndarray:
        total = np.zeros(self.n_keys, dtype=np.int64)
        np.add.at(total, self.key[pieces], self.length[pieces])
        return total

    def union(self, sets) -> np.ndarray:
        """``|U sets|`` per key (int64 ns)."""
        return self._length_per_key(self._any(sets))

    def intersection(self, sets_a, sets_b) -> np.ndarray:
        """``|(U sets_a) ∩ (U sets_b)|`` per key."""
        return self._length_per_key(self._any(sets_a) & self._any(sets_b))

    def difference(self, sets_a, sets_b) -> np.ndarray:
        """``|(U sets_a) minus (U sets_b)|`` per key."""
        return self._length_per_key(self._any(sets_a) & ~self._any(sets_b))


def _stats(keys, n_keys, starts, ends, category, payload, window_ns) -> dict[str, np.ndarray]:
    """Every per-key quantity of the module docstring, as int64 arrays of length ``n_keys``."""
    member = category[:, None] == np.array([COMPUTE, COMM, WAIT])
    cover = _Coverage(keys, starts, ends, member, n_keys)
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


def _latest_at_or_before(cand_keys, cand_times, query_keys, query_times) -> np.ndarray:
    """For each query, the candidate with equal keys and the latest time <= the query's time.

    Returns indices into the candidates, -1 where none. Candidates and queries are sorted
    together by (keys, time, candidates first), stably, so the answer is the last candidate at
    or before each query's position, provided its keys are the query's; of equal candidates
    the later one in the input comes last. The keys are packed into int64 words with the row
    index in the lowest bits: one value sort when keys, time and index fit 63 bits, else two
    (time, then keys), else :func:`stable_order` on the separate keys.
    """
    n_cand, n_query = len(cand_times), len(query_times)
    found = np.full(n_query, -1, dtype=np.int64)
    if n_cand == 0 or n_query == 0:
        return found
    n = n_cand + n_query
    sides = ([*cand_keys, cand_times], [*query_keys, query_times])
    lows = [min(int(c.min()), int(q.min())) for c, q in zip(*sides)]
    bits = [(max(int(c.max()), int(q.max())) - low).bit_length() for c, q, low in zip(*sides, lows)]
    key_bits, time_bits = sum(bits[:-1]), bits[-1]
    index_bits = max(1, (n - 1).bit_length())
    one_word = key_bits + time_bits + 1 + index_bits <= 63
    if not one_word and (key_bits + index_bits > 63 or time_bits + 1 + index_bits > 63):
        keys = [np.concatenate([c, q]).astype(np.int64) for c, q in zip(cand_keys, query_keys)]
        times = np.concatenate([cand_times, query_times]).astype(np.int64)
        is_query = np.concatenate([np.zeros(n_cand, np.int8), np.ones(n_query, np.int8)])
        order = stable_order(*keys, times, is_query)
        group = None
    else:
        order, group = _packed_order(sides, lows, bits, one_word, index_bits)
    # Each query's answer: the last candidate before it in this order, if it has the query's keys.
    at_query = order >= n_cand
    last = np.arange(n)
    last[at_query] = -1
    np.maximum.accumulate(last, out=last)
    query_pos = np.flatnonzero(at_query)
    del at_query
    cand_pos = last[query_pos]
    del last
    same = cand_pos >= 0
    np.maximum(cand_pos, 0, out=cand_pos)
    cand = order[cand_pos]
    query_index = order[query_pos] - n_cand
    if group is not None:
        same &= group[cand_pos] == group[query_pos]
    else:
        for key in keys:
            same &= key[cand] == key[n_cand + query_index]
    found[query_index] = np.where(same, cand, -1)
    return found


def _packed_order(sides, lows, bits, one_word: bool, index_bits: int):
    """The sort of :func:`_latest_at_or_before` on packed words: (order, keys packed per row in order).

    ``sides``: the candidates' then the queries' columns, keys then time.
    """
    n = sum(len(side[-1]) for side in sides)
    time_bits = bits[-1]
    group = np.empty(n, dtype=np.int64)  # the packed keys (and, in one word, the time)
    later = group if one_word else np.empty(n, dtype=np.int64)  # the time and is-query bit
    start = 0
    for is_query, columns in enumerate(sides):
        for lo in range(0, len(columns[-1]), _READ_ROWS):
            hi = min(lo + _READ_ROWS, len(columns[-1]))
            key = np.zeros(hi - lo, dtype=np.int64)
            for column, low, width in zip(columns[:-1], lows, bits):
                key <<= width
                key |= np.subtract(column[lo:hi], low, dtype=np.int64)
            time = np.subtract(columns[-1][lo:hi], lows[-1], dtype=np.int64)
            time <<= 1
            time |= is_query
            if one_word:
                key <<= time_bits + 1
                key |= time
                group[start + lo : start + hi] = key
            else:
                group[start + lo : start + hi], later[start + lo : start + hi] = key, time
        start += len(columns[-1])
    # The lowest bits carry the row index: a value sort is then stable and gives the order.
    mask = (1 << index_bits) - 1
    if one_word:
        group <<= index_bits
        group |= np.arange(n)
        group.sort()
        order = group & mask
        group >>= index_bits + 1 + time_bits
        return order, group
    later <<= index_bits
    later |= np.arange(n)
    later.sort()
    later &= mask  # the order by time alone
    group = group[later]
    group <<= index_bits
    group |= np.arange(n)
    group.sort()
    order = later[group & mask]
    group >>= index_bits
    return order, group


def sm_index(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The SMs with events and which of them each event ran on.

    Returns ``(rows, index)``: ``rows`` an int64 ``(n_sms, 2)`` array of ``(cur_rank, cu_id)``
    sorted by rank then SM, and ``index`` the row of every event.

    Example:
        >>> rows, index = sm_index(trace.events)
        >>> rows[index[0]]          # (rank, SM) of the first event
    """
    # One int64 per SM: np.unique on a 1-D array is far faster than with axis=0.
    cu_id = events["cu_id"].astype(np.int64) & 0xFFFF
    combined = (events["cur_rank"].astype(np.int64) << 16) | cu_id
    unique, index = np.unique(combined, return_inverse=True)
    rows = np.stack([unique >> 16, (unique & 0xFFFF).astype(np.uint16).view(np.int16)], axis=1)
    return rows.astype(np.int64), index.reshape(-1).astype(np.int64)


_WAIT, _RELEASE, _VALUED_RELEASE = 1, 2, 3
#: Events read at a time by match_releasers' passes: whole records (``take``, several times
#: faster than one field at a time), about 1 MiB of them, which stay in the CPU cache while
#: their fields are copied out; the temporaries stay small next to the trace.
_READ_ROWS = 1 << 14


def _release_kinds(event_ids: np.ndarray) -> np.ndarray:
    """0, ``_WAIT``, ``_RELEASE`` or ``_VALUED_RELEASE`` for every event id (int8).

    16-bit ids (the event dtype's) read a 64 Ki-entry table, one gather instead of three isin.
    An id has one kind: wait and release ids are disjoint, valued releases are releases.
    """
    event_ids = np.asarray(event_ids)
    groups = ((WAIT_EVENTS, _WAIT), (RELEASE_EVENTS, _RELEASE), (VALUED_RELEASES, _VALUED_RELEASE))
    kinds = np.zeros(event_ids.shape, dtype=np.int8)
    if event_ids.dtype.kind in "iu" and event_ids.dtype.itemsize == 2:
        table = np.zeros(1 << 16, dtype=np.int8)
        for ids, kind in groups:
            table[[i & 0xFFFF for i in ids]] = kind
        for lo in range(0, len(event_ids), _READ_ROWS):
            np.take(table, event_ids[lo : lo + _READ_ROWS].view(np.uint16), out=kinds[lo : lo + _READ_ROWS])
        return kinds
    for ids, kind in groups:
        kinds[np.isin(event_ids, list(ids))] = kind
    return kinds


def match_releasers(events: np.ndarray) -> np.ndarray:
    """Index of the event that released each wait (module docstring), -1 for others and unmatched.

    Vectorised (two sorts), so exporters can draw a flow arrow per wait on large traces; the
    events are read a slice at a time, so beyond the result it needs about 40 bytes per event.

    Example:
        >>> releaser = match_releasers(trace.events)
        >>> waits = np.nonzero(releaser >= 0)[0]
        >>> arrows = zip(releaser[waits], waits)      # (source event, waiting event)
    """
    events = np.asarray(events)
    if len(events) == 0:
        return np.full(0, -1, dtype=np.int64)
    kind = _release_kinds(events["event_id"])
    waits = np.flatnonzero(kind == _WAIT)
    releases = np.flatnonzero(kind >= _RELEASE)
    valued = releases[kind[releases] == _VALUED_RELEASE]
    del kind
    if len(waits) == 0 or len(releases) == 0:
        return np.full(len(events), -1, dtype=np.int64)
    query = _read_columns(
        events, waits, ("cur_rank", "address", "value"), lambda r: np.maximum(r["end_ns"], r["start_ns"])
    )
    cand = _read_columns(events, releases, ("target_rank", "address"), lambda r: r["start_ns"])
    found = _latest_at_or_before(cand[:2], cand[2], query[:2], query[3])
    any_release = np.where(found >= 0, releases[np.maximum(found, 0)], -1)
    del cand
    same_value = np.full(len(waits), -1, dtype=np.int64)
    if len(valued):
        cand = _read_columns(events, valued, ("target_rank", "address", "value"), lambda r: r["start_ns"])
        found = _latest_at_or_before(cand[:3], cand[3], query[:3], query[3])
        same_value = np.where(found >= 0, valued[np.maximum(found, 0)], -1)
    result = np.full(len(events), -1, dtype=np.int64)
    result[waits] = np.where(same_value >= 0, same_value, any_release)
    return result


def _read_columns(events, index, fields, time) -> list[np.ndarray]:
    """``fields`` of the events at ``index``, then ``time(records)``, as contiguous arrays.

    Whole records are read a slice at a time: one pass, several times faster than reading
    field by field, with temporaries bounded by the slice.
    """
    columns = [np.empty(len(index), dtype=events.dtype[f]) for f in fields] + [np.empty(len(index), np.int64)]
    for lo in range(0, len(index), _READ_ROWS):
        records = events.take(index[lo : lo + _READ_ROWS])
        for column, name in zip(columns, fields):
            column[lo : lo + len(records)] = records[name]
        columns[-1][lo : lo + len(records)] = time(records)
    return columns


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

    def to_dict(self) -> dict:
        """Everything as JSON-ready builtins.

        Example:
            >>> report.to_dict()["overall"]["stall_ns"]
        """
        return {
            "world_size": self.world_size,
            "window_start_ns": self.window_start_ns,
            "window_ns": self.window_ns,
            "overall": dict(self.overall),
            "per_rank": [dict(row) for row in self.per_rank],
            "per_sm": [dict(row) for row in self.per_sm],
            "top_stalls": [dict(row) for row in self.top_stalls],
        }

    def to_json(self, path: str | None = None) -> str:
        """The report as JSON text, also written to ``path`` when given.

        Example:
            >>> report.to_json("analysis/report.json")
        """
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    def to_csv(self, directory: str) -> list[str]:
        """Write ``per_sm.csv``, ``per_rank.csv`` and ``top_stalls.csv``; returns their paths.

        None is written as an empty cell.

        Example:
            >>> paths = report.to_csv("analysis/")
        """
        os.makedirs(directory, exist_ok=True)
        paths = []
        for name, fields, rows in (
            ("per_sm.csv", PER_SM_FIELDS, self.per_sm),
            ("per_rank.csv", PER_RANK_FIELDS, self.per_rank),
            ("top_stalls.csv", STALL_FIELDS, self.top_stalls),
        ):
            path = os.path.join(directory, name)
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=fields)
                writer.writeheader()
                writer.writerows(rows)
            paths.append(path)
        return paths

    def format_table(self) -> str:
        """Fixed-width text: per rank, the SMs that stalled longest, then the longest stalls.

        Lengths are microseconds with one decimal; stall start times are from the window start.

        Example:
            >>> print(report.format_table())
        """
        us = _microseconds
        lines = [
            f"window {us(self.window_ns)} us, {self.world_size} rank(s), "
            f"{len(self.per_sm)} SM(s) with events; times in us",
            "",
            "per rank",
        ]
        headers = ["rank", "compute", "comm", "wait", "overlap", "stall", "idle", "ratio", "bytes"]
        rows = []
        for row in [*self.per_rank, {**self.overall, "rank": "all"}]:
            lengths = [us(row[k]) for k in ("compute_ns", "comm_ns", "wait_ns", "overlap_ns", "stall_ns")]
            rows.append(
                [row["rank"], *lengths, us(row["idle_ns"]), f"{row['overlap_ratio']:.3f}", row["bytes_moved"]]
            )
        lines += _fixed_width(headers, rows)

        by_stall = sorted(self.per_sm, key=lambda r: (-r["stall_ns"], r["rank"], r["cu_id"]))
        lines += ["", f"per SM, longest stall first (at most {TABLE_SM_ROWS} of {len(self.per_sm)})"]
        headers = ["rank", "sm", "compute", "comm", "wait", "overlap", "stall", "idle", "bytes"]
        rows = [
            [r["rank"], r["cu_id"]]
            + [us(r[k]) for k in ("compute_ns", "comm_ns", "wait_ns", "overlap_ns", "stall_ns", "idle_ns")]
            + [r["bytes_moved"]]
            for r in by_stall[:TABLE_SM_ROWS]
        ]
        lines += _fixed_width(headers, rows)

        lines += ["", f"longest stalls ({len(self.top_stalls)})"]
        headers = ["rank", "sm", "pid", "tile", "op", "address", "start", "duration", "value", "released by"]
        rows = []
        for s in self.top_stalls:
            if s["releaser_rank"] is None:
                releaser = "-"
            else:
                at = us(s["releaser_start_ns"] - self.window_start_ns)
                releaser = f"rank {s['releaser_rank']} sm {s['releaser_cu_id']} {s['releaser_op']} at {at}"
            rows.append(
                [
                    s["rank"],
                    s["cu_id"],
                    s["pid"],
                    f"{s['pid_m']},{s['pid_n']}",
                    s["op"],
                    f"{s['address']:#x}",
                    us(s["start_ns"] - self.window_start_ns),
                    us(s["duration_ns"]),
                    s["value"],
                    releaser,
                ]
            )
        lines += _fixed_width(headers, rows)
        return "\n".join(lines)


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


def _top_stalls(events, starts, ends, releaser, scope_names, top) -> list[dict]:
    waits = np.nonzero(np.isin(events["event_id"], list(WAIT_EVENTS)))[0]
    duration = ends[waits] - starts[waits]
    # lexsort: longest first, then earliest start, then input order.
    chosen = waits[np.lexsort((waits, starts[waits], -duration))][: max(top, 0)]
    rows = []
    for i in chosen:
        event = events[i]
        row = {
            "rank": int(event["cur_rank"]),
            "cu_id": int(event["cu_id"]),
            "pid": int(event["pid"]),
            "pid_m": int(event["pid_m"]),
            "pid_n": int(event["pid_n"]),
            "op": event_name(int(event["event_id"]), scope_names),
            "address": int(event["address"]),
            "start_ns": int(starts[i]),
            "duration_ns": int(ends[i] - starts[i]),
            "value": int(event["value"]),
            "releaser_rank": None,
            "releaser_cu_id": None,
            "releaser_op": None,
            "releaser_start_ns": None,
        }
        if releaser[i] >= 0:
            source = events[releaser[i]]
            row["releaser_rank"] = int(source["cur_rank"])
            row["releaser_cu_id"] = int(source["cu_id"])
            row["releaser_op"] = event_name(int(source["event_id"]), scope_names)
            row["releaser_start_ns"] = int(source["start_ns"])
        rows.append(row)
    return rows


def analyze(
    events: np.ndarray, world_size: int, scope_names: dict[int, str] | None = None, top: int = 10
) -> Report:
    """Compute, communication, overlap, stall and idle time per SM, per rank and overall.

    Definitions are in the module docstring. ``events`` is an ``EVENT_DTYPE`` array on one
    clock (``Trace.events``), in any order.

    Example:
        >>> report = analyze(trace.events, trace.world_size, trace.scope_names, top=5)
        >>> report.per_rank[1]["stall_ns"], report.overall["overlap_ratio"]
        >>> report.top_stalls[0]["releaser_rank"]
    """
    events = np.asarray(events)
    if events.dtype != EVENT_DTYPE:
        raise TypeError(f"events have dtype {events.dtype}, expected iris_trace.events.EVENT_DTYPE")
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

    releaser = match_releasers(events)
    top_stalls = _top_stalls(events, starts, ends, releaser, scope_names, top)
    return Report(
        world_size=world_size,
        window_start_ns=window_start,
        window_ns=window_ns,
        per_sm=per_sm,
        per_rank=per_rank,
        overall=overall,
        top_stalls=top_stalls,
    )
