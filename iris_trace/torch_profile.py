"""PyTorch profiler (Kineto) events on the Iris trace's clock: host ops, CUDA kernels, Iris ops together.

``ctx.tracing.torch_profiler()`` runs ``torch.profiler.profile`` and, at its start and at
its end, a few *clock markers*: a one-thread kernel (``iris_clock_marker``) that stores
the GPU's clock, each launched inside a ``record_function("iris::clock_marker")`` range
and waited for. The profiler sees every marker as a CUDA kernel (a slice on its own clock,
Kineto's: host nanoseconds since the epoch) and Iris holds the time the marker read
inside it (the rank's device clock, the one its events are on). The device time lies
inside the kernel's slice, so each marker bounds the offset between the clocks from both
sides; the markers of one end are intersected (:func:`fit_profile_clock`), and the two
ends give the drift. Where the profile has no CUDA activity (emulation, or a profile of
CPU activity only) the ``record_function`` ranges stand in for the kernels: under
emulation the marker runs inside its range on the host clock Iris's events use, so
the same bounds hold; on a GPU a range bounds the launch, not the clock, and the fit
says how uncertain it is.

A rank's profile is kept as a compact table (:class:`TorchProfile`): every complete
event (``"ph": "X"``) with its name, track (a host thread or a CUDA stream), start,
duration and correlation id (which ties a CUDA runtime call to the kernel or copy it
launched). Rank files store it beside the events; the Perfetto writer puts each rank's
host threads and CUDA streams under that rank, on rank 0's clock, with an arrow from
each launch to its kernel.

Example:
    >>> profile = TorchProfile.from_kineto(json.load(open("kineto.json")), device_stamps)
    >>> clock = profile.clock()        # Kineto time -> this rank's device clock
    >>> device_ns = clock.to_device(profile.events["start_ns"])
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

#: The marker kernel's name, as the profiler lists it, and the host range around each launch.
MARKER_KERNEL = "iris_clock_marker"
MARKER_RANGE = "iris::clock_marker"
#: Markers taken at each end of a profile.
MARKERS_PER_END = 8

TORCH_EVENT_DTYPE = np.dtype(
    [
        ("start_ns", np.int64),  # Kineto's clock
        ("dur_ns", np.int64),
        ("name", np.int32),  # index into TorchProfile.names
        ("track", np.int32),  # index into TorchProfile.tracks
        ("correlation", np.int64),  # CUDA launch <-> kernel or copy (-1: none)
        ("device_side", np.bool_),  # a GPU activity (kernel, copy, set) rather than a host one
    ]
)
#: Kineto categories of GPU activity, drawn on a CUDA stream track.
_DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}
#: Kineto categories whose ``correlation`` is a launch a GPU activity points back to.
_LAUNCH_CATEGORIES = {"cuda_runtime", "cuda_driver"}
#: Names and tracks beyond these counts are not a profile's (a hostile file's).
MAX_STRINGS = 1 << 20


class ProfileError(ValueError):
    """A profile that cannot be aligned or read; the message says why in one line."""


@dataclass
class ProfileClock:
    """Kineto's clock to this rank's device clock: ``kineto - (offset_ns + drift * (kineto - at_ns))``.

    ``uncertainty_ns`` bounds the error at the markers: half the width of the narrowest
    offset interval the markers left (or their spread, where they disagreed).
    """

    offset_ns: float
    drift: float
    at_ns: float
    uncertainty_ns: float
    source: str  # "kernels" or "host ranges": what the markers were found as

    def to_device(self, kineto_ns: np.ndarray) -> np.ndarray:
        """Kineto timestamps (ns) on the rank's device clock (float ns).

        Example:
            >>> clock.to_device(np.array([profile.events["start_ns"][0]]))
        """
        kineto = np.asarray(kineto_ns, dtype=np.float64)
        return kineto - (self.offset_ns + self.drift * (kineto - self.at_ns))


def fit_profile_clock(anchors: np.ndarray, source: str = "kernels") -> ProfileClock:
    """The clock map from ``anchors``, rows of ``(device_ns, kineto_lo_ns, kineto_hi_ns, end)``.

    Each row says the marker read ``device_ns`` while the profiler saw it between
    ``kineto_lo_ns`` and ``kineto_hi_ns``, so ``kineto - device`` lies in ``[lo - d, hi - d]``.
    The rows of one end (``end`` 0 or 1) are intersected; an empty intersection (the
    clocks moved apart during the markers) falls back to the median of the midpoints.
    Two ends give a drift.

    Example:
        >>> fit_profile_clock(np.array([[100, 1100, 1102, 0], [200, 1199, 1203, 0]])).offset_ns
        1001.0
    """
    anchors = np.asarray(anchors, dtype=np.float64).reshape(-1, 4)
    if not len(anchors):
        raise ProfileError("the profile holds no clock markers")
    points = []
    for end in (0, 1):
        rows = anchors[anchors[:, 3] == end]
        if not len(rows):
            continue
        low, high = rows[:, 1] - rows[:, 0], rows[:, 2] - rows[:, 0]
        if low.max() <= high.min():
            offset, half = (low.max() + high.min()) / 2, (high.min() - low.max()) / 2
        else:
            middles = (low + high) / 2
            offset = float(np.median(middles))
            half = float(np.max(np.abs(middles - offset)) + np.min(high - low) / 2)
        points.append((float(np.median(rows[:, 0])) + offset, float(offset), float(half)))
    (at, offset, half) = points[0]
    drift = 0.0
    if len(points) == 2 and points[1][0] > at:
        drift = (points[1][1] - offset) / (points[1][0] - at)
        half = max(half, points[1][2])
    return ProfileClock(offset_ns=offset, drift=drift, at_ns=at, uncertainty_ns=half, source=source)


@dataclass
class TorchProfile:
    """One rank's PyTorch profiler events, and the clock markers that align them.

    ``anchors``: rows of ``(device_ns, kineto_lo_ns, kineto_hi_ns, end)`` (:func:`fit_profile_clock`).
    """

    events: np.ndarray
    names: list[str]
    tracks: list[str]
    anchors: np.ndarray
    source: str = "kernels"

    @classmethod
    def from_kineto(cls, document: dict, device_stamps: np.ndarray) -> TorchProfile:
        """Read a Kineto Chrome trace (``prof.export_chrome_trace``) whose markers read ``device_stamps``.

        ``device_stamps`` is ``(2, MARKERS_PER_END)``: the device times the markers read at
        the profile's start and end. The markers are found as CUDA kernels named
        :data:`MARKER_KERNEL`, or failing those as host ranges named :data:`MARKER_RANGE`.
        Markers themselves are left out of the events.

        Raises:
            ProfileError: the document is not a Kineto trace, or its markers do not match.

        Example:
            >>> TorchProfile.from_kineto(json.load(open("trace.json")), stamps)
        """
        raw = document.get("traceEvents") if isinstance(document, dict) else None
        if not isinstance(raw, list):
            raise ProfileError("not a PyTorch profiler trace (no traceEvents list)")
        base = document.get("baseTimeNanoseconds", 0)
        base = base if isinstance(base, int) and not isinstance(base, bool) else 0
        stamps = np.asarray(device_stamps, dtype=np.int64).reshape(2, -1)
        complete = [e for e in raw if isinstance(e, dict) and e.get("ph") == "X" and _is_time(e)]
        threads = _thread_names(raw)
        kernels = sorted((e for e in complete if _is_marker(e, MARKER_KERNEL, "kernel")), key=_ts)
        ranges = sorted((e for e in complete if _is_marker(e, MARKER_RANGE, None)), key=_ts)
        if len(kernels) == stamps.size:
            markers, source = kernels, "kernels"
        elif len(ranges) == stamps.size:
            markers, source = ranges, "host ranges"
        else:
            raise ProfileError(
                f"the profile holds {len(kernels)} marker kernels and {len(ranges)} marker ranges, "
                f"expected {stamps.size} (was it taken with ctx.tracing.torch_profiler()?)"
            )
        anchors = np.array(
            [
                (stamp, _ns(e["ts"], base), _ns(e["ts"], base) + _ns(e["dur"], 0), index // stamps.shape[1])
                for index, (stamp, e) in enumerate(zip(stamps.reshape(-1).tolist(), markers))
            ],
            dtype=np.int64,
        )
        skip = {id(e) for e in kernels} | {id(e) for e in ranges}
        kept = [e for e in complete if id(e) not in skip]
        names: dict[str, int] = {}
        tracks: dict[str, int] = {}
        events = np.zeros(len(kept), dtype=TORCH_EVENT_DTYPE)
        for row, e in enumerate(kept):
            device_side = e.get("cat") in _DEVICE_CATEGORIES
            events[row] = (
                _ns(e["ts"], base),
                max(_ns(e["dur"], 0), 0),
                names.setdefault(str(e.get("name", "?")), len(names)),
                tracks.setdefault(_track_name(e, device_side, threads), len(tracks)),
                _correlation(e),
                device_side,
            )
        events = events[np.argsort(events["start_ns"], kind="stable")]
        return cls(events=events, names=list(names), tracks=list(tracks), anchors=anchors, source=source)

    def clock(self) -> ProfileClock:
        """The map from Kineto's clock to this rank's device clock (:func:`fit_profile_clock`).

        Example:
            >>> profile.clock().uncertainty_ns
            850.0
        """
        return fit_profile_clock(self.anchors, self.source)

    def launches(self) -> tuple[np.ndarray, np.ndarray]:
        """Pairs of event indices ``(launch, activity)``: a CUDA runtime call and the GPU work it launched.

        Example:
            >>> launch, kernel = profile.launches()
        """
        corr = self.events["correlation"]
        device = self.events["device_side"]
        host_rows = np.flatnonzero(~device & (corr >= 0))
        device_rows = np.flatnonzero(device & (corr >= 0))
        if not len(host_rows) or not len(device_rows):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        order = host_rows[np.argsort(corr[host_rows], kind="stable")]
        at = np.searchsorted(corr[order], corr[device_rows])
        at = np.minimum(at, len(order) - 1)
        found = corr[order[at]] == corr[device_rows]
        return order[at[found]], device_rows[found]

    # ------------------------------------------------------------------ rank files
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a rank file stores (``torch_events``, ``torch_anchors``, ``torch_strings``)."""
        strings = json.dumps({"names": self.names, "tracks": self.tracks, "source": self.source})
        return {
            "torch_events": self.events,
            "torch_anchors": self.anchors,
            "torch_strings": np.array(strings),
        }

    @classmethod
    def from_arrays(cls, path: str, arrays: dict[str, np.ndarray]) -> TorchProfile:
        """Read back :meth:`arrays`, every part checked; raises :class:`ProfileError` naming ``path``.

        Example:
            >>> TorchProfile.from_arrays("rank0.npz", arrays)
        """
        events, anchors = arrays["torch_events"], arrays["torch_anchors"]
        if events.dtype != TORCH_EVENT_DTYPE or events.ndim != 1:
            raise ProfileError(f"{path}: torch_events have dtype {events.dtype}, expected the profile dtype")
        if anchors.dtype.kind not in "iu" or anchors.ndim != 2 or anchors.shape[1] != 4 or not len(anchors):
            raise ProfileError(f"{path}: torch_anchors of shape {anchors.shape} are not clock markers")
        try:
            strings = json.loads(str(arrays["torch_strings"][()]))
            names, tracks, source = strings["names"], strings["tracks"], strings["source"]
        except (ValueError, TypeError, KeyError, IndexError):
            raise ProfileError(f"{path}: torch_strings is not the profile's names and tracks") from None
        valid = (
            isinstance(names, list) and isinstance(tracks, list) and len(names) + len(tracks) <= MAX_STRINGS
        )
        if not valid or not all(isinstance(s, str) for s in (*names, *tracks)):
            raise ProfileError(f"{path}: torch_strings is not the profile's names and tracks")
        if source not in ("kernels", "host ranges"):
            raise ProfileError(f"{path}: the profile's markers are of an unknown kind {source!r}")
        if len(events):
            if events["name"].min() < 0 or events["name"].max() >= len(names):
                raise ProfileError(f"{path}: a profile event names a string the file does not hold")
            if events["track"].min() < 0 or events["track"].max() >= len(tracks):
                raise ProfileError(f"{path}: a profile event is on a track the file does not hold")
            durations = events["dur_ns"]
            if durations.min() < 0 or max(np.abs(events["start_ns"]).max(), durations.max()) >= 1 << 62:
                raise ProfileError(f"{path}: a profile event's time is beyond any clock's range")
        if np.abs(anchors.astype(np.int64)).max() >= 1 << 62 or not set(anchors[:, 3].tolist()) <= {0, 1}:
            raise ProfileError(f"{path}: a clock marker is beyond any clock's range")
        return cls(
            events=events.copy(), names=names, tracks=tracks, anchors=anchors.astype(np.int64), source=source
        )


def _is_time(event: dict) -> bool:
    return all(
        isinstance(event.get(k), (int, float)) and not isinstance(event.get(k), bool) for k in ("ts", "dur")
    )


def _ts(event: dict) -> float:
    return event["ts"]


def _ns(microseconds: float, base: int) -> int:
    # Kineto writes microseconds with three decimals, from baseTimeNanoseconds where given.
    return int(round(microseconds * 1000)) + base


def _is_marker(event: dict, name: str, category: str | None) -> bool:
    return event.get("name") == name and (category is None or event.get("cat") == category)


def _correlation(event: dict) -> int:
    args = event.get("args")
    value = args.get("correlation", -1) if isinstance(args, dict) else -1
    if event.get("cat") not in _DEVICE_CATEGORIES | _LAUNCH_CATEGORIES:
        return -1
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def _thread_names(raw: list) -> dict[tuple, str]:
    # Kineto's metadata events name threads ("thread 12 (python)") and streams.
    names = {}
    for e in raw:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name":
            args = e.get("args")
            if isinstance(args, dict) and isinstance(args.get("name"), str):
                names[(e.get("pid"), e.get("tid"))] = args["name"]
    return names


def _track_name(event: dict, device_side: bool, threads: dict) -> str:
    pid, tid = event.get("pid"), event.get("tid")
    if device_side:
        args = event.get("args") if isinstance(event.get("args"), dict) else {}
        stream = args.get("stream", tid)
        # A record_function range as the GPU ran it spans kernels: a row of its own.
        ranges = " · ranges" if event.get("cat") == "gpu_user_annotation" else ""
        return f"CUDA stream {stream}{ranges}"
    return f"host · {threads.get((pid, tid), f'thread {tid}')}"
