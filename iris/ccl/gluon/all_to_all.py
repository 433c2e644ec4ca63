"""All-to-all in Gluon: :mod:`iris.ccl.all_to_all`'s kernel with its tiles' layout spelled out.

A ``BLOCK_M x BLOCK_N`` tile is laid out row-major: each thread holds ``VEC`` neighbouring
columns (16 bytes where the tile is that wide), ``LANES_N`` threads of a warp span a row and
the warps stack rows, so loads and remote stores go out as whole vectors. The host picks
``VEC`` and ``LANES_N`` (:func:`tile_layout`); the handshakes are the Triton kernel's.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ...device import rma
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
    GROUP: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, VEC: gl.constexpr,
    LANES_N: gl.constexpr, WARPS: gl.constexpr,
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
        # Consecutive units go to different members, as in the Triton kernel.
        target = (my_index + unit % GROUP) % GROUP
        tile = unit // GROUP
        r = (tile // tiles_n) * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        c = (tile % tiles_n) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        r = gl.expand_dims(r, 1)
        c = gl.expand_dims(c, 0)
        mask = (r < rows) & (c < cols)
        row64 = r.to(gl.int64)
        values = gl.load(inp + row64 * in_stride + (target * cols + c), mask=mask)
        peer = gl.load(ranks + target)
        rma.store(
            out + row64 * out_stride + (my_index * cols + c), values, cur_rank, peer, heap_bases, mask=mask
        )
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
