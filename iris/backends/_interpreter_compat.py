"""A fix for the Triton interpreter under NumPy >= 2.4, applied by the emulation backend.

The interpreter stores scalars as one-element arrays and converts them with
``int(array)``, which NumPy 2.4 turned into an error; ``for i in range(n)`` with
a runtime ``n`` then fails. This re-installs ``tensor.__index__`` with an
explicit element read. It changes nothing where the original already works.
"""

from __future__ import annotations

from triton.runtime import interpreter as _interpreter


def _index(tensor) -> int:
    return int(tensor.handle.data.reshape(-1)[0])


def apply() -> None:
    """Install the fix once per process."""
    original = _interpreter._patch_lang_tensor
    if getattr(original, "_iris_fixed", False):
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", _index)

    patch_lang_tensor._iris_fixed = True
    _interpreter._patch_lang_tensor = patch_lang_tensor
