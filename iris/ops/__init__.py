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
out, A, B)``, :mod:`iris.ops.upstream`) and its ``FusedConfig`` field names.

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
``"auto"`` uses :func:`iris.ops.config.choose_variant`. The fallbacks of
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

import functools
import weakref

import torch
import triton

from ..host.prepared import LaunchCache, PreparedLaunch, tensor_key
from .all_scatter import (
    BOTH,
    CONSUMER,
    PRODUCER,
    all_scatter_kernel,
    fused_sequential_kernel,
    workgroup_specialized_kernel,
)
from .config import (
    COPY_ENGINE,
    FusedConfig,
    choose_variant,
    default_config,
    gemm_launch_options,
    last_wave_split,
    split_sm_registers,
    upstream_setting,
)
from .copy_plans import (
    all_gather_matmul_plan,
    matmul_all_gather_plan,
    matmul_into,
    matmul_reduce_scatter_plan,
)
from .gather import all_gather_matmul_kernel
from .gemm import SCOPE_GEMM
from .matmul import matmul_launch
from .pull_gather import pull_gather_matmul_kernel
from .reduce import gemm_reduce_kernel
from .tile_reduce_scatter import tile_reduce_scatter_kernel
from .workspace import FusedWorkspace, upstream_lock_tiles

__all__ = [
    "FusedConfig",
    "FusedWorkspace",
    "Ops",
    "OpsNamespace",
    "all_gather_matmul",
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

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Recorded plans kept per context (oldest dropped first).
MAX_PLANS = 64


class Ops:
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

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._plans = LaunchCache(MAX_PLANS)
        self._epoch = None
        self._side_stream = None
        ctx.tracing.name_scope(int(SCOPE_GEMM), "gemm tile")

    # ------------------------------------------------------------------ configuration
    def default_config(self, rows: int, cols: int, k: int, op: str | None = None) -> FusedConfig:
        """The configuration an op picks for a ``rows x cols`` per-rank output of depth ``k`` here.

        :func:`iris.ops.config.default_config` with this context's world size, SM
        count and backend; ``op`` names the ``ctx.ops`` method.

        Example:
            >>> cfg = ctx.ops.default_config(8192, 2048, 8192).replace(variant="fused_sequential")
            >>> ctx.ops.matmul_all_gather(out, a, b, dim=1, config=cfg)
        """
        ctx = self._ctx
        return default_config(
            rows, cols, k, ctx.get_num_ranks(), ctx.get_cu_count(), op, interpreted=ctx.backend.interpreted
        )

    def choose_variant(self, config: FusedConfig, rows: int, cols: int, k: int, op: str | None = None) -> str:
        """The variant ``config`` runs as here (:func:`iris.ops.config.choose_variant` for this context).

        Example:
            >>> ctx.ops.choose_variant(FusedConfig(), 1024, 1024, 4096)
            'unfused'
        """
        ctx = self._ctx
        return choose_variant(
            config,
            rows,
            cols,
            k,
            ctx.get_num_ranks(),
            ctx.get_cu_count(),
            op,
            interpreted=ctx.backend.interpreted,
            spans_nodes=ctx.spans_nodes,
            memory_bandwidth=self._memory_bandwidth,
        )

    @functools.cached_property
    def _memory_bandwidth(self) -> float:
        return self._ctx.backend.memory_bandwidth(self._ctx.heap.device)

    # ------------------------------------------------------------------ public ops
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
        key = ("matmul_all_gather", dim, *self._call_key(out, A, B, async_op, config, bias))
        self._run(
            key,
            lambda: (
                self._plan_matmul_all_gather(out, A, B, dim, async_op, config)
                + self._gathered_bias_steps(out, A, bias, dim, async_op)
            ),
        )
        _fill_workspace(workspace, "matmul_all_gather", A, B, self._ctx)
        return out

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
        world = self._ctx.get_num_ranks()
        if _gathers_columns(A, B, world):
            key = ("all_gather_matmul_columns", *self._call_key(out, A, B, async_op, config, bias))
            self._run(key, lambda: self._plan_pull_gather_matmul(out, A, B, bias, async_op, config))
        else:
            key = ("all_gather_matmul", *self._call_key(out, A, B, async_op, config, bias))
            self._run(
                key,
                lambda: (
                    self._plan_all_gather_matmul(out, A, B, async_op, config)
                    + _row_bias_steps("all_gather_matmul", out, bias)
                ),
            )
        _fill_workspace(workspace, "all_gather_matmul", A, B, self._ctx)
        return out

    def matmul_all_reduce(self, out, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``out = sum over ranks of A @ B`` (row-parallel linear layer): ``A (M, K)``, ``out (M, N)``.

        Fused: partial tiles are reduced by an owner rank each (two-shot) while the GEMM
        goes on; the owner sums every rank's partial in fp32 and stores the result everywhere.
        ``bias`` must be None (upstream Iris accepts it here and ignores it).

        Example:
            >>> out = ctx.empty(M, N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_all_reduce(out, x, w_shard)
        """
        _refuse_bias("matmul_all_reduce", bias)
        variant = upstream_setting(config, "all_reduce_variant")
        lock_tiles = upstream_lock_tiles(A, B, config, variant)
        _fill_workspace(workspace, "matmul_all_reduce", A, B, self._ctx, variant, lock_tiles, reuse=True)
        key = ("matmul_all_reduce", *self._call_key(out, A, B, async_op, config))
        self._run(
            key, lambda: self._plan_gemm_reduce("matmul_all_reduce", out, A, B, False, async_op, config)
        )
        return out

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
        _refuse_bias("matmul_reduce_scatter", bias)
        lock_tiles = upstream_lock_tiles(A, B, config)
        _fill_workspace(workspace, "matmul_reduce_scatter", A, B, self._ctx, "two_shot", lock_tiles)
        if _scatters_tiles(out, A, B, self._ctx.get_num_ranks()):
            key = ("matmul_reduce_scatter_tiles", *self._call_key(out, A, B, async_op, config))
            self._run(key, lambda: self._plan_tile_reduce_scatter(out, A, B, async_op, config))
        else:
            key = ("matmul_reduce_scatter", *self._call_key(out, A, B, async_op, config))
            self._run(
                key,
                lambda: self._plan_gemm_reduce("matmul_reduce_scatter", out, A, B, True, async_op, config),
            )
        return out

    # ------------------------------------------------------------------ plans
    def _call_key(self, out, A, B, async_op, config, bias=None) -> tuple:
        tensors = tuple(tensor_key(t) for t in (out, A, B))
        biased = None if bias is None else tensor_key(bias)
        return (*tensors, biased, bool(async_op), config, self._ctx.tracing.enabled)

    def _run(self, key, build):
        for step in self._plans.get_or_build(key, build):
            step()

    def _plan_matmul_all_gather(self, out, A, B, dim, async_op, config):
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        M, K, N = _gemm_dims("matmul_all_gather", A, B)
        if dim not in (0, 1):
            raise ValueError(f"iris.ops.matmul_all_gather: dim must be 0 or 1, got {dim}")
        expected = (world * M, N) if dim == 0 else (M, world * N)
        _check_out("matmul_all_gather", out, expected, A, ctx, symmetric=True)
        block = out.narrow(dim, rank * (M if dim == 0 else N), M if dim == 0 else N)
        cfg, variant = self._config_and_variant(config, M, N, K, "matmul_all_gather")
        if variant == COPY_ENGINE:
            return matmul_all_gather_plan(self, out, A, B, block, cfg, async_op)
        if variant == "fused":
            variant = "producer_consumer" if cfg.consumer_warps else "workgroup_specialized"
        num_sms = ctx.get_cu_count()
        heap_bases = ctx._heap_bases_for_iris()
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        entry, epoch = self._flags("entry", world), self._epoch_counter()
        gemm = gemm_launch_options(cfg, K)
        steps = [lambda: epoch.add_(1)]
        if variant in ("unfused", "bulk_synchronous"):
            if variant == "unfused":
                steps.append(lambda: matmul_into(A, B, block))
            else:
                steps.append(matmul_launch(A, B, block, cfg, num_sms, heap_bases))
            steps.append(self._all_scatter_launch(block, cfg))
        elif variant == "fused_sequential":
            steps.append(PreparedLaunch(
                fused_sequential_kernel, (min(num_sms, tiles),),
                (A, B, block, entry, epoch, M, N, K, *A.stride(), *B.stride(), *block.stride(),
                 rank, world, heap_bases), gemm,
            ))  # fmt: skip
        else:
            sharing = variant == "producer_consumer" and cfg.consumer_warps > 0
            gemm_programs = num_sms if sharing else num_sms - min(cfg.comm_sms, num_sms - 1)
            split = tiles
            if cfg.split_last_wave and cfg.block_n >= 32:
                split = last_wave_split(tiles, gemm_programs)
            flags, tickets = self._flags("tile", 2 * tiles - split), self._flags("tickets", 3)
            args = (
                A, B, block, flags, tickets, entry, epoch, M, N, K, *A.stride(), *B.stride(), *block.stride(),
                rank, world, heap_bases, gemm_programs, split,
            )  # fmt: skip
            options = dict(COMM_ROWS=cfg.comm_rows, **gemm)
            if variant == "workgroup_specialized":
                options["ROLE"] = BOTH
                steps.append(PreparedLaunch(workgroup_specialized_kernel, (num_sms,), args, options))
            else:
                steps += self._producer_consumer(args, tickets, cfg, num_sms, gemm_programs, options)
        # Peers store into this rank's out: only a barrier tells that they are done.
        if not async_op:
            steps.append(ctx.device_barrier)
        return steps

    def _plan_all_gather_matmul(self, out, A, B, async_op, config):
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        M, K, N = _gemm_dims("all_gather_matmul", A, B)
        _check_out("all_gather_matmul", out, (world * M, N), A, ctx, symmetric=False)
        cfg, variant = self._config_and_variant(config, world * M, N, K, "all_gather_matmul")
        if variant not in ("fused", "unfused", COPY_ENGINE):
            raise ValueError(
                "iris.ops.all_gather_matmul: variant must be auto, fused, unfused or copy_engine, "
                f"got {variant!r}"
            )
        if variant == COPY_ENGINE:
            return all_gather_matmul_plan(self, out, A, B)
        if variant == "unfused" or world == 1:
            # Its own buffer: ctx.ccl's handshake guards it, not the fused path's flags.
            gathered = self._buffer("gathered_unfused", (world * M, K), A.dtype)
            steps = [lambda: ctx.ccl.all_gather(gathered, A), lambda: matmul_into(gathered, B, out)]
            if not A.is_contiguous():
                shard = torch.empty_like(A, memory_format=torch.contiguous_format)
                steps = [lambda: shard.copy_(A), lambda: ctx.ccl.all_gather(gathered, shard), steps[1]]
            return steps
        gathered = self._buffer("gathered", (world * M, K), A.dtype)
        a_shard = A if A.stride() == gathered.stride() else A.contiguous()
        chunks = triton.cdiv(M, cfg.block_m)
        num_sms = ctx.get_cu_count()
        comm = min(cfg.comm_sms, num_sms - 1)
        # Enough K slices per row block for every pusher to have one (at most one per COMM_K step).
        parts = max(1, min(triton.cdiv(comm, chunks * (world - 1)), triton.cdiv(K, cfg.block_k)))
        flags, epoch = self._flags("chunk", world * chunks * parts), self._epoch_counter()
        steps = [lambda: epoch.add_(1)]
        if a_shard is not A:
            steps.append(lambda: a_shard.copy_(A))
        steps.append(PreparedLaunch(
            all_gather_matmul_kernel, (num_sms,),
            (a_shard, gathered, B, out, flags, epoch, M, N, K, *a_shard.stride(), *B.stride(),
             *out.stride(), rank, world, ctx._heap_bases_for_iris(), comm, parts),
            dict(COMM_K=cfg.block_k, **gemm_launch_options(cfg, K)),
        ))  # fmt: skip
        if not async_op:
            steps.append(ctx.device_barrier)
        return steps

    def _plan_gemm_reduce(self, name, out, A, B, scatter, async_op, config):
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        total_rows, K, N = _gemm_dims(name, A, B)
        if scatter and total_rows % world:
            raise ValueError(f"iris.ops.{name}: A has {total_rows} rows, not a multiple of {world} ranks")
        M = total_rows // world if scatter else total_rows
        _check_out(name, out, (M, N), A, ctx, symmetric=not scatter)
        cfg, variant = self._config_and_variant(config, total_rows, N, K, name)
        allowed = ("fused", "unfused", COPY_ENGINE) if scatter else ("fused", "unfused")
        if variant not in allowed:
            raise ValueError(f"iris.ops.{name}: variant must be auto or one of {allowed}, got {variant!r}")
        partial = self._buffer("partial", (total_rows, N), out.dtype)
        if world == 1:
            return [lambda: matmul_into(A, B, out)]
        if variant == COPY_ENGINE:
            return matmul_reduce_scatter_plan(self, out, A, B, partial)
        if variant == "unfused":
            # ctx.ccl's collectives finish like NCCL's: this rank's out is complete and
            # nobody reads this rank's partial any more, so no barrier has to follow.
            collective = ctx.ccl.reduce_scatter if scatter else ctx.ccl.all_reduce
            return [lambda: matmul_into(A, B, partial), lambda: collective(out, partial)]
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        counters = self._flags("reduce", tiles)
        num_sms = ctx.get_cu_count()
        comm = min(cfg.comm_sms, num_sms - 1)
        steps = [PreparedLaunch(
            gemm_reduce_kernel, (num_sms,),
            (A, B, partial, out, counters, M, N, K, *A.stride(), *B.stride(), *partial.stride(),
             *out.stride(), rank, world, ctx._heap_bases_for_iris(), num_sms - comm),
            dict(COMM_ROWS=cfg.comm_rows, SCATTER=scatter, **gemm_launch_options(cfg, K)),
        )]  # fmt: skip
        if not async_op:
            steps.append(ctx.device_barrier)
        return steps

    def _plan_pull_gather_matmul(self, out, A, B, bias, async_op, config):
        # Upstream Iris's all_gather_matmul: A sharded by columns, read from the peers' heaps.
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        M, K_local, N = _gemm_dims("all_gather_matmul", A, B, shards=world)
        _check_out("all_gather_matmul", out, (M, N), A, ctx, symmetric=False)
        if not ctx.is_symmetric(A):
            raise ValueError(
                "iris.ops.all_gather_matmul: A is a column shard that the other ranks read, so it "
                "must be on the symmetric heap"
            )
        cfg = (
            config if config is not None else self.default_config(M, N, world * K_local, "all_gather_matmul")
        )
        if cfg.variant not in ("auto", "fused"):
            raise ValueError(
                "iris.ops.all_gather_matmul: gathering A by columns runs fused only, got variant "
                f"{cfg.variant!r}"
            )
        has_bias = bias is not None
        if has_bias:
            _check_bias("all_gather_matmul", bias, M, A)
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        options = gemm_launch_options(cfg, K_local)
        # Every rank's shard is in place before anyone reads it.
        steps = [ctx.device_barrier, PreparedLaunch(
            pull_gather_matmul_kernel, (tiles,),
            (A, B, out, bias if has_bias else out, M, N, K_local, *A.stride(), *B.stride(),
             *out.stride(), bias.stride(0) if has_bias else 0, rank, world, ctx._heap_bases_for_iris()),
            dict(HAS_BIAS=has_bias, **options),
        )]  # fmt: skip
        # Peers read this rank's shard until they finish: only a barrier tells that they have.
        if not async_op:
            steps.append(ctx.device_barrier)
        return steps

    def _plan_tile_reduce_scatter(self, out, A, B, async_op, config):
        # Upstream Iris's matmul_reduce_scatter: every rank's out is M x N, reduced in the tiles it owns.
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        M, K, N = _gemm_dims("matmul_reduce_scatter", A, B)
        _check_out("matmul_reduce_scatter", out, (M, N), A, ctx, symmetric=False)
        # Which tiles a rank owns follows from the tile size, so it must not vary with the shape.
        cfg = config if config is not None else FusedConfig()
        if cfg.variant not in ("auto", "fused"):
            raise ValueError(
                "iris.ops.matmul_reduce_scatter: scattering by tiles runs fused only, got variant "
                f"{cfg.variant!r}"
            )
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        partial = self._buffer("tile_partial", (M, N), out.dtype)
        locks = self._buffer("tile_locks", (tiles, 1), torch.int32).view(-1)
        options = gemm_launch_options(cfg, K)
        options.pop("GROUP_M")  # tiles run in row-major order: ownership depends on it
        launch = PreparedLaunch(
            tile_reduce_scatter_kernel, (tiles,),
            (A, B, partial, out, locks, M, N, K, *A.stride(), *B.stride(), *partial.stride(),
             *out.stride(), ctx._device_context_for_iris(), rank, world),
            options,
        )  # fmt: skip
        # The locks are 0/1 flags (upstream's protocol): zeroed on every rank before any
        # rank raises one; tiles this rank does not own stay zero in out.
        steps = [lambda: locks.zero_(), lambda: out.zero_(), ctx.device_barrier, launch]
        if not async_op:
            steps.append(ctx.device_barrier)
        return steps

    def _gathered_bias_steps(self, out, A, bias, dim, async_op):
        # Upstream's matmul_all_gather bias: M entries per rank, added to that rank's rows.
        if bias is None:
            return []
        if dim != 0:
            raise ValueError(
                "iris.ops.matmul_all_gather: bias is supported with dim=0 (upstream Iris's form)"
            )
        ctx = self._ctx
        M = A.shape[0]
        _check_bias("matmul_all_gather", bias, M, A)
        gathered = self._buffer("bias", (ctx.get_num_ranks() * M, 1), bias.dtype).view(-1)
        local = bias if bias.is_contiguous() else bias.contiguous()
        steps = [] if not async_op else [ctx.device_barrier]  # the peers' rows must have landed
        return steps + [lambda: ctx.ccl.all_gather(gathered, local), lambda: out.add_(gathered[:, None])]

    # ------------------------------------------------------------------ internals
    def _config_and_variant(self, config, rows, cols, k, op=None):
        cfg = config if config is not None else self.default_config(rows, cols, k, op)
        variant = self.choose_variant(cfg, rows, cols, k, op)
        if variant == COPY_ENGINE and self._ctx.spans_nodes:
            raise ValueError(
                f"iris.ops.{op}: the copy_engine variant reaches only the GPUs of this node, and this "
                "job spans nodes: pick fused or unfused (or auto)"
            )
        return cfg, variant

    def _buffer(self, name, shape, dtype):
        numel = shape[0] * shape[1]
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = self._buffers[(name, dtype)] = self._ctx.empty(numel, dtype=dtype)
        return buf[:numel].view(shape)

    def _flags(self, name, count):
        # Every protocol leaves its flags either at 0 or below the next epoch, so one
        # array per protocol serves every shape; a fresh (zeroed) one only when it grows.
        flags = self._buffers.get((name, torch.int32))
        if flags is None or flags.numel() < count:
            flags = self._buffers[(name, torch.int32)] = self._ctx.zeros(max(count, 64), dtype=torch.int32)
            # Peers signal into these flags: none may do so before every rank's zeros
            # have landed, or a faster rank's signal is wiped and both sides wait forever.
            self._ctx.barrier()
        return flags

    def _all_scatter_launch(self, block, cfg) -> PreparedLaunch:
        # The bulk-synchronous push: every SM stores this rank's finished ``block`` (its
        # view of a symmetric output) into every peer's copy, after the call's entry
        # handshake (the flags and epoch every all-scatter plan of this object shares).
        ctx = self._ctx
        world = ctx.get_num_ranks()
        return PreparedLaunch(
            all_scatter_kernel,
            (ctx.get_cu_count(),),
            (block, self._flags("entry", world), self._epoch_counter(), *block.shape, *block.stride(),
             ctx.get_rank(), world, ctx._heap_bases_for_iris()),
            dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, COMM_ROWS=cfg.comm_rows, num_warps=cfg.num_warps),
        )  # fmt: skip

    def _epoch_counter(self):
        # One epoch for every epoch-valued flag, bumped by the first step of each call's
        # plan: queued on the stream before the kernel (so CUDA graph replays bump it
        # too), and every rank makes the same calls, so the ranks' epochs agree.
        if self._epoch is None:
            self._epoch = self._ctx.zeros(1, dtype=torch.int32)
        return self._epoch

    def _producer_consumer(self, args, tickets, cfg, num_sms, gemm_programs, common):
        sharing = cfg.consumer_warps > 0
        # Sharing SMs, every SM computes and one small consumer sits beside each GEMM program.
        comm_programs = num_sms if sharing else num_sms - gemm_programs

        def launch(role, programs, **options):
            options = dict(common, ROLE=role, **options)
            return PreparedLaunch(workgroup_specialized_kernel, (programs,), args, options)

        backend = self._ctx.backend
        if sharing and not backend.interpreted:
            producer, consumer = _sm_sharing_launches(cfg, launch, gemm_programs, comm_programs)
        else:  # under emulation a sharing consumer differs only in its sleeps (no-ops there)
            producer = launch(PRODUCER, gemm_programs)
            consumer = launch(CONSUMER, comm_programs, BACKOFF_NS=SHARING_BACKOFF_NS if sharing else 0)
        if self._side_stream is None:
            self._side_stream = backend.side_stream(self._ctx.get_device())
        # Consumers that reached the SMs first could keep GEMM programs off them while
        # waiting for their tiles: when sharing, they are launched once all have started.
        started = (tickets[2:3], gemm_programs) if sharing else None

        def run():
            backend.run_beside(self._side_stream, producer, consumer, started)

        return [run]


def _sm_sharing_launches(cfg, launch, gemm_programs, comm_programs):
    """The producer and consumer launches of SM-sharing producer-consumer (:func:`split_sm_registers`)."""
    sharing = dict(num_warps=cfg.consumer_warps, num_stages=1, BACKOFF_NS=SHARING_BACKOFF_NS)

    def producer(cap):
        return launch(PRODUCER, gemm_programs, maxnreg=cap)

    def consumer(cap):
        return launch(CONSUMER, comm_programs, maxnreg=cap, **sharing)

    def compiled(make):
        def registers_and_spills(cap):
            kernel = make(cap).compile()
            return kernel.n_regs, kernel.n_spills

        return registers_and_spills

    producer_cap, consumer_cap = split_sm_registers(
        compiled(producer), compiled(consumer), cfg.num_warps, cfg.consumer_warps
    )
    return producer(producer_cap), consumer(consumer_cap)


#: Sleep between a sharing consumer's polls of a tile flag, so the GEMM warps on its SM
#: keep issuing (4 x H200, 4096 x 8192 x 8192: 0.283 ms in the run with it, 0.292 in
#: the run before, polling busily).
SHARING_BACKOFF_NS = 500


def _gemm_dims(name, A, B, shards: int = 1):
    # (rows of A, columns of A, columns of B); B has ``shards`` times A's columns as rows
    # (more than 1 where A is one rank's column shard).
    if A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"iris.ops.{name}: A and B must be 2-D, got {tuple(A.shape)} and {tuple(B.shape)}")
    if A.shape[1] * shards != B.shape[0]:
        raise ValueError(
            f"iris.ops.{name}: A is {tuple(A.shape)} but B is {tuple(B.shape)} (inner dims differ)"
        )
    if A.dtype != B.dtype or A.dtype not in _DTYPES:
        raise TypeError(
            f"iris.ops.{name}: A and B must share a dtype among {_DTYPES}, got {A.dtype}, {B.dtype}"
        )
    return A.shape[0], A.shape[1], B.shape[1]


def _check_out(name, out, shape, A, ctx, symmetric: bool):
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"iris.ops.{name}: out must be {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype not in _DTYPES:
        raise TypeError(f"iris.ops.{name}: out dtype {out.dtype} is not one of {_DTYPES}")
    if symmetric and not ctx.is_symmetric(out):
        raise ValueError(
            f"iris.ops.{name}: out is written by other ranks, so it must be on the symmetric heap"
        )
    if A.device != out.device:
        raise ValueError(f"iris.ops.{name}: A is on {A.device} but out is on {out.device}")


def _gathers_columns(A, B, world: int) -> bool:
    # Upstream Iris's all_gather_matmul: A (M, K / world), B (K, N). Never ambiguous
    # with this package's row gather (A (M, K), B (K, N)) once there are two ranks.
    return world > 1 and A.dim() == 2 and B.dim() == 2 and A.shape[1] * world == B.shape[0]


def _scatters_tiles(out, A, B, world: int) -> bool:
    # Upstream Iris's matmul_reduce_scatter: out has the full (M, N) shape; this
    # package's row scatter has out (M / world, N).
    if world == 1 or A.dim() != 2 or B.dim() != 2 or out.dim() != 2:
        return False
    return tuple(out.shape) == (A.shape[0], B.shape[1])


def _check_bias(name, bias, rows: int, A):
    if bias.dim() != 1 or bias.shape[0] != rows:
        raise ValueError(
            f"iris.ops.{name}: bias must have {rows} entries (one per row), got {tuple(bias.shape)}"
        )
    if bias.device != A.device:
        raise ValueError(f"iris.ops.{name}: bias is on {bias.device} but A is on {A.device}")


def _row_bias_steps(name, out, bias) -> list:
    if bias is None:
        return []
    _check_bias(name, bias, out.shape[0], out)
    return [lambda: out.add_(bias[:, None])]


def _refuse_bias(name, bias):
    if bias is not None:
        raise ValueError(
            f"iris.ops.{name}: bias is not supported (upstream Iris accepts it here and ignores it); "
            "add it to out after the call"
        )


def _fill_workspace(workspace, operation: str, A, B, ctx, variant="", lock_tiles=None, reuse=False):
    # Upstream Iris's ops return and take a FusedWorkspace; here buffers are the
    # context's own, so a workspace passed in records the call and the tiles
    # upstream's locks would hold, refusing a reuse where those would be too few
    # (upstream's matmul_all_reduce reuses a matching workspace; matmul_reduce_scatter
    # prepares it again, checking the old locks first).
    if workspace is None:
        return
    if not isinstance(workspace, FusedWorkspace):
        raise TypeError(
            f"iris.ops.{operation}: workspace must be an iris.ops.FusedWorkspace, got {type(workspace)}"
        )
    world = ctx.get_num_ranks()
    if reuse:
        workspace.reuse(operation, A, B, world, variant, lock_tiles)
    else:
        workspace.prepare(operation, A, B, world, variant, lock_tiles, check=lock_tiles is not None)


#: Upstream Iris's name of :class:`Ops`.
OpsNamespace = Ops

# Upstream Iris's module-level form of the ops (context first); imported last, as
# ``iris.ops.upstream`` runs the ``Ops`` methods above.
from .upstream import (  # noqa: E402
    all_gather_matmul,
    all_gather_matmul_preamble,
    matmul_all_gather,
    matmul_all_gather_preamble,
    matmul_all_reduce,
    matmul_all_reduce_preamble,
    matmul_reduce_scatter,
    matmul_reduce_scatter_preamble,
)
