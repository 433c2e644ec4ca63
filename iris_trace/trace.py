"""Per-rank trace files and the merged, clock-aligned multi-rank trace.

A rank file (``.npz``) holds one rank's decoded events plus everything needed
to align it with the others::

    events        EVENT_DTYPE array, timestamps in that GPU's own clock
    sync_enable   int64 (world, rounds, 4) ping-pong stamps taken at enable()
    sync_collect  int64 (world, rounds, 4) the same at collect()
    meta          JSON: format, rank, world_size, dropped, device, heap_size,
                  num_sms, scope_names, command, clock_domain (ranks with the same one
                  read the same clock: one GPU, or the host under emulation)

:class:`Trace` merges one file (or in-memory :class:`RankTrace`) per rank and
maps every timestamp onto rank 0's clock.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field

import numpy as np

from .attribution import attribute_waits
from .clock import ClockFit, fit_all
from .events import EVENT_DTYPE, upgrade
from .lanes import assign_lanes
from .matching import match_releasers

FORMAT = "iris-trace-rank/1"


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
        }

    def save(self, path: str) -> str:
        """Write this rank's ``.npz`` file; returns the path.

        Example:
            >>> rank_trace.save("traces/rank0.npz")
        """
        arrays = {"events": self.events, "sync_enable": self.sync_enable}
        if self.sync_collect is not None:
            arrays["sync_collect"] = self.sync_collect
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        np.savez(path, meta=np.array(json.dumps(self.meta())), **arrays)
        return path

    @classmethod
    def load(cls, path: str) -> RankTrace:
        """Read a rank file written by :meth:`save`, with errors that name the file.

        Example:
            >>> rank0 = RankTrace.load("traces/rank0.npz")
        """
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
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                events = upgrade(data["events"])
                sync_enable = data["sync_enable"]
                sync_collect = data["sync_collect"] if "sync_collect" in data.files else None
        except FileNotFoundError:
            raise TraceFileError(f"{path}: no such trace file") from None
        except (OSError, ValueError, KeyError) as exc:
            raise TraceFileError(f"{path}: not a readable Iris rank trace ({exc})") from None
        if meta.get("format") != FORMAT:
            raise TraceFileError(f"{path}: format {meta.get('format')!r}, expected {FORMAT!r}")
        if events.dtype != EVENT_DTYPE:
            raise TraceFileError(f"{path}: events have dtype {events.dtype}, expected the Iris event dtype")
        world = meta["world_size"]
        if sync_enable.shape[:1] != (world,) or sync_enable.ndim != 3 or sync_enable.shape[2] != 4:
            raise TraceFileError(
                f"{path}: clock samples of shape {sync_enable.shape} do not fit world size {world}"
            )
        return cls(
            rank=meta["rank"],
            world_size=world,
            events=events,
            sync_enable=sync_enable,
            sync_collect=sync_collect,
            dropped=meta.get("dropped", 0),
            device=meta.get("device", ""),
            heap_size=meta.get("heap_size", 0),
            num_sms=meta.get("num_sms", 0),
            scope_names={int(k): v for k, v in meta.get("scope_names", {}).items()},
            command=meta.get("command", ""),
            clock_domain=meta.get("clock_domain", ""),
        )


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
        reference = self.ranks[0]
        domain = reference.clock_domain
        shared = [bool(domain) and r.clock_domain == domain for r in self.ranks]
        self.clock_fits: list[ClockFit] = fit_all(reference.sync_enable, reference.sync_collect, shared)
        self.events = self._aligned_events()

    @property
    def shares_a_clock(self) -> bool:
        """Whether two or more ranks read one clock (ranks sharing a GPU, or emulated on one host).

        Example:
            >>> Trace.from_files(files).shares_a_clock
            False
        """
        domains = [r.clock_domain for r in self.ranks if r.clock_domain]
        return len(set(domains)) < len(domains)

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
        """Write one rank file per rank into ``directory``; returns the paths."""
        return [r.save(os.path.join(directory, f"rank{r.rank}.npz")) for r in self.ranks]
