"""Iris for NVIDIA GPUs: a symmetric heap and RMA from Triton kernels.

Import ``iris`` before defining kernels: on machines without a GPU it switches
Triton to its interpreter (the emulation backend), which must happen before
``@triton.jit`` runs.

Example:
    >>> import iris
    >>> ctx = iris.iris(heap_size=1 << 30)
    >>> buf = ctx.zeros(4096, dtype=torch.float32)
    >>> kernel[grid](buf, ctx.get_rank(), ctx.get_heap_bases())
"""

from . import config  # noqa: I001  (sets TRITON_INTERPRET before anything imports triton.jit users)
from .device import (
    DeviceContext,
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    copy,
    get,
    load,
    put,
    signal,
    store,
    trace_begin,
    trace_end,
    translate,
    wait_until,
)
from .distributed import HostTimeoutError
from .hang import WaitTimeoutError
from .iris import Iris, iris
from .launch import spawn
from .log import DEBUG, ERROR, INFO, WARNING, logger, set_logger_level

BACKEND = config.BACKEND

__all__ = [
    "BACKEND",
    "DEBUG",
    "ERROR",
    "INFO",
    "WARNING",
    "DeviceContext",
    "HostTimeoutError",
    "Iris",
    "WaitTimeoutError",
    "atomic_add",
    "atomic_and",
    "atomic_cas",
    "atomic_max",
    "atomic_min",
    "atomic_or",
    "atomic_sub",
    "atomic_xchg",
    "atomic_xor",
    "copy",
    "get",
    "iris",
    "load",
    "logger",
    "put",
    "set_logger_level",
    "signal",
    "spawn",
    "store",
    "trace_begin",
    "trace_end",
    "translate",
    "wait_until",
]
