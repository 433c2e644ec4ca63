"""CUDA backend with a virtual-memory heap, which can take outside memory in (``allocator_type="vmem"``).

The default CUDA heap (:mod:`.cuda_ipc`) is one ``cudaMalloc`` allocation that peers open
by IPC handle at an address the driver picks, so nothing can ever be placed after it. Here
the heap is built from CUDA's virtual-memory calls instead:

- Each rank reserves an address range twice the heap's size (``cuMemAddressReserve``),
  backs the first half with physical memory (``cuMemCreate``, ``cuMemMap``) and keeps the
  second half, the *import window*, for memory taken in later.
- The physical memory is exported as a POSIX file descriptor and passed to the other
  ranks of the host over Unix sockets (:mod:`._fd_passing`, which
  checks each sender's credentials); each peer imports it (``cuMemImportFromShareableHandle``)
  into a reservation of the same size, so every rank's heap has a window after it in
  every process.
- ``as_symmetric(tensor)`` takes the tensor's own physical memory, mapping by mapping
  (``cuMemGetAddressRange``, ``cuMemRetainAllocationHandle``), and maps it at one offset in the window on
  every rank; peers map the same memory, passed to them as descriptors, at that offset of
  their reservation for the rank. Device code then reaches it with the usual translation.

Only memory made with ``cuMemCreate`` has a handle to map: PyTorch's expandable segments
(``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) do; its default allocator's
``cudaMalloc`` memory does not (``tests/test_outside_memory.py``), and is refused in one
line that says so.
"""

from __future__ import annotations

import functools
import os
import sys
import weakref
from dataclasses import dataclass

import torch

from ._fd_passing import exchange_fds
from .base import Allocation
from .cuda_ipc import CudaBackend, _DeviceBuffer


def _driver():
    from cuda.bindings import driver

    return driver


def _ok(result, what: str):
    driver = _driver()
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"iris: {what} failed with {driver.cuGetErrorName(err)[1].decode()}")
    return values[0] if len(values) == 1 else (values or None)


def _fd_type():
    return _driver().CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR


def _properties(device: torch.device):
    driver = _driver()
    properties = driver.CUmemAllocationProp()
    properties.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    properties.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    properties.location.id = device.index
    properties.requestedHandleTypes = _fd_type()
    return properties


@functools.cache  # a driver call, and the same answer for a device every time
def _granularity(device: torch.device) -> int:
    driver = _driver()
    recommended = driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    return int(_ok(driver.cuMemGetAllocationGranularity(_properties(device), recommended), "granularity"))


def _allow(address: int, nbytes: int, device: torch.device) -> None:
    """Let ``device`` read and write ``nbytes`` mapped at ``address``."""
    driver = _driver()
    access = driver.CUmemAccessDesc()
    access.location.type = driver.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = device.index
    access.flags = driver.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    _ok(driver.cuMemSetAccess(address, nbytes, [access], 1), "cuMemSetAccess")


class _Reservation:
    """An address range and the physical memory mapped into it, all given back when it goes.

    Tensors over the range hold it (through their buffers), so the memory stays mapped
    while any tensor of it is left, whatever the context does.
    """

    def __init__(self, nbytes: int, alignment: int):
        self.nbytes = nbytes
        self.address = int(_ok(_driver().cuMemAddressReserve(nbytes, alignment, 0, 0), "cuMemAddressReserve"))
        self.mappings: list[tuple[int, int, object]] = []  # (address, bytes, handle), each released
        self._finalizer = weakref.finalize(self, _release, self.address, nbytes, self.mappings)

    def map(self, offset: int, nbytes: int, handle, device: torch.device) -> int:
        """Map ``handle`` (``nbytes`` from its first byte) at ``offset``. The handle is the
        reservation's from then on, released with it, or at once where the mapping fails."""
        driver = _driver()
        address = self.address + offset
        result = driver.cuMemMap(address, nbytes, 0, handle, 0)
        if result[0] != driver.CUresult.CUDA_SUCCESS:
            driver.cuMemRelease(handle)
            _ok(result, "cuMemMap")
        self.mappings.append((address, nbytes, handle))
        _allow(address, nbytes, device)
        return address

    def release(self) -> None:
        self._finalizer()


def _release(address: int, nbytes: int, mappings: list) -> None:
    # Called by the garbage collector too: errors (a device gone at exit) go to the log.
    driver = _driver()
    # Unmapping does not wait for kernels still reading the memory (cudaFree would): wait here.
    driver.cuCtxSynchronize()
    for mapped, size, handle in reversed(mappings):
        for call, what in ((lambda: driver.cuMemUnmap(mapped, size), "cuMemUnmap"),
                           (lambda: driver.cuMemRelease(handle), "cuMemRelease")):  # fmt: skip
            try:
                _ok(call(), what)
            except Exception as error:  # noqa: BLE001 - nothing above to raise to
                sys.stderr.write(f"iris: releasing heap memory at {mapped:#x}: {error}\n")
    mappings.clear()
    try:
        _ok(driver.cuMemAddressFree(address, nbytes), "cuMemAddressFree")
    except Exception as error:  # noqa: BLE001
        sys.stderr.write(f"iris: freeing the address range at {address:#x}: {error}\n")


def _tensor(reservation: _Reservation, address: int, nbytes: int, device: torch.device) -> torch.Tensor:
    # torch keeps the buffer behind __cuda_array_interface__, and the buffer its reservation:
    # the range stays mapped while any tensor of it is left.
    buffer = _DeviceBuffer(address, nbytes)
    buffer.reservation = reservation
    return torch.as_tensor(buffer, device=device)


@dataclass
class _Outside:
    """A tensor's memory as whole physical allocations: (offset from the first one's start, bytes)."""

    start: int  # address of the first allocation's first byte
    pieces: list[tuple[int, int]]
    span: int  # bytes from the first allocation's start to the last one's end
    tensor_offset: int  # where the tensor starts, from ``start``
    tensor_bytes: int
    alignment: int


def _handle_at(address: int):
    """The physical allocation mapped at ``address`` (retained: release it), or None."""
    driver = _driver()
    err, handle = driver.cuMemRetainAllocationHandle(address)
    return handle if err == driver.CUresult.CUDA_SUCCESS else None


def _allocations(start: int, nbytes: int) -> list[tuple[int, int]] | None:
    """The physical allocations behind ``[start, start + nbytes)``, each whole: (address, bytes).

    For memory mapped with ``cuMemMap``, ``cuMemGetAddressRange`` gives the one mapping that
    holds an address (one allocation: PyTorch maps each of an expandable segment's
    allocations on its own), not the reservation around it; so the range is walked
    mapping by mapping. None where a mapping has no virtual-memory handle (``cudaMalloc``
    memory), which no heap can map.
    """
    driver = _driver()
    found = []
    at, end = start, start + nbytes
    while at < end:
        handle = _handle_at(at)
        if handle is None:
            return None
        driver.cuMemRelease(handle)
        err, base, size = driver.cuMemGetAddressRange(at)
        if err != driver.CUresult.CUDA_SUCCESS:
            return None
        found.append((int(base), int(size)))
        at = int(base) + int(size)
    return found


class CudaVmmBackend(CudaBackend):
    """The CUDA backend with a virtual-memory heap that ``as_symmetric`` can map outside memory into."""

    allocator = "vmem"

    def allocation_granularity(self, device: torch.device) -> int:
        return _granularity(device)

    def allocate(self, nbytes: int, device: torch.device, tag: str) -> Allocation:
        padded = self.padded_size(nbytes, device)
        reservation = _Reservation(2 * padded, _granularity(device))
        driver = _driver()
        try:
            handle = _ok(driver.cuMemCreate(padded, _properties(device), 0), f"cuMemCreate({padded} bytes)")
            reservation.map(0, padded, handle, device)
            fd = int(_ok(driver.cuMemExportToShareableHandle(handle, _fd_type(), 0), "exporting the heap"))
        except BaseException:
            reservation.release()
            raise
        tensor = _tensor(reservation, reservation.address, nbytes, device)
        return Allocation(tensor=tensor, handle=fd, owner=reservation)

    def share_handles(self, comm, allocation: Allocation) -> list:
        received = exchange_fds(comm, [allocation.handle])
        return [None if rank == comm.rank else received[rank][0] for rank in range(comm.world_size)]

    def map_peer(self, handle, nbytes: int, device: torch.device):
        driver = _driver()
        padded = self.padded_size(nbytes, device)
        try:
            physical = _ok(
                driver.cuMemImportFromShareableHandle(handle, _fd_type()), "importing a peer's heap"
            )
        finally:
            os.close(handle)
        reservation = _Reservation(2 * padded, _granularity(device))
        try:
            reservation.map(0, padded, physical, device)
        except BaseException:
            reservation.release()
            raise
        return reservation.address, reservation

    def unmap_peer(self, token) -> None:
        token.release()

    def free(self, allocation: Allocation) -> None:
        if allocation.handle is not None:
            os.close(allocation.handle)
            allocation.handle = None
        # The memory goes with the last tensor of it (its buffer holds the reservation).

    def import_window(self, nbytes: int) -> int:
        return self.padded_size(nbytes, torch.device("cuda", torch.cuda.current_device()))

    def outside_memory(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
            return "only CUDA tensors can be mapped into the heap"
        if not tensor.is_contiguous():
            return "only contiguous tensors can be mapped into the heap: call .contiguous() first"
        if tensor.device.index != torch.cuda.current_device():
            return f"the tensor is on {tensor.device}, the heap on cuda:{torch.cuda.current_device()}"
        page = _granularity(tensor.device)
        start = tensor.data_ptr()
        nbytes = max(tensor.numel() * tensor.element_size(), 1)
        allocations = _allocations(start, nbytes)
        if allocations is None:
            return (
                "its memory has no CUDA virtual-memory handle (PyTorch's default allocator uses cudaMalloc): "
                "start the process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or copy it in: "
                "ctx.empty_like(tensor).copy_(tensor)"
            )
        first = allocations[0][0]
        pieces = [(address - first, size) for address, size in allocations]
        span = pieces[-1][0] + pieces[-1][1]
        return _Outside(first, pieces, span, start - first, tensor.numel() * tensor.element_size(), page)

    def take_in(self, comm, allocation, peers, outside, offset, spans):
        device = allocation.tensor.device
        reservation: _Reservation = allocation.owner
        driver = _driver()
        handles, exported, received = [], [], {}
        try:
            for at, _ in outside.pieces:
                handle = _handle_at(outside.start + at)
                if handle is None:
                    raise RuntimeError("iris: as_symmetric: the tensor's memory was unmapped meanwhile")
                handles.append(handle)
                exported.append(
                    int(_ok(driver.cuMemExportToShareableHandle(handle, _fd_type(), 0), "export"))
                )
            layouts = comm.all_gather_object(outside.pieces)
            received = exchange_fds(comm, exported)
            for at, size in outside.pieces:
                reservation.map(offset + at, size, handles.pop(0), device)
            for rank, fds in received.items():
                for fd, (at, size) in zip(fds, layouts[rank]):
                    physical = _ok(driver.cuMemImportFromShareableHandle(fd, _fd_type()), "importing")
                    peers[rank].map(offset + at, size, physical, device)
        finally:
            for handle in handles:
                driver.cuMemRelease(handle)
            for fd in exported + [fd for fds in received.values() for fd in fds]:
                os.close(fd)
        address = reservation.address + offset + outside.tensor_offset
        return _tensor(reservation, address, outside.tensor_bytes, device)
