"""The few device primitives that differ between backends, chosen once at import.

Everything else in ``iris.device`` is plain Triton and runs unchanged on both.
"""

from ..config import BACKEND

if BACKEND == "emulated":
    from ._intrinsics_emulated import (
        HAS_STATIC_TIMEOUT,
        claim_alone,
        copy_alone,
        device_check,
        fence_system,
        load_acquire,
        load_invariant,
        opaque,
        progress,
        reserve_slots,
        set_hang_describer,
        sleep_ns,
        sm_id,
        spin_check,
        spin_start,
        static_timeout_ns,
        store_alone,
        timer_ns,
        wait_expired,
        write_record,
        write_reserved_record,
    )
else:
    from ._intrinsics_cuda import (
        HAS_STATIC_TIMEOUT,
        claim_alone,
        copy_alone,
        device_check,
        fence_system,
        load_acquire,
        load_invariant,
        opaque,
        progress,
        reserve_slots,
        set_hang_describer,
        sleep_ns,
        sm_id,
        spin_check,
        spin_start,
        static_timeout_ns,
        store_alone,
        timer_ns,
        wait_expired,
        write_record,
        write_reserved_record,
    )

__all__ = [
    "HAS_STATIC_TIMEOUT",
    "claim_alone",
    "copy_alone",
    "device_check",
    "fence_system",
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
]
