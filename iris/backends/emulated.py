"""Emulation backend: ranks are CPU processes, heaps are shared-memory files.

Every rank creates one file of ``heap_size`` bytes, maps it, and maps every
peer's file too, so a raw address into any rank's heap is valid in every
process. Kernels run under the Triton interpreter, which dereferences those raw
addresses, so the same RMA kernels that run on GPUs run here unchanged.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import socket

import torch

from iris_trace import files
from iris_trace.flight_file import pid_alive

from .. import _env
from . import _interpreter_compat
from .base import Allocation, Backend, CopyLanes, describe_bytes

#: SMs reported by ``get_cu_count()``; tracing maps program ids onto them.
DEFAULT_VIRTUAL_SMS = 8


def virtual_sm_count() -> int:
    """SMs the emulator pretends to have (``IRIS_EMU_NUM_SMS``, default 8)."""
    return _env.integer("IRIS_EMU_NUM_SMS", DEFAULT_VIRTUAL_SMS, minimum=1, maximum=4096)


def _shm_dir() -> str:
    """Where the heap files go: ``IRIS_EMU_SHM_DIR``, else this user's own ``/dev/shm/iris-<uid>``."""
    return _env.directory("IRIS_EMU_SHM_DIR") or files.private_directory()


_HEAP_PREFIX = "iris-heap-"
_HEAP_NAME = re.compile(r"iris-heap-[0-9a-f]+-rank\d+-pid(?P<pid>\d+)$")


def _heap_path(directory: str, tag: str) -> str:
    # The creator's pid in the name: a file whose creator died during set-up (before
    # every peer mapped it and the name was removed) is found and removed by the next start.
    return os.path.join(directory, f"{_HEAP_PREFIX}{tag}-pid{os.getpid()}")


def _remove_stale_heaps(directory: str) -> None:
    """Delete heap files of this user's that a process which is gone left behind."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = _HEAP_NAME.match(name)
        path = os.path.join(directory, name)
        if match and files.is_own_file(path) and not pid_alive(int(match["pid"])):
            try:
                os.unlink(path)
            except OSError:
                pass


def _map_file(path: str, nbytes: int, create: bool) -> tuple[mmap.mmap, torch.Tensor]:
    if create:
        fd = files.create_exclusive(path, nbytes)
    else:
        fd = files.open_own(path, max_bytes=nbytes, writable=True)
    try:
        size = os.fstat(fd).st_size
        if size != nbytes:
            raise RuntimeError(f"iris (emulated): peer heap {path} has {size} bytes, expected {nbytes}")
        region = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        if create:
            os.unlink(path)
        raise
    os.close(fd)
    # torch.frombuffer keeps the mmap alive for as long as any view of the heap exists,
    # so dropping Iris's own reference can never leave a dangling pointer.
    return region, torch.frombuffer(region, dtype=torch.uint8)


class _ImmediateLanes(CopyLanes):
    """Copies done at once by the CPU: the interpreter runs every launch to its end before
    the next one starts, so work queued "beside" the current stream is simply work done now."""

    def fork(self) -> None:
        pass

    def copy_2d(self, lane, dst, dst_pitch, src, src_pitch, width, rows):
        if dst_pitch == src_pitch == width:
            ctypes.memmove(dst, src, width * rows)
            return
        for row in range(rows):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, width)

    def run(self, lane, launch):
        launch()

    def join(self) -> None:
        pass


class RemoteWrites:
    """This rank's cross-node writes in flight: the emulation's model of NVSHMEM completion.

    A put to a rank of another node (``IRIS_RANKS_PER_NODE``) is not written when it
    is issued: its bytes wait here until this rank completes its writes (a ``quiet``:
    every release op does one, and so does the host barrier), as NVSHMEM leaves a put
    incomplete until ``nvshmem_quiet``. NVSHMEM still delivers a put eventually, so the
    writes also land when this rank spins in a wait (``intrinsics.progress``) and when
    its kernel ends. A program that reads cross-node data before any of these, without a
    signal in between, sees stale data here as it could on a cluster.
    """

    _pending: list[tuple[int, bytes]] = []

    @classmethod
    def defer(cls, addresses, data) -> None:
        """Hold the write of ``data[i]`` (bytes) to raw address ``addresses[i]`` until :meth:`complete`."""
        cls._pending.extend(zip((int(a) for a in addresses), data))

    @classmethod
    def complete(cls) -> int:
        """Write everything held, in issue order; returns how many writes landed."""
        pending, cls._pending = cls._pending, []
        for address, data in pending:
            ctypes.memmove(address, data, len(data))
        return len(pending)


_interpreter_compat.AFTER_LAUNCH.append(RemoteWrites.complete)


class EmulatedBackend(Backend):
    name = "emulated"
    interpreted = True
    dist_backend = "gloo"

    def device_count(self) -> int:
        return os.cpu_count() or 1

    def select_device(self, local_rank: int, local_world_size: int) -> torch.device:
        return torch.device("cpu")

    def multiprocessor_count(self, device: torch.device) -> int:
        return virtual_sm_count()

    def device_name(self, device: torch.device) -> str:
        return "emulated (CPU)"

    def describe_gpu(self, device: torch.device) -> dict:
        # Every rank of a host runs its kernels on the one CPU: one "GPU", shared.
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
        return {
            "device_name": self.device_name(device),
            "uuid": f"emulated:{socket.gethostname()}",
            "pci_bus_id": "",
            "total_memory_mb": memory,
            "numa_node": -1,
            "vendor": "emulated",
            "fabric": ("", 0),
        }

    def local_links(self) -> dict:
        return {"link_types": [["SELF"]], "p2p_access": [[True]]}

    def clock_domain(self, device: torch.device) -> str:
        # Interpreted kernels read the host's clock: every rank of a host shares it.
        return f"host:{socket.gethostname()}"

    def heap_problem(self, nbytes: int, device: torch.device) -> str:
        directory = _shm_dir()
        _remove_stale_heaps(directory)  # before the free space is read: what they held is free
        ranks = _env.local_world_size()
        info = os.statvfs(directory)
        free = info.f_bavail * info.f_frsize
        if nbytes * ranks <= free:
            return ""
        each, all_ranks, room = describe_bytes(nbytes), describe_bytes(nbytes * ranks), describe_bytes(free)
        return (
            f"a heap of {each} per rank ({all_ranks} for the {ranks} rank(s) of this host) does not fit "
            f"in {directory}, which has {room} free: lower heap_size, or set IRIS_EMU_SHM_DIR to a "
            "directory with room (in Docker, --shm-size raises /dev/shm's 64 MiB)"
        )

    def allocate(self, nbytes: int, device: torch.device, tag: str) -> Allocation:
        path = _heap_path(_shm_dir(), tag)
        region, tensor = _map_file(path, nbytes, create=True)
        return Allocation(tensor=tensor, handle=path, owner=[region, path])

    def map_peer(self, handle, nbytes: int, device: torch.device):
        region, tensor = _map_file(handle, nbytes, create=False)
        return tensor.data_ptr(), tensor

    def after_all_mapped(self, allocation: Allocation) -> None:
        # Every peer holds its own mapping now; removing the name means nothing is
        # left behind in /dev/shm even if a rank is killed later.
        if allocation.owner:
            try:
                os.unlink(allocation.owner[1])
            except FileNotFoundError:
                pass

    def unmap_peer(self, token) -> None:
        pass  # the mapping goes away with the last tensor that references it

    def free(self, allocation: Allocation) -> None:
        self.after_all_mapped(allocation)
        allocation.owner.clear()

    def copy_lanes(self, device: torch.device, count: int) -> CopyLanes:
        return _ImmediateLanes()

    def synchronize(self, device: torch.device, stream=None) -> None:
        pass  # the interpreter runs kernels synchronously

    def check_nodes(self, num_nodes: int) -> None:
        pass  # every "node" is a group of processes of this host: the model runs anywhere

    def complete_remote_writes(self) -> None:
        RemoteWrites.complete()

    def accepts_device(self, requested: torch.device, heap_device: torch.device) -> bool:
        # Code written for GPUs says device="cuda"; here the CPU stands in for the GPU.
        return requested.type in ("cpu", "cuda")
