"""Upstream Iris's ``FusedWorkspace``: what an ``iris.ops`` call returns and may be handed back.

Upstream keeps each fused op's scratch buffers (locks, an auxiliary output) in a
workspace the caller passes from call to call. Here ``ctx.ops`` keeps its own
buffers on the heap and reuses them by itself, so a workspace only describes the
call it came from: programs that pass one around run unchanged, and a workspace
whose buffers were filled by upstream code is left as it is. It also records how
many tiles upstream's lock array would hold (``lock_tiles``), so that reusing it
for smaller tiles is refused as upstream refuses it
(:class:`~iris.errors.WorkspaceTooSmallError`).

Example:
    >>> ws = iris.ops.matmul_all_reduce_preamble(ctx, out, a, b)
    >>> ws = iris.ops.matmul_all_reduce(ctx, out, a, b, workspace=ws)
    >>> ws.operation, ws.shape
    ('matmul_all_reduce', (1024, 4096, 512))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import WorkspaceTooSmallError
from .config import FusedConfig, tile_count

#: ``matmul_all_reduce`` variants for which upstream's preamble allocates a lock per tile.
LOCKED_ALL_REDUCE_VARIANTS = ("spinlock", "one_shot", "two_shot")


def upstream_lock_tiles(A: torch.Tensor, B: torch.Tensor, config=None, all_reduce_variant=None) -> int:
    """The locks upstream's preamble allocates for ``A @ B``: one per output tile.

    Tiles are ``config``'s ``block_m x block_n`` (``FusedConfig()``'s when ``config`` is
    None). Pass ``matmul_all_reduce``'s variant as ``all_reduce_variant``: upstream keeps
    no locks (0) for those outside :data:`LOCKED_ALL_REDUCE_VARIANTS`.

    Example:
        >>> upstream_lock_tiles(ctx.zeros(512, 64), ctx.zeros(64, 512), FusedConfig(block_m=128, block_n=128))
        16
    """
    if all_reduce_variant is not None and all_reduce_variant not in LOCKED_ALL_REDUCE_VARIANTS:
        return 0
    config = config or FusedConfig()
    return tile_count(A.shape[0], B.shape[1], config.block_m, config.block_n)


@dataclass
class FusedWorkspace:
    """The operation, problem size and dtype of the last call that used this workspace.

    Args:
        operation: the op's name, e.g. ``"matmul_all_reduce"``.
        shape: ``(M, N, K)`` of the GEMM.
        dtype: the inputs' dtype.
        world_size: ranks of the call.
        variant: upstream's reduction variant name, when the config set one.
        aux_buffer, locks: upstream's scratch buffers; unused here, kept if set.
        prepared: whether a call or preamble has described this workspace.
        lock_tiles: tiles upstream's lock array would hold for the last preparation
            (0: none).
        trace_data: per-program timings of the last traced call, where the op keeps them
            (:func:`iris.ops.all_gather_matmul_hbm_buffer` with ``trace=True``).

    Example:
        >>> ws = FusedWorkspace()
        >>> ctx.ops.matmul_all_reduce(out, a, b, workspace=ws)
        >>> ws.prepared
        True
    """

    operation: str = ""
    shape: tuple = ()
    dtype: torch.dtype | None = None
    world_size: int = 1
    variant: str = ""
    aux_buffer: torch.Tensor | None = None
    locks: torch.Tensor | None = None
    prepared: bool = False
    lock_tiles: int = 0
    trace_data: dict | None = None

    def matches(
        self, operation: str, shape: tuple, dtype: torch.dtype, world_size: int, variant: str = ""
    ) -> bool:
        """Whether this workspace was prepared for exactly this call.

        Example:
            >>> ws.matches("matmul_all_reduce", (M, N, K), torch.bfloat16, 2)
            True
        """
        return self.prepared and (
            self.operation,
            tuple(self.shape),
            self.dtype,
            self.world_size,
            self.variant,
        ) == (
            operation,
            tuple(shape),
            dtype,
            world_size,
            variant,
        )

    def describe(
        self, operation: str, A: torch.Tensor, B: torch.Tensor, world_size: int, variant: str = ""
    ) -> None:
        """Record a call of ``operation`` on ``A @ B`` and mark the workspace prepared.

        Example:
            >>> ws.describe("matmul_all_gather", a, b, ctx.get_num_ranks())
        """
        self.operation = operation
        self.shape = (A.shape[0], B.shape[1], B.shape[0])
        self.dtype = A.dtype
        self.world_size = world_size
        self.variant = variant
        self.prepared = True

    def prepare(
        self,
        operation: str,
        A: torch.Tensor,
        B: torch.Tensor,
        world_size: int,
        variant: str = "",
        lock_tiles: int | None = None,
        check: bool = False,
    ) -> None:
        """Describe a call as upstream's preamble would, recording ``lock_tiles`` if given.

        ``check``: first refuse, as upstream's ``matmul_reduce_scatter`` preamble does,
        when the workspace was prepared for fewer tiles than ``lock_tiles``.

        Raises:
            WorkspaceTooSmallError: ``check`` and too few tiles.

        Example:
            >>> ws.prepare("matmul_reduce_scatter", a, b, 2, "two_shot", lock_tiles=64, check=True)
        """
        if check and lock_tiles is not None:
            self.check_locks(lock_tiles)
        self.describe(operation, A, B, world_size, variant)
        if lock_tiles is not None:
            self.lock_tiles = lock_tiles

    def reuse(
        self, operation: str, A: torch.Tensor, B: torch.Tensor, world_size: int, variant: str, lock_tiles: int
    ) -> None:
        """Take the workspace for a call as upstream's ``matmul_all_reduce`` does.

        A workspace prepared for exactly this call is reused, and refused if it holds
        fewer tiles than ``lock_tiles``; any other is prepared again.

        Raises:
            WorkspaceTooSmallError: reused with too few tiles.

        Example:
            >>> ws.reuse("matmul_all_reduce", a, b, 2, "two_shot", lock_tiles=64)
        """
        shape = (A.shape[0], B.shape[1], B.shape[0])
        if self.matches(operation, shape, A.dtype, world_size, variant):
            self.check_locks(lock_tiles)
        else:
            self.prepare(operation, A, B, world_size, variant, lock_tiles)

    def check_locks(self, tiles: int) -> None:
        """Refuse a call of ``tiles`` tiles when upstream's lock array would hold fewer.

        Raises:
            WorkspaceTooSmallError: prepared for fewer (but some) tiles.

        Example:
            >>> ws.check_locks(64)
        """
        if 0 < self.lock_tiles < tiles:
            raise WorkspaceTooSmallError("Lock", self.lock_tiles, tiles)

    def reset(self) -> None:
        """Mark the workspace unprepared.

        Example:
            >>> ws.reset(); ws.prepared
            False
        """
        self.prepared = False

    def clear(self) -> None:
        """Drop the scratch buffers and mark the workspace unprepared.

        Example:
            >>> ws.clear(); ws.locks is None
            True
        """
        self.aux_buffer = None
        self.locks = None
        self.lock_tiles = 0
        self.prepared = False
