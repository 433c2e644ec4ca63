"""Reduce-scatter by tiles, in upstream Iris's form: every member keeps the full shape.

``out`` and ``inp`` are both ``(M, N)``. The tiles of ``M x N`` (``block_size_m x
block_size_n``) are shared out among the group's members; each member sums its
tiles over every member's ``inp`` and writes them into the same place of its own
``out``. Tiles owned by other members are left as they were, so after the call a
member's ``out`` holds the reduced values of its tiles only. This is what
upstream's ``ctx.ccl.reduce_scatter`` does; :mod:`iris.ccl.reduce_scatter` is the
torch form (``inp`` of ``group_size`` blocks, ``out`` one block), and
:meth:`iris.ccl.CCL.reduce_scatter` picks this one when ``out`` and ``inp`` have
the same shape in a group of several members.

Which tiles a member owns follows upstream's rule, so that a program that reads its
own tiles afterwards finds them where it expects:

* tiles are numbered in upstream's grouped order: ``swizzle_size`` tile rows at a
  time, down each column of the group before moving right, as the tile GEMMs walk
  their output (:func:`iris.device.tiles.tile_coords`);
* ``all_reduce_distribution=1`` (upstream's default for this call) gives member ``i``
  the ``i``-th contiguous run of ``ceil(tiles / group_size)`` tile numbers;
  ``all_reduce_distribution=0`` gives it numbers ``i, i + group_size, ...``.

The kernel is the collectives' usual three steps (:mod:`iris.ccl.device`): a ready
handshake (every member's ``inp`` is written), :func:`~iris.ccl.device.reduce_tile`
over the member's tiles (remote loads from every member, traced like any other
load), and a done handshake (no member reads this ``inp`` any more). ``inp`` must be
on the heap, where peers can read it; ``out`` may live anywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device.tiles import tile_coords
from ..host.prepared import PreparedLaunch, tensor_key
from . import device as ccl
from .config import Config, ReduceOp
from .runtime import REDUCIBLE_DTYPES, check_out_and_inp, describe_tensor

#: Upstream's tiles and distribution when the call gives no config.
UPSTREAM_DEFAULT = Config(block_size_m=32, block_size_n=64, swizzle_size=4, all_reduce_distribution=1)


@triton.jit
def owned_tile(k, my_index, tiles, GROUP: tl.constexpr, CONTIGUOUS: tl.constexpr):
    """The tile number of this member's ``k``-th tile, and how many it owns."""
    if CONTIGUOUS:
        share = tl.cdiv(tiles, GROUP)
        first = my_index * share
        return first + k, tl.minimum(share, tl.maximum(tiles - first, 0))
    return my_index + k * GROUP, tl.cdiv(tl.maximum(tiles - my_index, 0), GROUP)


@triton.jit(do_not_specialize=ccl.RANK_ARGS)
def tile_reduce_scatter_kernel(
    out, inp,
    rows, cols, in_stride, out_stride,
    group, my_index, cur_rank,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SWIZZLE_M: tl.constexpr,
    CONTIGUOUS: tl.constexpr, OP: tl.constexpr,
):  # fmt: skip
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    tiles_m = tl.cdiv(rows, BLOCK_M)
    tiles_n = tl.cdiv(cols, BLOCK_N)
    _, owned = owned_tile(0, my_index, tiles_m * tiles_n, GROUP, CONTIGUOUS)
    for k in range(pid, owned, tl.num_programs(0)):
        tile, _ = owned_tile(k, my_index, tiles_m * tiles_n, GROUP, CONTIGUOUS)
        pid_m, pid_n = tile_coords(tile, tiles_m, tiles_n, SWIZZLE_M)  # upstream's grouped order
        r = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M))[:, None].to(tl.int64)
        c = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N))[None, :]
        mask = (r < rows) & (c < cols)
        src = inp + r * in_stride + c
        total = ccl.reduce_tile(src, cur_rank, ranks, my_index, GROUP, heap_bases, mask, OP)
        tl.store(out + r * out_stride + c, total.to(out.dtype.element_ty), mask=mask)
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


def tile_reduce_scatter(runtime, out, inp, op=None, group=None, config=None) -> PreparedLaunch:
    """Reduce this member's tiles of every member's ``inp`` into ``out`` (module docstring)."""
    op = ReduceOp.parse(op)
    config = config or UPSTREAM_DEFAULT
    state = runtime.group(group)
    key = runtime.key("tile_reduce_scatter", state, config, op, tensor_key(out), tensor_key(inp))

    def prepare(errors: list[str]):
        ctx = runtime.ctx
        if config.protocol not in ("auto", "direct"):
            errors.append(
                "the full-shape (tile) reduce_scatter runs with protocol 'direct' only, "
                f"got {config.protocol!r}"
            )
        if check_out_and_inp(errors, ctx, out, inp, REDUCIBLE_DTYPES, out_on_heap=False, inp_on_heap=True):
            if inp.dim() != 2:
                errors.append(f"inp must be 2-D (M, N) in the full-shape form, got {inp.dim()}-D")
        signature = (describe_tensor(out, ctx, False), describe_tensor(inp, ctx, True), op, config)
        runtime.agree(state, signature, errors, "reduce_scatter")
        rows, cols = inp.shape
        block_m, block_n = config.block_size_m, config.block_size_n
        share = triton.cdiv(triton.cdiv(rows, block_m) * triton.cdiv(cols, block_n), state.size)
        grid = (runtime.programs(share, config),)
        args = (
            out,
            inp,
            rows,
            cols,
            inp.stride(0),
            out.stride(0),
            *runtime.group_args(state),
            block_m,
            block_n,
            config.swizzle_size,
            config.all_reduce_distribution == 1,
            op.value,
        )
        return tile_reduce_scatter_kernel, grid, args, config.num_warps

    return runtime.prepare_and_launch(key, prepare)
