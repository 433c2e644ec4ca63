"""Upstream Iris's module paths, as aliases of this package's modules.

Upstream splits its package into ``iris.host.*`` (host runtime) and
``iris.mem.triton.*`` / ``iris.device.triton.*`` (device code); programs written
for it import from those paths (``from iris.host.logging.logging import
IrisFormatter``, ``from iris.mem.triton.context import
Context``). This package keeps one module per job instead (docs/layout.md). Each
upstream module path is registered here as this package's module that does its job
(``iris.host.logging.logging`` is ``iris.log``), and each upstream package path as
a small module object naming those; nothing here has code of its own.
"""

from __future__ import annotations

import sys
import types


def _alias(path: str, doc: str, **names) -> types.ModuleType:
    module = types.ModuleType(path, doc)
    module.__dict__.update(names)
    return module


def register() -> None:
    """Install the aliases in ``sys.modules`` (and as attributes of their parents)."""
    import iris

    from . import device, distributed, log, tensor_creation, topology
    from .ccl import config as ccl_config
    from .ccl import runtime as ccl_runtime
    from .device import context, rma, tiles, tracing
    from .ops import upstream as ops_upstream

    host = sys.modules["iris.iris"]  # the module: ``iris.iris`` itself is the factory function
    device_api = {name: getattr(device, name) for name in device.__all__}
    # One module object for both of upstream's device paths (iris.device.triton is its shim).
    mem_triton = _alias(
        "iris.mem.triton",
        "Alias of iris.device (the Triton device API).",
        Context=context.Context,
        context=context,
        types=tiles,
        ops=rma,
        **device_api,
    )
    host_logging = _alias(
        "iris.host.logging",
        "Alias of iris.log.",
        logging=log,
        **{n: getattr(log, n) for n in ("set_logger_level", "logger", "DEBUG", "INFO", "WARNING", "ERROR")},
    )
    events = _alias("iris.host.tracing.events", "Alias of the event ids.", TraceEvent=tracing.TraceEvent)
    host_tracing = _alias("iris.host.tracing", "Alias of the tracing names.", events=events)
    host_memory = _alias("iris.host.memory", "Alias of iris.tensor_creation.", tensors=tensor_creation)
    helpers = _alias(
        "iris.host.distributed.helpers",
        "Alias of iris.distributed's group helpers.",
        extract_group_info=distributed.extract_group_info,
    )
    host_distributed = _alias(
        "iris.host.distributed", "Alias of iris.distributed.", helpers=helpers, topology=topology
    )
    ccl_utils = _alias(
        "iris.ccl.utils",
        "Alias of the ccl helpers upstream keeps in iris.ccl.utils.",
        extract_group_info=ccl_runtime.extract_group_info,
        ReduceOp=ccl_config.ReduceOp,
    )
    host_pkg = _alias(
        "iris.host",
        "Alias of the host runtime.",
        iris=host,
        logging=host_logging,
        tracing=host_tracing,
        memory=host_memory,
        distributed=host_distributed,
    )
    modules = {
        "iris.host": host_pkg,
        "iris.host.iris": host,
        "iris.host.logging": host_logging,
        "iris.host.logging.logging": log,
        "iris.host.tracing": host_tracing,
        "iris.host.tracing.events": events,
        "iris.host.memory": host_memory,
        "iris.host.memory.tensors": tensor_creation,
        "iris.host.distributed": host_distributed,
        "iris.host.distributed.helpers": helpers,
        "iris.host.distributed.topology": topology,
        "iris.ccl.utils": ccl_utils,
        "iris.mem": _alias("iris.mem", "Alias of the device API.", triton=mem_triton),
        "iris.mem.triton": mem_triton,
        "iris.mem.triton.context": context,
        "iris.mem.triton.types": tiles,
        "iris.mem.triton.ops": rma,
        "iris.device.triton": mem_triton,
        "iris.device.triton.context": context,
    }
    # Upstream keeps each fused op in a module of its name (``from iris.ops.matmul_reduce_scatter
    # import matmul_reduce_scatter``); here they share one, and ``iris.ops.<op>`` stays the function.
    for op in ("matmul_all_reduce", "all_gather_matmul", "matmul_all_gather", "matmul_reduce_scatter"):
        modules[f"iris.ops.{op}"] = ops_upstream
    for path, module in modules.items():
        sys.modules.setdefault(path, module)
    iris.host = host_pkg
    iris.ccl.utils = ccl_utils
    iris.mem = modules["iris.mem"]
    device.triton = mem_triton
