"""Upstream's device queries (``iris.hip``), answered for this backend's devices.

Upstream's ``iris.hip`` wraps the HIP runtime; its device queries carry over to any
GPU and are here: device count and selection, SM (compute unit) count, the
architecture string, the allocation granularity, the XCC count (1: NVIDIA GPUs are
one die as far as kernels see), and the rate of :func:`iris.device.utils.read_realtime`'s clock. Upstream's
memory calls (IPC handles, dmabuf export and import, virtual-memory mapping) are
its allocator's internals and have no counterpart here: the heap is mapped by the
backend (``iris.backends``).

Example:
    >>> import iris
    >>> iris.hip.get_num_xcc(), iris.hip.get_cu_count()
    (1, 132)
"""

from __future__ import annotations

import functools

import torch

from ... import config
from ...backends import make_backend

#: kHz of read_realtime's clock: it counts nanoseconds (%globaltimer; the emulation's host clock).
REALTIME_CLOCK_KHZ = 1_000_000


@functools.cache
def _backend():
    return make_backend(config.BACKEND)


def _device(device_id: int | None) -> torch.device:
    current = _backend().current_device()
    return current if device_id is None else torch.device(current.type, device_id)


def count_devices() -> int:
    """Devices this process can use (GPUs; 1 under emulation).

    Example:
        >>> iris.hip.count_devices()
        4
    """
    return _backend().device_count()


def get_device_id() -> int:
    """Index of the device this process's kernels go to now.

    Example:
        >>> iris.hip.get_device_id()
        0
    """
    return _backend().current_device().index or 0


def set_device(gpu_id: int) -> None:
    """Make device ``gpu_id`` the current one, as ``torch.cuda.set_device`` (nothing under emulation).

    Example:
        >>> iris.hip.set_device(1)
    """
    _backend().set_current_device(gpu_id)


def get_cu_count(device_id: int | None = None) -> int:
    """Streaming multiprocessors of the device (upstream: compute units).

    Example:
        >>> iris.hip.get_cu_count()   # an H200
        132
    """
    return _backend().multiprocessor_count(_device(device_id))


def get_arch_string(device_id: int | None = None) -> str:
    """The device's architecture: ``"sm_90"`` on an H100 or H200 (upstream on CUDA says the same).

    Example:
        >>> iris.hip.get_arch_string()
        'sm_90'
    """
    return _backend().architecture(_device(device_id))


def get_allocation_granularity(device_id: int | None = None) -> int:
    """Bytes a heap's physical memory is allocated in on the device (2 MiB on NVIDIA GPUs; the
    page size under emulation); ``ctx.heap.allocator.aligned_heap_size`` is a multiple of it.

    Example:
        >>> iris.hip.get_allocation_granularity()
        2097152
    """
    return _backend().allocation_granularity(_device(device_id))


def get_num_xcc(device_id: int | None = None) -> int:
    """Dies (AMD: XCCs) a kernel's programs are spread over: 1, as upstream answers on CUDA.

    Example:
        >>> iris.hip.get_num_xcc()
        1
    """
    return 1


def get_wall_clock_rate(device_id: int | None = None) -> int:
    """Ticks per millisecond (kHz) of :func:`iris.device.utils.read_realtime`'s clock.

    Upstream's examples turn ``read_realtime`` differences into time with it
    (``cycles / rate`` ms). The clock here counts nanoseconds, so the rate is 10**6
    (upstream on MI300X: 10**5, a 100 MHz counter).

    Example:
        >>> ms = (end - start) / iris.hip.get_wall_clock_rate()
    """
    return REALTIME_CLOCK_KHZ
