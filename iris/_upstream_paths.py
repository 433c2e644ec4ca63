"""Upstream Iris's module paths that are not this package's own, as aliases of its modules.

The host runtime lives where upstream keeps it (``iris.host.iris``,
``iris.host.memory.tensors``, ``iris.host.distributed.helpers`` and ``.topology``), so
those paths are real modules. Upstream's other paths name modules this package splits
or names differently: its logging module (``iris.host.logging.logging`` is
``iris.host.log``), its event ids (``iris.host.tracing.events``), its device API under
``iris.mem.triton`` / ``iris.device.triton`` (here ``iris.device``), its Gluon device
API's module path ``iris.mem.gluon`` (here ``iris.device.gluon``; ``iris.gluon`` is a
module of its own) and its ``iris.experimental``, its ccl helpers (``iris.ccl.utils``).
Each is registered here as the module that does its job, or a small module object
naming those; nothing here has code of its own.
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

    from . import device, host
    from .ccl import config as ccl_config
    from .ccl import runtime as ccl_runtime
    from .device import context, gluon, rma, tiles, tracing
    from .device import utils as device_utils
    from .host import iris as _host_iris  # noqa: F401  (iris.host.iris: upstream's module of the Iris class)
    from .host import log
    from .host import tracing as host_tracing  # noqa: F401  (the package gains upstream's events)
    from .host.distributed import helpers, topology  # noqa: F401  (upstream's paths, real here)
    from .host.memory import tensors  # noqa: F401

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
        "Alias of iris.host.log.",
        logging=log,
        **{n: getattr(log, n) for n in ("set_logger_level", "logger", "DEBUG", "INFO", "WARNING", "ERROR")},
    )
    events = _alias("iris.host.tracing.events", "Alias of the event ids.", TraceEvent=tracing.TraceEvent)
    ccl_utils = _alias(
        "iris.ccl.utils",
        "Alias of the ccl helpers upstream keeps in iris.ccl.utils.",
        extract_group_info=ccl_runtime.extract_group_info,
        ReduceOp=ccl_config.ReduceOp,
    )
    gluon_api = {"IrisDeviceCtx": gluon.IrisDeviceCtx, "GluonDeviceTracing": gluon.GluonDeviceTracing}
    mem_gluon = _alias(
        "iris.mem.gluon",
        "Alias of iris.device.gluon.",
        Context=gluon.IrisDeviceCtx,
        context=gluon,
        **gluon_api,
    )
    experimental = _alias(
        "iris.experimental", "Upstream's home of the Gluon API: iris.gluon here.", gluon_context=gluon
    )
    modules = {
        "iris.experimental": experimental,
        "iris.mem.gluon": mem_gluon,
        "iris.mem.gluon.context": gluon,
        "iris.host.logging": host_logging,
        "iris.host.logging.logging": log,
        "iris.host.tracing.events": events,
        "iris.ccl.utils": ccl_utils,
        "iris.mem": _alias(
            "iris.mem", "Alias of the device API.", triton=mem_triton, gluon=mem_gluon, utils=device_utils
        ),
        "iris.mem.triton": mem_triton,
        "iris.mem.triton.context": context,
        "iris.mem.triton.types": tiles,
        "iris.mem.triton.ops": rma,
        "iris.device.triton": mem_triton,
        "iris.device.triton.context": context,
        "iris.mem.utils": device_utils,
    }
    for path, module in modules.items():
        sys.modules.setdefault(path, module)
    host.logging = host_logging
    host_tracing.events = events
    iris.ccl.utils = ccl_utils
    iris.mem = modules["iris.mem"]
    iris.experimental = experimental
    device.triton = mem_triton
