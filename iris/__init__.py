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
from . import device
from .device import *  # noqa: F403  (the device API: device.__all__)
from .host.memory import tensors as tensor_creation
from ._upstream_paths import register as _register_upstream_paths
from .host.distributed.helpers import HostTimeoutError
from ._env import SettingError
from .errors import ArgumentCountError, DeviceCheckError, InvalidArgumentError, WaitTimeoutError
from .host.iris import Iris, iris
from .host.launch import spawn
from .host.log import DEBUG, ERROR, INFO, WARNING, IrisFormatter, logger, set_logger_level
from .host.platform import hip
from .host.memory.tensor_utils import CUDAArrayInterface, tensor_from_ptr
from .host.platform.utils import do_bench, get_device_id_for_rank, is_simulation_env
from .host.tracing import kernel_artifacts

BACKEND = config.BACKEND
#: Upstream Iris's name for :class:`DeviceContext`.
Context = device.DeviceContext

_register_upstream_paths()
kernel_artifacts.enable_from_environment()

# Upstream's namespace holds its fused ops, Gluon API and benchmark framework as well
# (``iris.ops.FusedConfig``, ``iris.bench.main``).
from . import bench, gluon, ops  # noqa: E402

__all__ = [
    *device.__all__,
    "BACKEND",
    "Context",
    "DEBUG",
    "ERROR",
    "INFO",
    "WARNING",
    "DeviceCheckError",
    "HostTimeoutError",
    "SettingError",
    "ArgumentCountError",
    "CUDAArrayInterface",
    "InvalidArgumentError",
    "Iris",
    "IrisFormatter",
    "WaitTimeoutError",
    "bench",
    "do_bench",
    "get_device_id_for_rank",
    "gluon",
    "hip",
    "iris",
    "is_simulation_env",
    "logger",
    "set_logger_level",
    "ops",
    "spawn",
    "tensor_creation",
    "tensor_from_ptr",
]
