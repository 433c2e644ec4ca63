"""Upstream Iris's module paths, as aliases of this package's modules.

Upstream splits its package into ``iris.host.*`` (host runtime) and
``iris.mem.triton.*`` / ``iris.device.triton.*`` (device code); programs written
for it import from those paths (``from iris.host.logging.logging import
IrisFormatter``, ``from iris.mem.triton.context import Context``). This package
keeps one module per job instead (docs/layout.md), and registers each upstream
path here as a module object whose names come from the module that does that
job, so those imports work unchanged. Nothing here has code of its own.
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

    host = sys.modules["iris.iris"]  # the module: ``iris.iris`` itself is the factory function
    from . import log, tensors
    from .device import context, rma, tiles, tracing

    device_names = {
        "Context": context.DeviceContext,
        "DeviceContext": context.DeviceContext,
        "TraceEvent": tracing.TraceEvent,
        **{name: getattr(tiles, name) for name in tiles.__all__},
        **{name: getattr(rma, name) for name in rma.OPS},
    }
    context_module = _alias("iris.mem.triton.context", "Alias of iris.device.context.", **device_names)
    types_module = _alias(
        "iris.mem.triton.types",
        "Alias of iris.device.tiles.",
        **{n: getattr(tiles, n) for n in tiles.__all__},
    )
    ops_module = _alias(
        "iris.mem.triton.ops", "Alias of iris.device.rma.", **{n: getattr(rma, n) for n in rma.OPS}
    )
    mem_triton = _alias(
        "iris.mem.triton",
        "Alias of iris.device (Triton device API).",
        **device_names,
        context=context_module,
        types=types_module,
        ops=ops_module,
    )
    logging_module = log
    host_logging = _alias(
        "iris.host.logging",
        "Alias of iris.log.",
        logging=logging_module,
        **{n: getattr(log, n) for n in ("set_logger_level", "logger", "DEBUG", "INFO", "WARNING", "ERROR")},
    )
    events_module = _alias(
        "iris.host.tracing.events", "Alias of the event ids.", TraceEvent=tracing.TraceEvent
    )
    host_tracing = _alias("iris.host.tracing", "Alias of the tracing names.", events=events_module)
    host_memory = _alias("iris.host.memory", "Alias of iris.tensors.", tensors=tensors)
    host_pkg = _alias(
        "iris.host",
        "Alias of the host runtime.",
        iris=host,
        logging=host_logging,
        tracing=host_tracing,
        memory=host_memory,
    )
    device_triton = _alias(
        "iris.device.triton", "Alias of iris.device.", **device_names, context=context_module
    )

    modules = {
        "iris.host": host_pkg,
        "iris.host.iris": host,
        "iris.host.logging": host_logging,
        "iris.host.logging.logging": logging_module,
        "iris.host.tracing": host_tracing,
        "iris.host.tracing.events": events_module,
        "iris.host.memory": host_memory,
        "iris.host.memory.tensors": tensors,
        "iris.mem": _alias("iris.mem", "Alias of the device API.", triton=mem_triton),
        "iris.mem.triton": mem_triton,
        "iris.mem.triton.context": context_module,
        "iris.mem.triton.types": types_module,
        "iris.mem.triton.ops": ops_module,
        "iris.device.triton": device_triton,
        "iris.device.triton.context": context_module,
    }
    for path, module in modules.items():
        sys.modules.setdefault(path, module)
    iris.host = host_pkg
    iris.mem = modules["iris.mem"]
    sys.modules["iris.device"].triton = device_triton
