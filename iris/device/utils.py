"""Upstream's device utilities (``iris.device.utils``): a wall clock and where a program runs.

Upstream's examples time their tiles with ``read_realtime()`` and turn differences into
milliseconds with ``iris.hip.get_wall_clock_rate()``; here the clock is the GPU's
%globaltimer (nanoseconds; the host clock under emulation) and the rate says so.

Example:
    >>> from iris.device.utils import read_realtime
    >>> @triton.jit
    ... def kernel(out):
    ...     start = read_realtime()
    ...     ...
    ...     tl.store(out + tl.program_id(0), read_realtime() - start)
"""

import triton
import triton.language as tl

from . import intrinsics


@triton.jit
def read_realtime():
    """A 64-bit timestamp in nanoseconds, on a clock that does not follow the SM clock.

    Example:
        >>> start = read_realtime()
    """
    return intrinsics.timer_ns()


@triton.jit
def get_cu_id():
    """The SM this program runs on (upstream: its compute unit).

    Example:
        >>> sm = get_cu_id()
    """
    return intrinsics.sm_id()


@triton.jit
def get_xcc_id():
    """The die this program runs on: 0 (one per GPU here; upstream reads the XCC on MI300).

    Example:
        >>> xcc = get_xcc_id()
    """
    return tl.cast(0, tl.int32)
