"""Iris for NVIDIA GPUs: a symmetric heap and RMA from Triton kernels.

On machines without a GPU, ``import iris`` switches Triton to its interpreter
(the emulation backend); kernels defined before it, and Triton's own helpers,
are interpreted too, so the import order does not matter.

Example:
    >>> import iris
    >>> ctx = iris.iris(heap_size=1 << 30)
    >>> buf = ctx.zeros(4096, dtype=torch.float32)
    >>> kernel[grid](buf, ctx.get_rank(), ctx.get_heap_bases())
"""

from . import config  # noqa: I001  (sets TRITON_INTERPRET before anything imports triton.jit users)
from .device import (
    AllReduceConfig,
    DeviceContext,
    TensorView,
    Tile,
    TileView,
    TraceEvent,
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
    fence,
    get,
    load,
    make_tensor_view,
    offset_ptr,
    put,
    signal,
    store,
    tile_layout,
    tile_ptr,
    trace_begin,
    trace_end,
    translate,
    wait_until,
)
from .host.memory import tensors as tensor_creation
from ._upstream_paths import register as _register_upstream_paths
from .host.distributed.helpers import HostTimeoutError
from ._env import SettingError
from .errors import ArgumentCountError, DeviceCheckError, InvalidArgumentError, WaitTimeoutError
from .host.iris import Iris, iris
from .host.launch import spawn
from .host.log import DEBUG, ERROR, INFO, WARNING, IrisFormatter, logger, set_logger_level

BACKEND = config.BACKEND
#: Upstream Iris's name for :class:`DeviceContext`.
Context = DeviceContext

_register_upstream_paths()

__all__ = [
    "AllReduceConfig",
    "BACKEND",
    "Context",
    "DEBUG",
    "ERROR",
    "INFO",
    "WARNING",
    "DeviceCheckError",
    "DeviceContext",
    "HostTimeoutError",
    "SettingError",
    "ArgumentCountError",
    "InvalidArgumentError",
    "Iris",
    "IrisFormatter",
    "TensorView",
    "Tile",
    "TileView",
    "TraceEvent",
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
    "fence",
    "get",
    "iris",
    "load",
    "logger",
    "make_tensor_view",
    "offset_ptr",
    "put",
    "set_logger_level",
    "signal",
    "spawn",
    "store",
    "tensor_creation",
    "tile_layout",
    "tile_ptr",
    "trace_begin",
    "trace_end",
    "translate",
    "wait_until",
]
