"""All-to-all in Gluon: :mod:`iris.ccl.all_to_all`'s kernel with its tiles' layout spelled out.

A ``BLOCK_M x BLOCK_N`` tile is laid out row-major: each thread holds ``VEC`` neighbouring
columns (16 bytes where the tile is that wide), ``LANES_N`` threads of a warp span a row and
the warps stack rows, so loads and remote stores go out as whole vectors. The host picks
``VEC`` and ``LANES_N`` (:func:`tile_layout`); the work units, the addressing and the
handshakes are the Triton kernel's (:mod:`iris.ccl.device`).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .. import device as ccl
from ..device import RANK_ARGS


def tile_layout(block_n: int, element_size: int) -> tuple[int, int]:
    """``(VEC, LANES_N)`` for tiles ``block_n`` elements wide: 16 bytes a thread, at most a warp a row.

    Example:
        >>> tile_layout(64, 4)
        (4, 16)
    """
    vec = max(1, min(16 // element_size, block_n))
    return vec, max(1, min(32, block_n // vec))


@gluon.jit(do_not_specialize=RANK_ARGS)
def all_to_all_kernel(
    out, inp,
    rows, cols, in_stride, out_stride,
    group, my_index, cur_rank,
    GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
    VEC: gl.constexpr, LANES_N: gl.constexpr, WARPS: gl.constexpr,
):  # fmt: skip
    """Send block ``j`` of this member's ``inp`` to member ``j``'s ``out``, into slot ``my_index``.

    Example:
        >>> all_to_all_kernel[(programs,)](out, inp, rows, cols, inp.stride(0), out.stride(0),
        ...     *runtime.group_args(state), 64, 64, *tile_layout(64, 4), 8, num_warps=8)
    """
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = gl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    layout: gl.constexpr = gl.BlockedLayout([1, VEC], [32 // LANES_N, LANES_N], [WARPS, 1], [1, 0])
    tiles_n = gl.cdiv(cols, BLOCK_N)
    units = gl.cdiv(rows, BLOCK_M) * tiles_n * GROUP
    for unit in range(pid, units, gl.num_programs(0)):
        target, row0, col0 = ccl.exchange_unit(unit, my_index, tiles_n, GROUP, BLOCK_M, BLOCK_N)
        r = row0 + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        c = col0 + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        r, c = gl.expand_dims(r, 1), gl.expand_dims(c, 0)
        ccl.exchange_tile(
            out, inp, r, c, rows, cols, in_stride, out_stride, target, my_index, cur_rank, ranks, heap_bases
        )
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
