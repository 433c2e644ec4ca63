"""``ctx.ops.matmul_all_gather``: every rank's ``A @ B``, gathered into every rank's ``out``.

With ``dim=0`` the ranks' blocks are stacked by rows (``all_gather_into_tensor`` of the
products); with ``dim=1`` they sit side by side (GEMM + all-scatter: ``B`` sharded by
columns). This rank's block is computed into its place in its own ``out``, a view of a
symmetric tensor, and pushed into the same place of every peer's. Five styles
(docs/fused.md): ``unfused`` (cuBLAS, then the all-scatter kernel), ``bulk_synchronous``
(the tile GEMM, then the all-scatter kernel), ``fused_sequential`` (each program pushes
the tile it just computed), ``workgroup_specialized`` (some programs compute, others
push finished tiles as their flags rise; one kernel) and ``producer_consumer`` (the same
as two kernels, side by side); and ``copy_engine`` (cuBLAS on every SM while the copy
engines move finished row blocks, :mod:`iris.ops.copy_plans`). ``auto`` asks
:mod:`iris.ops.selection`. Peers store into this rank's ``out``, so a device barrier
closes the call unless ``async_op``.
"""

from __future__ import annotations

import triton

from ..host.prepared import PreparedLaunch
from ._plans import check_bias, check_out, checked_workspace, fill_workspace, gemm_dims, prepared_workspace
from .all_scatter import BOTH, fused_sequential_kernel, workgroup_specialized_kernel
from .config import COPY_ENGINE, FusedConfig, gemm_launch_options, last_wave_split
from .copy_plans import matmul_all_gather_plan, matmul_into
from .matmul import matmul_launch
from .workspace import FusedWorkspace


def run(ops, out, A, B, bias, async_op, config, workspace, dim):
    """``ctx.ops.matmul_all_gather`` (:meth:`iris.ops.Ops.matmul_all_gather`)."""
    key = ("matmul_all_gather", dim, *ops._call_key(out, A, B, async_op, config, bias))
    ops._run(
        key,
        lambda: (
            _plan(ops, out, A, B, dim, async_op, config)
            + _gathered_bias_steps(ops, out, A, bias, dim, async_op)
        ),
    )
    fill_workspace(workspace, "matmul_all_gather", A, B, ops._ctx)
    return out


def _plan(ops, out, A, B, dim, async_op, config):
    ctx = ops._ctx
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, K, N = gemm_dims("matmul_all_gather", A, B)
    if dim not in (0, 1):
        raise ValueError(f"iris.ops.matmul_all_gather: dim must be 0 or 1, got {dim}")
    expected = (world * M, N) if dim == 0 else (M, world * N)
    check_out("matmul_all_gather", out, expected, A, ctx, symmetric=True)
    block = out.narrow(dim, rank * (M if dim == 0 else N), M if dim == 0 else N)
    cfg, variant = ops._config_and_variant(config, M, N, K, "matmul_all_gather")
    if variant == COPY_ENGINE:
        return matmul_all_gather_plan(ops, out, A, B, block, cfg, async_op)
    if variant == "fused":
        variant = "producer_consumer" if cfg.consumer_warps else "workgroup_specialized"
    num_sms = ctx.get_cu_count()
    heap_bases = ctx._heap_bases_for_iris()
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    entry, epoch = ops._flags("entry", world), ops._epoch_counter()
    gemm = gemm_launch_options(cfg, K)
    steps = [lambda: epoch.add_(1)]
    if variant in ("unfused", "bulk_synchronous"):
        if variant == "unfused":
            steps.append(lambda: matmul_into(A, B, block))
        else:
            steps.append(matmul_launch(A, B, block, cfg, num_sms, heap_bases))
        steps.append(ops._all_scatter_launch(block, cfg))
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
        flags, tickets = ops._flags("tile", 2 * tiles - split), ops._flags("tickets", 3)
        args = (
            A, B, block, flags, tickets, entry, epoch, M, N, K, *A.stride(), *B.stride(), *block.stride(),
            rank, world, heap_bases, gemm_programs, split,
        )  # fmt: skip
        options = dict(COMM_ROWS=cfg.comm_rows, **gemm)
        if variant == "workgroup_specialized":
            options["ROLE"] = BOTH
            steps.append(PreparedLaunch(workgroup_specialized_kernel, (num_sms,), args, options))
        else:
            steps += ops._producer_consumer(args, tickets, cfg, num_sms, gemm_programs, options)
    # Peers store into this rank's out: only a barrier tells that they are done.
    if not async_op:
        steps.append(ctx.device_barrier)
    return steps


def _gathered_bias_steps(ops, out, A, bias, dim, async_op):
    # Upstream's matmul_all_gather bias: M entries per rank, added to that rank's rows.
    if bias is None:
        return []
    if dim != 0:
        raise ValueError("iris.ops.matmul_all_gather: bias is supported with dim=0 (upstream Iris's form)")
    ctx = ops._ctx
    M = A.shape[0]
    check_bias("matmul_all_gather", bias, M, A)
    gathered = ops._buffer("bias", (ctx.get_num_ranks() * M, 1), bias.dtype).view(-1)
    local = bias if bias.is_contiguous() else bias.contiguous()
    steps = [] if not async_op else [ctx.device_barrier]  # the peers' rows must have landed
    return steps + [lambda: ctx.ccl.all_gather(gathered, local), lambda: out.add_(gathered[:, None])]


# ------------------------------------------------------------------ upstream Iris's module functions
def matmul_all_gather_preamble(shmem, A, B, config: FusedConfig | None = None) -> FusedWorkspace:
    """A workspace for :func:`matmul_all_gather`.

    Example:
        >>> ws = iris.ops.matmul_all_gather_preamble(ctx, a, b)
    """
    return prepared_workspace(shmem, "matmul_all_gather", A, B, config, None)


def matmul_all_gather(
    shmem, output_tensor, A, B, bias=None, async_op: bool = False, config=None, workspace=None
) -> FusedWorkspace:
    """``output = all_gather(A @ B (+ bias))`` along rows; returns the workspace.

    Args:
        output_tensor: ``(world_size * M, N)`` on the heap.
        A, B: ``(M, K)`` and ``(K, N)``.
        bias: optional, ``M`` entries added to this rank's rows.

    Example:
        >>> ws = iris.ops.matmul_all_gather(ctx, out, a, b)
    """
    workspace = checked_workspace(shmem, config, workspace)
    shmem.ops.matmul_all_gather(
        output_tensor, A, B, bias=bias, async_op=async_op, config=config, workspace=workspace
    )
    return workspace
