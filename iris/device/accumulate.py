"""What a reduction accumulates in, and how two partial results combine.

Shared by the collectives (:mod:`iris.ccl`) and ``DeviceContext``'s tile collectives
(:mod:`iris.device.tile_collectives`): floats accumulate in fp32 whatever their storage
type, and ``combine`` applies ``"sum"``, ``"max"`` or ``"min"``.

Example:
    >>> acc = accumulator(tl.load(src + offs))
    >>> acc = combine(acc, accumulator(tl.load(other + offs)), "sum")
"""

import triton
import triton.language as tl


@triton.jit
def accumulator(values):
    """``values`` in the type a reduction accumulates them in: fp32 for floats, else their own."""
    if values.dtype.is_floating():
        result = values.to(tl.float32)
    else:
        result = values
    return result


@triton.jit
def combine(acc, values, OP: tl.constexpr):
    """``acc OP values`` for OP in ``"sum"``, ``"max"``, ``"min"``."""
    if OP == "sum":
        result = acc + values
    elif OP == "max":
        result = tl.maximum(acc, values)
    else:
        tl.static_assert(OP == "min", "reduction must be sum, max or min")
        result = tl.minimum(acc, values)
    return result
