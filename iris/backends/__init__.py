"""Backend selection: ``cuda`` on NVIDIA GPUs, ``emulated`` everywhere else.

The choice is made once per process, when ``iris`` is imported, because the
emulation backend must switch Triton to its interpreter before any kernel is
decorated with ``@triton.jit``.
"""

from __future__ import annotations

import os

from .. import _env
from .base import Allocation, Backend

_BACKENDS = ("cuda", "emulated")


def choose_backend_name() -> str:
    """Read ``IRIS_BACKEND`` or pick ``cuda`` when a GPU is visible, else ``emulated``."""
    requested = _env.choice("IRIS_BACKEND", "", _BACKENDS)
    if requested:
        return requested
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "emulated"
    from .cuda_ipc import visible_gpu_count

    return "cuda" if visible_gpu_count() > 0 else "emulated"


def process_environment(name: str) -> dict[str, str]:
    """Variables that give a new process the backend ``name`` from its first import.

    The emulation backend needs ``TRITON_INTERPRET=1`` before Triton is imported.

    Example:
        >>> process_environment("emulated")
        {'IRIS_BACKEND': 'emulated', 'TRITON_INTERPRET': '1'}
    """
    env = {"IRIS_BACKEND": name}
    if name == "emulated":
        env["TRITON_INTERPRET"] = "1"
    return env


def prepare_process(name: str) -> None:
    """Set this process up for backend ``name``, before any ``@triton.jit`` runs (``import iris``).

    The emulation backend switches Triton to its interpreter and installs the
    interpreter's fixes (``iris.backends._interpreter_compat``); the CUDA backend adds
    the site pass to Triton's compiler (``iris.backends._cuda_call_sites``).
    """
    environment = process_environment(name)
    os.environ.update(environment)
    if "TRITON_INTERPRET" in environment:
        from . import _interpreter_compat

        _interpreter_compat.apply()
    else:
        from . import _cuda_call_sites

        _cuda_call_sites.install()


def make_backend(name: str, cross_node: bool = False, allocator: str = "torch") -> Backend:
    """Instantiate the backend called ``name``; ``cross_node`` when device ops may reach other nodes.

    ``allocator`` is upstream Iris's ``allocator_type``: ``"vmem"`` gives the CUDA backend a
    virtual-memory heap that ``as_symmetric`` can map outside memory into
    (:mod:`.cuda_vmm`), and the emulation backend its counterpart (:mod:`.emulated_vmm`),
    within one node: across nodes the heap is NVSHMEM's on GPUs (and the plain one under
    emulation, which behaves as they do), and takes no outside memory in.

    Example:
        >>> make_backend("emulated").name
        'emulated'
    """
    if name == "cuda":
        if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
            raise RuntimeError("IRIS_BACKEND=cuda cannot run with TRITON_INTERPRET=1")
        if cross_node:
            from .cuda_nvshmem import NvshmemBackend

            return NvshmemBackend()
        if allocator == "vmem":
            from .cuda_vmm import CudaVmmBackend

            return CudaVmmBackend()
        from .cuda_ipc import CudaBackend

        return CudaBackend()
    if allocator == "vmem" and not cross_node:
        from .emulated_vmm import EmulatedVmmBackend

        return EmulatedVmmBackend()
    from .emulated import EmulatedBackend

    return EmulatedBackend()


__all__ = [
    "Allocation",
    "Backend",
    "choose_backend_name",
    "make_backend",
    "prepare_process",
    "process_environment",
]
