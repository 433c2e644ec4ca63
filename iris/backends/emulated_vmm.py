"""Emulation backend with room after each heap, which ``as_symmetric`` maps outside memory into.

The emulation's counterpart of :mod:`.cuda_vmm` (``allocator_type="vmem"``), so that the
heap's side of ``as_symmetric`` (one offset on every rank, peers' mappings, the bounds of
``IRIS_DEBUG``'s checks) runs in CI with the same kernels:

- Each heap file is mapped at the start of an address range twice its size, reserved
  with inaccessible pages (``mmap`` of no file, ``PROT_NONE``), in its owner and in every
  peer; the second half is the import window.
- Outside memory is a CPU tensor in shared memory (``tensor.share_memory_()``, a file
  PyTorch holds open), the counterpart of CUDA virtual memory: its descriptor goes to the
  peers as :mod:`.cuda_vmm`'s do (:mod:`._fd_passing`), and every process maps the file at
  the same offset of its window for that rank (``MAP_FIXED`` over the reserved pages).
  A tensor in private memory has no file to share, and is refused in one line.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref
from dataclasses import dataclass

import numpy as np
import torch

from iris_trace import files

from ._fd_passing import exchange_fds
from .base import Allocation, byte_interface
from .emulated import EmulatedBackend, _heap_path, _shm_dir

_PAGE = mmap.PAGESIZE
# Linux's values; Python's mmap module does not name them.
_PROT_NONE, _MAP_FIXED, _MAP_NORESERVE = 0, 0x10, 0x4000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _mmap(address: int, nbytes: int, protection: int, flags: int, fd: int) -> int:
    result = _libc.mmap(address or None, nbytes, protection, flags, fd, 0)
    if result in (None, _MAP_FAILED):
        error = ctypes.get_errno()
        raise OSError(error, f"iris (emulated): mmap of {nbytes} bytes failed: {os.strerror(error)}")
    return int(result)


def _paged(nbytes: int) -> int:
    return -(-nbytes // _PAGE) * _PAGE


class _Reservation:
    """An address range of inaccessible pages with files mapped into it; unmapped when it goes."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        self.address = _mmap(0, nbytes, _PROT_NONE, flags, -1)
        self._finalizer = weakref.finalize(self, _libc.munmap, self.address, nbytes)

    def map(self, offset: int, nbytes: int, fd: int) -> int:
        """Map ``nbytes`` of file ``fd`` from its start at ``offset``, over the reserved pages."""
        if offset < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"iris (emulated): {nbytes} bytes at {offset} leave the reservation")
        protection = mmap.PROT_READ | mmap.PROT_WRITE
        return _mmap(self.address + offset, nbytes, protection, mmap.MAP_SHARED | _MAP_FIXED, fd)

    def release(self) -> None:
        self._finalizer()


class _View:
    """``nbytes`` at ``address`` for numpy (then torch); keeps its reservation mapped."""

    def __init__(self, reservation: _Reservation, address: int, nbytes: int):
        self.reservation = reservation
        self.__array_interface__ = byte_interface(address, nbytes)


def _tensor(reservation: _Reservation, address: int, nbytes: int) -> torch.Tensor:
    # numpy keeps the _View as the array's base and torch keeps the array: the range stays
    # mapped while any tensor of it is left.
    return torch.from_numpy(np.asarray(_View(reservation, address, nbytes)))


@dataclass
class _Outside:
    """A shared-memory tensor: its file (PyTorch's descriptor, open while the tensor lives), the
    file's mapped bytes and the tensor's place."""

    fd: int
    span: int
    tensor_offset: int
    tensor_bytes: int
    alignment: int = _PAGE


class EmulatedVmmBackend(EmulatedBackend):
    """The emulation backend with an import window after every heap (``allocator_type="vmem"``)."""

    allocator = "vmem"

    def allocate(self, nbytes: int, device: torch.device, tag: str) -> Allocation:
        path = _heap_path(_shm_dir(), tag)
        fd = files.create_exclusive(path, nbytes)
        try:
            reservation = _Reservation(2 * _paged(nbytes))
            reservation.map(0, nbytes, fd)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        tensor = _tensor(reservation, reservation.address, nbytes)
        return Allocation(tensor=tensor, handle=path, owner=[reservation, path])

    def map_peer(self, handle, nbytes: int, device: torch.device):
        fd = files.open_own(handle, max_bytes=nbytes, writable=True)
        try:
            size = os.fstat(fd).st_size
            if size != nbytes:
                raise RuntimeError(f"iris (emulated): peer heap {handle} has {size} bytes, expected {nbytes}")
            reservation = _Reservation(2 * _paged(nbytes))
            reservation.map(0, nbytes, fd)
        finally:
            os.close(fd)
        return reservation.address, reservation

    def unmap_peer(self, token) -> None:
        token.release()

    def import_window(self, nbytes: int) -> int:
        return _paged(nbytes)

    def outside_memory(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            return "only CPU tensors can be mapped into an emulated heap"
        if not tensor.is_contiguous():
            return "only contiguous tensors can be mapped into the heap: call .contiguous() first"
        storage = tensor.untyped_storage()
        if not storage.is_shared() or torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
            return (
                "its memory is private to this process: under emulation call tensor.share_memory_() first "
                "(the counterpart of PyTorch's expandable segments on GPUs), or copy it in: "
                "ctx.empty_like(tensor).copy_(tensor)"
            )
        fd, size = storage._share_fd_cpu_()
        if storage.data_ptr() % _PAGE:
            return "its shared memory does not start on a page"
        return _Outside(
            fd=fd,
            span=_paged(size),
            tensor_offset=tensor.data_ptr() - storage.data_ptr(),
            tensor_bytes=tensor.numel() * tensor.element_size(),
        )

    def take_in(self, comm, allocation, peers, outside, offset, spans):
        reservation: _Reservation = allocation.owner[0]
        received = {}
        try:
            received = exchange_fds(comm, [outside.fd])
            reservation.map(offset, outside.span, outside.fd)
            for rank, fds in received.items():
                peers[rank].map(offset, spans[rank], fds[0])
        finally:
            for fds in received.values():
                os.close(fds[0])
        address = reservation.address + offset + outside.tensor_offset
        return _tensor(reservation, address, outside.tensor_bytes)
