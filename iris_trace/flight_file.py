"""Flight files: the layout of the file each rank keeps, and reading it from any process.

Every rank of a live Iris context keeps one *flight file*
(``<IRIS_HANG_DIR>/iris-flight-<session>-rank<N>.bin``, default ``/dev/shm``). The
rank publishes into it: its host phase as it changes, and its ring of device
sync ops plus any timeout report on a timeout, a signal, a dump, or when asked
(:func:`request_publish`, which writes the request word and waits for the rank's
watchdog to answer). So this module reads it from any process while kernels
still run, after one trapped, and after the rank died (then as last published).
Layout (little-endian int64 words)::

    bytes 0..511      header: magic, version, rank, world, pid, regions, entries per region,
                      heap_size, created (unix ns), state, timeout_ns, host phase,
                      host phase since (unix ns), metadata bytes, heartbeat (unix ns),
                      publish requests, requests answered, pending slots per region
    bytes 512..1023   timeout report: state, rank, sm, program, op, heap offset, expected,
                      seen, cmp, waited ns, device clock, timeout ns
    bytes 1024..8191  JSON metadata: session, named heap regions (e.g. the device barrier)
    bytes 8192..      ring: regions x entries x 8 words (layout in ``iris.device.flight``),
                      then regions x pending slots entries: the waits spinning now

Importing it needs numpy only. :mod:`iris_trace.hang` turns the files into a report.

Example:
    >>> state = read_flight_file("/dev/shm/iris-flight-1a2b3c-rank0.bin")
    >>> state.pending   # the waits spinning when the rank last published
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import re
import time
from dataclasses import dataclass, field

import numpy as np

from . import schema

MAGIC = int.from_bytes(b"IRISFLT1", "little")
VERSION = 2
HEADER_BYTES = 512
REPORT_OFFSET = 512
REPORT_WORDS = schema.REPORT_WORDS
META_OFFSET = 1024
META_BYTES = 8192 - 1024
RING_OFFSET = 8192
ENTRY_WORDS = schema.ENTRY_WORDS

# Header words.
H_MAGIC, H_VERSION, H_RANK, H_WORLD, H_PID, H_REGIONS, H_ENTRIES, H_HEAP_SIZE = range(8)
H_CREATED, H_STATE, H_TIMEOUT, H_PHASE, H_PHASE_SINCE, H_META_BYTES, H_HEARTBEAT = range(8, 15)
H_PUBLISH_REQUEST, H_PUBLISHED, H_PENDING = range(15, 18)

#: Host phases a rank publishes in its header.
PHASES = {
    0: "is running host code",
    1: "is in a host barrier",
    2: "is in a host collective",
    3: "has closed its context",
}
PHASE_RUNNING, PHASE_BARRIER, PHASE_COLLECTIVE, PHASE_CLOSED = 0, 1, 2, 3

WAIT_BEGIN = schema.WAIT_BEGIN
#: The ring records a wait's end under the wait_until id (its op family is in ``op``).
WAIT_END = schema.WAIT_UNTIL
SIGNAL = schema.SIGNAL
#: Ring kinds: the tracing event ids plus the start of a wait.
KIND_NAMES = {**schema.EVENT_NAMES, WAIT_BEGIN: "wait_begin", WAIT_END: "wait_end"}
CMPS = schema.CMPS
CMP_SYMBOLS = {"eq": "==", "ne": "!=", "gt": ">", "ge": ">=", "lt": "<", "le": "<="}
OP_NAMES = schema.OP_NAMES

ENTRY_DTYPE = np.dtype(
    [
        ("seq", np.int64),
        ("kind", np.int16),
        ("sub", np.int16),
        ("cur_rank", np.int16),
        ("target_rank", np.int16),
        ("sm", np.int32),
        ("pid", np.int32),
        ("op", np.int32),
        ("offset", np.int64),
        ("value", np.int64),
        ("time_ns", np.int64),
        ("extra", np.int64),
    ]
)

_FILE_RE = re.compile(r"iris-(?:flight|hang)-(?P<session>[0-9a-f]+)-rank(?P<rank>\d+)\.bin$")


def flight_path(directory: str, session: str, rank: int) -> str:
    """Where rank ``rank`` of ``session`` keeps its live flight file."""
    return os.path.join(directory, f"iris-flight-{session}-rank{rank}.bin")


def dump_path(directory: str, session: str, rank: int) -> str:
    """Where rank ``rank`` of ``session`` copies its flight file on a timeout or signal."""
    return os.path.join(directory, f"iris-hang-{session}-rank{rank}.bin")


def decode_entries(ring: np.ndarray, regions: int, entries: int, pending: int = 0) -> np.ndarray:
    """The written entries of the ring and of the ``pending`` wait slots behind it, oldest first.

    Example:
        >>> decode_entries(words[RING_OFFSET // 8 :], 8, 64, 4)["kind"]
    """
    count = regions * (entries + pending) * ENTRY_WORDS
    words = np.asarray(ring, dtype=np.int64)[:count].reshape(-1, ENTRY_WORDS)
    raw = words[words[:, 0] > 0]
    out = np.empty(len(raw), dtype=ENTRY_DTYPE)
    ident, where = raw[:, 1], raw[:, 2]
    out["seq"] = raw[:, 0]
    out["kind"] = ident & 0xFF
    out["sub"] = (ident >> 8) & 0xFF
    out["cur_rank"] = (ident >> 16) & 0xFFFF
    target = (ident >> 32) & 0xFFFF
    out["target_rank"] = np.where(target == 0xFFFF, -1, target)
    out["sm"] = (ident >> 48) & 0xFFFF
    out["pid"] = where & 0xFFFFFFFF
    out["op"] = where >> 32
    out["offset"] = raw[:, 3]
    out["value"] = raw[:, 4]
    out["time_ns"] = raw[:, 5]
    out["extra"] = raw[:, 6]
    return out[np.lexsort((out["seq"], out["time_ns"]))]


@dataclass
class Timeout:
    """The report a timed-out wait left: who waited, where, for what, and what it saw."""

    rank: int
    sm: int
    pid: int
    op: str
    offset: int
    expected: int
    seen: int
    cmp: str
    waited_ns: int
    timeout_ns: int

    def describe(self) -> str:
        return (
            f"{self.op} on SM {self.sm}, program {self.pid} waited {self.waited_ns / 1e9:.3g} s "
            f"(timeout {self.timeout_ns / 1e9:g} s) for flag {CMP_SYMBOLS.get(self.cmp, self.cmp)} "
            f"{self.expected} at heap offset {self.offset:#x}; last seen {self.seen}"
        )


@dataclass
class RankState:
    """What one rank's flight file says."""

    rank: int
    world_size: int
    pid: int
    session: str
    path: str
    created_ns: int
    closed: bool
    phase: int
    phase_since_ns: int
    timeout_ns: int
    alive: bool
    metadata: dict
    entries: np.ndarray
    timeout: Timeout | None = None
    pending: list = field(default_factory=list)

    @property
    def status(self) -> str:
        if not self.alive:
            return f"is gone (process {self.pid} exited)"
        if self.closed:
            return "has closed its context"
        return PHASES.get(self.phase, f"phase {self.phase}")

    def region_name(self, offset: int) -> str | None:
        """The named heap region (``metadata['regions']``) holding ``offset``, with the element."""
        for region in self.metadata.get("regions", []):
            start, shape, item = region["offset"], region["shape"], region["itemsize"]
            count = int(np.prod(shape))
            if start <= offset < start + count * item:
                index = np.unravel_index((offset - start) // item, shape)
                return region["name"].format(*[int(i) for i in index])
        return None

    def releaser_of(self, offset: int) -> int | None:
        """The rank a named region says must release the flag at ``offset`` (e.g. a barrier member)."""
        for region in self.metadata.get("regions", []):
            start, shape, item = region["offset"], region["shape"], region["itemsize"]
            if region.get("releaser_axis") is None:
                continue
            if start <= offset < start + int(np.prod(shape)) * item:
                index = np.unravel_index((offset - start) // item, shape)
                return int(index[region["releaser_axis"]])
        return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # an exited child its parent has not reaped yet is a zombie, not alive
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def read_flight_file(path: str) -> RankState:
    """Parse one flight (or dump) file.

    Example:
        >>> state = read_flight_file("/dev/shm/iris-flight-ab12-rank0.bin")
        >>> state.timeout, state.pending
    """
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < RING_OFFSET:
        raise ValueError(f"{path}: {len(data)} bytes is too short for a flight file")
    words = np.frombuffer(data, dtype=np.int64)
    if int(words[H_MAGIC]) != MAGIC:
        raise ValueError(f"{path}: not an Iris flight file")
    if int(words[H_VERSION]) != VERSION:
        raise ValueError(f"{path}: flight file version {int(words[H_VERSION])}, this reader knows {VERSION}")
    meta_len = int(words[H_META_BYTES])
    metadata = json.loads(data[META_OFFSET : META_OFFSET + meta_len].decode()) if meta_len else {}
    regions, entries = int(words[H_REGIONS]), int(words[H_ENTRIES])
    ring = words[RING_OFFSET // 8 :]
    state = RankState(
        rank=int(words[H_RANK]),
        world_size=int(words[H_WORLD]),
        pid=int(words[H_PID]),
        session=metadata.get("session", ""),
        path=path,
        created_ns=int(words[H_CREATED]),
        closed=int(words[H_STATE]) == 1,
        phase=int(words[H_PHASE]),
        phase_since_ns=int(words[H_PHASE_SINCE]),
        timeout_ns=int(words[H_TIMEOUT]),
        alive=_pid_alive(int(words[H_PID]))
        and metadata.get("hostname", os.uname().nodename) == os.uname().nodename,
        metadata=metadata,
        entries=decode_entries(ring, regions, entries, int(words[H_PENDING])),
    )
    report = words[REPORT_OFFSET // 8 : REPORT_OFFSET // 8 + REPORT_WORDS]
    field = {name: int(report[index]) for name, index in schema.REPORT_WORD.items()}
    if field["state"] == 1:
        state.timeout = Timeout(
            rank=field["rank"],
            sm=field["sm"],
            pid=field["pid"],
            op=OP_NAMES.get(field["op"], "wait"),
            offset=field["offset"],
            expected=field["expected"],
            seen=field["seen"],
            cmp=CMPS[field["cmp"]] if 0 <= field["cmp"] < len(CMPS) else "?",
            waited_ns=field["waited_ns"],
            timeout_ns=field["timeout_ns"],
        )
    state.pending = pending_waits(state.entries)
    return state


def pending_waits(entries: np.ndarray) -> list[np.void]:
    """Waits that began and have not ended (per SM and program), oldest first."""
    open_waits: dict[tuple, np.void] = {}
    for entry in entries[np.lexsort((entries["seq"], entries["sm"]))]:
        key = (int(entry["sm"]), int(entry["pid"]), int(entry["offset"]), int(entry["value"]))
        if entry["kind"] == WAIT_BEGIN:
            open_waits[key] = entry
        elif entry["kind"] == WAIT_END:
            open_waits.pop(key, None)
    return sorted(open_waits.values(), key=lambda e: int(e["time_ns"]))


def find_sessions(directory: str) -> dict[str, tuple[list[str], int]]:
    """``session -> (files, newest creation time)`` for the flight and dump files in ``directory``."""
    sessions: dict[str, tuple[list[str], int]] = {}
    for path in glob.glob(os.path.join(directory, "iris-*-rank*.bin")):
        match = _FILE_RE.search(os.path.basename(path))
        if not match:
            continue
        try:
            created = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            continue
        files, newest = sessions.get(match["session"], ([], 0))
        files.append(path)
        sessions[match["session"]] = (files, max(newest, created))
    return sessions


def request_publish(paths: list[str], wait_s: float = 1.0) -> list[str]:
    """Ask the live ranks behind these flight files to publish their newest ring.

    Waits up to ``wait_s`` seconds for their answers; returns the files whose rank
    did not answer in time (a rank whose host is wedged, say). Files of closed or
    dead ranks, dumps, and this process's own files are left alone (a context
    publishes itself: ``FlightRecorder.publish``).

    Example:
        >>> late = request_publish(glob.glob("/dev/shm/iris-flight-*.bin"))
    """

    def word(header: mmap.mmap, index: int) -> int:
        return int.from_bytes(header[index * 8 : index * 8 + 8], "little", signed=True)

    asked = []
    for path in paths:
        if "iris-flight-" not in os.path.basename(path):
            continue
        try:
            with open(path, "r+b") as handle:
                header = mmap.mmap(handle.fileno(), HEADER_BYTES)
        except (OSError, ValueError):
            continue
        pid = word(header, H_PID)
        if (
            word(header, H_MAGIC) != MAGIC
            or word(header, H_STATE) == 1
            or pid == os.getpid()
            or not _pid_alive(pid)
        ):
            header.close()
            continue
        target = word(header, H_PUBLISH_REQUEST) + 1
        header[H_PUBLISH_REQUEST * 8 : H_PUBLISH_REQUEST * 8 + 8] = target.to_bytes(8, "little", signed=True)
        asked.append((path, header, target))
    deadline = time.monotonic() + wait_s
    waiting = asked
    while waiting and time.monotonic() < deadline:
        time.sleep(0.01)
        waiting = [item for item in waiting if word(item[1], H_PUBLISHED) < item[2]]
    for _, header, _ in asked:
        header.close()
    return [path for path, _, _ in waiting]
