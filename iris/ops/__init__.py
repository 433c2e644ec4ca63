"""Fused GEMM + communication, reached as ``ctx.ops`` (names as in Iris's ``iris.ops``).

* ``matmul_all_gather(out, A, B, dim=0)``: ``A (M, K)``, ``B (K, N)``; ``out (world*M, N)``
  holds every rank's ``A @ B``, stacked by rank
* ``matmul_all_gather(out, A, B, dim=1)``: the same with ``out (M, world*N)``, blocks side
  by side (GEMM + all-scatter: ``B`` is sharded by columns)
* ``all_gather_matmul(out, A, B)``: ``A (M, K)`` is a row shard; ``out (world*M, N) =
  all_gather(A) @ B``
* ``matmul_all_reduce(out, A, B)``: ``out (M, N)`` = the sum over ranks of ``A @ B``
* ``matmul_reduce_scatter(out, A, B)``: ``A (world*M, K)``; ``out (M, N)`` = row block
  ``rank`` of the sum over ranks of ``A @ B``

Upstream Iris's shapes work too, told apart by the shapes: ``all_gather_matmul`` with
``A (M, K / world)`` sharded by columns and ``out (M, N)`` (:mod:`iris.ops.pull_gather`),
and ``matmul_reduce_scatter`` with ``A (M, K)`` and ``out (M, N)``, each rank keeping
its share of the tiles (:mod:`iris.ops.tile_reduce_scatter`). So do upstream's
``bias=`` and ``workspace=`` arguments, its module functions (``iris.ops.matmul_all_reduce(ctx,
out, A, B)``, one module per op, as upstream has) and its ``FusedConfig`` field names.

Shapes, strides and dtypes come from the tensors; gathers and scatters follow
``torch.distributed`` (``all_gather_into_tensor``, ``reduce_scatter_tensor``: row
blocks in rank order). Outputs written by other ranks (``matmul_all_gather``,
``matmul_all_reduce``) must be on the symmetric heap and allocated in the same order
on every rank. Every op is collective. With ``async_op=False`` (default) a device
barrier follows, so work queued afterwards on any rank sees the whole result; with
``async_op=True`` call ``ctx.device_barrier()`` (or ``ctx.barrier()``) before reading
the output or calling the op again.

Each op either runs a fused Triton kernel, its unfused fallback (cuBLAS through
``torch.matmul``, then a ``ctx.ccl`` collective) or, for ``matmul_all_gather``,
``all_gather_matmul`` and ``matmul_reduce_scatter``, cuBLAS with copy-engine puts
pipelined behind it (:mod:`iris.ops.copy_plans`); ``config.variant`` picks, and
``"auto"`` asks :mod:`iris.ops.selection`. The fallbacks of
``all_gather_matmul``, ``matmul_all_reduce`` and ``matmul_reduce_scatter`` end like
their collective (as NCCL's do): this rank's output is complete, and no barrier follows.

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> a = ctx.randn(4096, 1024, dtype=torch.bfloat16)
    >>> b = ctx.randn(1024, 8192, dtype=torch.bfloat16)
    >>> out = ctx.empty(4096, 8192, dtype=torch.bfloat16)
    >>> ctx.ops.matmul_all_reduce(out, a, b)
"""

from __future__ import annotations

from ..host.tracing import kernel_artifacts
from . import all_gather_matmul as _all_gather_matmul
from . import matmul_all_gather as _matmul_all_gather
from . import matmul_all_reduce as _matmul_all_reduce
from . import matmul_reduce_scatter as _matmul_reduce_scatter
from ._plans import Planner
from .config import FusedConfig
from .selection import choose_variant, default_config
from .workspace import FusedWorkspace

__all__ = [
    "FusedConfig",
    "FusedWorkspace",
    "Ops",
    "OpsNamespace",
    "all_gather_matmul",
    "all_gather_matmul_hbm_buffer",
    "all_gather_matmul_hbm_buffer_preamble",
    "all_gather_matmul_preamble",
    "choose_variant",
    "default_config",
    "matmul_all_gather",
    "matmul_all_gather_preamble",
    "matmul_all_reduce",
    "matmul_all_reduce_preamble",
    "matmul_reduce_scatter",
    "matmul_reduce_scatter_preamble",
]


class Ops(Planner):
    """Fused GEMM + collective ops of one :class:`iris.Iris` context (``ctx.ops``).

    Workspaces (flags, partial and gather buffers) live on the symmetric heap; each is
    allocated on first use and again only when a larger one is needed (the heap never
    frees, so run the largest shape first to allocate once). Every rank must issue the
    same ops with the same shapes in the same order.

    The first call with given tensors (addresses, shapes, strides, dtypes), options
    and tracing state checks them, compiles and records its launches as a *plan*;
    later identical calls replay the plan with a few microseconds of host time.

    Example:
        >>> out = ctx.empty(world * 1024, 4096, dtype=torch.bfloat16)
        >>> ctx.ops.matmul_all_gather(out, a, b)   # a (1024, K), b (K, 4096) on every rank
    """

    def matmul_all_gather(self, out, A, B, bias=None, async_op=False, config=None, workspace=None, *, dim=0):
        """``out = all_gather(A @ B)`` along ``dim``: 0 stacks rows (``all_gather_into_tensor``),
        1 places each rank's block at columns ``rank * N`` (GEMM + all-scatter).

        ``config.variant`` may name any of the four overlap styles (docs/fused.md);
        ``"fused"`` is ``workgroup_specialized`` (``producer_consumer`` if ``config.consumer_warps``).

        Args:
            out: ``(world * M, N)`` (``dim=0``) or ``(M, world * N)`` (``dim=1``), on the heap.
            A, B: ``(M, K)`` and ``(K, N)``, fp16, bf16 or fp32.
            bias: ``dim=0`` only: ``M`` entries added to this rank's rows (upstream Iris's
                ``bias``); every rank passes one or none. Added after the op, so the
                rounding differs from adding it to the fp32 accumulator.
            async_op: skip the closing device barrier.
            config: a :class:`FusedConfig` (upstream's field names work too).
            workspace: upstream Iris's :class:`FusedWorkspace`; accepted and filled in.
            dim: keyword only, 0 or 1.

        Example:
            >>> out = ctx.empty(M, world * N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_all_gather(out, a, b_shard, dim=1)
        """
        with kernel_artifacts.filed_under("matmul_all_gather"):  # IRIS_KERNEL_ARTIFACTS_DIR: by op
            return _matmul_all_gather.run(self, out, A, B, bias, async_op, config, workspace, dim)

    def all_gather_matmul(self, out, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``out = all_gather(A) @ B``, gathering ``A``'s rows or, as upstream Iris, its columns.

        * ``A (M, K)`` a row shard, ``B (K, N)``: ``out (world*M, N)`` (``all_gather_into_tensor``
          rows). Fused: some programs push this rank's shard to every peer while the others
          multiply, own rows first, then each peer's rows as they land.
        * ``A (M, K / world)`` a column shard on the heap, ``B (K, N)``: ``out (M, N)``
          (upstream Iris's ``all_gather_matmul``). Fused only: each output tile reads
          every peer's slices of ``A`` from its heap (:mod:`iris.ops.pull_gather`).

        Args:
            bias: ``out.shape[0]`` entries added to the rows of ``out``.
            async_op, config, workspace: as :meth:`matmul_all_gather`.

        Example:
            >>> out = ctx.empty(world * M, N, dtype=torch.bfloat16)
            >>> ctx.ops.all_gather_matmul(out, x_shard, w)
        """
        with kernel_artifacts.filed_under("all_gather_matmul"):  # IRIS_KERNEL_ARTIFACTS_DIR: by op
            return _all_gather_matmul.run(self, out, A, B, bias, async_op, config, workspace)

    def matmul_all_reduce(self, out, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``out = sum over ranks of A @ B`` (row-parallel linear layer): ``A (M, K)``, ``out (M, N)``.

        Fused: partial tiles are reduced by an owner rank each (two-shot) while the GEMM
        goes on; the owner sums every rank's partial in fp32 and stores the result everywhere.
        ``bias`` must be None (upstream Iris accepts it here and ignores it).

        Example:
            >>> out = ctx.empty(M, N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_all_reduce(out, x, w_shard)
        """
        with kernel_artifacts.filed_under("matmul_all_reduce"):  # IRIS_KERNEL_ARTIFACTS_DIR: by op
            return _matmul_all_reduce.run(self, out, A, B, bias, async_op, config, workspace)

    def matmul_reduce_scatter(self, out, A, B, bias=None, async_op=False, config=None, workspace=None):
        """The sum over ranks of ``A @ B``, scattered by row blocks or, as upstream Iris, by tiles.

        * ``A (world*M, K)``, ``out (M, N)``: row block ``rank`` of the sum
          (``reduce_scatter_tensor``). Fused: rank ``r`` reduces row block ``r`` tile by
          tile as the ranks' partial tiles finish.
        * ``A (M, K)``, ``out (M, N)``, more than one rank: upstream Iris's tile ownership.
          With ``T`` tiles of ``config.block_m x config.block_n`` (``FusedConfig()``'s when
          ``config`` is None) in row-major order, rank ``r`` gets the sum in tiles
          ``[r * (T // world), (r + 1) * (T // world))`` (the last rank also the rest) and
          zeros elsewhere (:mod:`iris.ops.tile_reduce_scatter`).

        ``bias`` must be None (upstream Iris's ``matmul_reduce_scatter`` has none).

        Example:
            >>> out = ctx.empty(M // world, N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_reduce_scatter(out, x, w_shard)
        """
        with kernel_artifacts.filed_under("matmul_reduce_scatter"):  # IRIS_KERNEL_ARTIFACTS_DIR: by op
            return _matmul_reduce_scatter.run(self, out, A, B, bias, async_op, config, workspace)


#: Upstream Iris's name of :class:`Ops`.
OpsNamespace = Ops

# Upstream Iris's module-level form of the ops (context first), each in the module of its
# name; importing it binds ``iris.ops.<op>`` to the function, as upstream's package does.
from .all_gather_matmul import all_gather_matmul, all_gather_matmul_preamble  # noqa: E402
from .all_gather_matmul_hbm_buffer import (  # noqa: E402
    all_gather_matmul_hbm_buffer,
    all_gather_matmul_hbm_buffer_preamble,
)
from .matmul_all_gather import matmul_all_gather, matmul_all_gather_preamble  # noqa: E402
from .matmul_all_reduce import matmul_all_reduce, matmul_all_reduce_preamble  # noqa: E402
from .matmul_reduce_scatter import matmul_reduce_scatter, matmul_reduce_scatter_preamble  # noqa: E402
