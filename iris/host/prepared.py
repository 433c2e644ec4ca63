"""Kernel launches prepared once and replayed with a few microseconds of host time.

Triton's ``kernel[grid](...)`` binds and specialises every argument on every call,
which costs tens of microseconds: more than a small collective or a device barrier
takes on the GPU. A :class:`PreparedLaunch` pays that once; later calls hand the
same arguments straight to the compiled kernel on the current stream. The caller
keys its launches by everything that shapes them (tensor addresses, shapes,
strides, dtypes, scalars), so a prepared launch only ever replays identical
arguments, and the specialisation Triton chose on the first call stays valid.

A :class:`LaunchCache` keeps the prepared launches (or multi-step plans) of one API
by such a key (:func:`tensor_key` for each tensor), and only the latest few: a launch
holds its tensors, so a caller passing fresh tensors every call (a training loop's
activations) must not pin them all.

Example:
    >>> step = PreparedLaunch(my_kernel, (132,), (out, inp, n), {"BLOCK": 1024, "num_warps": 8})
    >>> step()   # compiles and launches through Triton
    >>> step()   # launches the compiled kernel directly
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch
import triton
from triton import knobs


class PreparedLaunch:
    """One kernel, grid and argument list, launched on the current stream by calling it.

    ``kwargs`` may mix kernel parameters (by name) with launch options such as
    ``num_warps``; parameters the call leaves out take their defaults.

    Example:
        >>> barrier = PreparedLaunch(device_barrier_kernel, (1,), (arrivals, heap_bases, ranks, 4, rank))
        >>> barrier()
    """

    def __init__(self, kernel, grid: tuple, args: tuple = (), kwargs: dict | None = None):
        kwargs = dict(kwargs or {})
        names = set(kernel.arg_names)
        self.kernel, self.grid = kernel, grid
        self.args, self.kwargs = tuple(args), kwargs
        bound = inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items() if k in names})
        bound.apply_defaults()
        # The compiled launcher takes every parameter in order, constexprs included
        # (it skips them itself), just as Triton's own launch path passes them.
        self.positional = tuple(bound.arguments[name] for name in kernel.arg_names)
        self.compiled = None
        self._device = None

    def compile(self):
        """Compile for the current device without launching; Triton's compiled kernel, handles loaded.

        The first call then launches it directly. GPU backends only (the
        interpreter compiles nothing).

        Example:
            >>> step.compile().n_regs
            224
        """
        if self.compiled is None:
            self.compiled = self.kernel.warmup(*self.args, grid=self.grid, **self.kwargs)
            self.compiled._init_handles()  # registers and the function handle come with loading
            self._device = triton.runtime.driver.active.get_current_device()
        return self.compiled

    def __call__(self) -> None:
        if self.compiled is None or _hooks_installed():
            compiled = self.kernel[self.grid](*self.args, **self.kwargs)
            # The interpreter returns nothing to reuse; it always takes this path.
            self.compiled = compiled if hasattr(compiled, "packed_metadata") else None
            if self.compiled is not None:
                # Compiled for, and launched on, this device (a rank's device never changes).
                self._device = triton.runtime.driver.active.get_current_device()
            return
        stream = triton.runtime.driver.active.get_current_stream(self._device)
        c = self.compiled
        grid = self.grid
        c.run(
            grid[0],
            grid[1] if len(grid) > 1 else 1,
            grid[2] if len(grid) > 2 else 1,
            stream,
            c.function,
            c.packed_metadata,
            None,
            None,
            None,
            *self.positional,
        )


class CapturedPlan:
    """A plan's steps, run as they are on the first call, then recorded once as one graph and replayed.

    A plan of many host steps (the copy-engine variants queue a cuBLAS call and a DMA
    copy per chunk, each costing tens of microseconds in Python) can take longer to
    queue than the GPU takes to run it, and the GPU then waits for the host. A replay
    queues the whole plan with one launch. The first call runs the steps directly
    (compiling kernels and allocating workspaces, which a recording must not do); the
    second records them (``backend.capture``) and replays. Where the backend cannot
    record (the interpreter), or while the caller records its own graph, the steps
    run as they are, so a caller's capture holds them, not a nested replay. A recording
    that fails warns once, and the steps run one by one from then on.

    The plan must do the same device work on every call: keyed by its tensors'
    addresses and shapes (:class:`LaunchCache`), with counters on the device.

    Example:
        >>> plan = CapturedPlan([lambda: epoch.add_(1), matmul, put, barrier], ctx.backend)
        >>> plan(); plan()   # run; then record and replay
    """

    def __init__(self, steps, backend):
        self.steps = list(steps)
        self._backend = backend
        self._replay: Callable[[], None] | None = None
        self._runs = 0
        self._recordable = True

    def __call__(self) -> None:
        if not self._backend.capturing():
            if self._replay is None and self._runs and self._recordable:
                self._replay = self._record()
            if self._replay is not None:
                self._replay()
                return
        self._runs += 1
        for step in self.steps:
            step()

    def _record(self) -> Callable[[], None] | None:
        # Called only while nothing records, so None means the backend never can.
        try:
            replay = self._backend.capture(self.steps)
        except Exception as error:  # noqa: BLE001 - the steps still run, one by one
            warnings.warn(
                f"iris: a plan could not be recorded as a graph and runs step by step from now on: {error}",
                RuntimeWarning,
                stacklevel=3,
            )
            replay = None
        self._recordable = replay is not None
        return replay


def _hooks_installed() -> bool:
    """Whether a profiler or debugger watches launches (then only Triton's own path calls its hooks).

    Tracing's own launch log does not count: it would cost every prepared launch Triton's
    whole launch path (a traced ``ctx.device_barrier()`` took 27 us instead of 10 on
    2 x H200), and prepared launches are the library's, whose grids the trace can do without.
    """
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        # Triton 3.6 keeps its hooks in an always-present chain; older ones use None.
        calls = getattr(hook, "calls", None if hook is None else [hook])
        if any(not getattr(call, "iris_launch_log", False) for call in calls or ()):
            return True
    return False


def tensor_key(tensor: torch.Tensor) -> tuple:
    """What makes two calls with ``tensor`` launch differently: address, shape, strides, dtype, device.

    Example:
        >>> key = ("all_gather", tensor_key(out), tensor_key(inp))
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"iris: expected a torch.Tensor, got {type(tensor).__name__}")
    return (tensor.data_ptr(), tuple(tensor.shape), tensor.stride(), tensor.dtype, tensor.device)


class LaunchCache:
    """Launches (or plans) by key, built on first use; past ``capacity`` entries the oldest goes.

    Example:
        >>> cache = LaunchCache(64)
        >>> launch = cache.get_or_build(key, lambda: PreparedLaunch(kernel, grid, args))
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._entries: dict[Hashable, Any] = {}

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The entry for ``key``, from ``build()`` the first time (nothing is kept if it raises)."""
        entry = self._entries.get(key)
        if entry is None:
            entry = build()
            while len(self._entries) >= self.capacity:
                self._entries.pop(next(iter(self._entries)))
            self._entries[key] = entry
        return entry

    def __getitem__(self, key: Hashable) -> Any:
        return self._entries[key]

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
