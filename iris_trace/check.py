"""Protocol checks over a merged trace: ``iris-trace check``, a linter for flag protocols.

A trace holds every remote op of every rank with its time, program, target rank, heap
offset and value, and :func:`iris_trace.matching.match_releasers` says which op released
each wait. From that, mistakes of hand-written protocols show up as patterns, whatever
the kernel:

``stale-flag``
    A program's wait on a flag passes when the flag has been raised fewer times than that
    program has waited on it, and the flag is raised again later: the wait did not wait, it
    passed on the value left from a round before (the flag was not reset, or the expected
    value not advanced). What it guards was read before it was written.

``data-after-signal``
    A program raises a flag that releases another rank's ``wait_until``, then writes data
    to that rank, and its rank raises nothing to that rank afterwards (no signal, no
    barrier): no wait orders those writes before the reader's reads (the signal must
    follow the writes it publishes). Only what comes last to a rank can be judged: a write
    followed by a later release (the next round's signal, a barrier) may be published by
    it, so a protocol that signals too early in every round is found in its last round.

``raised-twice``
    A flag is set (``iris.signal(..., op="set")``) to the same value twice and no wait on
    it ends between the two: whoever waits sees one raise where two were sent, so one
    round's hand-off is lost (the second raise came before the flag was consumed and
    reset). Adds count every raise and are not judged; neither is a flag no wait in the
    trace waits on (it may be polled some other way).

``racing-writes``
    Two ranks write data to the same place of one rank's memory (the same first heap
    offset) and nothing orders the two writes: no chain of synchronisations (a wait and
    the release it saw, an atomic and the release before it on its flag) leads from the
    end of one write to the start of the other, and their launches ran together: the same
    step of the program (the same kernel's launch of the same index on the two ranks) or
    at the same time. Which value the memory keeps depends on timing. Other launches are
    taken as ordered by the host (a barrier between steps); writes to a block's other
    offsets than its first are not compared (a tile's bytes are strided, so ranges would
    overlap where the tiles do not).

Each finding names the check, the ranks, SMs, programs, ops, heap offsets and times
(microseconds from the trace's first event), the event indices in the merged trace and,
where the trace knows them, the source lines that issued those events (``iris_trace.sites``).
Waits the library issues for its own protocols (the device barrier, collectives, fused
ops) are checked by the first rule and not by the second, whose pattern a library
handshake at a kernel's start (then its data, then a device barrier) also has.

Example:
    >>> from iris_trace import Trace, check
    >>> findings = check.run(Trace.from_files(paths))
    >>> print("\\n".join(f.message for f in findings) or "clean")
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from .matching import match_releasers
from .schema import (
    DATA_EVENTS,
    DMA_PUT,
    GET,
    LOAD,
    RELEASE_EVENTS,
    SIGNAL,
    SIGNAL_OPS,
    WAIT_EVENTS,
    WAIT_UNTIL,
    event_name,
)
from .sites import launch_at, launch_keys

#: The checks, by name, with what each finding of it means (``iris-trace check --help`` lists them).
CHECKS = {
    "stale-flag": "a wait passed on a flag value left from an earlier round (raised again later)",
    "data-after-signal": "data written to a rank after the signal that released its wait, none after",
    "raised-twice": "a flag set to one value twice with no wait on it ending between: one raise is lost",
    "racing-writes": "two ranks wrote the same place of one rank's memory with nothing ordering the writes",
}
#: Writes of data to another rank's memory (not reads, not the copy engine's, which has no program).
_WRITES = frozenset(DATA_EVENTS - {LOAD, GET, DMA_PUT})


@dataclass
class Finding:
    """One protocol mistake: which check, in words, and the events that show it.

    Example:
        >>> finding.check, finding.ranks, finding.events
        ('stale-flag', (1, 0), (812, 344, 990))
    """

    check: str
    message: str
    ranks: tuple[int, ...]
    events: tuple[int, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {
            "check": self.check,
            "message": self.message,
            "ranks": list(self.ranks),
            "events": list(self.events),
        }


def run(trace, checks: tuple[str, ...] | None = None) -> list[Finding]:
    """Every finding of ``checks`` (default: all of :data:`CHECKS`) in ``trace``, ordered by time.

    Args:
        trace: a merged :class:`iris_trace.Trace`.
        checks: names from :data:`CHECKS`.

    Example:
        >>> [f.check for f in run(trace)]
        ['data-after-signal']
    """
    chosen = tuple(CHECKS) if checks is None else tuple(checks)
    unknown = [name for name in chosen if name not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; the checks are {', '.join(CHECKS)}")
    if getattr(trace, "sample_period", 1) > 1:
        # A raise by a program that was not sampled is missing: every count would be short.
        raise ValueError(
            f"the trace recorded one program in {trace.sample_period} (enable(sample=...)); the protocol "
            "checks need every program's ops: trace the run again without sample="
        )
    events = trace.events
    releaser = match_releasers(events)
    origin = int(events["start_ns"].min()) if len(events) else 0
    findings: list[Finding] = []
    if "stale-flag" in chosen:
        findings += stale_flags(events, origin)
    if "data-after-signal" in chosen:
        findings += data_after_signal(events, releaser, origin)
    if "raised-twice" in chosen:
        findings += raised_twice(events, origin)
    if "racing-writes" in chosen:
        findings += racing_writes(events, releaser, origin, _launch_steps(trace))
    origins = getattr(trace, "origins", None)
    if origins is not None:
        findings = [_with_call_sites(finding, origins) for finding in findings]
    return sorted(findings, key=lambda f: int(events["start_ns"][f.events[0]]))


def _with_call_sites(finding: Finding, origins) -> Finding:
    # The finding's message ends with the source lines of its events, where known.
    site_at, _, labels = origins
    lines = list(dict.fromkeys(labels[site_at[index]] for index in finding.events))
    lines = [line for line in lines if line != labels[0]]  # labels[0]: unknown
    if lines:
        finding.message += f" (call sites: {'; '.join(lines)})"
    return finding


def stale_flags(events: np.ndarray, origin: int = 0) -> list[Finding]:
    """``stale-flag`` findings (module docstring).

    A program's ``n``-th wait on a flag needs ``n`` raises of it: each raise releases at
    most one round, whatever the protocol counts (a set to 1 and a reset, an epoch that
    grows, several ranks adding). Waits are counted from the flag's first raise in the
    trace, so raises from before tracing began do not count against them.

    Example:
        >>> stale_flags(trace.events)
        []
    """
    released = _releases_by_flag(events)
    waits = np.flatnonzero(np.isin(events["event_id"], list(WAIT_EVENTS)))
    findings = []
    counted: dict[tuple, int] = {}  # (rank, program, offset) -> its waits so far
    reported: set[tuple] = set()
    for index in waits[np.argsort(events["end_ns"][waits], kind="stable")]:
        wait = events[index]
        rank, offset, end = int(wait["cur_rank"]), int(wait["address"]), int(wait["end_ns"])
        raises = released.get((rank, offset))
        if raises is None or end < int(events["start_ns"][raises[0]]):
            continue  # no raise of this flag in the trace yet: it may have come before tracing
        key = (rank, int(wait["pid"]), offset)
        counted[key] = counted.get(key, 0) + 1
        seen = int(np.searchsorted(events["start_ns"][raises], end, side="right"))
        if counted[key] <= seen or seen == len(raises) or key in reported:
            continue  # enough raises, or none after it (a last check of a value, not a round)
        reported.add(key)
        last, again = events[raises[seen - 1]], events[raises[seen]]
        message = (
            f"rank {rank} {_where(wait)} passed its wait number {counted[key]} on {_flag(wait)} "
            f"({event_name(int(wait['event_id']))}, ended {_us(end, origin)}) when only {seen} raise(s) "
            f"of the flag had begun, the last rank {int(last['cur_rank'])}'s {_op(last)} at "
            f"{_us(last['start_ns'], origin)}; rank {int(again['cur_rank'])} raised it again only at "
            f"{_us(again['start_ns'], origin)}: the wait passed on the value of an earlier round; reset "
            "the flag or advance the expected value each round"
        )
        ranks = (rank, int(last["cur_rank"]))
        findings.append(
            Finding("stale-flag", message, ranks, (int(index), int(raises[seen - 1]), int(raises[seen])))
        )
    return findings


def data_after_signal(events: np.ndarray, releaser: np.ndarray, origin: int = 0) -> list[Finding]:
    """``data-after-signal`` findings (module docstring).

    Example:
        >>> data_after_signal(trace.events, match_releasers(trace.events))
        []
    """
    user_waits = np.flatnonzero((releaser >= 0) & (events["event_id"] == WAIT_UNTIL))
    if len(user_waits) == 0:
        return []
    # The releases that let a user wait through, by the program that issued them and its target.
    signalled: dict[tuple, list[tuple[int, int]]] = {}
    for wait in user_waits:
        source = int(releaser[wait])
        key = _program_to(events[source])
        signalled.setdefault(key, []).append((source, int(wait)))
    last_release = _last_release_time(events)
    writes = np.flatnonzero(np.isin(events["event_id"], list(_WRITES)))
    releasing = set(releaser[releaser >= 0].tolist())  # a write that is itself a flag's release
    findings = []
    reported: set[tuple] = set()
    for index in writes[np.argsort(events["start_ns"][writes], kind="stable")]:
        write = events[index]
        key = _program_to(write)
        if key not in signalled or key in reported or int(index) in releasing:
            continue
        start = int(write["start_ns"])
        if last_release.get(key[::3], -1) > start:
            continue  # a later release of this rank to that rank (a signal, a barrier) may publish it
        before = [(s, w) for s, w in signalled[key] if int(events["start_ns"][s]) <= start]
        if not before:
            continue
        source, wait = before[-1]
        reported.add(key)  # one finding per program and target: the first write it left unpublished
        signal, waited = events[source], events[wait]
        message = (
            f"rank {int(write['cur_rank'])} {_where(write)} wrote {int(write['payload_bytes'])} bytes at "
            f"heap offset {int(write['address']):#x} of rank {int(write['target_rank'])} ({_op(write)} at "
            f"{_us(start, origin)}) after its {_op(signal)} at {_us(signal['start_ns'], origin)} had "
            f"released rank {int(waited['cur_rank'])}'s wait on {_flag(waited)} (ended "
            f"{_us(waited['end_ns'], origin)}), and raised nothing to that rank afterwards: the reader "
            "may read before the data lands; signal after the writes"
        )
        ranks = (int(write["cur_rank"]), int(write["target_rank"]))
        findings.append(Finding("data-after-signal", message, ranks, (int(index), source, wait)))
    return findings


def raised_twice(events: np.ndarray, origin: int = 0) -> list[Finding]:
    """``raised-twice`` findings (module docstring): one per flag, its first lost raise.

    Example:
        >>> raised_twice(trace.events)
        []
    """
    is_set = (events["event_id"] == SIGNAL) & (events["sub"] == SIGNAL_OPS.index("set"))
    waits = np.flatnonzero(np.isin(events["event_id"], list(WAIT_EVENTS)))
    wait_ends: dict[tuple[int, int], list[int]] = {}
    for index in waits:
        key = (int(events["cur_rank"][index]), int(events["address"][index]))
        wait_ends.setdefault(key, []).append(int(events["end_ns"][index]))
    findings = []
    for (rank, offset), releases in _releases_by_flag(events).items():
        if (rank, offset) not in wait_ends:
            continue  # no wait on it in the trace: how it is consumed cannot be seen
        ends = np.sort(np.asarray(wait_ends[(rank, offset)]))
        indices = [int(index) for index in releases if is_set[index]]
        for first, second in zip(indices, indices[1:]):
            one, two = events[first], events[second]
            if int(one["value"]) != int(two["value"]):
                continue  # a new value each round (an epoch): both are seen
            begun, again = int(one["start_ns"]), int(two["start_ns"])
            if np.searchsorted(ends, again, side="right") > np.searchsorted(ends, begun, side="left"):
                continue  # a wait ended between them: the first raise was seen
            raisers = int(one["cur_rank"]), int(two["cur_rank"])
            message = (
                f"rank {raisers[0]} {_where(one)} set rank {rank}'s flag at heap offset {offset:#x} to "
                f"{int(one['value'])} at {_us(begun, origin)}, and rank {raisers[1]} {_where(two)} set it "
                f"to {int(two['value'])} again at {_us(again, origin)} with no wait on it ending between: "
                "the waiter sees one raise for two, so one hand-off is lost; wait for the flag to be "
                "consumed before raising it again, advance the value each round, or add"
            )
            ranks = tuple(dict.fromkeys((*raisers, rank)))
            findings.append(Finding("raised-twice", message, ranks, (first, second)))
            break
    return findings


def racing_writes(
    events: np.ndarray, releaser: np.ndarray, origin: int = 0, steps: np.ndarray | None = None
) -> list[Finding]:
    """``racing-writes`` findings (module docstring): one per place written, its first race.

    ``steps`` gives each event its launch's step (kernel and launch index, as one id; -1
    where not known): launches of one step run together on their ranks. Without it only
    launches that overlap in time do.

    Example:
        >>> racing_writes(trace.events, match_releasers(trace.events))
        []
    """
    writes = np.flatnonzero(
        np.isin(events["event_id"], list(_WRITES | {DMA_PUT})) & (events["payload_bytes"] > 0)
    )
    by_place: dict[tuple[int, int], list[int]] = {}
    for index in writes[np.argsort(events["start_ns"][writes], kind="stable")]:
        key = (int(events["target_rank"][index]), int(events["address"][index]))
        by_place.setdefault(key, []).append(int(index))
    shared = {
        key: found for key, found in by_place.items() if len({int(events["cur_rank"][i]) for i in found}) > 1
    }
    if not shared:
        return []
    knows = _HappensBefore(events, releaser)
    spans = _launch_spans(events, steps)
    findings = []
    for (target, offset), indices in shared.items():
        race = _first_race(events, indices, knows, spans)
        if race is None:
            continue
        first, second = events[race[0]], events[race[1]]
        writers = int(first["cur_rank"]), int(second["cur_rank"])
        message = (
            f"rank {writers[0]} {_where(first)} and rank {writers[1]} {_where(second)} both wrote "
            f"heap offset {offset:#x} of rank {target} ({event_name(int(first['event_id']))} "
            f"{_us(first['start_ns'], origin)}-{_us(first['end_ns'], origin)}, "
            f"{event_name(int(second['event_id']))} {_us(second['start_ns'], origin)}-"
            f"{_us(second['end_ns'], origin)}) and nothing orders the two writes (no chain of signals and "
            "the waits or atomics that saw them leads from the first to the second): which value stays "
            "depends on timing; give each rank its own slot, or hand the place over with a signal and a wait"
        )
        findings.append(Finding("racing-writes", message, tuple(dict.fromkeys((*writers, target))), race))
    return findings


def _first_race(events, indices: list[int], knows, spans) -> tuple[int, int] | None:
    # The first write (in start order) that nothing orders after another rank's earlier write
    # to the place. Of each other rank's earlier writes, the latest in a launch that overlaps
    # this one's is enough: the vector clocks only grow, so one ordered after it is ordered
    # after that rank's earlier ones too.
    earlier: dict[int, list[int]] = {}
    for second in indices:
        b = int(events["cur_rank"][second])
        for a, theirs in earlier.items():
            if a == b:
                continue
            first = next((i for i in reversed(theirs) if _launches_overlap(spans, i, second)), None)
            if first is not None and not knows.ordered(first, second):
                return first, second
        earlier.setdefault(b, []).append(second)
    return None


class _HappensBefore:
    """What each rank has seen of the others: a vector clock per rank, moved on where it
    synchronises with another rank, by what that rank had seen when it released (and the
    release itself).

    A rank synchronises at a wait (with the op that released it, ``releaser``) and at an
    atomic (a compare-and-swap taking a lock, an add joining a count) with the last release
    to the same flag by another rank that ended before it began: atomics on one address are
    ordered, so it read that release. A rank's ops are taken in time order (a rank's SMs
    are not ordered by the trace, so this can only miss races, never invent them).
    """

    def __init__(self, events: np.ndarray, releaser: np.ndarray):
        world = int(max(events["cur_rank"].max(), events["target_rank"].max())) + 1
        self.events = events
        self.times: list[list[int]] = [[] for _ in range(world)]
        self.seen: list[list[np.ndarray]] = [[] for _ in range(world)]
        edges = [(int(releaser[w]), int(w)) for w in np.flatnonzero(releaser >= 0)]
        edges += _atomic_edges(events)
        for source, target in sorted(edges, key=lambda edge: int(events["end_ns"][edge[1]])):
            rank, by = int(events["cur_rank"][target]), int(events["cur_rank"][source])
            if rank == by:
                continue
            released = self.at(by, int(events["start_ns"][source])).copy()
            released[by] = max(released[by], int(events["start_ns"][source]))
            merged = np.maximum(self.at(rank, int(events["end_ns"][target])), released)
            self.times[rank].append(int(events["end_ns"][target]))
            self.seen[rank].append(merged)

    def at(self, rank: int, time_ns: int) -> np.ndarray:
        """Per rank, the latest time of it that ``rank`` has seen by ``time_ns``."""
        position = bisect.bisect_right(self.times[rank], time_ns)
        if position == 0:
            return np.full(len(self.times), -(1 << 62), dtype=np.int64)
        return self.seen[rank][position - 1]

    def ordered(self, first: int, second: int) -> bool:
        """Whether write ``first`` (the earlier start) is known to end before write ``second`` starts."""
        e = self.events
        a, b = int(e["cur_rank"][first]), int(e["cur_rank"][second])
        if int(e["end_ns"][first]) > int(e["start_ns"][second]):
            return False  # they overlap in time: nothing can order them
        return int(self.at(b, int(e["start_ns"][second]))[a]) >= int(e["end_ns"][first])


def _atomic_edges(events: np.ndarray) -> list[tuple[int, int]]:
    """(release, atomic) pairs: each atomic and the last release by another rank to its flag
    that ended before it began."""
    atomics = np.isin(events["event_id"], list(RELEASE_EVENTS - _WRITES - {SIGNAL}))
    edges = []
    for releases in _releases_by_flag(events).values():
        releases = releases[~np.isin(events["event_id"][releases], list(_WRITES))]
        chosen = np.flatnonzero(atomics[releases])
        if not len(chosen):
            continue
        # Releases [0, ended) of the flag ended before the atomic began (ends, in start order,
        # as a running maximum); of those, the last by another rank is the last before the
        # run of the atomic's own rank that ends the prefix.
        ends = np.maximum.accumulate(events["end_ns"][releases])
        ended = np.minimum(np.searchsorted(ends, events["start_ns"][releases[chosen]], side="right"), chosen)
        ranks = events["cur_rank"][releases]
        new_run = np.r_[True, ranks[1:] != ranks[:-1]]
        run_start = np.maximum.accumulate(np.where(new_run, np.arange(len(ranks)), 0))
        last = np.maximum(ended - 1, 0)
        other = np.where(ranks[last] != ranks[chosen], last, run_start[last] - 1)
        found = (ended > 0) & (other >= 0)
        edges += zip(releases[other[found]].tolist(), releases[chosen[found]].tolist())
    return edges


def _launch_steps(trace) -> np.ndarray:
    """Per event, its launch's step: one id per (kernel, launch index), -1 where not known."""
    keys, inverse = launch_keys(trace.events)
    ids: dict[tuple[str, int], int] = {}
    step_of = np.full(len(keys), -1, dtype=np.int64)
    for k, key in enumerate(keys.tolist()):
        launch = launch_at(trace.launches, key)
        if launch is not None and launch.kernel:
            step_of[k] = ids.setdefault((launch.kernel, launch.index), len(ids))
    return step_of[inverse]


def _launch_spans(events: np.ndarray, steps: np.ndarray | None):
    """Per event, its launch's first start and last end in the trace, and its step."""
    keys, inverse = launch_keys(events)
    first = np.full(len(keys), np.iinfo(np.int64).max)
    last = np.full(len(keys), np.iinfo(np.int64).min)
    np.minimum.at(first, inverse, events["start_ns"])
    np.maximum.at(last, inverse, np.maximum(events["end_ns"], events["start_ns"]))
    return first[inverse], last[inverse], np.full(len(events), -1) if steps is None else steps


def _launches_overlap(spans, first: int, second: int) -> bool:
    """Whether the launches of two events ran together: the same step, or at the same time."""
    begin, end, steps = spans
    if steps[first] >= 0 and steps[first] == steps[second]:
        return True
    return begin[first] <= end[second] and begin[second] <= end[first]


# ---------------------------------------------------------------------------- helpers
def _program_to(event) -> tuple[int, int, int, int]:
    """(rank, SM, program, target rank): one program's ops to one rank."""
    return int(event["cur_rank"]), int(event["cu_id"]), int(event["pid"]), int(event["target_rank"])


def _last_release_time(events: np.ndarray) -> dict[tuple[int, int], int]:
    """(rank, target rank) -> the start of the rank's last flag release to that rank."""
    releases = np.flatnonzero(np.isin(events["event_id"], list(RELEASE_EVENTS - _WRITES)))
    latest: dict[tuple[int, int], int] = {}
    for index in releases:
        key = (int(events["cur_rank"][index]), int(events["target_rank"][index]))
        latest[key] = max(latest.get(key, -1), int(events["start_ns"][index]))
    return latest


def _releases_by_flag(events: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """(target rank, heap offset) -> the releases to it, by start time."""
    releases = np.flatnonzero(np.isin(events["event_id"], list(RELEASE_EVENTS)))
    by_flag: dict[tuple[int, int], list[int]] = {}
    for index in releases[np.argsort(events["start_ns"][releases], kind="stable")]:
        key = (int(events["target_rank"][index]), int(events["address"][index]))
        by_flag.setdefault(key, []).append(int(index))
    return {key: np.asarray(value) for key, value in by_flag.items()}


def _first_release_after(events, released, rank: int, offset: int, time_ns: int) -> int:
    candidates = released.get((rank, offset))
    if candidates is None:
        return -1
    starts = events["start_ns"][candidates]
    position = int(np.searchsorted(starts, time_ns, side="right"))
    return int(candidates[position]) if position < len(candidates) else -1


def _where(event) -> str:
    return f"SM {int(event['cu_id'])} program {int(event['pid'])}"


def _flag(event) -> str:
    return f"its flag at heap offset {int(event['address']):#x} (for {int(event['value'])})"


def _op(event) -> str:
    return f"{event_name(int(event['event_id']))} (value {int(event['value'])})"


def _us(time_ns, origin: int) -> str:
    return f"{(int(time_ns) - origin) / 1000:.1f} us"
