"""Hang reports: which rank waits on which, and what each last sent, from the flight files.

Each rank of a live Iris context keeps a flight file (:mod:`iris_trace.flight_file`:
its host phase, its ring of device sync ops, the waits spinning now, any timeout
report). A :class:`HangReport` reads one session's files, asks live ranks to publish
first, and names the likely culprit.

Example:
    >>> from iris_trace.hang import HangReport
    >>> print(HangReport.from_directory("/dev/shm").format())
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import schema
from .flight_file import (
    CMP_SYMBOLS,
    CMPS,
    KIND_NAMES,
    OP_NAMES,
    PHASE_DEVICE_SYNC,
    SIGNAL,
    WAIT_BEGIN,
    WAIT_END,
    RankState,
    dump_sequence,
    find_sessions,
    read_flight_file,
    request_publish,
)

#: Kinds that change a peer's memory: what a rank "sent".
SENT_KINDS = schema.RELEASE_EVENTS


def describe_entry(entry: np.void) -> str:
    """One ring entry as text, e.g. ``signal add 1 -> rank 1 @0x200``."""
    kind = int(entry["kind"])
    name = KIND_NAMES.get(kind, f"kind{kind}")
    where = f"@{int(entry['offset']):#x}"
    if kind in (WAIT_BEGIN, WAIT_END):
        cmp = CMPS[int(entry["sub"])] if int(entry["sub"]) < len(CMPS) else "?"
        op = OP_NAMES.get(int(entry["op"]), "wait")
        text = f"{op} {where} {CMP_SYMBOLS[cmp] if cmp in CMP_SYMBOLS else cmp} {int(entry['value'])}"
        return text + (" (began)" if kind == WAIT_BEGIN else f" (satisfied, saw {int(entry['extra'])})")
    if kind == SIGNAL:
        name = "signal add" if int(entry["sub"]) == 1 else "signal set"
    value = "" if kind in (1, 2, 3, 4, 5) else f" {int(entry['value'])}"
    return f"{name}{value} -> rank {int(entry['target_rank'])} {where}"


def _is_live_file(state: RankState) -> bool:
    return "iris-flight-" in os.path.basename(state.path)


def _newness(state: RankState) -> tuple[bool, int]:
    return _is_live_file(state), dump_sequence(state.path)


@dataclass
class HangReport:
    """Every rank's flight state of one session, with the likely culprit of a hang.

    Example:
        >>> report = HangReport.from_directory("/dev/shm")
        >>> print(report.format())
    """

    session: str
    world_size: int
    ranks: dict[int, RankState]
    last: int = 5

    @classmethod
    def from_files(cls, paths: list[str], last: int = 5) -> HangReport:
        """A report from explicit flight or dump files (all of one session)."""
        states = [read_flight_file(p) for p in paths]
        if not states:
            raise ValueError("no flight files to report on")
        sessions = {s.session for s in states}
        if len(sessions) != 1:
            raise ValueError(f"flight files of several sessions given: {sorted(sessions)}")
        ranks: dict[int, RankState] = {}
        for state in states:  # a live file wins over the rank's dumps, a later dump over an earlier one
            if state.rank not in ranks or _newness(state) > _newness(ranks[state.rank]):
                ranks[state.rank] = state
        return cls(states[0].session, states[0].world_size, ranks, last)

    @classmethod
    def from_directory(
        cls, directory: str, session: str | None = None, last: int = 5, refresh_s: float = 1.0
    ) -> HangReport:
        """A report on ``session`` (default: the newest one) from the files in ``directory``.

        Live ranks are first asked to publish their newest ring, for up to ``refresh_s``
        seconds (0: read the files as they are).
        """
        sessions = find_sessions(directory)
        if not sessions:
            raise ValueError(f"no Iris flight or dump files in {directory}")
        if session is None:
            session = max(sessions, key=lambda s: sessions[s][1])
        if session not in sessions:
            raise ValueError(f"no files of session {session} in {directory} (found: {sorted(sessions)})")
        if refresh_s > 0:
            request_publish(sessions[session][0], refresh_s)
        return cls.from_files(sessions[session][0], last)

    # ------------------------------------------------------------------ analysis
    def releasers(self, rank: int, offset: int) -> list[int]:
        """Ranks that ever released (signalled, updated) ``rank``'s flag at ``offset``, per their rings."""
        state = self.ranks.get(rank)
        named = state.releaser_of(offset) if state else None
        found = set() if named is None else {named}
        for other in self.ranks.values():
            sent = other.entries[np.isin(other.entries["kind"], list(SENT_KINDS))]
            if np.any((sent["target_rank"] == rank) & (sent["offset"] == offset)):
                found.add(other.rank)
        return sorted(found)

    def waits(self) -> dict[int, tuple[int, int, str]]:
        """Per waiting rank: (heap offset, expected, text) of its oldest pending or timed-out wait."""
        result = {}
        for rank, state in sorted(self.ranks.items()):
            if state.timeout is not None:
                t = state.timeout
                result[rank] = (t.offset, t.expected, "TIMED OUT: " + t.describe())
            elif state.pending:
                entry = state.pending[0]
                cmp = CMPS[int(entry["sub"])] if int(entry["sub"]) < len(CMPS) else "?"
                result[rank] = (
                    int(entry["offset"]),
                    int(entry["value"]),
                    f"waiting in {OP_NAMES.get(int(entry['op']), 'wait')} on SM {int(entry['sm'])}, "
                    f"program {int(entry['pid'])} for flag {CMP_SYMBOLS.get(cmp, cmp)} {int(entry['value'])} "
                    f"at heap offset {int(entry['offset']):#x}",
                )
        return result

    def culprit(self) -> tuple[int | None, str]:
        """``(rank, reason)`` of the rank most likely to blame, or ``(None, reason)``.

        A rank whose process ended without closing its context (its live flight file is
        still there: it was killed or crashed) is blamed first: the others wait for it.
        """
        missing = [r for r in range(self.world_size) if r not in self.ranks]
        waits = self.waits()
        gone = [r for r, s in sorted(self.ranks.items()) if not s.alive and not s.closed and _is_live_file(s)]
        if gone:
            state = self.ranks[gone[0]]
            waiting = [(r, self._flag_name(r, offset)) for r, (offset, _, _) in sorted(waits.items())]
            also = "".join(f"; rank {r} waits for {flag}" for r, flag in waiting if r not in gone)
            return gone[0], (
                f"rank {gone[0]} is gone: its process {state.pid} ended without closing its context "
                f"(killed, or crashed){also}"
            )
        for rank, (offset, _expected, _) in sorted(waits.items(), key=lambda kv: kv[0]):
            candidates = self.releasers(rank, offset)
            flag = self._flag_name(rank, offset)
            for candidate in candidates:
                if candidate == rank:
                    continue
                if candidate in missing:
                    return candidate, (
                        f"rank {rank} waits for {flag}, which rank {candidate} releases, but rank "
                        f"{candidate} has no flight file: it never created its context, or exited"
                    )
                state = self.ranks[candidate]
                if candidate not in waits:
                    return candidate, (
                        f"rank {rank} waits for {flag}, which rank {candidate} releases, but rank "
                        f"{candidate} is in no Iris wait on the device: it {state.status}"
                        + self._last_sent_hint(candidate, rank, offset)
                    )
            if not candidates:
                idle = [r for r in range(self.world_size) if r != rank and r not in waits]
                if idle:
                    blame = idle[0]
                    status = "has no flight file" if blame in missing else self.ranks[blame].status
                    return blame, (
                        f"rank {rank} waits for {flag}, which no rank ever released; rank {blame} is not "
                        f"waiting on the device (it {status}): it never reached the op that should "
                        "release it (an early exit or mismatched calls)"
                    )
                return rank, f"rank {rank} waits for {flag}, which no rank ever released or will release"
        if waits:
            cycle = " -> ".join(f"rank {r}" for r in sorted(waits))
            return min(waits), f"every rank waits on another ({cycle}): a deadlock between ranks"
        ended = [r for r, s in sorted(self.ranks.items()) if not s.alive]
        if ended and len(ended) < len(self.ranks):
            others = [r for r in sorted(self.ranks) if r not in ended]
            return ended[0], (
                f"rank {ended[0]} is gone (process {self.ranks[ended[0]].pid} ended) while rank(s) {others} "
                "still run: it was stopped, crashed or left early"
            )
        if missing:
            return missing[
                0
            ], f"rank {missing[0]} has no flight file: it never created its context, or exited"
        return None, "no rank is waiting on the device"

    def _flag_name(self, rank: int, offset: int) -> str:
        named = self.ranks[rank].region_name(offset) if rank in self.ranks else None
        return f"its flag at heap offset {offset:#x}" + (f" ({named})" if named else "")

    def _last_sent_hint(self, sender: int, rank: int, offset: int) -> str:
        entries = self.ranks[sender].entries
        mine = entries[(entries["target_rank"] == rank) & (entries["offset"] == offset)]
        if len(mine):
            return f"; its last release of that flag was: {describe_entry(mine[-1])}"
        return ""

    # ------------------------------------------------------------------ output
    def format(self) -> str:
        """The report as text: per rank its state, what it waits on and what it last sent."""
        lines = [f"iris hang report: session {self.session}, {self.world_size} rank(s)"]
        waits = self.waits()
        for rank in range(self.world_size):
            state = self.ranks.get(rank)
            if state is None:
                lines.append(f"rank {rank}: no flight file (never created its context, or exited)")
                continue
            lines.append(f"rank {rank} (pid {state.pid}) {state.status}:")
            if rank in waits:
                offset, _, text = waits[rank]
                named = state.region_name(offset)
                lines.append(f"  {text}" + (f" ({named})" if named else ""))
                who = [r for r in self.releasers(rank, offset) if r != rank]
                if who:
                    lines.append(f"  released by: {', '.join(f'rank {r}' for r in who)}")
            elif state.alive and not state.closed and state.phase == PHASE_DEVICE_SYNC:
                lines.append("  in no Iris wait: its kernel runs on (long work, or a loop of its own)")
            else:
                lines.append("  not waiting on the device")
            sent = state.entries[np.isin(state.entries["kind"], list(SENT_KINDS))]
            if len(sent):
                lines.append(f"  last sent ({min(self.last, len(sent))} of {len(sent)} in the ring):")
                lines.extend(f"    {describe_entry(e)}" for e in sent[-self.last :])
            else:
                lines.append("  sent nothing (in the ring)")
        rank, reason = self.culprit()
        lines.append(f"likely culprit: {'none' if rank is None else f'rank {rank}'}: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """The report as JSON-ready data."""
        rank, reason = self.culprit()
        waits = self.waits()
        return {
            "session": self.session,
            "world_size": self.world_size,
            "culprit": rank,
            "reason": reason,
            "ranks": {
                str(r): {
                    "pid": s.pid,
                    "status": s.status,
                    "wait": waits[r][2] if r in waits else None,
                    "last_sent": [
                        describe_entry(e)
                        for e in s.entries[np.isin(s.entries["kind"], list(SENT_KINDS))][-self.last :]
                    ],
                }
                for r, s in sorted(self.ranks.items())
            },
        }
