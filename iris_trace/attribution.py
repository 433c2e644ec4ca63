"""Why each wait waited: who released it, what that rank was doing first, and where the time went.

Every length is in nanoseconds on the merged trace's aligned clock.

**Wait attribution.** For every wait (``WAIT_EVENTS``: ``wait_until``, the device
barrier's, a collective's or a fused op's waits), :func:`iris_trace.matching.match_releasers`
finds the op that released it (a signal, atomic or store on the waiter's flag). The
*releaser's last step* is what the releaser's SM last finished before releasing: the
latest compute scope or wait on the releaser's ``(rank, SM)`` that ended at or before
the release started (a GEMM tile, say, or the releaser's own wait). The wait
``[start, end)`` then splits, in this order, into

* ``computing_ns``: the last step is a compute scope that had not ended yet
  (``[start, step end)``): the producer was still computing;
* ``releaser_waiting_ns``: the last step is a wait that had not ended yet: the
  releaser was itself stalled (follow it with :func:`critical_path`);
* ``not_started_ns``: between the end of the last step (or the wait's start, when
  there is none) and the releasing rank's first traced event: that rank had not
  started yet (its launch came later: host time before it, or a rank that left the last
  barrier later);
* ``not_released_ns``: the rest of the time up to the release's start in which the
  releaser's SM ran no traced communication: untraced work, or host code between two
  launches;
* ``in_flight_ns``: in that same stretch, the time the releaser's SM spent in traced
  communication (pushing the data the flag announces), then the release itself until it
  was issued (``release end``);
* ``late_look_ns``: the release had been issued but the waiter had not seen it yet
  (``[release end, end)``): the flag's way to the waiter's memory (an op's ``end_ns`` is
  when it was issued, not when it landed), the poll interval, or the waiter not running
  at all, as when ranks share a GPU and take turns;
* ``unattributed_ns``: no releaser was found (the wait ended on a value no traced op set).

Each piece is clipped to the wait, so the parts add up to the wait's length; a
release that seems to end after the wait did (clock alignment is good to its
residual, see ``Trace.clock_fits``) counts as in flight up to the wait's end.

**Tile lifecycles.** A tile is a ``(rank, pid_m, pid_n)`` with a compute scope that
carries those coordinates. It is *computed* when its last compute scope ends,
*pushed* from the first to the last data or release op of that rank carrying its
coordinates and aimed at another rank, *visible* at its peers when the last of those
ends, and *consumed* when the last wait on another rank released by one of them ends.
Ops a rank aims at itself (the flag a GEMM program raises for the program that will
push the tile) are the handover inside the rank: they fall in ``queued``.
:func:`tile_lifecycles` gives each tile's times; :func:`lifecycle_summary` the median
and 99th percentile, per rank, of ``queued`` (computed to first push), ``push`` (first
push to visible), ``latency`` (computed to visible) and ``consumed`` (visible to
consumed).

**Critical path.** :func:`critical_path` walks back from the event that ended last:
from a wait to its releaser (or, when the release had been issued before the wait began, to
what the waiter's SM did before: the waiter was the late one), from a release to the
compute scope before it on its SM (the producer step), from a compute scope to the wait
before it on its SM, and so on, to a wait with no releaser or an SM with nothing
earlier. Read forwards, it is the chain of compute, release and wait that set the end
of the traced call; a gap between two steps is time in which nothing traced ran on
that path (host code, untraced work), which the report shows.

Example:
    >>> from iris_trace.attribution import attribute_waits, summarize_waits
    >>> causes = attribute_waits(trace.events)
    >>> groups = wait_groups(trace.events, causes, trace.scope_names)
    >>> for line in summarize_waits(groups, trace.world_size):
    ...     print(line)
"""

from __future__ import annotations

import numpy as np

from .events import EVENT_DTYPE
from .intervals import Coverage
from .matching import COMM, COMPUTE, _latest_at_or_before, categories, match_releasers, sm_index, sm_keys
from .schema import DATA_EVENTS, RELEASE_EVENTS, SCOPE_BASE, WAIT_EVENTS, event_name

#: The parts a wait splits into (module docstring), in the order they are reported.
PARTS = (
    "computing_ns",
    "releaser_waiting_ns",
    "not_started_ns",
    "not_released_ns",
    "in_flight_ns",
    "late_look_ns",
    "unattributed_ns",
)
#: How each part reads in the report's sentences.
PART_WORDS = {
    "computing_ns": "the producer was still computing",
    "releaser_waiting_ns": "the releaser was itself waiting",
    "in_flight_ns": "the data and flag were in flight",
    "late_look_ns": "the flag had been sent but the waiter had not seen it yet",
    "not_started_ns": "the releasing rank had not started yet",
    "not_released_ns": "the releaser was running untraced work or host code",
    "unattributed_ns": "no traced op released it",
}
_NO_TIME = np.iinfo(np.int64).min
#: Ranks whose first traced events lie this far apart get a line in the report's summary.
START_SPREAD_NS = 10_000


def attribute_waits(events: np.ndarray, releaser: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every wait's releaser, producer step and split (module docstring), as columns.

    ``releaser`` is :func:`~iris_trace.matching.match_releasers` of ``events`` when the
    caller has it already (it is the costly part); else it is computed here.

    Returns a dict of equal-length numpy arrays, one row per wait in input order:
    ``index`` (into ``events``), ``rank``, ``cu_id``, ``event_id``, ``start_ns``, ``end_ns``,
    ``releaser`` (index, -1: none), ``producer`` (index of the releaser's last step, -1: none),
    and the parts of :data:`PARTS`.

    Example:
        >>> causes = attribute_waits(trace.events)
        >>> causes["computing_ns"].sum() / (causes["end_ns"] - causes["start_ns"]).sum()
    """
    events = np.asarray(events)
    if events.dtype != EVENT_DTYPE:
        raise TypeError(f"events have dtype {events.dtype}, expected iris_trace.events.EVENT_DTYPE")
    waits = np.flatnonzero(np.isin(events["event_id"], list(WAIT_EVENTS)))
    starts = events["start_ns"].astype(np.int64)
    ends = np.maximum(events["end_ns"].astype(np.int64), starts)
    if releaser is None:
        releaser = match_releasers(events)
    releaser = releaser[waits]

    # The releaser's last step: the latest compute scope or wait on its SM ended by the release's start.
    producer = np.full(len(waits), -1, dtype=np.int64)
    released = releaser >= 0
    kind = categories(events["event_id"])
    steps = np.flatnonzero(kind != COMM)
    if len(steps) and released.any():
        sm_key = sm_keys(events)
        sources = releaser[released]
        found = _latest_at_or_before([sm_key[steps]], ends[steps], [sm_key[sources]], starts[sources])
        producer[released] = np.where(found >= 0, steps[np.maximum(found, 0)], -1)

    w_start, w_end = starts[waits], ends[waits]
    length = w_end - w_start
    source = np.maximum(releaser, 0)
    r_start = np.where(released, starts[source], w_end)
    r_end = np.where(released, ends[source], w_end)
    has_step = producer >= 0
    step = np.maximum(producer, 0)
    step_computes = has_step & (kind[step] == COMPUTE)

    # Boundaries inside [w_start, w_end], in order: step | releasing rank's start | up to the
    # release | release | late look.
    stepped = np.clip(np.where(has_step, ends[step], w_start), w_start, w_end)
    releasing = np.clip(r_start, stepped, w_end)
    started = np.clip(_first_starts(events, starts)[events["cur_rank"][source]], stepped, releasing)
    issued = np.clip(r_end, releasing, w_end)
    pushing = _communicating(events, kind, source, stepped, releasing)
    step_part = np.where(released, stepped - w_start, 0)
    parts = {
        "computing_ns": np.where(step_computes, step_part, 0),
        "releaser_waiting_ns": np.where(step_computes, 0, step_part),
        "not_started_ns": np.where(released, started - stepped, 0),
        "not_released_ns": np.where(released, releasing - started - pushing, 0),
        "in_flight_ns": np.where(released, pushing + issued - releasing, 0),
        "late_look_ns": np.where(released, w_end - issued, 0),
        "unattributed_ns": np.where(released, 0, length),
    }
    return {
        "index": waits,
        "rank": events["cur_rank"][waits].astype(np.int64),
        "cu_id": events["cu_id"][waits].astype(np.int64),
        "event_id": events["event_id"][waits].astype(np.int64),
        "start_ns": w_start,
        "end_ns": w_end,
        "releaser": releaser,
        "producer": producer,
        **{name: parts[name].astype(np.int64) for name in PARTS},
    }


def _first_starts(events, starts) -> np.ndarray:
    """Each rank's first traced start (indexed by rank; ranks with no events: the latest time)."""
    ranks = events["cur_rank"].astype(np.int64)
    first = np.full(int(ranks.max()) + 1 if len(ranks) else 1, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, ranks, starts)
    return first


def _communicating(events, kind, source, lo, hi) -> np.ndarray:
    """How much of ``[lo, hi)`` the SM of each ``source`` event spent in traced communication."""
    if len(source) == 0 or not (hi > lo).any():
        return np.zeros(len(source), dtype=np.int64)
    _, sm = sm_index(events)
    comm = np.flatnonzero(kind == COMM)
    starts = events["start_ns"][comm].astype(np.int64)
    ends = np.maximum(events["end_ns"][comm].astype(np.int64), starts)
    cover = Coverage(sm[comm], starts, ends, np.ones((len(comm), 1), dtype=bool), int(sm.max()) + 1)
    return cover.length_within((0,), sm[source], lo, hi)


def step_held_up(split):
    """Whether the releaser's last step held the wait up: it was still running when the wait began.

    ``split`` holds a wait's parts (a row of :func:`attribute_waits`, or its columns: then
    one answer per wait). A step that had ended before the wait began is not its cause.

    Example:
        >>> step_held_up(report.top_stalls[0])
        True
    """
    return split["computing_ns"] + split["releaser_waiting_ns"] > 0


def wait_groups(
    events: np.ndarray, causes: dict[str, np.ndarray], scope_names: dict[int, str] | None = None
) -> list[dict]:
    """Wait time per (waiting rank, wait op, releasing rank, releaser's last step), longest first.

    Each row: ``rank``, ``op``, ``releaser_rank`` (None: unreleased), ``producer`` (the name of
    the releaser's last step, a scope or a wait, where that step was still running when the
    wait began; else None: a step that had ended before held nothing up), ``producer_tile``
    (which of the producer's tiles: ``"(2,3)"``, or ``"(2)"`` for scopes that name only
    ``pid_m``, when one tile has half of the group's wait time or more, ``"(2,*)"`` or
    ``"(*,3)"`` when they all share a row or a column, else None), ``waits``, ``wait_ns``,
    ``share`` (of the rank's wait time) and the parts.

    Example:
        >>> wait_groups(trace.events, attribute_waits(trace.events))[0]["producer"]
        'gemm tile'
    """
    rows: dict[tuple, dict] = {}
    tiles: dict[tuple, dict[tuple[int, int], int]] = {}
    totals: dict[int, int] = {}
    length = causes["end_ns"] - causes["start_ns"]
    held_up = step_held_up(causes)
    for i in range(len(causes["index"])):
        rank = int(causes["rank"][i])
        source = int(causes["releaser"][i])
        step = int(causes["producer"][i]) if held_up[i] else -1
        key = (
            rank,
            event_name(int(causes["event_id"][i]), scope_names),
            int(events["cur_rank"][source]) if source >= 0 else None,
            event_name(int(events["event_id"][step]), scope_names) if step >= 0 else None,
        )
        row = rows.get(key)
        if row is None:
            row = rows[key] = {
                "rank": key[0],
                "op": key[1],
                "releaser_rank": key[2],
                "producer": key[3],
                "waits": 0,
                "wait_ns": 0,
                **dict.fromkeys(PARTS, 0),
            }
        row["waits"] += 1
        row["wait_ns"] += int(length[i])
        for name in PARTS:
            row[name] += int(causes[name][i])
        totals[rank] = totals.get(rank, 0) + int(length[i])
        if step >= 0 and events["pid_m"][step] >= 0:
            tile = (int(events["pid_m"][step]), int(events["pid_n"][step]))
            waited = tiles.setdefault(key, {})
            waited[tile] = waited.get(tile, 0) + int(length[i])
    for key, row in rows.items():
        row["producer_tile"] = _tile_label(tiles.get(key, {}), row["wait_ns"])
    ordered = sorted(rows.values(), key=lambda r: (-r["wait_ns"], r["rank"], r["op"]))
    for row in ordered:
        row["share"] = row["wait_ns"] / totals[row["rank"]] if totals[row["rank"]] else 0.0
    return ordered


def _tile_label(waited: dict[tuple[int, int], int], total_ns: int) -> str | None:
    # Which producer tiles a group of waits waited for (wait_groups' ``producer_tile``).
    if not waited:
        return None
    (pid_m, pid_n), most = max(waited.items(), key=lambda item: item[1])
    if 2 * most >= total_ns:
        return f"({pid_m},{pid_n})" if pid_n >= 0 else f"({pid_m})"  # a scope may name only pid_m
    if len({m for m, _ in waited}) == 1 and pid_n >= 0:
        return f"({pid_m},*)"
    if len({n for _, n in waited}) == 1 and pid_n >= 0:
        return f"(*,{pid_n})"
    return None


def seen_latency(events: np.ndarray, causes: dict[str, np.ndarray]) -> list[dict]:
    """How soon an issued release was seen, per (releasing rank, waiting rank).

    Only waits that were already polling when their release was issued count (the
    release's ``end_ns`` at or after the wait's start): for those, ``wait end - release
    end`` is the flag's way to the waiter's memory plus at most one poll, with no
    lateness of the waiter in it. Between two GPUs it is the link's latency (a few
    microseconds over NVLink); a floor far above that says the flag was held up on its
    way or the clocks' alignment is off there, and a negative one that the alignment is.
    It is what a *late look* is made of when the waiter was not late.

    Many waits can watch one release (every pusher of a kernel polls the peer's entry
    flag), so each row also names its slowest release, timed by the first of its waits
    to see it: its heap ``address``, how many waits saw it, and whether it was the
    releaser's first release to that rank in the trace (when the NVLink links slept, 50 ms
    or more without traffic, a launch's first flag each way arrives about 105 us late;
    docs/tracing.md).

    Returns one row per pair with such waits, ordered by (releaser rank, rank):
    ``releaser_rank``, ``rank``, ``waits``, ``min_ns``, ``median_ns``, ``slowest_ns``,
    ``slowest_address``, ``slowest_waits``, ``slowest_is_first``.

    Example:
        >>> seen_latency(trace.events, attribute_waits(trace.events))[0]["median_ns"]
        1984
    """
    source = causes["releaser"]
    released = source >= 0
    safe = np.maximum(source, 0)
    starts = events["start_ns"].astype(np.int64)
    issued = np.maximum(events["end_ns"].astype(np.int64), starts)[safe]
    polling = released & (issued >= causes["start_ns"])
    if not polling.any():
        return []
    latency = (causes["end_ns"] - issued)[polling]
    releases = source[polling]
    # One pass over the waits, grouped by (releaser rank, rank), and one over the releases
    # for each pair's earliest (a trace holds millions of events; pairs grow as ranks^2).
    ranks = int(max(events["cur_rank"].max(), events["target_rank"].max(), causes["rank"].max())) + 1
    pair_key = events["cur_rank"][releases].astype(np.int64) * ranks + causes["rank"][polling]
    sent = np.flatnonzero(np.isin(events["event_id"], list(RELEASE_EVENTS)) & (events["target_rank"] >= 0))
    sent_key = events["cur_rank"][sent].astype(np.int64) * ranks + events["target_rank"][sent]
    first_sent = np.full(ranks * ranks, np.iinfo(np.int64).max)
    np.minimum.at(first_sent, sent_key, starts[sent])
    order = np.argsort(pair_key, kind="stable")
    keys, bounds = np.unique(pair_key[order], return_index=True)
    rows = []
    for key, lo, hi in zip(keys.tolist(), bounds, [*bounds[1:], len(order)]):
        group = order[lo:hi]
        mine = latency[group]
        watched, which = np.unique(releases[group], return_inverse=True)
        seen_first = np.full(len(watched), np.iinfo(np.int64).max)
        np.minimum.at(seen_first, which, mine)
        slowest = int(np.argmax(seen_first))
        release = int(watched[slowest])
        rows.append(
            {
                "releaser_rank": key // ranks,
                "rank": key % ranks,
                "waits": int(len(mine)),
                "min_ns": int(mine.min()),
                "median_ns": int(np.median(mine)),
                "slowest_ns": int(seen_first[slowest]),
                "slowest_address": int(events["address"][release]),
                "slowest_waits": int(np.count_nonzero(which == slowest)),
                # A release this wait saw was sent to it, whatever target it names.
                "slowest_is_first": bool(starts[release] <= first_sent[key]),
            }
        )
    return rows


def summarize_waits(
    groups: list[dict], world_size: int, lifecycle: dict | None = None, starts: dict | None = None
) -> list[str]:
    """The report's first lines: per rank, where most of its wait time went, in words.

    ``lifecycle`` (:func:`lifecycle_summary`) adds each rank's tile push latency;
    ``starts`` (:func:`first_events`) a line when the ranks started
    :data:`START_SPREAD_NS` or more apart.

    Example:
        >>> summarize_waits(wait_groups(events, causes), 2)[0]
        '62% of wait time on rank 1 (1.2 ms) is wait_until for rank 0's gemm tile: ...'
    """
    lines = []
    for rank in range(world_size):
        mine = [g for g in groups if g["rank"] == rank]
        total = sum(g["wait_ns"] for g in mine)
        if not mine or total == 0:
            continue
        top = mine[0]
        if top["releaser_rank"] is None:
            whom = "a value no traced op set"
        elif top["producer"] is None:
            whom = f"rank {top['releaser_rank']}"
        else:
            tile = f" {top['producer_tile']}" if top.get("producer_tile") else ""
            whom = f"rank {top['releaser_rank']}'s {top['producer']}{tile}"
        # Parts that round to 0% say nothing: leave them out.
        split = sorted(((top[p], p) for p in PARTS if top[p] * 200 >= top["wait_ns"] > 0), reverse=True)
        reasons = "; ".join(f"{PART_WORDS[p]} ({100 * n / top['wait_ns']:.0f}%)" for n, p in split)
        waits = sum(g["waits"] for g in mine)
        lines.append(
            f"{100 * top['share']:.0f}% of wait time on rank {rank} ({_duration(total)} summed over "
            f"{waits} wait{'s' if waits != 1 else ''}) is {top['op']} for {whom}: {reasons}"
        )
    if starts and starts["spread_ns"] >= START_SPREAD_NS:
        total = sum(g["wait_ns"] for g in groups)
        unstarted = sum(g["not_started_ns"] for g in groups)
        share = f"{100 * unstarted / total:.0f}%" if total else "none"
        lines.append(
            f"rank {starts['last']}'s first traced event came {_duration(starts['spread_ns'])} "
            f"after rank {starts['first']}'s (its launch began later: host time before it, or a "
            f"later exit from the last barrier); waits on a rank that had not started yet took {share} "
            "of all wait time"
        )
    if lifecycle:
        for rank, stats in sorted(lifecycle.items()):
            latency = stats.get("latency_ns")
            if latency and latency["count"]:
                lines.append(
                    f"rank {rank}: {latency['count']} tiles, median tile push latency (computed to "
                    f"visible at the peers) {_duration(latency['median'])}, p99 {_duration(latency['p99'])}"
                )
    return lines


def first_events(events: np.ndarray) -> dict | None:
    """When each rank's first traced event began, and which ranks began first and last.

    Returns ``{"first_ns": {rank: ns}, "first": rank, "last": rank, "spread_ns": ns}``, or
    None with fewer than two ranks in ``events``. A rank whose launch began later than
    the others' leaves its peers waiting with nothing to blame but that start
    (``not_started_ns`` of :func:`attribute_waits`).

    Example:
        >>> first_events(trace.events)["spread_ns"]
        103424
    """
    events = np.asarray(events)
    ranks = np.unique(events["cur_rank"])
    if len(ranks) < 2:
        return None
    firsts = _first_starts(events, events["start_ns"].astype(np.int64))
    first_ns = {int(r): int(firsts[r]) for r in ranks}
    first = min(first_ns, key=first_ns.get)
    last = max(first_ns, key=first_ns.get)
    return {"first_ns": first_ns, "first": first, "last": last, "spread_ns": first_ns[last] - first_ns[first]}


def tile_lifecycles(events: np.ndarray, releaser: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Each tile's computed, pushed, visible and consumed times (module docstring), as columns.

    ``releaser``: :func:`~iris_trace.matching.match_releasers` of ``events``, if at hand.

    Returns arrays ``rank``, ``pid_m``, ``pid_n``, ``computed_ns``, ``push_start_ns``,
    ``visible_ns`` and ``consumed_ns`` (``-1`` where a tile was never pushed or consumed).

    Example:
        >>> tiles = tile_lifecycles(trace.events)
        >>> np.median(tiles["visible_ns"] - tiles["computed_ns"])
    """
    events = np.asarray(events)
    ids = events["event_id"].astype(np.int64)
    starts = events["start_ns"].astype(np.int64)
    ends = np.maximum(events["end_ns"].astype(np.int64), starts)
    tiled = (events["pid_m"] >= 0) & (events["pid_n"] >= 0)
    rank = events["cur_rank"].astype(np.int64)
    key = (rank << 42) | (events["pid_m"].astype(np.int64) << 21) | events["pid_n"].astype(np.int64)

    computed = tiled & (ids >= SCOPE_BASE)
    tiles, inverse = np.unique(key[computed], return_inverse=True)
    out = {
        "rank": tiles >> 42,
        "pid_m": (tiles >> 21) & 0x1FFFFF,
        "pid_n": tiles & 0x1FFFFF,
        "computed_ns": np.full(len(tiles), _NO_TIME, dtype=np.int64),
        "push_start_ns": np.full(len(tiles), -1, dtype=np.int64),
        "visible_ns": np.full(len(tiles), -1, dtype=np.int64),
        "consumed_ns": np.full(len(tiles), -1, dtype=np.int64),
    }
    np.maximum.at(out["computed_ns"], inverse, ends[computed])
    if len(tiles) == 0:
        return out

    target = events["target_rank"].astype(np.int64)
    moved = tiled & np.isin(ids, list(DATA_EVENTS | RELEASE_EVENTS)) & (target >= 0) & (target != rank)
    position = np.searchsorted(tiles, key[moved])
    inside = position < len(tiles)
    inside[inside] = tiles[position[inside]] == key[moved][inside]
    first = np.full(len(tiles), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, position[inside], starts[moved][inside])
    np.maximum.at(out["visible_ns"], position[inside], ends[moved][inside])
    out["push_start_ns"] = np.where(first == np.iinfo(np.int64).max, -1, first)

    # Consumed: the last wait on another rank released by one of the tile's ops.
    if releaser is None:
        releaser = match_releasers(events)
    waits = np.flatnonzero(releaser >= 0)
    source = releaser[waits]
    by_tile = moved[source] & (rank[waits] != rank[source])
    if by_tile.any():
        position = np.searchsorted(tiles, key[source[by_tile]])
        ok = position < len(tiles)
        ok[ok] = tiles[position[ok]] == key[source[by_tile]][ok]
        np.maximum.at(out["consumed_ns"], position[ok], ends[waits[by_tile]][ok])
    return out


def lifecycle_summary(tiles: dict[str, np.ndarray]) -> dict[int, dict]:
    """Per rank: median and p99 of ``queued``, ``push``, ``latency`` and ``consumed`` (ns).

    Example:
        >>> lifecycle_summary(tile_lifecycles(trace.events))[0]["latency_ns"]["median"]
    """
    summary: dict[int, dict] = {}
    pushed = tiles["push_start_ns"] >= 0
    spans = {
        "queued_ns": (tiles["push_start_ns"] - tiles["computed_ns"], pushed),
        "push_ns": (tiles["visible_ns"] - tiles["push_start_ns"], pushed),
        "latency_ns": (tiles["visible_ns"] - tiles["computed_ns"], pushed),
        "consumed_ns": (tiles["consumed_ns"] - tiles["visible_ns"], pushed & (tiles["consumed_ns"] >= 0)),
    }
    for rank in np.unique(tiles["rank"]).tolist():
        mine = tiles["rank"] == rank
        stats = {}
        for name, (values, valid) in spans.items():
            chosen = values[mine & valid]
            stats[name] = {
                "count": int(len(chosen)),
                "median": int(np.median(chosen)) if len(chosen) else None,
                "p99": int(np.percentile(chosen, 99)) if len(chosen) else None,
            }
        summary[int(rank)] = stats
    return summary


def critical_path(events: np.ndarray, releaser: np.ndarray | None = None, limit: int = 64) -> list[int]:
    """Indices of the events on the chain that set the trace's end, earliest first (module docstring).

    Backwards from the event that ended last: a wait steps to its releaser, unless the
    release had been issued before the wait began (the waiter arrived late, so what it did
    before set the pace: the walk goes on as for any other op); a compute scope steps to
    the latest wait that ended on its SM before it began; any other op (a release, a
    push) to the latest compute scope or wait that ended on its SM before it began,
    whichever ended later. The walk stops at a wait nothing traced released, or where
    the SM has nothing earlier.

    Example:
        >>> [event_name(int(e)) for e in trace.events["event_id"][critical_path(trace.events)]]
        ['scope0', 'signal', 'wait_until', 'put']
    """
    events = np.asarray(events)
    if len(events) == 0:
        return []
    if releaser is None:
        releaser = match_releasers(events)
    starts = events["start_ns"].astype(np.int64)
    ends = np.maximum(events["end_ns"].astype(np.int64), starts)
    sm_key = sm_keys(events)
    kind = categories(events["event_id"])
    is_wait = np.isin(events["event_id"], list(WAIT_EVENTS))
    waits = _BySmAndEnd(np.flatnonzero(is_wait), sm_key, ends)
    computes = _BySmAndEnd(np.flatnonzero(kind == COMPUTE), sm_key, ends)

    chain = [int(np.argmax(ends))]
    while len(chain) < limit:
        current = chain[-1]
        source = int(releaser[current]) if is_wait[current] else -1
        if is_wait[current] and (source < 0 or ends[source] > starts[current]):
            step = source
        elif kind[current] == COMPUTE:
            step = waits.latest(sm_key[current], starts[current])
        else:
            before = (waits, computes)
            candidates = [c for c in (b.latest(sm_key[current], starts[current]) for b in before) if c >= 0]
            step = max(candidates, key=lambda c: ends[c]) if candidates else -1
        if step < 0 or step in chain:
            break
        chain.append(step)
    return chain[::-1]


class _BySmAndEnd:
    """Events sorted by (SM, end): the latest one on an SM that ended by a given time."""

    def __init__(self, index: np.ndarray, sm_key: np.ndarray, ends: np.ndarray):
        order = np.lexsort((ends[index], sm_key[index]))
        self.index = index[order]
        self.keys = sm_key[self.index]
        self.ends = ends[self.index]

    def latest(self, key: int, by: int) -> int:
        lo = np.searchsorted(self.keys, key, side="left")
        hi = np.searchsorted(self.keys, key, side="right")
        at = lo + np.searchsorted(self.ends[lo:hi], by, side="right") - 1
        return int(self.index[at]) if at >= lo else -1


def _duration(ns) -> str:
    ns = float(ns)
    if abs(ns) >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if abs(ns) >= 1e3:
        return f"{ns / 1e3:.1f} us"
    return f"{ns:.0f} ns"
