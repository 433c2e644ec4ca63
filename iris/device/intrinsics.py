"""The few device primitives that differ between backends, chosen once at import.

Everything else in ``iris.device`` is plain Triton and runs unchanged on both. Each
backend's module (``_intrinsics_cuda``, ``_intrinsics_emulated``) defines every name of
:data:`NAMES`; this module takes them from the one the process runs on.
"""

import importlib

from ..config import BACKEND

#: What each backend's module defines (tests/test_backends.py holds both to it).
NAMES = (
    "HAS_STATIC_TIMEOUT",
    "call_site",
    "claim_alone",
    "copy_alone",
    "device_check",
    "fence_system",
    "launch_tag",
    "load_acquire",
    "load_invariant",
    "opaque",
    "progress",
    "reserve_slots",
    "set_hang_describer",
    "sleep_ns",
    "sm_id",
    "spin_check",
    "spin_start",
    "static_timeout_ns",
    "store_alone",
    "timer_ns",
    "wait_expired",
    "write_record",
    "write_reserved_record",
)
__all__ = list(NAMES)

_IMPLEMENTATION = importlib.import_module(
    "._intrinsics_emulated" if BACKEND == "emulated" else "._intrinsics_cuda", __package__
)
globals().update({name: getattr(_IMPLEMENTATION, name) for name in NAMES})
