"""``ctx.ops.all_gather_matmul``: ``all_gather(A) @ B``, gathering ``A``'s rows or its columns.

Rows (``A (M, K)`` a row shard, ``out (world*M, N)``): fused, some programs push this
rank's shard into every peer's gather buffer while the others multiply, own rows first,
then each peer's rows as their flags rise; ``unfused`` gathers with ``ctx.ccl.all_gather``
and multiplies with cuBLAS; ``copy_engine`` moves the shards with the copy engines while
cuBLAS multiplies the rows already there (:mod:`iris.ops.copy_plans`). Columns (upstream
Iris's form, ``A (M, K / world)`` on the heap, ``out (M, N)``): fused only, each output
tile reads every peer's slice of ``A`` from its heap (:mod:`iris.ops.pull_gather`).
``auto`` asks :mod:`iris.ops.selection`.
"""

from __future__ import annotations

import torch
import triton

from ..host.prepared import PreparedLaunch
from ._plans import (
    check_bias,
    check_out,
    checked_workspace,
    fill_workspace,
    gathers_columns,
    gemm_dims,
    prepared_workspace,
    row_bias_steps,
)
from .config import COPY_ENGINE, FusedConfig, gemm_launch_options
from .copy_plans import all_gather_matmul_plan, matmul_into
from .gather import all_gather_matmul_kernel
from .pull_gather import pull_gather_matmul_kernel
from .workspace import FusedWorkspace


def run(ops, out, A, B, bias, async_op, config, workspace):
    """``ctx.ops.all_gather_matmul`` (:meth:`iris.ops.Ops.all_gather_matmul`)."""
    world = ops._ctx.get_num_ranks()
    if gathers_columns(A, B, world):
        key = ("all_gather_matmul_columns", *ops._call_key(out, A, B, async_op, config, bias))
        ops._run(key, lambda: _plan_columns(ops, out, A, B, bias, async_op, config))
    else:
        key = ("all_gather_matmul", *ops._call_key(out, A, B, async_op, config, bias))
        ops._run(
            key,
            lambda: (
                _plan_rows(ops, out, A, B, async_op, config) + row_bias_steps("all_gather_matmul", out, bias)
            ),
        )
    fill_workspace(workspace, "all_gather_matmul", A, B, ops._ctx)
    return out


def _plan_rows(ops, out, A, B, async_op, config):
    ctx = ops._ctx
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, K, N = gemm_dims("all_gather_matmul", A, B)
    check_out("all_gather_matmul", out, (world * M, N), A, ctx, symmetric=False)
    cfg, variant = ops._config_and_variant(config, world * M, N, K, "all_gather_matmul")
    if variant not in ("fused", "unfused", COPY_ENGINE):
        raise ValueError(
            "iris.ops.all_gather_matmul: variant must be auto, fused, unfused or copy_engine, "
            f"got {variant!r}"
        )
    if variant == COPY_ENGINE:
        return all_gather_matmul_plan(ops, out, A, B)
    if variant == "unfused" or world == 1:
        # Its own buffer: ctx.ccl's handshake guards it, not the fused path's flags.
        gathered = ops._buffer("gathered_unfused", (world * M, K), A.dtype)
        steps = [lambda: ctx.ccl.all_gather(gathered, A), lambda: matmul_into(gathered, B, out)]
        if not A.is_contiguous():
            shard = torch.empty_like(A, memory_format=torch.contiguous_format)
            steps = [lambda: shard.copy_(A), lambda: ctx.ccl.all_gather(gathered, shard), steps[1]]
        return steps
    gathered = ops._buffer("gathered", (world * M, K), A.dtype)
    a_shard = A if A.stride() == gathered.stride() else A.contiguous()
    chunks = triton.cdiv(M, cfg.block_m)
    num_sms = ctx.get_cu_count()
    comm = min(cfg.comm_sms, num_sms - 1)
    # Enough K slices per row block for every pusher to have one (at most one per COMM_K step).
    parts = max(1, min(triton.cdiv(comm, chunks * (world - 1)), triton.cdiv(K, cfg.block_k)))
    flags, epoch = ops._flags("chunk", world * chunks * parts), ops._epoch_counter()
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


def _plan_columns(ops, out, A, B, bias, async_op, config):
    # Upstream Iris's all_gather_matmul: A sharded by columns, read from the peers' heaps.
    ctx = ops._ctx
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, K_local, N = gemm_dims("all_gather_matmul", A, B, shards=world)
    check_out("all_gather_matmul", out, (M, N), A, ctx, symmetric=False)
    if not ctx.is_symmetric(A):
        raise ValueError(
            "iris.ops.all_gather_matmul: A is a column shard that the other ranks read, so it "
            "must be on the symmetric heap"
        )
    cfg = config if config is not None else ops.default_config(M, N, world * K_local, "all_gather_matmul")
    if cfg.variant not in ("auto", "fused"):
        raise ValueError(
            f"iris.ops.all_gather_matmul: gathering A by columns runs fused only, got variant {cfg.variant!r}"
        )
    has_bias = bias is not None
    if has_bias:
        check_bias("all_gather_matmul", bias, M, A)
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


def _shard_width_matches(shmem, A_sharded, B):
    world = shmem.get_num_ranks()
    if A_sharded.dim() != 2 or B.dim() != 2 or A_sharded.shape[1] * world != B.shape[0]:
        raise ValueError(
            f"iris.ops.all_gather_matmul: B has {B.shape[0] if B.dim() else 0} rows but A_sharded is "
            f"{tuple(A_sharded.shape)} on {world} ranks; K must be world_size * K_local"
        )


# ------------------------------------------------------------------ upstream Iris's module functions
def all_gather_matmul_preamble(shmem, A_sharded, B, config: FusedConfig | None = None) -> FusedWorkspace:
    """A workspace for :func:`all_gather_matmul` (nothing to allocate: peers' shards are read in place).

    Example:
        >>> ws = iris.ops.all_gather_matmul_preamble(ctx, a_shard, b)
    """
    _shard_width_matches(shmem, A_sharded, B)
    return prepared_workspace(shmem, "all_gather_matmul", A_sharded, B, config, None)


def all_gather_matmul(
    shmem, output_tensor, A_sharded, B, bias=None, async_op: bool = False, config=None, workspace=None
) -> FusedWorkspace:
    """``output = concat_K(every rank's A_sharded) @ B (+ bias)``; returns the workspace.

    Args:
        shmem: the :class:`iris.Iris` context.
        output_tensor: ``(M, N)``.
        A_sharded: ``(M, K / world_size)``, this rank's columns of ``A``, on the heap.
        B: ``(K, N)``, the same on every rank.
        bias: optional, ``M`` entries added to the rows.

    Example:
        >>> a_shard = ctx.randn(M, K // world, dtype=torch.float16)
        >>> ws = iris.ops.all_gather_matmul(ctx, out, a_shard, b)
    """
    _shard_width_matches(shmem, A_sharded, B)
    workspace = checked_workspace(shmem, config, workspace)
    shmem.ops.all_gather_matmul(
        output_tensor, A_sharded, B, bias=bias, async_op=async_op, config=config, workspace=workspace
    )
    return workspace
