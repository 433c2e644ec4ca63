"""The few device primitives that differ between backends, chosen once at import.

Everything else in ``iris.device`` is plain Triton and runs unchanged on both.
"""

from ..config import BACKEND

if BACKEND == "emulated":
    from ._intrinsics_emulated import device_check, load_acquire, sm_id, spin_check, spin_start, timer_ns
else:
    from ._intrinsics_cuda import device_check, load_acquire, sm_id, spin_check, spin_start, timer_ns

__all__ = ["device_check", "load_acquire", "sm_id", "spin_check", "spin_start", "timer_ns"]
