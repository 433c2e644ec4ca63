"""``ctx.ops.matmul_all_reduce``: the sum over ranks of ``A @ B`` in every rank's ``out``.

The row-parallel linear layer. Fused (:mod:`iris.ops.reduce`): as the GEMM finishes a
partial tile, the rank that owns that tile (two-shot) sums every rank's partial in fp32
and stores the result into every rank's ``out``. ``unfused`` is cuBLAS then
``ctx.ccl.all_reduce`` and ends like it (no barrier). The same plan, with each owner
keeping its row block, is ``matmul_reduce_scatter`` by rows (:func:`plan_gemm_reduce`).
"""

from __future__ import annotations

import triton

from ..host.prepared import PreparedLaunch
from ._plans import check_out, checked_workspace, fill_workspace, gemm_dims, prepared_workspace, refuse_bias
from .config import COPY_ENGINE, FusedConfig, gemm_launch_options, upstream_setting
from .copy_plans import matmul_into, matmul_reduce_scatter_plan
from .reduce import gemm_reduce_kernel
from .workspace import FusedWorkspace, upstream_lock_tiles


def run(ops, out, A, B, bias, async_op, config, workspace):
    """``ctx.ops.matmul_all_reduce`` (:meth:`iris.ops.Ops.matmul_all_reduce`)."""
    refuse_bias("matmul_all_reduce", bias)
    variant = upstream_setting(config, "all_reduce_variant")
    lock_tiles = upstream_lock_tiles(A, B, config, variant)
    fill_workspace(workspace, "matmul_all_reduce", A, B, ops._ctx, variant, lock_tiles, reuse=True)
    key = ("matmul_all_reduce", *ops._call_key(out, A, B, async_op, config))
    ops._run(key, lambda: plan_gemm_reduce(ops, "matmul_all_reduce", out, A, B, False, async_op, config))
    return out


def plan_gemm_reduce(ops, name, out, A, B, scatter, async_op, config):
    """The plan of ``matmul_all_reduce`` (``scatter=False``) and of ``matmul_reduce_scatter`` by rows."""
    ctx = ops._ctx
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    total_rows, K, N = gemm_dims(name, A, B)
    if scatter and total_rows % world:
        raise ValueError(f"iris.ops.{name}: A has {total_rows} rows, not a multiple of {world} ranks")
    M = total_rows // world if scatter else total_rows
    check_out(name, out, (M, N), A, ctx, symmetric=not scatter)
    cfg, variant = ops._config_and_variant(config, total_rows, N, K, name)
    allowed = ("fused", "unfused", COPY_ENGINE) if scatter else ("fused", "unfused")
    if variant not in allowed:
        raise ValueError(f"iris.ops.{name}: variant must be auto or one of {allowed}, got {variant!r}")
    partial = ops._buffer("partial", (total_rows, N), out.dtype)
    if world == 1:
        return [lambda: matmul_into(A, B, out)]
    if variant == COPY_ENGINE:
        return matmul_reduce_scatter_plan(ops, out, A, B, partial)
    if variant == "unfused":
        # ctx.ccl's collectives finish like NCCL's: this rank's out is complete and
        # nobody reads this rank's partial any more, so no barrier has to follow.
        collective = ctx.ccl.reduce_scatter if scatter else ctx.ccl.all_reduce
        return [lambda: matmul_into(A, B, partial), lambda: collective(out, partial)]
    tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
    counters = ops._flags("reduce", tiles)
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


# ------------------------------------------------------------------ upstream Iris's module functions
def matmul_all_reduce_preamble(
    shmem, C, A, B, config: FusedConfig | None = None, workspace=None
) -> FusedWorkspace:
    """A workspace for :func:`matmul_all_reduce`; zeroes ``C`` and waits for every rank, as upstream.

    Example:
        >>> ws = iris.ops.matmul_all_reduce_preamble(ctx, out, a, b)
    """
    variant = upstream_setting(config, "all_reduce_variant")
    lock_tiles = upstream_lock_tiles(A, B, config, variant)
    workspace = prepared_workspace(shmem, "matmul_all_reduce", A, B, config, workspace, variant, lock_tiles)
    C.zero_()
    shmem.barrier()
    return workspace


def matmul_all_reduce(
    shmem, C, A, B, async_op: bool = False, config: FusedConfig | None = None, workspace=None
) -> FusedWorkspace:
    """``C = sum over ranks of A @ B`` (:meth:`iris.ops.Ops.matmul_all_reduce`); returns the workspace.

    Example:
        >>> ws = iris.ops.matmul_all_reduce(ctx, out, a, b)
    """
    workspace = checked_workspace(shmem, config, workspace)
    shmem.ops.matmul_all_reduce(C, A, B, async_op=async_op, config=config, workspace=workspace)
    return workspace
