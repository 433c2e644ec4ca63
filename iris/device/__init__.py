"""Device-side (Triton) API: RMA ops, the device context and the device barrier."""

from .context import DeviceContext
from .rma import (
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
    translate,
    wait_until,
)
from .tracing import trace_begin, trace_end

__all__ = [
    "DeviceContext",
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
    "load",
    "put",
    "signal",
    "store",
    "trace_begin",
    "trace_end",
    "translate",
    "wait_until",
]
