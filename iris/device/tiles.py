"""Tiles and tensor views: the objects the in-kernel tile collectives take.

A kernel that computes a 2-D output tile by tile describes each tile once and
hands it to a collective (``ctx.all_reduce_one_shot(tile, src_view, dst_view,
locks)``) instead of passing pointers, strides and masks around:

- :class:`TileView` is where a tile sits: its coordinates ``(pid_m, pid_n)`` in
  the grid of ``block_m x block_n`` tiles.
- :class:`Tile` is a ``TileView`` plus its values (``data``, e.g. a GEMM
  accumulator still in registers).
- :class:`TensorView` is a 2-D tensor in memory (pointer, shape, strides); it
  gives a tile's pointers and bounds mask. Build one inside the kernel with
  :func:`make_tensor_view`.

The names, fields and methods are upstream Iris's (``iris.Tile``,
``iris.TensorView``, ...), so its tile-level kernels run here unchanged.

Example:
    >>> @triton.jit
    >>> def kernel(context, out, M, N, stride_m, stride_n, rank: tl.constexpr,
    ...            world_size: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    >>>     ctx = iris.DeviceContext.initialize(context, rank, world_size)
    >>>     acc = ...  # this rank's partial tile, BM x BN
    >>>     tile = iris.Tile(pid_m, pid_n, BM, BN, acc)
    >>>     ctx.all_reduce_atomic(tile, iris.make_tensor_view(out, M, N, stride_m, stride_n))
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from .aggregate import aggregate

__all__ = [
    "AllReduceConfig", "TensorView", "Tile", "TileView",
    "make_tensor_view", "offset_ptr", "tile_coords", "tile_layout", "tile_ptr",
]  # fmt: skip


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of linear tile ``tile_id``, walking GROUP_M-row bands column by column.

    The order of the tile GEMMs (consecutive tiles share panels of A and B in L2) and of
    upstream Iris's tile collectives, which number tiles the same way.

    Example:
        >>> pid_m, pid_n = tile_coords(t, tl.cdiv(M, 128), tl.cdiv(N, 256), 8)
    """
    width = GROUP_M * num_pid_n
    group = tile_id // width
    first_m = group * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % width) % group_rows
    pid_n = (tile_id % width) // group_rows
    return pid_m, pid_n


@triton.jit
def _tile_indices(pid_m, pid_n, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    rm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    return rm, rn


@triton.jit
def tile_layout(pid_m, pid_n, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Row indices, column indices and bounds mask of tile ``(pid_m, pid_n)`` of an ``M x N`` tensor.

    Example:
        >>> rm, rn, mask = iris.tile_layout(pid_m, pid_n, M, N, BM, BN)
    """
    rm, rn = _tile_indices(pid_m, pid_n, BLOCK_SIZE_M, BLOCK_SIZE_N)
    # A tile's indices start on a multiple of its size and run contiguously: saying
    # so lets Triton vectorise the accesses built from them.
    rm = tl.max_contiguous(tl.multiple_of(rm, BLOCK_SIZE_M), BLOCK_SIZE_M)
    rn = tl.max_contiguous(tl.multiple_of(rn, BLOCK_SIZE_N), BLOCK_SIZE_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    return rm, rn, mask


@triton.jit
def tile_ptr(
    ptr, M, N, stride_m, stride_n, pid_m, pid_n, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr
):
    """Pointers and bounds mask of tile ``(pid_m, pid_n)`` of the tensor at ``ptr``.

    Example:
        >>> ptrs, mask = iris.tile_ptr(out, M, N, stride_m, stride_n, pid_m, pid_n, BM, BN)
    """
    rm, rn, mask = tile_layout(pid_m, pid_n, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N)
    return ptr + rm[:, None] * stride_m + rn[None, :] * stride_n, mask


@triton.jit
def offset_ptr(ptr, stride_m, stride_n, offset_m, offset_n):
    """``ptr`` moved by ``offset_m`` rows and ``offset_n`` columns.

    Example:
        >>> rank_block = iris.offset_ptr(out, stride_m, stride_n, rank * M_local, 0)
    """
    return ptr + offset_m * stride_m + offset_n * stride_n


@aggregate
class TileView:
    """Where a tile sits: coordinates ``(pid_m, pid_n)`` in a grid of ``block_m x block_n`` tiles.

    Example:
        >>> view = iris.TileView(pid_m, pid_n, BM, BN)
        >>> rm, rn, mask = view.layout(M, N)
    """

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr

    @constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)

    @triton.jit
    def layout(self, M, N):
        """Row indices, column indices and bounds mask in an ``M x N`` tensor."""
        return tile_layout(self.pid_m, self.pid_n, M, N, self.block_m, self.block_n)

    @triton.jit
    def indices(self):
        """Row and column indices, without a bounds mask."""
        return _tile_indices(self.pid_m, self.pid_n, self.block_m, self.block_n)


@aggregate
class Tile:
    """A tile's place and its values: a :class:`TileView` plus ``data`` (``block_m x block_n``).

    Example:
        >>> acc = tl.dot(a, b)
        >>> tile = iris.Tile(pid_m, pid_n, BM, BN, acc)
        >>> ctx.all_gather(tile, out_view, dim=0)
    """

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr
    data: tl.tensor

    @constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)
        self.data = data

    @triton.jit
    def layout(self, M, N):
        """Row indices, column indices and bounds mask in an ``M x N`` tensor."""
        return tile_layout(self.pid_m, self.pid_n, M, N, self.block_m, self.block_n)

    @triton.jit
    def indices(self):
        """Row and column indices, without a bounds mask."""
        return _tile_indices(self.pid_m, self.pid_n, self.block_m, self.block_n)


@aggregate
class TensorView:
    """A 2-D tensor in memory: pointer, ``M x N`` shape and strides. Make it with :func:`make_tensor_view`.

    Example:
        >>> view = iris.make_tensor_view(out, M, N, stride_m, stride_n)
        >>> ptrs, mask = view.tile_ptr(tile)
    """

    ptr: tl.tensor
    M: tl.tensor
    N: tl.tensor
    stride_m: tl.tensor
    stride_n: tl.tensor

    @constexpr_function
    def __init__(self, ptr, M, N, stride_m, stride_n):
        self.ptr = ptr
        self.M = M
        self.N = N
        self.stride_m = stride_m
        self.stride_n = stride_n

    @triton.jit
    def tile_ptr(self, tile):
        """Pointers and bounds mask of ``tile`` (a :class:`Tile` or :class:`TileView`) in this tensor."""
        return tile_ptr(
            self.ptr,
            self.M,
            self.N,
            self.stride_m,
            self.stride_n,
            tile.pid_m,
            tile.pid_n,
            tile.block_m,
            tile.block_n,
        )

    @triton.jit
    def tile_ptr_from_indices(self, rm, rn, block_m: tl.constexpr, block_n: tl.constexpr):
        """Pointers and bounds mask of the rows ``rm`` and columns ``rn`` (a tile's worth)."""
        rm = tl.max_contiguous(tl.multiple_of(rm, block_m), block_m)
        rn = tl.max_contiguous(tl.multiple_of(rn, block_n), block_n)
        mask = (rm[:, None] < self.M) & (rn[None, :] < self.N)
        return self.ptr + rm[:, None] * self.stride_m + rn[None, :] * self.stride_n, mask

    @triton.jit
    def offset_tile_ptr(self, tile, offset_m=0, offset_n=0, src_mask=None):
        """Pointers and mask of ``tile`` moved by ``offset_m`` rows and ``offset_n`` columns.

        ``src_mask``, when given, is and-ed into the bounds mask.
        """
        rm, rn = tile.indices()
        ptrs, mask = self.tile_ptr_from_indices(rm + offset_m, rn + offset_n, tile.block_m, tile.block_n)
        if src_mask is not None:
            mask = mask & src_mask
        return ptrs, mask

    @triton.jit
    def offset(self, offset_m=0, offset_n=0):
        """The same tensor seen from ``offset_m`` rows and ``offset_n`` columns further."""
        moved = offset_ptr(self.ptr, self.stride_m, self.stride_n, offset_m, offset_n)
        return TensorView(moved, self.M, self.N, self.stride_m, self.stride_n)

    @triton.jit
    def number_of_tiles(self, block_m, block_n):
        """How many ``block_m x block_n`` tiles cover the tensor."""
        return tl.cdiv(self.M, block_m) * tl.cdiv(self.N, block_n)


@triton.jit
def make_tensor_view(ptr, M, N, stride_m, stride_n):
    """A :class:`TensorView` of the ``M x N`` tensor at ``ptr``; call it inside a kernel.

    Sizes and strides may be literals, constexprs or runtime values: adding a
    zero-valued int32 tensor makes each a tensor, which the view's fields require
    (upstream's ``+ 0`` leaves a literal a constexpr).

    Example:
        >>> view = iris.make_tensor_view(out, M, N, stride_m, stride_n)
    """
    zero = tl.zeros([], tl.int32)
    return TensorView(ptr, M + zero, N + zero, stride_m + zero, stride_n + zero)


@aggregate
class AllReduceConfig:
    """Which tile all-reduce a kernel runs, and its locks (upstream Iris's device-side config).

    ``variant_code``: 0 atomic, 1 ring, 2 one-shot, 3 two-shot, 4 spinlock (upstream's
    numbering). ``locks_ptr`` must always be a pointer, a dummy one for variants that
    take no locks (atomic, ring).

    Example:
        >>> cfg = iris.AllReduceConfig(2, locks)
        >>> if cfg.variant_code == 2:
        >>>     ctx.all_reduce_one_shot(tile, src_view, dst_view, cfg.locks_ptr)
    """

    variant_code: tl.constexpr
    locks_ptr: tl.tensor

    @constexpr_function
    def __init__(self, variant_code, locks_ptr):
        self.variant_code = tl.constexpr(variant_code)
        self.locks_ptr = locks_ptr
