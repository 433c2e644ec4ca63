"""Hardware primitives for the emulation backend.

These run inside the Triton interpreter as ordinary Python, so they can read
the host clock and raise Python exceptions where a GPU would trap or hang.
"""

from __future__ import annotations

import time

import numpy as np
import triton.language as tl

from ..backends.emulated import virtual_sm_count
from ..config import emulated_wait_timeout


class DeviceError(RuntimeError):
    """A device-side check failed (debug mode)."""


class WaitTimeout(RuntimeError):
    """An emulated spin-wait exceeded ``IRIS_EMU_WAIT_TIMEOUT``."""


def _values(x):
    return np.asarray(x.handle.data) if hasattr(x, "handle") else np.asarray(x)


def load_acquire(pointer, scope):
    # The interpreter executes one program at a time and reads memory directly.
    return tl.load(pointer, volatile=True)


def spin_start():
    return time.monotonic_ns()


def spin_check(start, pointer, seen, expected, op):
    timeout = emulated_wait_timeout()
    started_ns = int(_values(start).reshape(-1)[0])
    if time.monotonic_ns() - started_ns <= timeout * 1e9:
        return
    address = int(_values(pointer).reshape(-1)[0])
    raise WaitTimeout(
        f"{op} waited {timeout:g} s on the flag at address {address:#x}: last seen "
        f"{_values(seen).reshape(-1)[0]}, waiting for {_values(expected).reshape(-1)[0]}. "
        "Under the emulation backend the programs of one launch run one after another, so a "
        "program cannot wait for another program of the same launch; otherwise no rank released "
        "this flag (set IRIS_EMU_WAIT_TIMEOUT to wait longer)."
    )


def device_check(condition, message):
    if not np.all(_values(condition)):
        raise DeviceError(str(getattr(message, "value", message)))


def timer_ns():
    # One host clock serves every rank process, so emulated traces need no alignment.
    return tl.full([], time.monotonic_ns(), tl.int64)


def sm_id():
    pid = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
    return pid % virtual_sm_count()
