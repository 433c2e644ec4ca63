"""Broadcast: every member copies ``src``'s tensor into its own, in place.

Receivers pull (remote loads) so the copy is spread over all of them rather than
issued by ``src`` alone; the tensor must be on the heap.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import rma
from . import device as ccl
from .device import RANK_ARGS
from .runtime import COPYABLE_DTYPES, check_tensor, describe_tensor, tensor_key


@triton.jit(do_not_specialize=RANK_ARGS)
def broadcast_kernel(
    tensor,
    n,
    src,
    flags,
    ranks,
    my_index,
    cur_rank,
    world_size,
    max_programs,
    heap_bases,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    ccl.sync_row(
        ccl.flag_row(flags, ccl.READY, pid, max_programs, world_size), cur_rank, ranks, GROUP, heap_bases
    )
    if cur_rank != src:
        for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
            offsets = tile * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            tl.store(
                tensor + offsets, rma.load(tensor + offsets, cur_rank, src, heap_bases, mask=mask), mask=mask
            )
    ccl.sync_row(
        ccl.flag_row(flags, ccl.DONE, pid, max_programs, world_size), cur_rank, ranks, GROUP, heap_bases
    )


def broadcast(runtime, tensor, src: int = 0, group=None, config=None) -> None:
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every member; see :meth:`iris.ccl.CCL.broadcast`."""
    state = runtime.group(group)
    key = runtime.key("broadcast", state, config, src, tensor_key(tensor))

    def prepare():
        ctx = runtime.ctx
        errors: list[str] = []
        check_tensor(errors, ctx, tensor, "tensor", COPYABLE_DTYPES, on_heap=True)
        if src not in state.members:
            errors.append(f"src={src} is not a member of the group {list(state.members)}")
        signature = (describe_tensor(tensor, ctx), src, config)
        runtime.agree(state, signature, errors, "broadcast")
        block = config.block_for(tensor.element_size())
        grid = (runtime.programs(triton.cdiv(tensor.numel(), block), config),)
        args = (tensor, tensor.numel(), src, *runtime.group_args(state), block)
        return broadcast_kernel, grid, args, config.num_warps

    runtime.prepare(key, prepare)
    runtime.launch(key)
