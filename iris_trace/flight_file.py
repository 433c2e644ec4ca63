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

from . import files, schema

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
    4: "is in a host barrier, waiting for its own GPU work to finish (a kernel of its still runs)",
}
PHASE_RUNNING, PHASE_BARRIER, PHASE_COLLECTIVE, PHASE_CLOSED, PHASE_DEVICE_SYNC = 0, 1, 2, 3, 4

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

#: The names of flight files (``kind`` flight) and dumps (``kind`` hang, ``seq`` from the second on).
FILE_NAME = re.compile(
    r"iris-(?P<kind>flight|hang)-(?P<session>[0-9a-f]+)-rank(?P<rank>\d+)(?:-(?P<seq>\d+))?\.bin$"
)
#: The most entries per SM region a flight file may hold (``IRIS_FLIGHT_ENTRIES`` is capped there too).
MAX_ENTRIES = 1 << 16
#: The most SM regions a flight file may hold.
MAX_REGIONS = 4096
#: The most pending-wait slots per region.
MAX_PENDING = 256
#: Files larger than a flight file with the most of everything are not flight files.
MAX_FILE_BYTES = RING_OFFSET + MAX_REGIONS * (MAX_ENTRIES + MAX_PENDING) * ENTRY_WORDS * 8


class FlightFileError(ValueError):
    """A flight or dump file that cannot be read: missing, not ours, truncated or malformed.

    The message is one line that names the file.
    """


def flight_path(directory: str, session: str, rank: int) -> str:
    """Where rank ``rank`` of ``session`` keeps its live flight file."""
    return os.path.join(directory, f"iris-flight-{session}-rank{rank}.bin")


def dump_path(directory: str, session: str, rank: int, seq: int = 1) -> str:
    """Where rank ``rank`` of ``session`` writes its ``seq``-th dump (on a timeout, a signal, a request).

    Example:
        >>> dump_path("/dev/shm/iris-1000", "ab12", 0, seq=2)
        '/dev/shm/iris-1000/iris-hang-ab12-rank0-2.bin'
    """
    suffix = "" if seq == 1 else f"-{seq}"
    return os.path.join(directory, f"iris-hang-{session}-rank{rank}{suffix}.bin")


def default_directory() -> str:
    """Where this user's ranks keep their flight files unless ``IRIS_HANG_DIR`` says otherwise.

    Example:
        >>> default_directory()
        '/dev/shm/iris-1000'
    """
    return os.environ.get("IRIS_HANG_DIR") or files.private_directory(create=False)


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


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie its parent has not reaped counts as gone)."""
    if not 0 < pid < 1 << 22:  # beyond any pid_max: a damaged header, never a process (nor a group)
        return False
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
    """Parse one flight (or dump) file of this user's.

    Raises:
        FlightFileError: the file is missing, not a regular file of this user's, larger
            than any flight file, truncated, or its header or metadata is malformed.

    Example:
        >>> state = read_flight_file("/dev/shm/iris-1000/iris-flight-ab12-rank0.bin")
        >>> state.timeout, state.pending
    """
    try:
        data = files.read_own(path, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise FlightFileError(f"{path}: no such flight file") from None
    except OSError as error:
        raise FlightFileError(str(error)) from None
    if len(data) < RING_OFFSET:
        raise FlightFileError(f"{path}: {len(data)} bytes is too short for a flight file")
    words = np.frombuffer(data[: len(data) // 8 * 8], dtype=np.int64)
    if int(words[H_MAGIC]) != MAGIC:
        raise FlightFileError(f"{path}: not an Iris flight file")
    if int(words[H_VERSION]) != VERSION:
        raise FlightFileError(
            f"{path}: flight file version {int(words[H_VERSION])}, this reader knows {VERSION}"
        )
    regions, entries, pending = int(words[H_REGIONS]), int(words[H_ENTRIES]), int(words[H_PENDING])
    rank, world = int(words[H_RANK]), int(words[H_WORLD])
    if not (0 < regions <= MAX_REGIONS and 0 < entries <= MAX_ENTRIES and 0 <= pending <= MAX_PENDING):
        raise FlightFileError(
            f"{path}: header claims {regions} regions of {entries} entries: not a flight file"
        )
    if not 0 <= rank < world <= 1 << 20:
        raise FlightFileError(f"{path}: header claims rank {rank} of {world}: not a flight file")
    ring_bytes = regions * (entries + pending) * ENTRY_WORDS * 8
    if len(data) < RING_OFFSET + ring_bytes:
        raise FlightFileError(
            f"{path}: truncated ({len(data)} bytes; its header needs {RING_OFFSET + ring_bytes})"
        )
    metadata = _metadata(path, data, int(words[H_META_BYTES]))
    ring = words[RING_OFFSET // 8 :]
    state = RankState(
        rank=rank,
        world_size=world,
        pid=int(words[H_PID]),
        session=str(metadata.get("session", "")),
        path=path,
        created_ns=int(words[H_CREATED]),
        closed=int(words[H_STATE]) == 1,
        phase=int(words[H_PHASE]),
        phase_since_ns=int(words[H_PHASE_SINCE]),
        timeout_ns=int(words[H_TIMEOUT]),
        alive=pid_alive(int(words[H_PID]))
        and metadata.get("hostname", os.uname().nodename) == os.uname().nodename,
        metadata=metadata,
        entries=decode_entries(ring, regions, entries, pending),
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


def _metadata(path: str, data: bytes, length: int) -> dict:
    """The JSON metadata block: a dict whose named regions are well formed, or a FlightFileError."""
    if not 0 <= length <= META_BYTES:
        raise FlightFileError(f"{path}: metadata length {length} is out of range: not a flight file")
    if not length:
        return {}
    try:
        metadata = json.loads(data[META_OFFSET : META_OFFSET + length].decode())
    except (UnicodeDecodeError, ValueError):
        raise FlightFileError(f"{path}: its metadata is not JSON") from None
    if not isinstance(metadata, dict):
        raise FlightFileError(f"{path}: its metadata is not a JSON object")
    regions = metadata.get("regions", [])
    well_formed = isinstance(regions, list) and all(
        isinstance(r, dict)
        and isinstance(r.get("name"), str)
        and isinstance(r.get("offset"), int)
        and isinstance(r.get("itemsize"), int)
        and r["itemsize"] > 0
        and isinstance(r.get("shape"), list)
        and all(isinstance(n, int) and n >= 0 for n in r["shape"])
        and (r.get("releaser_axis") is None or (isinstance(r["releaser_axis"], int)
                                                and 0 <= r["releaser_axis"] < len(r["shape"])))
        for r in regions
    )  # fmt: skip
    if not well_formed:
        raise FlightFileError(f"{path}: its metadata's named regions are malformed")
    return metadata


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
    """``session -> (files, newest modification time)`` of this user's flight and dump files in ``directory``.

    Files of other users, links and anything that is not a regular file are left out.
    """
    sessions: dict[str, tuple[list[str], int]] = {}
    for path in glob.glob(os.path.join(directory, "iris-*-rank*.bin")):
        match = FILE_NAME.search(os.path.basename(path))
        if not match or not files.is_own_file(path):
            continue
        try:
            created = os.lstat(path).st_mtime_ns
        except FileNotFoundError:
            continue
        found, newest = sessions.get(match["session"], ([], 0))
        found.append(path)
        sessions[match["session"]] = (found, max(newest, created))
    return sessions


def dump_sequence(path: str) -> int:
    """Which dump of its rank ``path`` is (1 for the first, and for a live flight file).

    Example:
        >>> dump_sequence("/dev/shm/iris-1000/iris-hang-ab12-rank0-3.bin")
        3
    """
    match = FILE_NAME.search(os.path.basename(path))
    return int(match["seq"]) if match and match["seq"] else 1


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
            fd = files.open_own(path, MAX_FILE_BYTES, writable=True)
        except OSError:
            continue
        try:
            header = mmap.mmap(fd, HEADER_BYTES)
        except (OSError, ValueError):
            continue
        finally:
            os.close(fd)
        pid = word(header, H_PID)
        if (
            word(header, H_MAGIC) != MAGIC
            or word(header, H_STATE) == 1
            or pid == os.getpid()
            or not pid_alive(pid)
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
