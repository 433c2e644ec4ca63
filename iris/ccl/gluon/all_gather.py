"""All-gather in Gluon: :mod:`iris.ccl.all_gather`'s kernel with its tile's layout spelled out.

A tile of ``BLOCK`` elements is spread over the program's threads as ``BLOCK // (32 x
WARPS)`` neighbouring elements each, so every thread loads and pushes whole vectors;
the handshakes around the pushes are the Triton kernel's (:func:`iris.ccl.device.handshake`).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from .. import device as ccl
from ..device import RANK_ARGS


@gluon.jit(do_not_specialize=RANK_ARGS)
def all_gather_kernel(
    out, inp, n, group, my_index, cur_rank, GROUP: gl.constexpr, BLOCK: gl.constexpr, WARPS: gl.constexpr
):
    """Push this member's ``inp`` (``n`` elements) into its slot of every member's ``out``.

    Example:
        >>> all_gather_kernel[(programs,)](out, inp, n, *runtime.group_args(state), 4096, 8, num_warps=8)
    """
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = gl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    layout: gl.constexpr = gl.BlockedLayout([max(BLOCK // (32 * WARPS), 1)], [32], [WARPS], [0])
    dst = out + my_index.to(gl.int64) * n
    for tile in range(pid, gl.cdiv(n, BLOCK), gl.num_programs(0)):
        offsets = tile * BLOCK + gl.arange(0, BLOCK, layout=layout)
        mask = offsets < n
        values = gl.load(inp + offsets, mask=mask)
        ccl.push_tile(dst + offsets, values, cur_rank, ranks, my_index, GROUP, heap_bases, mask)
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
