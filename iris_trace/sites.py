"""Which kernel, launch and source line each event came from.

Every record carries two 24-bit tags (:mod:`iris_trace.schema`): the id of the call site
of the op, fixed when its kernel was compiled, and the tag of the launch that ran it (the
GPU's launch number, or the interpreter's). A rank file names them: ``sites`` maps a site
id to its kernel, file and line; ``launches`` maps a launch tag to its kernel, its index
among that rank's launches of the kernel that recorded events, and its grid where the
host saw it (:func:`name_launches`). This module holds both tables' forms and the labels
the exports, the report and the checks show: ``put_kernel · app.py:42``,
``put_kernel #3 (8, 1, 1)``.
"""

from __future__ import annotations

import dataclasses
import linecache
import os

import numpy as np

from .schema import UNKNOWN_SITE

#: The label of an event whose call site or launch is not known.
UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Site:
    """One call site of a traced op: the kernel it was compiled into, and its source line.

    Example:
        >>> Site("put_kernel", "/work/app.py", 42).label
        'put_kernel · app.py:42'
    """

    kernel: str
    file: str
    line: int

    @property
    def label(self) -> str:
        return f"{self.kernel} · {os.path.basename(self.file)}:{self.line}"

    def source(self) -> str:
        """The line's text, where the file is still there to read ("" otherwise)."""
        return linecache.getline(self.file, self.line).strip()


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch: its kernel, its index among the rank's launches of that kernel that recorded
    events (from 0, in order), and its grid (None where the host did not see it).

    Example:
        >>> Launch("put_kernel", 3, (8, 1, 1)).label
        'put_kernel #3 (8, 1, 1)'
    """

    kernel: str
    index: int
    grid: tuple[int, int, int] | None = None

    @property
    def label(self) -> str:
        return f"{self.kernel} #{self.index}" + ("" if self.grid is None else f" {self.grid}")


def name_launches(
    events: np.ndarray, sites: dict[int, Site], log: list[tuple[str, tuple | None, int | None]]
) -> dict[int, Launch]:
    """Each launch tag of one rank's ``events``: its kernel, index and grid.

    A launch's kernel is its events' sites' kernel. ``log`` is the host's list of launches
    of kernels with sites, in order, as ``(kernel, grid, tag)``: under emulation each entry
    has its tag, so it names its launch outright; on GPUs the tag is not known to the host,
    so a kernel's launches take its log entries in order where the counts agree (every
    launch recorded something) and have no grid where they do not.

    Example:
        >>> name_launches(events, sites, [("put_kernel", (8, 1, 1), None)])
        {4097: Launch(kernel='put_kernel', index=0, grid=(8, 1, 1))}
    """
    if not len(events):
        return {}
    tags, first = np.unique(events["launch"], return_index=True)  # events are sorted by start
    kernels = dict.fromkeys(tags.tolist(), "")
    # Each (tag, site) pair once, sites ascending within a tag: a tag's kernel is its first known site's.
    pairs = np.unique(np.stack([events["launch"].astype(np.int64), events["site"].astype(np.int64)]), axis=1)
    for tag, site in pairs.T.tolist():
        if not kernels[tag] and site != UNKNOWN_SITE and site in sites:
            kernels[tag] = sites[site].kernel
    by_kernel: dict[str, list[int]] = {}
    for tag in tags[np.argsort(first, kind="stable")].tolist():
        by_kernel.setdefault(kernels[tag], []).append(tag)
    launches = {}
    for kernel, ordered in by_kernel.items():
        logged = [(grid, tag) for name, grid, tag in log if name == kernel]
        by_tag = {tag: grid for grid, tag in logged if tag is not None}
        in_order = len(logged) == len(ordered) and not by_tag
        for index, tag in enumerate(ordered):
            grid = by_tag.get(tag) if by_tag else (logged[index][0] if in_order else None)
            launches[tag] = Launch(kernel, index, None if grid is None else tuple(grid))
    return launches


def launch_keys(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each event's launch as a key per (rank, launch tag): the distinct keys, each event's index in them.

    Example:
        >>> keys, inverse = launch_keys(trace.events)
        >>> launch_at(trace.launches, int(keys[inverse[0]])).label
        'gemm_kernel #0 (264, 1, 1)'
    """
    keys = events["cur_rank"].astype(np.int64) << 32 | events["launch"].astype(np.int64)
    unique, inverse = np.unique(keys, return_inverse=True)
    return unique, inverse.reshape(-1)


def launch_at(launches: list[dict[int, Launch]], key: int) -> Launch | None:
    """The launch a :func:`launch_keys` key names, from each rank's launches by tag (None: not known)."""
    rank, tag = key >> 32, key & 0xFFFFFFFF
    return launches[rank].get(tag) if rank < len(launches) else None


def origins(events: np.ndarray, sites: dict[int, Site], launches: list[dict[int, Launch]]):
    """Per event, the index of its call site's label and of its launch's label in ``labels``.

    ``launches`` is each rank's table (:func:`name_launches`). Returns
    ``(site_index, launch_index, labels)``; an unknown site or launch reads :data:`UNKNOWN`
    (label 0).

    Example:
        >>> site_at, launch_at, labels = origins(trace.events, trace.sites, trace.launches)
        >>> labels[site_at[0]]
        'put_kernel · app.py:42'
    """
    labels = [UNKNOWN]
    index = {UNKNOWN: 0}

    def label_of(text: str) -> int:
        if text not in index:
            index[text] = len(labels)
            labels.append(text)
        return index[text]

    site_ids, site_inverse = np.unique(events["site"], return_inverse=True)
    site_labels = np.array(
        [label_of(sites[s].label) if s in sites else 0 for s in site_ids.tolist()], dtype=np.int64
    )
    keys, launch_inverse = launch_keys(events)
    launch_labels = []
    for key in keys.tolist():
        found = launch_at(launches, key)
        launch_labels.append(label_of(found.label) if found is not None else 0)
    return (
        site_labels[site_inverse.reshape(-1)],
        np.array(launch_labels, dtype=np.int64)[launch_inverse],
        labels,
    )
