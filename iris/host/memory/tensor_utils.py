"""Tensors over memory given by address: upstream's ``iris.tensor_from_ptr`` and ``CUDAArrayInterface``.

The tensor does not own the memory: whoever allocated it must keep it alive while the
tensor is used. On the emulation backend (``device="cpu"``) the address is a host address.

Example:
    >>> view = iris.tensor_from_ptr(buf.data_ptr(), buf.numel() * 4, torch.float32, ctx.device)
"""

from __future__ import annotations

import ctypes

import torch

#: numpy-style type strings of ``__cuda_array_interface__`` (bfloat16 has none of its own).
_TYPESTRS = {
    torch.float64: "<f8", torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<f2",
    torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.int8: "|i1",
    torch.uint8: "|u1", torch.bool: "|b1",
}  # fmt: skip


def _shape(size_bytes: int, dtype: torch.dtype, shape) -> tuple[int, ...]:
    if isinstance(size_bytes, bool) or not isinstance(size_bytes, int) or size_bytes < 0:
        raise ValueError(f"iris: size_bytes must be a non-negative int, got {size_bytes!r}")
    if dtype not in _TYPESTRS:
        raise ValueError(f"iris: no array interface for {dtype}; one of {', '.join(map(str, _TYPESTRS))}")
    shape = (size_bytes // dtype.itemsize,) if shape is None else tuple(shape)
    needed = dtype.itemsize * torch.Size(shape).numel()
    if needed > size_bytes:
        raise ValueError(
            f"iris: shape {shape} of {dtype} needs {needed} bytes, more than size_bytes={size_bytes}"
        )
    return shape


class CUDAArrayInterface:
    """``__cuda_array_interface__`` (version 3) of ``size_bytes`` at device address ``ptr``.

    Args:
        ptr: the device address.
        size_bytes: bytes there.
        dtype: element type (default ``torch.uint8``).
        device: kept for upstream's signature (``torch.as_tensor`` takes the device).
        shape: default: as many elements as fit in ``size_bytes``.

    Example:
        >>> t = torch.as_tensor(iris.CUDAArrayInterface(ptr, 4096, torch.float32), device="cuda")
    """

    def __init__(
        self, ptr: int, size_bytes: int, dtype: torch.dtype = torch.uint8, device="cuda", shape=None
    ):
        if isinstance(ptr, bool) or not isinstance(ptr, int) or ptr <= 0:
            raise ValueError(f"iris: ptr must be a positive int address, got {ptr!r}")
        self.ptr, self.size_bytes, self.dtype, self.device = ptr, size_bytes, dtype, device
        self.shape = _shape(size_bytes, dtype, shape)
        self.typestr = _TYPESTRS[dtype]

    @property
    def __cuda_array_interface__(self) -> dict:
        """The interface torch reads (writable, C order)."""
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False), "version": 3}


def tensor_from_ptr(ptr: int, size_bytes: int, dtype: torch.dtype = torch.float32, device="cuda", shape=None):
    """A tensor over ``size_bytes`` at address ``ptr`` on ``device``, sharing that memory.

    Args:
        ptr: the address (a host address for ``device="cpu"``).
        size_bytes: bytes there.
        dtype: element type (default ``torch.float32``).
        device: ``"cuda"``, ``"cuda:N"`` or, on the emulation backend, ``"cpu"``.
        shape: default: as many elements as fit in ``size_bytes``.

    Example:
        >>> view = iris.tensor_from_ptr(buf.data_ptr(), 4096, torch.float32, ctx.device)
        >>> view.shape
        torch.Size([1024])
    """
    interface = CUDAArrayInterface(ptr, size_bytes, dtype, device, shape)
    if torch.device(str(device)).type != "cpu":
        tensor = torch.as_tensor(interface, device=device)
        return tensor.view(dtype) if dtype == torch.bfloat16 else tensor  # "<f2" reads as float16
    count = torch.Size(interface.shape).numel() * dtype.itemsize
    raw = torch.frombuffer((ctypes.c_uint8 * max(count, 1)).from_address(ptr), dtype=torch.uint8)
    return raw[:count].view(dtype).view(interface.shape)
