"""``ctx.ops.matmul_reduce_scatter``: the sum over ranks of ``A @ B``, scattered by rows or by tiles.

By rows (``A (world*M, K)``, ``out (M, N)``: ``reduce_scatter_tensor``'s blocks): the
plan of :mod:`iris.ops.matmul_all_reduce` in which each rank reduces and keeps its own
row block; ``copy_engine`` lets cuBLAS keep every SM while the copy engines move the
partial blocks (:mod:`iris.ops.copy_plans`). By tiles (upstream Iris's form, ``out (M,
N)`` on every rank): each rank reduces the tiles it owns under upstream's locks
(:mod:`iris.ops.tile_reduce_scatter`) and leaves the others zero.
"""

from __future__ import annotations

import torch
import triton

from ..host.prepared import PreparedLaunch
from ._plans import (
    check_out,
    checked_workspace,
    fill_workspace,
    gemm_dims,
    prepared_workspace,
    refuse_bias,
    scatters_tiles,
)
from .config import FusedConfig, gemm_launch_options
from .matmul_all_reduce import plan_gemm_reduce
from .tile_reduce_scatter import tile_reduce_scatter_kernel
from .workspace import FusedWorkspace, upstream_lock_tiles


def run(ops, out, A, B, bias, async_op, config, workspace):
    """``ctx.ops.matmul_reduce_scatter`` (:meth:`iris.ops.Ops.matmul_reduce_scatter`)."""
    refuse_bias("matmul_reduce_scatter", bias)
    lock_tiles = upstream_lock_tiles(A, B, config)
    fill_workspace(workspace, "matmul_reduce_scatter", A, B, ops._ctx, "two_shot", lock_tiles)
    if scatters_tiles(out, A, B, ops._ctx.get_num_ranks()):
        key = ("matmul_reduce_scatter_tiles", *ops._call_key(out, A, B, async_op, config))
        ops._run(key, lambda: _plan_tiles(ops, out, A, B, async_op, config))
    else:
        key = ("matmul_reduce_scatter", *ops._call_key(out, A, B, async_op, config))
        ops._run(
            key,
            lambda: plan_gemm_reduce(ops, "matmul_reduce_scatter", out, A, B, True, async_op, config),
        )
    return out


def _plan_tiles(ops, out, A, B, async_op, config):
    # Upstream Iris's matmul_reduce_scatter: every rank's out is M x N, reduced in the tiles it owns.
    ctx = ops._ctx
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, K, N = gemm_dims("matmul_reduce_scatter", A, B)
    check_out("matmul_reduce_scatter", out, (M, N), A, ctx, symmetric=False)
    # Which tiles a rank owns follows from the tile size, so it must not vary with the shape.
    cfg = config if config is not None else FusedConfig()
    if cfg.variant not in ("auto", "fused"):
        raise ValueError(
            "iris.ops.matmul_reduce_scatter: scattering by tiles runs fused only, got variant "
            f"{cfg.variant!r}"
        )
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    partial = ops._buffer("tile_partial", (M, N), out.dtype)
    locks = ops._buffer("tile_locks", (tiles, 1), torch.int32).view(-1)
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


# ------------------------------------------------------------------ upstream Iris's module functions
def matmul_reduce_scatter_preamble(
    shmem, C, A, B, config: FusedConfig | None = None, workspace=None
) -> FusedWorkspace:
    """A workspace for :func:`matmul_reduce_scatter`; zeroes ``C`` and waits for every rank (upstream's).

    Example:
        >>> ws = iris.ops.matmul_reduce_scatter_preamble(ctx, out, a, b)
    """
    lock_tiles = upstream_lock_tiles(A, B, config)
    workspace = prepared_workspace(
        shmem, "matmul_reduce_scatter", A, B, config, workspace, "two_shot", lock_tiles, check=True
    )
    C.zero_()
    shmem.barrier()
    return workspace


def matmul_reduce_scatter(
    shmem, C, A, B, async_op: bool = False, config: FusedConfig | None = None, workspace=None
) -> FusedWorkspace:
    """The sum over ranks of ``A @ B``, each rank keeping its tiles of ``C (M, N)``; returns the workspace.

    Tile ownership as :meth:`iris.ops.Ops.matmul_reduce_scatter` with an ``M x N`` output.

    Example:
        >>> ws = iris.ops.matmul_reduce_scatter(ctx, out, a, b, config=FusedConfig(block_size_m=64))
    """
    workspace = checked_workspace(shmem, config, workspace)
    shmem.ops.matmul_reduce_scatter(C, A, B, async_op=async_op, config=config, workspace=workspace)
    return workspace
