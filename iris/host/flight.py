"""Host side of the flight recorder: the device ring, the timeout report, and the per-rank flight file.

The GPU writes its ring of sync ops into device memory and, when a wait times out,
a report plus a copy of the ring into pinned host memory (``iris.device.flight``).
The flight file (layout in ``iris_trace.flight_file``, in ``IRIS_HANG_DIR``, default
``/dev/shm``) is what other processes read; this process *publishes* into it:
the header as things happen, the ring and report on a timeout, a signal, a
dump, ``state()``, and when ``iris-trace hang-report`` asks through the file's
request word (the watchdog thread of :mod:`iris.host.hang` answers within 0.1 s).
Copying the ring out of a GPU that still runs a spinning kernel uses a stream of
its own; after a trap, the copy the timed-out wait left is used.
"""

from __future__ import annotations

import glob
import json
import mmap
import os
import sys
import threading
import time
import uuid
import weakref

import numpy as np
import torch

from iris_trace import files
from iris_trace import flight_file as fmt

from .. import config
from ..device import flight as device_flight
from ..device.layout import flight_slot

ENTRY_BYTES = fmt.ENTRY_WORDS * 8
COUNTER_STRIDE = int(device_flight.COUNTER_STRIDE)
PENDING_SLOTS = int(device_flight.PENDING_SLOTS)


class FlightRecorder:
    """This rank's flight file, its registration with the GPU, and its context slots.

    Created collectively by :class:`iris.Iris` (every rank allocates the same heap
    objects). Read it with :meth:`state`, or from anywhere with ``iris-trace hang-report``.

    Example:
        >>> ctx.hang.recorder.state().entries[-3:]   # this rank's last three recorded ops
    """

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        rank, world = ctx.cur_rank, ctx.num_ranks
        self.session: str = ctx._comm.broadcast_object(uuid.uuid4().hex[:12] if rank == 0 else None, src=0)
        self.directory = config.hang_dir()
        _remove_stale_files(self.directory, self.session)
        self.regions = ctx.get_cu_count()
        self.entries = config.flight_entries()
        self.path = fmt.flight_path(self.directory, self.session, rank)
        # The ring, then each SM region's pending-wait entries (see iris.device.flight).
        ring_entries = self.regions * (self.entries + PENDING_SLOTS)
        self.nbytes = fmt.RING_OFFSET + ring_entries * ENTRY_BYTES
        ring_words = ring_entries * fmt.ENTRY_WORDS
        device = ctx.get_device()
        # Device memory, private to this rank: the ring, its per-SM claim counters, the report claim.
        self._ring = torch.zeros(ring_words, dtype=torch.int64, device=device)
        self._counters = torch.zeros(self.regions * COUNTER_STRIDE, dtype=torch.int64, device=device)
        self._claim = torch.zeros(1, dtype=torch.int32, device=device)
        # Host memory the GPU writes: the timeout report, then the ring's copy at that moment.
        self._report, self._report_address = ctx.backend.host_visible_zeros(
            fmt.REPORT_WORDS + ring_words, torch.int64
        )
        self._report_words = self._report.numpy()
        self._staging = ctx.backend.host_visible_zeros(ring_words, torch.int64)[0]
        self._publish_lock = threading.Lock()
        self._regions_meta: list[dict] = []
        self._closed = False

        # Made new, private, never through a link (iris_trace.files): the directory may be shared.
        fd = files.create_exclusive(self.path, self.nbytes)
        try:
            self._map = mmap.mmap(fd, self.nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.unlink(self.path)
            raise
        finally:
            os.close(fd)
        self._dumps = 0
        self.words = np.frombuffer(self._map, dtype=np.int64)
        now = time.time_ns()
        header = {
            fmt.H_MAGIC: fmt.MAGIC,
            fmt.H_VERSION: fmt.VERSION,
            fmt.H_RANK: rank,
            fmt.H_WORLD: world,
            fmt.H_PID: os.getpid(),
            fmt.H_REGIONS: self.regions,
            fmt.H_ENTRIES: self.entries,
            fmt.H_PENDING: PENDING_SLOTS,
            fmt.H_HEAP_SIZE: ctx.heap_size,
            fmt.H_CREATED: now,
            fmt.H_PHASE_SINCE: now,
            fmt.H_HEARTBEAT: now,
        }
        for word, value in header.items():
            self.words[word] = value
        self._write_metadata()
        self.set_timeout(config.wait_timeout())

    # ------------------------------------------------------------------ slots and header
    def _write_slots(self, values: dict[int, int]) -> None:
        world = self._ctx.num_ranks
        self._ctx._write_context({flight_slot(world, slot): value for slot, value in values.items()})

    def set_timeout(self, seconds: float) -> None:
        """Make every later wait with ``heap_bases`` on this rank give up after ``seconds`` (0: never)."""
        timeout_ns = int(seconds * 1e9)
        self._write_slots(
            {
                int(device_flight.SLOT_TIMEOUT_NS): timeout_ns,
                int(device_flight.SLOT_RING): self._ring.data_ptr() if config.FLIGHT else 0,
                int(device_flight.SLOT_RING_MASK): self.entries - 1,
                int(device_flight.SLOT_NUM_REGIONS): self.regions,
                int(device_flight.SLOT_COUNTERS): self._counters.data_ptr(),
                int(device_flight.SLOT_REPORT): self._report_address,
                int(device_flight.SLOT_CLAIM): self._claim.data_ptr(),
            }
        )
        self.words[fmt.H_TIMEOUT] = timeout_ns

    @property
    def timeout(self) -> float:
        """The current wait timeout in seconds (0: none)."""
        return int(self.words[fmt.H_TIMEOUT]) / 1e9

    def set_phase(self, phase: int) -> None:
        """Publish what the host is doing (``iris_trace.flight_file.PHASES``) for other ranks' reports."""
        if not self._closed:
            self.words[fmt.H_PHASE] = phase
            self.words[fmt.H_PHASE_SINCE] = time.time_ns()

    def heartbeat(self) -> None:
        if not self._closed:
            self.words[fmt.H_HEARTBEAT] = time.time_ns()

    def name_region(self, name: str, tensor: torch.Tensor, releaser_axis: int | None = None) -> None:
        """Name a heap tensor in reports; ``name`` may use ``{0}``, ``{1}`` for the element's index.

        ``releaser_axis``: the index along that axis is the rank that releases the element.

        Example:
            >>> ctx.hang.recorder.name_region("step flags of rank {0}", flags, releaser_axis=0)
        """
        self._regions_meta.append(
            {
                "name": name,
                "offset": self._ctx.heap.offset_of(tensor),
                "shape": list(tensor.shape),
                "itemsize": tensor.element_size(),
                "releaser_axis": releaser_axis,
            }
        )
        self._write_metadata()

    def _write_metadata(self) -> None:
        ctx = self._ctx
        device = ctx.backend.device_name(ctx.get_device())
        blob = json.dumps(
            {
                "session": self.session,
                "hostname": os.uname().nodename,
                "device": device,
                "command": " ".join(sys.argv),
                "regions": self._regions_meta,
            }
        ).encode()
        if len(blob) > fmt.META_BYTES:
            raise ValueError("iris: too many named regions for the flight file's metadata")
        self._map[fmt.META_OFFSET : fmt.META_OFFSET + len(blob)] = blob
        self.words[fmt.H_META_BYTES] = len(blob)

    # ------------------------------------------------------------------ reading
    def timed_out(self) -> bool:
        """Whether a wait on this rank has written its timeout report."""
        return not self._closed and int(self._report_words[0]) == 1

    def clear_report(self) -> None:
        """Forget a timeout report (under emulation, once the interpreter has raised it)."""
        self._report_words[0] = 0
        self.words[fmt.REPORT_OFFSET // 8] = 0
        self._claim.zero_()

    def publish(self) -> None:
        """Write the newest ring and the timeout report into the flight file.

        A GPU that still runs (even a kernel spinning forever) is read through a
        stream of its own; one that trapped leaves the ring copy of its timed-out
        wait; one that failed otherwise keeps the ring last published.

        Example:
            >>> ctx.hang.recorder.publish()   # then any process can read the file
        """
        with self._publish_lock:
            if self._closed:
                return
            asked = int(self.words[fmt.H_PUBLISH_REQUEST])
            report = self._report_words
            ring = None
            if int(report[0]) == 1:
                ring = report[fmt.REPORT_WORDS :]
            else:
                try:
                    self._ctx.backend.copy_while_running(self._staging, self._ring)
                    ring = self._staging.numpy()
                except Exception:  # noqa: BLE001 - a dead GPU: the last published ring stays
                    ring = None
            if ring is not None:
                self.words[fmt.RING_OFFSET // 8 :] = ring
            self.words[fmt.REPORT_OFFSET // 8 : fmt.REPORT_OFFSET // 8 + fmt.REPORT_WORDS] = report[
                : fmt.REPORT_WORDS
            ]
            self.words[fmt.H_PUBLISHED] = asked

    def publish_requested(self) -> bool:
        """Whether another process (``iris-trace hang-report``) asked for a :meth:`publish`."""
        return not self._closed and int(self.words[fmt.H_PUBLISH_REQUEST]) > int(self.words[fmt.H_PUBLISHED])

    def state(self) -> fmt.RankState:
        """This rank's flight state as ``iris-trace hang-report`` sees it (published first).

        Example:
            >>> state = ctx.hang.recorder.state()
            >>> state.timeout, state.pending
        """
        self.publish()
        return fmt.read_flight_file(self.path)

    def dump(self) -> str:
        """Publish, then copy the flight file to a new dump that outlives the process; returns its path.

        Each dump is a file of its own (``...-rank0.bin``, ``...-rank0-2.bin``, ...), made
        privately and never over an existing file (:func:`iris_trace.files.create_exclusive`).
        """
        self.publish()
        with self._publish_lock:
            if self._closed:
                raise RuntimeError("iris: the flight recorder is closed")
            data = bytes(self._map)
        fd, path, self._dumps = _new_dump(
            self.directory, self.session, int(self.words[fmt.H_RANK]), self._dumps + 1
        )
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        return path

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Remove the flight file (dumps are kept)."""
        with self._publish_lock:
            if self._closed:
                return
            self._closed = True
            self.words[fmt.H_STATE] = 1
            self.words[fmt.H_PHASE] = fmt.PHASE_CLOSED
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            del self.words
            self._map.close()


def _remove_stale_files(directory: str, session: str) -> None:
    """Delete live flight files of this user's that dead processes left behind (killed ranks).

    Only regular files of this user's are looked at, opened without following links or
    blocking (a FIFO named like a flight file is skipped, not waited on).
    """
    for path, pid in _flight_files(directory):
        if session not in os.path.basename(path) and not fmt.pid_alive(pid):
            try:
                os.unlink(path)
            except OSError:
                pass


def _flight_files(directory: str):
    """``(path, pid of its writer)`` for each live flight file of this user's in ``directory``."""
    for path in glob.glob(os.path.join(directory, "iris-flight-*-rank*.bin")):
        try:
            fd = files.open_own(path, fmt.MAX_FILE_BYTES)
        except OSError:
            continue
        with os.fdopen(fd, "rb") as handle:
            header = np.frombuffer(handle.read(fmt.HEADER_BYTES), dtype=np.int64)
        if len(header) > fmt.H_PID and int(header[fmt.H_MAGIC]) == fmt.MAGIC:
            yield path, int(header[fmt.H_PID])


def keep_as_dumps(directory: str, pids: set[int]) -> list[str]:
    """Turn the live flight files that processes ``pids`` (all ended) left in ``directory`` into dumps.

    A rank that was killed or crashed never removes its flight file; its launcher calls
    this once every rank has ended, so that what the rank last did stays as a dump (what
    ``iris-trace hang-report`` reads after a job), and no live file is left behind.
    Returns the dumps' paths.

    Example:
        >>> keep_as_dumps("/dev/shm/iris-1000", {4242})
        ['/dev/shm/iris-1000/iris-hang-3f2a9c41b7d0-rank1-2.bin']
    """
    kept = []
    for path, pid in _flight_files(directory):
        if pid not in pids:
            continue
        match = fmt.FILE_NAME.search(os.path.basename(path))
        if match is None:
            continue
        fd, dump, _ = _new_dump(directory, match["session"], int(match["rank"]), 1)
        os.close(fd)
        os.replace(path, dump)
        kept.append(dump)
    return kept


#: Dumps one rank of one session may leave: a name past them all is refused, not searched for.
MAX_DUMPS = 1000


def _new_dump(directory: str, session: str, rank: int, seq: int) -> tuple[int, str, int]:
    """Make the first free dump file from ``seq`` on; returns ``(fd, path, its seq)``.

    Each name is made with :func:`iris_trace.files.create_exclusive`, so a name that is
    taken (an earlier dump of the session, or one another user planted) is passed over.
    """
    for number in range(seq, MAX_DUMPS + 1):
        path = fmt.dump_path(directory, session, rank, number)
        try:
            return files.create_exclusive(path), path, number
        except files.UnsafeFileError:
            continue
    raise files.UnsafeFileError(
        f"iris: {MAX_DUMPS} dumps of rank {rank} of session {session} exist in {directory}"
    )
