"""Upstream Iris's ``FusedWorkspace``: what an ``iris.ops`` call returns and may be handed back.

Upstream keeps each fused op's scratch buffers (locks, an auxiliary output) in a
workspace the caller passes from call to call. Here ``ctx.ops`` keeps its own
buffers on the heap and reuses them by itself, so a workspace only describes the
call it came from: programs that pass one around run unchanged, and a workspace
whose buffers were filled by upstream code is left as it is.

Example:
    >>> ws = iris.ops.matmul_all_reduce_preamble(ctx, out, a, b)
    >>> ws = iris.ops.matmul_all_reduce(ctx, out, a, b, workspace=ws)
    >>> ws.operation, ws.shape
    ('matmul_all_reduce', (1024, 4096, 512))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
        self.prepared = False
