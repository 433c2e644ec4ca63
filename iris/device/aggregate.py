"""``aggregate``: Triton's aggregate classes, also under the interpreter.

An aggregate bundles device values into one object with ``@triton.jit`` methods
(``DeviceContext``, ``Tile``, ``TensorView``). Triton's decorator attaches only
compiled-mode ``JITFunction`` members; under ``TRITON_INTERPRET=1`` the methods
are ``InterpretedFunction`` objects and would be dropped, so this attaches them.
"""

import triton.language as tl

from ..config import BACKEND


def aggregate(cls):
    """``triton.language.core._aggregate`` that also works under the interpreter.

    Triton attaches only ``JITFunction`` members to aggregates; under
    ``TRITON_INTERPRET=1`` methods are ``InterpretedFunction`` objects, so they
    are attached here.
    """
    value_cls = tl.core._aggregate(cls)
    if BACKEND == "emulated":
        for name, member in vars(cls).items():
            if isinstance(member, staticmethod):
                setattr(value_cls, name, member)
            elif callable(member) and not name.startswith("__"):
                setattr(value_cls, name, _as_method(member))
    return value_cls


def _as_method(interpreted):
    def method(self, *args, **kwargs):
        return interpreted(self, *args, **kwargs)

    return method
