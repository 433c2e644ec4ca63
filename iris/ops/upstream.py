"""Upstream Iris's module-level fused ops: ``iris.ops.matmul_all_reduce(ctx, out, A, B, ...)``.

Upstream Iris offers each fused op twice: as a method of ``ctx.ops`` and as a
function of :mod:`iris.ops` that takes the context first, with a ``*_preamble``
that prepares a :class:`~iris.ops.workspace.FusedWorkspace`. These functions keep
upstream's names, argument order, defaults and return value (the workspace) and
run :class:`iris.ops.Ops`, which already accepts upstream's shapes: ``A`` sharded
by columns for ``all_gather_matmul``, an ``M x N`` output scattered by tiles for
``matmul_reduce_scatter``.

Example:
    >>> import iris.ops as ops
    >>> cfg = ops.FusedConfig(block_size_m=64, block_size_n=64, block_size_k=32)
    >>> ws = ops.matmul_all_reduce(ctx, out, a, b, config=cfg)
"""

from __future__ import annotations

from .config import FusedConfig, upstream_setting
from .workspace import FusedWorkspace, upstream_lock_tiles


def _checked(shmem, config, workspace) -> FusedWorkspace:
    # Upstream validates the config against the world size; the op fills the workspace in.
    if config is not None:
        config.validate(world_size=shmem.get_num_ranks())
    return workspace if workspace is not None else FusedWorkspace()


def _prepared(shmem, operation, A, B, config, workspace, variant="", lock_tiles=None, check=False):
    # A preamble: nothing runs, so it describes the call itself (and the tiles
    # upstream's locks would hold).
    workspace = _checked(shmem, config, workspace)
    workspace.prepare(operation, A, B, shmem.get_num_ranks(), variant, lock_tiles, check)
    return workspace


def _shard_width_matches(shmem, A_sharded, B):
    world = shmem.get_num_ranks()
    if A_sharded.dim() != 2 or B.dim() != 2 or A_sharded.shape[1] * world != B.shape[0]:
        raise ValueError(
            f"iris.ops.all_gather_matmul: B has {B.shape[0] if B.dim() else 0} rows but A_sharded is "
            f"{tuple(A_sharded.shape)} on {world} ranks; K must be world_size * K_local"
        )


def matmul_all_reduce_preamble(
    shmem, C, A, B, config: FusedConfig | None = None, workspace=None
) -> FusedWorkspace:
    """A workspace for :func:`matmul_all_reduce`; zeroes ``C`` and waits for every rank, as upstream.

    Example:
        >>> ws = iris.ops.matmul_all_reduce_preamble(ctx, out, a, b)
    """
    variant = upstream_setting(config, "all_reduce_variant")
    lock_tiles = upstream_lock_tiles(A, B, config, variant)
    workspace = _prepared(shmem, "matmul_all_reduce", A, B, config, workspace, variant, lock_tiles)
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
    workspace = _checked(shmem, config, workspace)
    shmem.ops.matmul_all_reduce(C, A, B, async_op=async_op, config=config, workspace=workspace)
    return workspace


def all_gather_matmul_preamble(shmem, A_sharded, B, config: FusedConfig | None = None) -> FusedWorkspace:
    """A workspace for :func:`all_gather_matmul` (nothing to allocate: peers' shards are read in place).

    Example:
        >>> ws = iris.ops.all_gather_matmul_preamble(ctx, a_shard, b)
    """
    _shard_width_matches(shmem, A_sharded, B)
    return _prepared(shmem, "all_gather_matmul", A_sharded, B, config, None)


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
    workspace = _checked(shmem, config, workspace)
    shmem.ops.all_gather_matmul(
        output_tensor, A_sharded, B, bias=bias, async_op=async_op, config=config, workspace=workspace
    )
    return workspace


def matmul_all_gather_preamble(shmem, A, B, config: FusedConfig | None = None) -> FusedWorkspace:
    """A workspace for :func:`matmul_all_gather`.

    Example:
        >>> ws = iris.ops.matmul_all_gather_preamble(ctx, a, b)
    """
    return _prepared(shmem, "matmul_all_gather", A, B, config, None)


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
    workspace = _checked(shmem, config, workspace)
    shmem.ops.matmul_all_gather(
        output_tensor, A, B, bias=bias, async_op=async_op, config=config, workspace=workspace
    )
    return workspace


def matmul_reduce_scatter_preamble(
    shmem, C, A, B, config: FusedConfig | None = None, workspace=None
) -> FusedWorkspace:
    """A workspace for :func:`matmul_reduce_scatter`; zeroes ``C`` and waits for every rank (upstream's).

    Example:
        >>> ws = iris.ops.matmul_reduce_scatter_preamble(ctx, out, a, b)
    """
    lock_tiles = upstream_lock_tiles(A, B, config)
    workspace = _prepared(
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
    workspace = _checked(shmem, config, workspace)
    shmem.ops.matmul_reduce_scatter(C, A, B, async_op=async_op, config=config, workspace=workspace)
    return workspace
