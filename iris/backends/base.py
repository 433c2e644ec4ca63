"""The small interface that each way of running Iris implements.

A backend knows how to give a rank one block of memory that other processes can
map, how to map a peer's block, and what "the device" is. Everything above it
(heap, host API, device API) is written once against this interface.
"""

from __future__ import annotations

import mmap
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from . import call_sites


@dataclass
class Allocation:
    """One rank's heap memory as seen by its owner.

    ``tensor`` is a flat ``uint8`` tensor over the whole heap, ``handle`` a picklable
    token that peers pass to :meth:`Backend.map_peer`, and ``owner`` whatever the
    backend must keep alive until :meth:`Backend.free`.
    """

    tensor: torch.Tensor
    handle: Any
    owner: Any


class CopyLanes(ABC):
    """Copy-engine queues beside the current stream, one per lane (a peer, say).

    Copies on a lane run in the order queued, concurrently with the kernels of the
    current stream and with the other lanes; :meth:`fork` and :meth:`join` order
    them against the current stream, so CUDA-graph capture records them too.
    """

    @abstractmethod
    def fork(self) -> None:
        """Work queued on any lane from now on starts after the work queued so far on the current stream."""

    @abstractmethod
    def copy_2d(self, lane: int, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, rows: int):
        """Queue a copy of ``rows`` rows of ``width`` bytes (addresses and pitches in bytes)."""

    @abstractmethod
    def run(self, lane: int, launch: Callable[[], None]) -> None:
        """Call ``launch`` with ``lane`` as the current stream: its kernels follow the lane's copies."""

    @abstractmethod
    def join(self) -> None:
        """Work queued on the current stream from now on starts after everything queued on the lanes."""


def names_device(requested: torch.device, device: torch.device) -> bool:
    """Whether ``requested`` names ``device``: the same type, and the same index unless it gives none.

    Example:
        >>> names_device(torch.device("cuda"), torch.device("cuda:1"))
        True
    """
    if requested.type != device.type:
        return False
    return requested.index is None or requested.index == device.index


def byte_interface(address: int, nbytes: int) -> dict:
    """``nbytes`` of memory at ``address`` as the array interface that numpy and torch read
    (``__array_interface__`` on the host, ``__cuda_array_interface__`` on GPUs).

    Example:
        >>> byte_interface(0x7F0000000000, 4096)["shape"]
        (4096,)
    """
    return {"shape": (nbytes,), "typestr": "|u1", "data": (address, False), "version": 3, "strides": None}


def outside_memory_refused(why: str) -> str:
    """Why a heap that maps nothing after it refuses ``as_symmetric`` of outside memory, and the ways out.

    Example:
        >>> outside_memory_refused("this heap is one cudaMalloc allocation")
        "cannot map memory allocated outside the symmetric heap into it: this heap is one ..."
    """
    return (
        f"cannot map memory allocated outside the symmetric heap into it: {why}; within one node, create "
        "the context with iris.iris(heap_size, allocator_type='vmem') to map such memory in, or copy it "
        "in: ctx.empty_like(tensor).copy_(tensor)"
    )


def describe_bytes(nbytes: int) -> str:
    """A byte count as a person reads it: ``1.5 GiB``, ``64 MiB``, ``512 bytes``.

    Example:
        >>> describe_bytes(3 << 29)
        '1.5 GiB'
    """
    units = (("EiB", 60), ("PiB", 50), ("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10))
    for unit, shift in units:
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} bytes"


class _HostTimingEvent:
    """A timing event on the host clock (:meth:`Backend.timing_event`)."""

    def __init__(self):
        self._at: float | None = None

    def record(self, stream=None) -> None:
        self._at = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _HostTimingEvent) -> float:
        if self._at is None or end._at is None:
            raise RuntimeError("iris: elapsed_time needs both events recorded")
        return (end._at - self._at) * 1e3


class Backend(ABC):
    """Memory, device and synchronisation primitives of one execution backend."""

    #: Short name used by ``IRIS_BACKEND``.
    name: str = ""
    #: True when Triton kernels run under the Triton interpreter on the CPU.
    interpreted: bool = False
    #: torch.distributed backend for host-side coordination.
    dist_backend: str = "gloo"
    #: Upstream's ``allocator_type`` this backend's heap answers to: ``"vmem"`` for the heaps
    #: that ``as_symmetric`` can map outside memory into.
    allocator: str = "torch"

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices ranks on this host can use."""

    def shares_devices(self, local_world_size: int) -> bool:
        """Whether ``local_world_size`` ranks of this host put more than one rank on a device.

        Example:
            >>> backend.shares_devices(4)   # 4 ranks, one GPU, IRIS_RANKS_PER_GPU=4
            True
        """
        return False

    @abstractmethod
    def select_device(self, local_rank: int, local_world_size: int) -> torch.device:
        """Pick and activate this rank's device, or raise if the host has too few."""

    def current_device(self) -> torch.device:
        """The device this process's kernels go to now (where a call names none).

        Example:
            >>> backend.current_device()
            device(type='cuda', index=0)
        """
        return torch.device("cpu")

    def set_current_device(self, index: int) -> None:  # noqa: B027 - optional hook
        """Make device ``index`` the one :meth:`current_device` names (one device here: nothing to do)."""

    def architecture(self, device: torch.device) -> str:
        """The instruction set kernels are built for (``"sm_90"``; ``"interpreter"``)."""
        return "interpreter"

    def timing_event(self):
        """An event that marks a point of the current stream and gives the ms between two
        (``record()``, ``other.elapsed_time(...)`` after ``synchronize``), as
        ``torch.cuda.Event(enable_timing=True)`` does. Here: the host clock, for backends
        whose launches have finished when they return.

        Example:
            >>> start, end = backend.timing_event(), backend.timing_event()
            >>> start.record(); work(); end.record(); end.synchronize()
            >>> start.elapsed_time(end)   # ms
        """
        return _HostTimingEvent()

    @abstractmethod
    def device_name(self, device: torch.device) -> str:
        """What traces and reports call ``device`` (``"NVIDIA H200"``, ``"emulated (CPU)"``)."""

    @abstractmethod
    def describe_gpu(self, device: torch.device) -> dict:
        """What ``iris.host.distributed.topology`` records about ``device``.

        Keys: ``device_name``, ``uuid``, ``pci_bus_id`` (``""`` if none), ``total_memory_mb``,
        ``numa_node`` (-1 if unknown), ``vendor``, ``fabric`` (``(cluster_uuid, clique_id)``
        of its NVLink fabric domain, ``("", 0)`` without one).

        Example:
            >>> backend.describe_gpu(torch.device("cuda", 0))["pci_bus_id"]
            '0000:18:00.0'
        """

    @abstractmethod
    def local_links(self) -> dict:
        """How the devices this process sees connect, by device index.

        Keys: ``link_types`` (rows of ``iris.host.distributed.topology.IntraNodeLinkType`` names, or
        ``None`` when unknown) and ``p2p_access`` (rows of bools, or ``None``).

        Example:
            >>> backend.local_links()["link_types"][0][1]
            'NVLINK'
        """

    @abstractmethod
    def clock_domain(self, device: torch.device) -> str:
        """Which clock device timestamps are on: ranks with the same one need no alignment.

        Example:
            >>> backend.clock_domain(torch.device("cuda", 0))   # the GPU's UUID
            'gpu:5e0a...'
        """

    @abstractmethod
    def multiprocessor_count(self, device: torch.device) -> int:
        """Streaming multiprocessors (Iris: compute units) of ``device``."""

    def memory_bandwidth(self, device: torch.device) -> float:
        """Peak bytes per second of ``device``'s own memory; 0.0 where it is not known.

        ``auto`` reads it where two cards of one architecture chose differently
        (``iris.ops.selection.FAST_MEMORY_BYTES_PER_S``).

        Example:
            >>> backend.memory_bandwidth(torch.device("cuda", 0)) / 1e12   # an H200
            4.8
        """
        return 0.0

    def heap_problem(self, nbytes: int, device: torch.device) -> str:
        """Why a heap of ``nbytes`` per rank cannot be made here (one line), or ``""`` if it can.

        Asked on every rank before anything is allocated, so that a heap the machine cannot
        back fails at once with the room there is, not later with an allocator's error.
        """
        return ""

    def allocation_granularity(self, device: torch.device) -> int:
        """Bytes the heap's physical memory comes in: :meth:`allocate` rounds up to a multiple.

        Example:
            >>> backend.allocation_granularity(torch.device("cuda", 0))   # CUDA: 2 MiB pages
            2097152
        """
        return mmap.PAGESIZE

    def padded_size(self, nbytes: int, device: torch.device) -> int:
        """``nbytes`` rounded up to :meth:`allocation_granularity`: the physical memory behind a
        heap of ``nbytes``.

        Example:
            >>> backend.padded_size(1, torch.device("cuda", 0))   # CUDA: one 2 MiB page
            2097152
        """
        unit = self.allocation_granularity(device)
        return -(-nbytes // unit) * unit

    @abstractmethod
    def allocate(self, nbytes: int, device: torch.device, tag: str) -> Allocation:
        """Allocate ``nbytes`` of shareable memory on ``device``."""

    @abstractmethod
    def map_peer(self, handle: Any, nbytes: int, device: torch.device) -> tuple[int, Any]:
        """Map a peer's heap into this process; returns (address, keep-alive token)."""

    def after_all_mapped(self, allocation: Allocation) -> None:  # noqa: B027 - optional hook
        """Called once every peer has mapped this rank's heap."""

    def share_handles(self, comm, allocation: Allocation) -> list[Any]:
        """Every rank's :attr:`Allocation.handle` as this rank may pass it to :meth:`map_peer`, in
        rank order (collective). The default gathers the handles as they are (picklable tokens).
        """
        return comm.all_gather_object(allocation.handle)

    def import_window(self, nbytes: int) -> int:
        """Bytes of address space kept after a heap of ``nbytes`` (every rank's, in every process)
        for memory taken in from outside (``as_symmetric``): 0 where none can be taken in."""
        return 0

    def outside_memory(self, tensor: torch.Tensor) -> Any:
        """What :meth:`take_in` needs of ``tensor``'s memory (``.span``: the window bytes it takes;
        ``.alignment``: where it may start), or why it cannot be taken in (one line, a ``str``)."""
        return outside_memory_refused("this heap is one shareable allocation")

    def take_in(self, comm, allocation: Allocation, peers: dict[int, Any], outside: Any, offset: int, spans):
        """Map every rank's outside memory at ``offset`` past the heap start, in its own heap and
        in every peer's mapping of it (collective; ``peers``: rank -> :meth:`map_peer` token,
        ``spans``: every rank's ``outside.span``); returns a flat ``uint8`` tensor over this
        rank's memory at its new address."""
        raise NotImplementedError(f"iris: the {self.name} backend takes no outside memory in")

    @abstractmethod
    def unmap_peer(self, token: Any) -> None:
        """Undo :meth:`map_peer`."""

    @abstractmethod
    def free(self, allocation: Allocation) -> None:
        """Release this rank's own heap."""

    def host_visible_zeros(self, count: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
        """Zeroed host memory that kernels write directly; returns (host tensor, address kernels use).

        The host reads it while kernels run and after one has stopped the device.
        The default suits backends whose kernels dereference host addresses directly.
        """
        tensor = torch.zeros(count, dtype=dtype, device="cpu")
        return tensor, tensor.data_ptr()

    def copy_while_running(self, destination: torch.Tensor, source: torch.Tensor) -> None:
        """Copy ``source`` (device) into ``destination`` (host) without waiting for running kernels."""
        destination.copy_(source)

    @abstractmethod
    def copy_lanes(self, device: torch.device, count: int) -> CopyLanes:
        """``count`` copy-engine lanes on ``device`` (see :class:`CopyLanes`)."""

    @abstractmethod
    def synchronize(self, device: torch.device, stream=None) -> None:
        """Wait until queued device work (on ``stream`` or the whole device) is done."""

    def completion_event(self, device: torch.device):
        """An event recorded on ``device``'s current stream now (``query()``, ``synchronize()``).

        ``None`` where queued work is already done when its launch returns (the interpreter).

        Example:
            >>> event = ctx.backend.completion_event(ctx.get_device())
            >>> done = event is None or event.query()
        """
        return None

    def side_stream(self, device: torch.device):
        """A new stream whose kernels run beside the current stream's (use it as ``with stream:``).

        ``None`` where launches run one after another whatever the stream (the
        interpreter): callers then launch in the order they must finish.

        Example:
            >>> side = ctx.backend.side_stream(ctx.get_device())
        """
        return None

    def run_beside(self, side, first: Callable[[], None], second: Callable[[], None], hold=None) -> None:
        """Launch ``first()`` on the current stream and ``second()`` beside it on ``side``.

        Both follow the current stream's earlier work and precede its later work.
        ``hold=(flag, value)`` keeps ``second`` from starting until int32 ``flag`` reaches
        ``value`` (:meth:`wait_value`). Where launches run one after another (``side`` is
        ``None``, see :meth:`side_stream`), ``first`` runs to its end, then ``second``.

        Example:
            >>> ctx.backend.run_beside(side, producer, consumer, hold=(started, programs))
        """
        first()
        second()

    def wait_value(self, flag: torch.Tensor, value: int) -> None:
        """Hold the current stream's later work until int32 ``flag`` (device memory) is at least ``value``.

        The device polls the flag, so a kernel already running on another stream can
        release work queued after this (CUDA graphs capture the wait too). GPU
        backends only: the interpreter runs launches one after another.

        Example:
            >>> ctx.backend.wait_value(started, 132)   # then launch what must follow them
        """
        raise NotImplementedError(f"the {self.name} backend has no stream-ordered waits")

    def capture(self, steps: Sequence[Callable[[], None]]) -> Callable[[], None] | None:
        """Record ``steps`` (launches on the current stream and on streams it forks) as one graph.

        Returns a callable that replays them on the current stream, or ``None`` where
        nothing can be recorded: the interpreter runs each launch as it is called, and
        while a capture is under way (:meth:`capturing`) the steps belong to that one.
        Recording does not run the steps.

        Example:
            >>> replay = ctx.backend.capture([lambda: torch.matmul(a, b, out=c)])
            >>> replay()
        """
        return None

    def capturing(self) -> bool:
        """Whether the current stream is being recorded into a graph (see :meth:`capture`)."""
        return False

    def log_launches(self, on: bool) -> None:
        """Start or stop noting launches of kernels with traced call sites in
        ``call_sites.LAUNCHES`` (while tracing is enabled), with their grids where the
        backend sees them.

        Example:
            >>> backend.log_launches(True)
        """
        call_sites.LAUNCHES.on = bool(on)

    def check_nodes(self, num_nodes: int) -> None:
        """Raise a clear error when this backend cannot run a job that spans ``num_nodes`` nodes.

        Example:
            >>> ctx.backend.check_nodes(2)   # IRIS_RANKS_PER_NODE=2 with 4 ranks
        """
        if num_nodes > 1:
            raise RuntimeError(f"iris: the {self.name} backend cannot reach ranks on other nodes")

    def complete_remote_writes(self) -> None:  # noqa: B027 - nothing to do where writes land at once
        """Complete every cross-node write this rank has issued (NVSHMEM's quiet), so peers see them.

        The host barrier calls it; device code completes its own at every release
        (``signal``, release atomics). Nothing to do within one node.

        Example:
            >>> ctx.backend.complete_remote_writes()
        """

    def accepts_device(self, requested: torch.device, heap_device: torch.device) -> bool:
        """Whether a user's ``device=`` argument names this rank's heap device."""
        return names_device(requested, heap_device)
