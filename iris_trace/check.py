"""Protocol checks over a merged trace: ``iris-trace check``, a linter for flag protocols.

A trace holds every remote op of every rank with its time, program, target rank, heap
offset and value, and :func:`iris_trace.matching.match_releasers` says which op released
each wait. From that, two mistakes of hand-written flag protocols show up as patterns,
whatever the kernel:

``stale-flag``
    A program waits on a flag twice, both waits are released by the same raise, and the
    flag is raised again only after the second wait has passed: the second wait did not
    wait, it passed on the value left from the round before (the flag was not reset, or
    the expected value not advanced). What it guards was read before it was written.

``data-after-signal``
    A program raises a flag that releases another rank's ``wait_until``, then writes data
    to that rank, and raises nothing to that rank afterwards: no wait orders those writes
    before the reader's reads (the signal must follow the writes it publishes).

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
from .schema import DATA_EVENTS, DMA_PUT, GET, LOAD, RELEASE_EVENTS, WAIT_EVENTS, WAIT_UNTIL, event_name

#: The checks, by name, with what each finding of it means (``iris-trace check --list``).
CHECKS = {
    "stale-flag": "a wait passed on a flag value left from an earlier round (raised again later)",
    "data-after-signal": "data written to a rank after the signal that released its wait, none after",
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
    events = trace.events
    releaser = match_releasers(events)
    origin = int(events["start_ns"].min()) if len(events) else 0
    findings: list[Finding] = []
    if "stale-flag" in chosen:
        findings += stale_flags(events, releaser, origin)
    if "data-after-signal" in chosen:
        findings += data_after_signal(events, releaser, origin)
    return sorted(findings, key=lambda f: int(events["start_ns"][f.events[0]]))


def stale_flags(events: np.ndarray, releaser: np.ndarray, origin: int = 0) -> list[Finding]:
    """``stale-flag`` findings (module docstring).

    Example:
        >>> stale_flags(trace.events, match_releasers(trace.events))
        []
    """
    waits = np.flatnonzero((releaser >= 0) & np.isin(events["event_id"], list(WAIT_EVENTS)))
    released = _releases_by_flag(events)
    findings = []
    earlier: dict[tuple, tuple[int, int]] = {}  # (rank, pid, offset) -> (its last wait, that wait's releaser)
    for index in waits[np.argsort(events["start_ns"][waits], kind="stable")]:
        wait = events[index]
        key = (int(wait["cur_rank"]), int(wait["pid"]), int(wait["address"]))
        source = int(releaser[index])
        before = earlier.get(key)
        earlier[key] = (int(index), source)
        if before is None or before[1] != source:
            continue
        later = _first_release_after(events, released, key[0], key[2], int(wait["end_ns"]))
        if later < 0:
            continue  # nothing raised it again: a repeated check of one value, not a missed round
        first, raise_, again = events[before[0]], events[source], events[later]
        message = (
            f"rank {key[0]} {_where(wait)} passed its {event_name(int(wait['event_id']))} on {_flag(wait)} "
            f"at {_us(wait['end_ns'], origin)} on the value that rank {int(raise_['cur_rank'])}'s "
            f"{_op(raise_)} at {_us(raise_['start_ns'], origin)} had set for its previous wait (ended "
            f"{_us(first['end_ns'], origin)}); rank {int(again['cur_rank'])} raised the flag again only at "
            f"{_us(again['start_ns'], origin)}: reset the flag or advance the expected value each round"
        )
        findings.append(
            Finding("stale-flag", message, (key[0], int(raise_["cur_rank"])), (int(index), source, later))
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
        if last_release.get(key, -1) > start:
            continue  # a later release of this program to that rank publishes the write
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


# ---------------------------------------------------------------------------- helpers
def _program_to(event) -> tuple[int, int, int, int]:
    """(rank, SM, program, target rank): one program's ops to one rank."""
    return int(event["cur_rank"]), int(event["cu_id"]), int(event["pid"]), int(event["target_rank"])


def _last_release_time(events: np.ndarray) -> dict[tuple, int]:
    releases = np.flatnonzero(np.isin(events["event_id"], list(RELEASE_EVENTS - _WRITES)))
    latest: dict[tuple, int] = {}
    for index in releases:
        key = _program_to(events[index])
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
