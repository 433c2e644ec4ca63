"""Per-rank trace files and the merged, clock-aligned multi-rank trace.

A rank file (``.npz``) holds one rank's decoded events plus everything needed
to align it with the others::

    events        EVENT_DTYPE array, timestamps in that GPU's own clock
    sync_enable   int64 (world, rounds, 4) ping-pong stamps taken at enable()
    sync_collect  int64 (world, rounds, 4) the same at collect()
    torch_*       optional: a PyTorch profile and its clock markers (iris_trace.torch_profile)
    meta          JSON: format, rank, world_size, dropped, device, heap_size,
                  num_sms, scope_names, command, clock_domain (ranks with the same one
                  read the same clock: one GPU, or the host under emulation), run
                  (the run's id: every rank of one tracing run has the same),
                  sample_period (one program in that many recorded), sites (call site id ->
                  kernel, file, line) and launches (launch tag -> kernel, index, grid):
                  what names each event's origin (iris_trace.sites)

:class:`Trace` merges one file (or in-memory :class:`RankTrace`) per rank and
maps every timestamp onto rank 0's clock; files of different runs are refused.
Files are written to a temporary name and renamed, so an interrupted save leaves
the previous file; a directory that a live job of another run is writing into is
left to it (:func:`claim_directory`).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import zipfile
from dataclasses import dataclass, field

import numpy as np

from . import files
from .attribution import attribute_waits
from .clock import ClockFit, fit_all
from .events import EVENT_DTYPE, upgrade
from .flight_file import pid_alive
from .lanes import assign_lanes
from .matching import match_releasers
from .sites import Launch, Site, origins
from .torch_profile import ProfileError, TorchProfile

#: The arrays of a rank file that hold a PyTorch profile (all or none).
TORCH_ARRAYS = ("torch_events", "torch_anchors", "torch_strings")

FORMAT = "iris-trace-rank/1"
#: Timestamps beyond this (in either direction) are not a clock's: 146 years of nanoseconds.
MAX_TIMESTAMP = 1 << 62
#: World sizes beyond this are not a job's.
MAX_WORLD = 1 << 16
#: The claim a job leaves in a trace directory it writes (:func:`claim_directory`).
CLAIM_FILE = ".iris-run"


class TraceFileError(ValueError):
    """A trace file is missing, malformed, or does not fit with the others."""


@dataclass
class RankTrace:
    """One rank's events and clock samples, as collected on that rank."""

    rank: int
    world_size: int
    events: np.ndarray
    sync_enable: np.ndarray
    sync_collect: np.ndarray | None
    dropped: int = 0
    device: str = ""
    heap_size: int = 0
    num_sms: int = 0
    scope_names: dict[int, str] = field(default_factory=dict)
    command: str = ""
    #: Which clock the timestamps are on (a GPU's UUID, or ``host:<name>`` under emulation).
    clock_domain: str = ""
    #: The run the events belong to (the same on every rank of one run; ``""`` if unknown).
    run: str = ""
    #: One program in this many recorded its events (``ctx.tracing.enable(sample=...)``).
    sample_period: int = 1
    #: PyTorch profiler events taken with ``ctx.tracing.torch_profiler()`` (None: none).
    torch: TorchProfile | None = None
    #: The call sites of this rank's events, by id (``iris_trace.sites``).
    sites: dict[int, Site] = field(default_factory=dict)
    #: This rank's launches, by tag (``iris_trace.sites.name_launches``).
    launches: dict[int, Launch] = field(default_factory=dict)
    #: Site ids that two call sites hashed to: their events name one of the two.
    shared_sites: list[int] = field(default_factory=list)

    def meta(self) -> dict:
        return {
            "format": FORMAT,
            "rank": self.rank,
            "world_size": self.world_size,
            "dropped": self.dropped,
            "device": self.device,
            "heap_size": self.heap_size,
            "num_sms": self.num_sms,
            "scope_names": {str(k): v for k, v in self.scope_names.items()},
            "command": self.command,
            "clock_domain": self.clock_domain,
            "run": self.run,
            "sample_period": self.sample_period,
            "sites": {str(k): [s.kernel, s.file, s.line] for k, s in self.sites.items()},
            "launches": {
                str(k): [x.kernel, x.index, None if x.grid is None else list(x.grid)]
                for k, x in self.launches.items()
            },
            "shared_sites": list(self.shared_sites),
        }

    def save(self, path: str) -> str:
        """Write this rank's ``.npz`` file (to a temporary name, then renamed); returns the path.

        Example:
            >>> rank_trace.save("traces/rank0.npz")
        """
        arrays = {"events": self.events, "sync_enable": self.sync_enable}
        if self.sync_collect is not None:
            arrays["sync_collect"] = self.sync_collect
        if self.torch is not None:
            arrays.update(self.torch.arrays())
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with files.replace_atomically(path) as handle:
            np.savez(handle, meta=np.array(json.dumps(self.meta())), **arrays)
        return path

    @classmethod
    def load(cls, path: str) -> RankTrace:
        """Read a rank file written by :meth:`save`, with errors that name the file.

        Every part is checked before it is used (the archive, each array's header against
        its size, the metadata's fields and types, the events' ranks and timestamps), so a
        truncated, corrupted or hostile file raises :class:`TraceFileError` in one line.

        Example:
            >>> rank0 = RankTrace.load("traces/rank0.npz")
        """
        arrays = _read_arrays(path, ("meta", "events", "sync_enable"), ("sync_collect", *TORCH_ARRAYS))
        meta = _parse_meta(path, arrays["meta"])
        world = meta["world_size"]
        events = upgrade(arrays["events"])
        if events.dtype != EVENT_DTYPE or events.ndim != 1:
            raise TraceFileError(f"{path}: events have dtype {events.dtype}, expected the Iris event dtype")
        _check_events(path, events, world)
        sync_enable = _check_samples(path, "sync_enable", arrays["sync_enable"], world)
        sync_collect = arrays.get("sync_collect")
        if sync_collect is not None:
            sync_collect = _check_samples(path, "sync_collect", sync_collect, world)
        profile = None
        if any(name in arrays for name in TORCH_ARRAYS):
            if not all(name in arrays for name in TORCH_ARRAYS):
                raise TraceFileError(
                    f"{path}: its PyTorch profile is incomplete (it needs {', '.join(TORCH_ARRAYS)})"
                )
            try:
                profile = TorchProfile.from_arrays(path, arrays)
            except ProfileError as error:
                raise TraceFileError(str(error)) from None
        # ``meta`` holds exactly the metadata fields (``_parse_meta``), rank and world size among them.
        return cls(events=events, sync_enable=sync_enable, sync_collect=sync_collect, torch=profile, **meta)


def _read_arrays(path: str, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` archive, each header checked against its size before it is read."""
    try:
        with open(path, "rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError:
        raise TraceFileError(f"{path}: no such trace file") from None
    except OSError as exc:
        raise TraceFileError(f"{path}: cannot be read ({exc.strerror})") from None
    if magic != b"PK\x03\x04":  # every .npz is a zip archive
        raise TraceFileError(
            f"{path}: not an Iris rank file (a rank<N>.npz written by ctx.tracing.collect(directory) "
            "or ctx.tracing.export(directory))"
        )
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            names = {name.removesuffix(".npy"): name for name in archive.namelist()}
            missing = [name for name in required if name not in names]
            if missing:
                raise TraceFileError(f"{path}: not a readable Iris rank trace (no {', '.join(missing)})")
            for name in (*required, *(n for n in optional if n in names)):
                with archive.open(names[name]) as member:
                    arrays[name] = _read_array(path, name, member, archive.getinfo(names[name]).file_size)
    except TraceFileError:
        raise
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        OSError,
        ValueError,
        NotImplementedError,
    ) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TraceFileError(f"{path}: damaged or truncated ({reason})") from None
    except MemoryError:
        raise TraceFileError(f"{path}: too large to load into memory") from None
    return arrays


def _read_array(path: str, name: str, member, size: int) -> np.ndarray:
    """One ``.npy`` member, refused when its header disagrees with its size (no allocation first)."""
    fmt = np.lib.format
    version = fmt.read_magic(member)
    if version not in ((1, 0), (2, 0)):
        raise TraceFileError(f"{path}: {name} has npy format version {version}, which no rank file uses")
    try:
        read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = read_header(member)
    except Exception as error:  # noqa: BLE001 - numpy parses the header as Python: any error means damage
        raise TraceFileError(f"{path}: {name} has an unreadable header ({type(error).__name__})") from None
    if dtype.hasobject:
        raise TraceFileError(f"{path}: {name} holds Python objects, which no rank file does")
    count = int(np.prod(shape, dtype=object))
    header = 6 + 2 + (2 if version == (1, 0) else 4)
    if count * dtype.itemsize > size or size - count * dtype.itemsize > 65536 + header:
        raise TraceFileError(
            f"{path}: {name} claims {count} elements of {dtype.itemsize} bytes, but holds {size} bytes"
        )
    data = member.read(count * dtype.itemsize)
    if len(data) != count * dtype.itemsize:
        raise TraceFileError(f"{path}: {name} is truncated")
    array = np.frombuffer(data, dtype=dtype)
    return array.reshape(shape, order="F" if fortran else "C")


def _parse_meta(path: str, meta: np.ndarray) -> dict:
    """The metadata as a dict of well-typed fields, or a :class:`TraceFileError` naming the first bad one."""
    try:
        parsed = json.loads(str(meta[()]) if meta.ndim == 0 else "")
    except (ValueError, TypeError, IndexError):
        parsed = None
    if not isinstance(parsed, dict):
        raise TraceFileError(f"{path}: its metadata is not a JSON object")
    if parsed.get("format") != FORMAT:
        raise TraceFileError(f"{path}: format {parsed.get('format')!r}, expected {FORMAT!r}")
    fields = {
        "rank": (int, None),
        "world_size": (int, None),
        "dropped": (int, 0),
        "heap_size": (int, 0),
        "num_sms": (int, 0),
        "device": (str, ""),
        "command": (str, ""),
        "clock_domain": (str, ""),
        "run": (str, ""),
        "sample_period": (int, 1),
        "scope_names": (dict, {}),
        "sites": (dict, {}),
        "launches": (dict, {}),
        "shared_sites": (list, []),
    }
    out = {}
    for name, (kind, default) in fields.items():
        value = parsed.get(name, default)
        if value is None:
            raise TraceFileError(f"{path}: its metadata has no {name}")
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TraceFileError(f"{path}: its metadata's {name} is {value!r}, not {kind.__name__}")
        out[name] = value
    if not 1 <= out["world_size"] <= MAX_WORLD or not 0 <= out["rank"] < out["world_size"]:
        raise TraceFileError(f"{path}: rank {out['rank']} of world size {out['world_size']} is impossible")
    if min(out["dropped"], out["heap_size"], out["num_sms"]) < 0:
        raise TraceFileError(f"{path}: its metadata has a negative count")
    if not 1 <= out["sample_period"] <= 1 << 31:
        raise TraceFileError(f"{path}: its metadata's sample_period {out['sample_period']} is not a period")
    try:
        out["scope_names"] = {int(k): str(v) for k, v in out["scope_names"].items()}
    except ValueError:
        raise TraceFileError(f"{path}: its metadata's scope_names are not keyed by scope number") from None
    out["sites"], out["launches"] = _origin_tables(path, out["sites"], out["launches"])
    if not all(type(site) is int for site in out["shared_sites"]):
        raise TraceFileError(f"{path}: its metadata's shared_sites are not site ids")
    return out


def _origin_tables(path: str, sites: dict, launches: dict) -> tuple[dict[int, Site], dict[int, Launch]]:
    """The metadata's call sites and launches (``iris_trace.sites``), each entry checked."""
    try:
        named_sites = {}
        for key, (kernel, file, line) in sites.items():
            if not (isinstance(kernel, str) and isinstance(file, str) and type(line) is int):
                raise ValueError
            named_sites[int(key)] = Site(kernel, file, line)
        named_launches = {}
        for key, (kernel, index, grid) in launches.items():
            if not (isinstance(kernel, str) and type(index) is int and index >= 0):
                raise ValueError
            if grid is not None and not (len(grid) == 3 and all(type(g) is int and g > 0 for g in grid)):
                raise ValueError
            named_launches[int(key)] = Launch(kernel, index, None if grid is None else tuple(grid))
    except (ValueError, TypeError):
        raise TraceFileError(f"{path}: its metadata's call sites or launches are malformed") from None
    return named_sites, named_launches


def _check_events(path: str, events: np.ndarray, world: int) -> None:
    if not len(events):
        return
    for name in ("start_ns", "end_ns"):
        if np.abs(events[name]).max() >= MAX_TIMESTAMP or events[name].min() <= -MAX_TIMESTAMP:
            raise TraceFileError(f"{path}: an event's {name} is beyond any clock's range")
    if (events["cur_rank"] < 0).any() or (events["cur_rank"] >= world).any():
        raise TraceFileError(f"{path}: an event's rank is outside the world of {world}")
    if (events["target_rank"] < -1).any() or (events["target_rank"] >= world).any():
        raise TraceFileError(f"{path}: an event's target rank is outside the world of {world}")
    if (events["cu_id"] < 0).any() or (events["event_id"] < 0).any() or (events["pid"] < 0).any():
        raise TraceFileError(f"{path}: an event has a negative SM, event id or program")
    if (events["payload_bytes"] < 0).any():
        raise TraceFileError(f"{path}: an event moved a negative number of bytes")


def _check_samples(path: str, name: str, samples: np.ndarray, world: int) -> np.ndarray:
    if samples.ndim != 3 or samples.shape[0] != world or samples.shape[2] != 4 or samples.shape[1] < 1:
        raise TraceFileError(f"{path}: clock samples of shape {samples.shape} do not fit world size {world}")
    if samples.dtype.kind not in "iu":
        raise TraceFileError(f"{path}: clock samples of dtype {samples.dtype}, expected integers")
    samples = samples.astype(np.int64)
    if samples.size and np.abs(samples).max() >= MAX_TIMESTAMP:
        raise TraceFileError(f"{path}: a clock sample ({name}) is beyond any clock's range")
    return samples


def claim_directory(directory: str, run: str, warn=print) -> str:
    """Where this run's trace files go: ``directory``, unless a live job of another run writes there.

    The writer leaves a claim (``.iris-run``: run, host, process) in the directory. A
    claim of a process that has exited, or of this run, is taken over; one of a live job
    of another run (or another host's) is left alone, and this run writes to
    ``<directory>-<run>`` instead, saying so through ``warn``. So two jobs started in
    one folder never mix their rank files.

    Example:
        >>> claim_directory("iris_traces", "3f2a9c-1")
        'iris_traces'
    """
    os.makedirs(directory, exist_ok=True)
    mine = {"run": run, "host": socket.gethostname(), "pid": os.getpid()}
    claim = os.path.join(directory, CLAIM_FILE)
    holder = _read_claim(claim)
    if holder is not None and run and not _claim_is_stale(holder, mine):
        elsewhere = f"{directory.rstrip(os.sep)}-{run}"
        if warn is not None:
            warn(
                f"iris: {directory} holds the traces of run {holder.get('run')!r}, still being written by "
                f"process {holder.get('pid')} on {holder.get('host')}; this run's go to {elsewhere}",
                file=sys.stderr,
            )
        os.makedirs(elsewhere, exist_ok=True)
        directory, claim = elsewhere, os.path.join(elsewhere, CLAIM_FILE)
    with files.replace_atomically(claim, "w") as handle:
        json.dump(mine, handle)
    return directory


def _read_claim(path: str) -> dict | None:
    if not os.path.lexists(path):
        return None
    try:
        holder = json.loads(files.read_own(path, 4096))
    except (OSError, ValueError):
        return {"run": "?", "host": "?", "pid": -1}  # not ours, or not a claim: not ours to take over
    return holder if isinstance(holder, dict) else {"run": "?", "host": "?", "pid": -1}


def _claim_is_stale(holder: dict, mine: dict) -> bool:
    same_host = holder.get("host") == mine["host"]
    if holder.get("run") == mine["run"] or (same_host and holder.get("pid") == mine["pid"]):
        return True
    pid = holder.get("pid")
    return same_host and isinstance(pid, int) and pid > 0 and not pid_alive(pid)


class Trace:
    """All ranks of one run on rank 0's clock.

    Example:
        >>> trace = Trace.from_files(["t/rank0.npz", "t/rank1.npz"])
        >>> trace.events["start_ns"]          # aligned, every rank
        >>> trace.clock_fits[1].residual_ns
    """

    def __init__(self, ranks: list[RankTrace], sources: list[str] | None = None):
        if not ranks:
            raise TraceFileError("no rank traces to merge")
        names = sources or [f"rank {r.rank}" for r in ranks]
        world = ranks[0].world_size
        for rank_trace, name in zip(ranks, names):
            if rank_trace.world_size != world:
                raise TraceFileError(
                    f"{name}: world size {rank_trace.world_size}, but {names[0]} has world size {world}"
                )
        runs = {rank_trace.run for rank_trace in ranks}
        if len(runs) > 1:
            listing = ", ".join(f"{name} (run {r.run or 'unknown'})" for r, name in zip(ranks, names))
            raise TraceFileError(f"rank files of different runs: {listing}; give the files of one run")
        by_rank = {}
        for rank_trace, name in zip(ranks, names):
            if rank_trace.rank in by_rank:
                raise TraceFileError(f"{name}: rank {rank_trace.rank} appears twice")
            by_rank[rank_trace.rank] = rank_trace
        missing = sorted(set(range(world)) - set(by_rank))
        if missing:
            raise TraceFileError(f"world size is {world} but no trace for rank(s) {missing}")
        self.ranks = [by_rank[r] for r in range(world)]
        self.world_size = world
        #: The run every rank file belongs to (``""`` for files from before runs had ids).
        self.run = ranks[0].run
        periods = {rank_trace.sample_period for rank_trace in self.ranks}
        if len(periods) > 1:
            raise TraceFileError(f"rank files sampled at different periods {sorted(periods)}: not one run")
        #: One program in this many recorded (``ctx.tracing.enable(sample=...)``; 1: all).
        self.sample_period = self.ranks[0].sample_period
        #: Where :meth:`save` last wrote the rank files (``None`` until it has).
        self.directory: str | None = None
        reference = self.ranks[0]
        domain = reference.clock_domain
        shared = [bool(domain) and r.clock_domain == domain for r in self.ranks]
        self.clock_fits: list[ClockFit] = fit_all(reference.sync_enable, reference.sync_collect, shared)
        self.events = self._aligned_events()
        #: Every rank's call sites, by id (the same id names the same line on every rank).
        self.sites: dict[int, Site] = {}
        for rank_trace in self.ranks:
            self.sites.update(rank_trace.sites)
        #: Each rank's launches, by tag (``iris_trace.sites.Launch``).
        self.launches: list[dict[int, Launch]] = [r.launches for r in self.ranks]
        #: Site ids that two call sites hashed to (their events name one of the two).
        self.shared_sites: list[int] = sorted({s for r in self.ranks for s in r.shared_sites})

    @property
    def shares_a_clock(self) -> bool:
        """Whether two or more ranks read one clock (ranks sharing a GPU, or emulated on one host).

        Example:
            >>> Trace.from_files(files).shares_a_clock
            False
        """
        domains = [r.clock_domain for r in self.ranks if r.clock_domain]
        return len(set(domains)) < len(domains)

    @property
    def emulated(self) -> bool:
        """Whether the times are the host's (the emulation backend), not a GPU's.

        Example:
            >>> timeline(trace.events, "t.png", trace.world_size, emulated=trace.emulated)
        """
        return all(r.clock_domain.startswith("host:") for r in self.ranks)

    @classmethod
    def from_files(cls, paths: list[str]) -> Trace:
        """Merge one ``.npz`` file per rank.

        Example:
            >>> trace = Trace.from_files(sorted(glob.glob("traces/rank*.npz")))
        """
        return cls([RankTrace.load(p) for p in paths], sources=list(paths))

    def _aligned_events(self) -> np.ndarray:
        parts = []
        for rank_trace, clock in zip(self.ranks, self.clock_fits):
            events = rank_trace.events.copy()
            events["start_ns"] = np.rint(clock.to_reference(events["start_ns"])).astype(np.int64)
            events["end_ns"] = np.rint(clock.to_reference(events["end_ns"])).astype(np.int64)
            parts.append(events)
        merged = np.concatenate(parts)
        return merged[np.argsort(merged["start_ns"], kind="stable")]

    def torch_events(self, rank: int) -> tuple[TorchProfile, np.ndarray, np.ndarray] | None:
        """Rank ``rank``'s PyTorch profile and its events' start and end on rank 0's clock (int64 ns).

        ``None`` when the rank took no profile (``ctx.tracing.torch_profiler()``).

        Example:
            >>> profile, start, end = trace.torch_events(0)
            >>> profile.names[profile.events["name"][0]], start[0]
        """
        profile = self.ranks[rank].torch
        if profile is None:
            return None
        clock, fit = profile.clock(), self.clock_fits[rank]
        events = profile.events
        start = fit.to_reference(clock.to_device(events["start_ns"]))
        end = fit.to_reference(clock.to_device(events["start_ns"] + events["dur_ns"]))
        return profile, np.rint(start).astype(np.int64), np.rint(np.maximum(end, start)).astype(np.int64)

    @functools.cached_property
    def origins(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Per event, its call site's and its launch's label, as indices into the returned labels.

        :func:`~iris_trace.sites.origins`, computed once per trace: the exporters and the
        report share it.

        Example:
            >>> site_at, launch_at, labels = trace.origins
            >>> labels[site_at[0]], labels[launch_at[0]]
            ('put_kernel · app.py:42', 'put_kernel #0 (8, 1, 1)')
        """
        return origins(self.events, self.sites, self.launches)

    @functools.cached_property
    def releasers(self) -> np.ndarray:
        """Per event of :attr:`events`, the index of the op that released it, -1 if none.

        :func:`~iris_trace.matching.match_releasers`, computed once per trace: the
        exporters and the report share it.

        Example:
            >>> waits = np.flatnonzero(trace.releasers >= 0)
        """
        return match_releasers(self.events)

    @functools.cached_property
    def wait_causes(self) -> dict[str, np.ndarray]:
        """Why each wait waited (:func:`~iris_trace.attribution.attribute_waits`), computed once per trace.

        The report and the exporters (which show each wait's split as arguments) share it.

        Example:
            >>> trace.wait_causes["computing_ns"].sum()   # wait time spent on producers computing
        """
        return attribute_waits(self.events, self.releasers)

    @functools.cached_property
    def lanes(self) -> np.ndarray:
        """Per event of :attr:`events`, its lane on its SM (:func:`~iris_trace.lanes.assign_lanes`).

        Computed once per trace, like :attr:`releasers`.

        Example:
            >>> trace.lanes.max() + 1   # the most programs that overlapped on one SM
        """
        return assign_lanes(self.events)

    @property
    def dropped(self) -> list[int]:
        """Events each rank could not record (its buffers were full)."""
        return [r.dropped for r in self.ranks]

    @property
    def scope_names(self) -> dict[int, str]:
        names: dict[int, str] = {}
        for rank_trace in self.ranks:
            names.update(rank_trace.scope_names)
        return names

    def save(self, directory: str) -> list[str]:
        """Write one rank file per rank into ``directory``; returns the paths.

        A directory that a live job of another run writes into is left to it: the files go
        to ``<directory>-<run>`` (:func:`claim_directory`); :attr:`directory` says where.

        Example:
            >>> trace.save("iris_traces")
            ['iris_traces/rank0.npz', 'iris_traces/rank1.npz']
        """
        self.directory = claim_directory(directory, self.run)
        return [r.save(os.path.join(self.directory, f"rank{r.rank}.npz")) for r in self.ranks]
