"""Device-side collectives: ``ctx.ccl.all_gather``, ``all_to_all``, ``all_reduce`` and friends.

Each collective is one Triton kernel on the current stream: no host
synchronisation, CUDA-graph capturable, traced like any other kernel when
``ctx.tracing`` is enabled. The tile-level pieces they are built from are in
:mod:`iris.ccl.device` for use inside your own kernels.

Example:
    >>> ctx = iris.iris()
    >>> inp = ctx.randn(1024, 256)
    >>> out = ctx.empty(ctx.get_num_ranks() * 1024, 256)
    >>> ctx.ccl.all_gather(out, inp)
"""

from __future__ import annotations

import weakref

import torch

from .all_gather import all_gather as _all_gather
from .all_reduce import AllReduceWorkspace, check_workspace, pick_variant
from .all_reduce import all_reduce as _all_reduce
from .all_reduce import all_reduce_preamble as _all_reduce_preamble
from .all_to_all import all_to_all as _all_to_all
from .broadcast import broadcast as _broadcast
from .config import Config, ReduceOp
from .reduce_scatter import reduce_scatter as _reduce_scatter
from .runtime import CollectiveError, Runtime
from .tile_reduce_scatter import tile_reduce_scatter as _tile_reduce_scatter

__all__ = ["CCL", "AllReduceWorkspace", "CollectiveError", "Config", "ReduceOp", "Work", "pick_variant"]

_DEFAULT_CONFIG = Config()


class Work:
    """Handle returned with ``async_op=True``, like :class:`torch.distributed.Work`.

    The collective is already queued on the current stream, so later work on that
    stream is ordered after it; ``wait()`` also blocks the host until it finished.

    Example:
        >>> work = ctx.ccl.all_gather(out, inp, async_op=True)
        >>> ...  # independent host work
        >>> work.wait()
    """

    def __init__(self, event=None):
        # ``event``: the backend's completion event (None: the work is already done).
        self._event = event

    def is_completed(self) -> bool:
        """Whether the collective has finished on the device."""
        return self._event is None or self._event.query()

    def wait(self) -> bool:
        """Block until the collective has finished; returns True."""
        if self._event is not None:
            self._event.synchronize()
        return True


class CCL:
    """The collectives of one :class:`~iris.Iris` object, reached as ``ctx.ccl``.

    Arguments follow Iris: ``(output, input, group=None, async_op=False, config=None)``.
    ``group`` is a :mod:`torch.distributed` process group (``None``: every rank).
    Every member must make the same calls in the same order with tensors of the
    same shape, dtype and heap offset; the first call with a set of tensors checks
    that on every member and raises the same :class:`CollectiveError` everywhere.
    """

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        self._runtime = Runtime(ctx)

    def _done(self, async_op: bool):
        return Work(self._ctx.backend.completion_event(self._ctx.get_device())) if async_op else None

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """Concatenate every member's ``input_tensor`` into ``output_tensor`` (``group_size * M`` rows).

        Like :func:`torch.distributed.all_gather_into_tensor`; ``output_tensor`` must
        be on the heap unless the call is small enough to be low-latency or staged
        (``Config.protocol``).

        Example:
            >>> out = ctx.empty(ctx.get_num_ranks() * 128, 64)
            >>> ctx.ccl.all_gather(out, ctx.randn(128, 64))
        """
        self._runtime.call(
            "all_gather",
            lambda: _all_gather(self._runtime, output_tensor, input_tensor, group, config or _DEFAULT_CONFIG),
            (output_tensor, input_tensor),
            (group, config),
        )
        return self._done(async_op)

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """Send block ``j`` of ``input_tensor`` to member ``j``, receiving its block into slot ``rank``.

        2-D tensors ``(M, N * group_size)`` are split by columns (Iris's layout);
        1-D tensors into contiguous blocks (:func:`torch.distributed.all_to_all_single`).
        ``output_tensor`` must be on the heap unless the call is small enough to be
        low-latency (``Config.protocol``).

        Example:
            >>> world = ctx.get_num_ranks()
            >>> out = ctx.empty(128, 32 * world)
            >>> ctx.ccl.all_to_all(out, ctx.randn(128, 32 * world))
        """
        self._runtime.call(
            "all_to_all",
            lambda: _all_to_all(self._runtime, output_tensor, input_tensor, group, config or _DEFAULT_CONFIG),
            (output_tensor, input_tensor),
            (group, config),
        )
        return self._done(async_op)

    def all_reduce_preamble(
        self, output_tensor, input_tensor, op=None, group=None, config=None, workspace=None
    ):
        """Check, pick the variant and compile an all-reduce ahead of time (collective).

        Useful before CUDA-graph capture. Returns an :class:`AllReduceWorkspace`
        (``.variant`` says which algorithm runs); ``workspace`` is accepted for Iris
        compatibility.

        Example:
            >>> ws = ctx.ccl.all_reduce_preamble(out, inp)
            >>> ws.variant
            'one_shot'
        """
        return _all_reduce_preamble(
            self._runtime, output_tensor, input_tensor, op, group, config or _DEFAULT_CONFIG
        )

    def all_reduce(
        self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None, workspace=None
    ):
        """Reduce every member's ``input_tensor`` into ``output_tensor`` on every member.

        ``op`` is :class:`ReduceOp` ``SUM`` (default), ``MAX`` or ``MIN`` (or torch's
        equivalents). ``config.all_reduce_variant`` picks the algorithm (see
        :mod:`iris.ccl.all_reduce`); ``"auto"`` picks by size and group size. Floating
        inputs are accumulated in fp32 (except ``ring``, which keeps partial sums in
        the output's dtype). ``workspace`` (from :meth:`all_reduce_preamble`) is taken
        for Iris compatibility: the preparation is cached per tensor pair anyway, and a
        workspace prepared for the same variant, shape and dtype but fewer tiles is
        refused as upstream refuses it (:class:`iris.errors.WorkspaceTooSmallError`).

        Example:
            >>> out = ctx.empty(4096)
            >>> ctx.ccl.all_reduce(out, ctx.randn(4096))
            >>> ctx.ccl.all_reduce(out, inp, config=Config(all_reduce_variant="two_shot"))
        """
        if workspace is not None:
            check_workspace(self._runtime, workspace, input_tensor, group, config or _DEFAULT_CONFIG)
        self._runtime.call(
            "all_reduce",
            lambda: _all_reduce(
                self._runtime, output_tensor, input_tensor, op, group, config or _DEFAULT_CONFIG
            ),
            (output_tensor, input_tensor),
            (op, group, config),
        )
        return self._done(async_op)

    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None):
        """Reduce block ``rank`` of every member's ``input_tensor`` into ``output_tensor``.

        ``input_tensor`` has ``group_size`` blocks of ``output_tensor.numel()`` elements,
        like :func:`torch.distributed.reduce_scatter_tensor`; it must be on the heap
        unless the call is small enough to be low-latency or staged (``Config.protocol``).

        Upstream Iris's form is taken too: with ``output_tensor`` and ``input_tensor`` of
        the same 2-D shape in a group of several members, each member reduces the tiles
        it owns into the same place of its own output and leaves the others as they were
        (:mod:`iris.ccl.tile_reduce_scatter`; ``input_tensor`` on the heap; tiles and
        their owners from ``config``, upstream's when it is ``None``).

        Example:
            >>> out = ctx.empty(128, 64)
            >>> ctx.ccl.reduce_scatter(out, ctx.randn(ctx.get_num_ranks() * 128, 64))
        """
        tiles = (
            isinstance(output_tensor, torch.Tensor)
            and isinstance(input_tensor, torch.Tensor)
            and output_tensor.shape == input_tensor.shape
            and input_tensor.dim() == 2
            and self._runtime.group(group).size > 1
        )
        # The full-shape form takes upstream's tiles when no config is given.
        form, default = (_tile_reduce_scatter, None) if tiles else (_reduce_scatter, _DEFAULT_CONFIG)
        self._runtime.call(
            "reduce_scatter",
            lambda: form(self._runtime, output_tensor, input_tensor, op, group, config or default),
            (output_tensor, input_tensor),
            (op, group, config),
        )
        return self._done(async_op)

    def broadcast(self, tensor, src=0, group=None, async_op=False, config=None):
        """Overwrite ``tensor`` on every member with rank ``src``'s, like :func:`torch.distributed.broadcast`.

        ``tensor`` must be on the heap unless the call is small enough to be staged;
        ``src`` is a global rank.

        Example:
            >>> weights = ctx.randn(4096) if ctx.get_rank() == 0 else ctx.empty(4096)
            >>> ctx.ccl.broadcast(weights, src=0)
        """
        self._runtime.call(
            "broadcast",
            lambda: _broadcast(self._runtime, tensor, src, group, config or _DEFAULT_CONFIG),
            (tensor,),
            (src, group, config),
        )
        return self._done(async_op)
