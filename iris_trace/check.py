"""Protocol checks over a merged trace: ``iris-trace check``, a linter for flag protocols.

A trace holds every remote op of every rank with its time, program, target rank, heap
offset and value, and :func:`iris_trace.matching.match_releasers` says which op released
each wait. From that, two mistakes of hand-written flag protocols show up as patterns,
whatever the kernel:

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

Each finding names the check, the ranks, SMs, programs, ops, heap offsets and times
(microseconds from the trace's first event), and the event indices in the merged trace.
Waits the library issues for its own protocols (the device barrier, collectives, fused
ops) are checked by the first rule and not by the second, whose pattern a library
handshake at a kernel's start (then its data, then a device barrier) also has.

Example:
    >>> from iris_trace import Trace, check
    >>> findings = check.run(Trace.from_files(paths))
    >>> print("\\n".join(f.message for f in findings) or "clean")
"""

from __future__ import annotations

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

#: The checks, by name, with what each finding of it means (``iris-trace check --help`` lists them).
CHECKS = {
    "stale-flag": "a wait passed on a flag value left from an earlier round (raised again later)",
    "data-after-signal": "data written to a rank after the signal that released its wait, none after",
    "raised-twice": "a flag set to one value twice with no wait on it ending between: one raise is lost",
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
    return sorted(findings, key=lambda f: int(events["start_ns"][f.events[0]]))


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
