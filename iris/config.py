"""Process-wide settings read once from the environment when ``iris`` is imported.

``IRIS_BACKEND``   ``cuda`` or ``emulated`` (default: ``cuda`` if a GPU is visible).
``IRIS_DEBUG``     ``1`` compiles range and heap-bounds checks into every device op.
``IRIS_EMU_WAIT_TIMEOUT``  seconds an emulated spin-wait may last before it fails (default 60).
"""

from __future__ import annotations

import os

from .backends import choose_backend_name

BACKEND: str = choose_backend_name()
DEBUG: bool = os.environ.get("IRIS_DEBUG", "0") not in ("", "0")

if BACKEND == "emulated":
    # Must happen before any @triton.jit runs, ours or the user's.
    os.environ["TRITON_INTERPRET"] = "1"
    from .backends import _interpreter_compat

    _interpreter_compat.apply()
if DEBUG:
    # device_assert is compiled in only in Triton's debug mode.
    os.environ["TRITON_DEBUG"] = "1"


def emulated_wait_timeout() -> float:
    """Seconds an emulated spin-wait may last before it raises."""
    return float(os.environ.get("IRIS_EMU_WAIT_TIMEOUT", "60"))
