"""Process-wide settings read once from the environment when ``iris`` is imported.

Each is checked then: a malformed value fails the import with one line naming the variable
(``iris: IRIS_WAIT_TIMEOUT='abc' is not a number of seconds (0 or more)``; see ``iris._env``).

``IRIS_BACKEND``   ``cuda`` or ``emulated`` (default: ``cuda`` if a GPU is visible).
``IRIS_DEBUG``     ``1`` compiles range and heap-bounds checks into every device op.
``IRIS_EMU_WAIT_TIMEOUT``  seconds an emulated spin-wait may last before it fails (default 60).
``IRIS_WAIT_TIMEOUT``  seconds any spin-wait may last before it fails (0: never). Default: 60 with
                   ``IRIS_DEBUG=1`` or under emulation (``IRIS_EMU_WAIT_TIMEOUT``), else off on GPUs.
``IRIS_HOST_TIMEOUT``  seconds a host barrier or collective waits for a missing rank (default 300).
``IRIS_FLIGHT``    ``0`` leaves the flight recorder out of every kernel (default ``1``: in).
``IRIS_FLIGHT_ENTRIES``  ring entries per SM (power of two, default 64).
``IRIS_HANG_DIR``  where each rank keeps its flight file and hang dumps (default: this user's own
                   directory ``/dev/shm/iris-<uid>``, mode 0700).
``IRIS_HANG_SIGNALS``  ``0`` leaves SIGTERM and SIGINT alone (default ``1``: dump the flight recorder).
``IRIS_EMU_SHM_DIR``  where the emulation backend keeps the ranks' heap files (default as ``IRIS_HANG_DIR``).
``IRIS_EMU_NUM_SMS``  SMs the emulation backend pretends to have (default 8).
``IRIS_LOG_LEVEL``  ``DEBUG``, ``INFO`` (default), ``WARNING`` or ``ERROR``.
``IRIS_RANKS_PER_GPU``  how many ranks of one host may share a GPU (default 1: one rank per GPU).
                   Rank r runs on GPU ``r mod count``; for correctness runs, traces and teaching on
                   fewer GPUs than ranks, never for timings (kernels of the ranks take turns).
``IRIS_RANKS_PER_NODE``  ranks per node (default: the launcher's ``LOCAL_WORLD_SIZE``). Below the
                   world size, the job spans several nodes and device ops reach ranks of other
                   nodes through NVSHMEM (``docs/scale_out.md``); on one host, ``k`` makes it
                   behave as several nodes of ``k`` ranks each, so that path runs without a second host.
``IRIS_KERNEL_ARTIFACTS_DIR``  where every compiled kernel's TTIR, TTGIR, LLIR, PTX, cubin, SASS and
                   metadata are written (a directory of this user's that others cannot write; made
                   if missing); see :mod:`iris.host.tracing.kernel_artifacts`.
``IRIS_CROSS_NODE_ALWAYS``  ``1`` sends every device op through the cross-node path, to ranks of this
                   node and to this rank itself included: for checking that path where no second
                   node exists (on GPUs it runs NVSHMEM even for one rank on one GPU).
"""

from __future__ import annotations

import os

from iris_trace import files

from . import _env
from ._env import SettingError
from .backends import choose_backend_name, prepare_process

BACKEND: str = choose_backend_name()
DEBUG: bool = _env.flag("IRIS_DEBUG", False)

# Must happen before any @triton.jit runs, ours or the user's.
prepare_process(BACKEND)
if DEBUG:
    # device_assert is compiled in only in Triton's debug mode.
    os.environ["TRITON_DEBUG"] = "1"


def ranks_per_node(world_size: int | None = None) -> int:
    """Ranks per node: ``IRIS_RANKS_PER_NODE``, else the launcher's ``LOCAL_WORLD_SIZE``, else the world.

    Ranks ``[n * k, (n + 1) * k)`` form node ``n``, as ``torchrun --nproc-per-node k`` places them.
    A value of at least the world size means one node. ``world_size`` is the job's (the
    launcher's ``WORLD_SIZE`` when not given): a job whose process group the program made
    itself, with no launcher variables, is one node unless ``IRIS_RANKS_PER_NODE`` says otherwise.

    Example:
        >>> os.environ["IRIS_RANKS_PER_NODE"] = "2"   # 4 ranks on one host act as 2 nodes
        >>> iris.config.ranks_per_node()
        2
    """
    world = _launcher_world_size() if world_size is None else world_size
    configured = _env.integer("IRIS_RANKS_PER_NODE", 0, minimum=1)
    if not configured:
        return min(_env.integer("LOCAL_WORLD_SIZE", world, minimum=1), world)
    if configured >= world >= 1:
        return world
    if world % configured:
        raise SettingError(
            f"iris: IRIS_RANKS_PER_NODE={configured} does not divide the {world} ranks of this job"
        )
    return configured


def _launcher_world_size() -> int:
    return _env.integer("WORLD_SIZE", 1, minimum=1)


#: Whether every device op takes the cross-node path, even to this node's ranks (a testing aid).
CROSS_NODE_ALWAYS: bool = _env.flag("IRIS_CROSS_NODE_ALWAYS", False)
#: Whether this job spans several nodes (fixed at import, from the launcher's environment), or
#: ``CROSS_NODE_ALWAYS``: only then are the cross-node paths compiled into device ops
#: (``iris.device.crossnode``).
SCALE_OUT: bool = ranks_per_node() < _launcher_world_size() or CROSS_NODE_ALWAYS

FLIGHT: bool = _env.flag("IRIS_FLIGHT", True)
DEFAULT_DEBUG_WAIT_TIMEOUT = 60.0

_wait_timeout_override: float | None = None


def emulated_wait_timeout() -> float:
    """Seconds an emulated spin-wait may last before it raises (``IRIS_EMU_WAIT_TIMEOUT``, default 60)."""
    return _env.seconds("IRIS_EMU_WAIT_TIMEOUT", 60.0)


def wait_timeout() -> float:
    """Seconds a spin-wait may last before it fails; 0 means forever.

    Order: :func:`set_wait_timeout`, ``IRIS_WAIT_TIMEOUT``, 60 s in debug mode,
    ``IRIS_EMU_WAIT_TIMEOUT`` under emulation, else 0 (GPU spin-waits are unbounded).

    Example:
        >>> iris.config.wait_timeout()
        0.0
    """
    if _wait_timeout_override is not None:
        return _wait_timeout_override
    configured = _env.seconds("IRIS_WAIT_TIMEOUT", -1.0)
    if configured >= 0:
        return configured
    if DEBUG:
        return DEFAULT_DEBUG_WAIT_TIMEOUT
    if BACKEND == "emulated":
        return emulated_wait_timeout()
    return 0.0


def set_wait_timeout(seconds: float | None) -> None:
    """Set the process-wide wait timeout (``None``: back to the environment's).

    Contexts created afterwards start with it; ``Iris.set_wait_timeout`` changes a live one.

    Example:
        >>> iris.config.set_wait_timeout(30)
    """
    global _wait_timeout_override
    _wait_timeout_override = None if seconds is None else _non_negative(float(seconds), "wait timeout")


def static_wait_timeout_ns() -> int:
    """The timeout compiled into GPU waits that have no ``heap_bases`` (fixed at import)."""
    return int(wait_timeout() * 1e9) if BACKEND == "cuda" else 0


def host_timeout() -> float:
    """Seconds host-side barriers and collectives wait for a missing rank (``IRIS_HOST_TIMEOUT``, 300)."""
    return _env.seconds("IRIS_HOST_TIMEOUT", 300.0, allow_zero=False)


#: Ranks of one host that may share a GPU (``IRIS_RANKS_PER_GPU``, default 1).
ranks_per_gpu = _env.ranks_per_gpu
local_world_size = _env.local_world_size


def flight_entries() -> int:
    """Flight-recorder entries per SM region (``IRIS_FLIGHT_ENTRIES``, a power of two, default 64)."""
    return _env.integer("IRIS_FLIGHT_ENTRIES", 64, minimum=1, maximum=1 << 16, power_of_two=True)


def hang_dir() -> str:
    """Directory of the flight files and hang dumps.

    ``IRIS_HANG_DIR`` when set (an existing directory), else this user's own directory
    under ``/dev/shm`` (``/dev/shm/iris-<uid>``, mode 0700; see :mod:`iris_trace.files`).

    Example:
        >>> iris.config.hang_dir()
        '/dev/shm/iris-1000'
    """
    return _env.directory("IRIS_HANG_DIR") or files.private_directory()


def kernel_artifacts_dir() -> str | None:
    """``IRIS_KERNEL_ARTIFACTS_DIR``, or ``None`` when unset (the directory need not exist yet).

    Example:
        >>> iris.config.kernel_artifacts_dir()
        '/home/me/iris-artifacts'
    """
    text = os.environ.get("IRIS_KERNEL_ARTIFACTS_DIR", "").strip()
    if not text:
        return None
    if os.path.lexists(text) and not os.path.isdir(text):
        raise SettingError(f"iris: IRIS_KERNEL_ARTIFACTS_DIR={text!r} exists and is not a directory")
    return text


def _non_negative(value: float, what: str) -> float:
    if not value >= 0:
        raise ValueError(f"iris: {what} must be a non-negative number of seconds, got {value}")
    return value


def _validate_environment() -> None:
    """Read every setting once, so that a malformed one fails ``import iris`` in one line."""
    emulated_wait_timeout()
    wait_timeout()
    host_timeout()
    ranks_per_gpu()
    local_world_size()
    flight_entries()
    _env.directory("IRIS_HANG_DIR")
    _env.directory("IRIS_EMU_SHM_DIR")
    kernel_artifacts_dir()
    _env.integer("IRIS_EMU_NUM_SMS", 8, minimum=1, maximum=4096)
    _env.flag("IRIS_HANG_SIGNALS", True)
    _env.choice("IRIS_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))


_validate_environment()
