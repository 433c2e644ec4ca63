"""``aggregate``: Triton's aggregate classes, also under the interpreter.

An aggregate bundles device values into one object with ``@triton.jit`` methods
(``DeviceContext``, ``Tile``, ``TensorView``). Triton's decorator attaches only
compiled-mode ``JITFunction`` members; under the emulation backend the interpreter's
fixes attach the rest (``iris.backends._interpreter_compat.finish_aggregate``).
"""

import triton.language as tl

from ..backends._interpreter_compat import finish_aggregate


def aggregate(cls):
    """``triton.language.core._aggregate`` that also works under the interpreter.

    Example:
        >>> @aggregate
        >>> class Pair:
        >>>     a: tl.tensor
        >>>     b: tl.tensor
    """
    value_cls = tl.core._aggregate(cls)
    finish_aggregate(value_cls, cls)
    return value_cls
