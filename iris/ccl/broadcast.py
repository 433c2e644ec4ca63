"""Broadcast: every member copies ``src``'s tensor into its own, in place.

The tensor is cut into tiles and each tile gets an *owner* among the other
members (tile ``t`` goes to the ``t mod (group_size - 1)``-th of them): the owner
reads the tile from ``src`` once and stores it into its own tensor and every
other receiver's. ``src`` thus sends each byte once, and the fan-out is spread
over every receiver's links instead of all of it leaving ``src``. The tensor must
be on the heap, except up to the staging capacity, where the call is staged
(:mod:`iris.ccl.staged`: one synchronisation, receivers read ``src``'s copy).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..device import rma
from ..host.prepared import PreparedLaunch, tensor_key
from . import device as ccl
from .device import RANK_ARGS
from .runtime import COPYABLE_DTYPES, check_tensor, describe_tensor, nbytes
from .staged import staged_launch


@triton.jit(do_not_specialize=RANK_ARGS)
def broadcast_kernel(
    tensor, n, src, src_index, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr
):
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    if cur_rank != src:
        receivers = GROUP - 1
        # This member's place among the receivers (members in order, src left out).
        me = my_index - (my_index > src_index).to(tl.int32)
        owned = (tl.cdiv(n, BLOCK) - me + receivers - 1) // receivers
        for k in range(pid, owned, tl.num_programs(0)):
            offsets = (k * receivers + me) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            values = rma.load(tensor + offsets, cur_rank, src, heap_bases, mask=mask)
            # Own copy first, then the other receivers, starting after this member.
            for i in tl.static_range(GROUP):
                member = (my_index + i) % GROUP
                if member != src_index:
                    peer = tl.load(ranks + member)
                    rma.store(tensor + offsets, values, cur_rank, peer, heap_bases, mask=mask)
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


def broadcast(runtime, tensor, src: int = 0, group=None, config=None) -> PreparedLaunch:
    """Copy rank ``src``'s ``tensor`` into ``tensor`` on every member; see :meth:`iris.ccl.CCL.broadcast`."""
    state = runtime.group(group)
    key = runtime.key("broadcast", state, config, src, tensor_key(tensor))

    def prepare(errors: list[str]):
        ctx = runtime.ctx
        protocol = runtime.protocol(errors, state, config, nbytes(tensor))
        staged = protocol == "staged"
        check_tensor(errors, ctx, tensor, "tensor", COPYABLE_DTYPES, on_heap=not staged)
        if src not in state.members:
            errors.append(f"src={src} is not a member of the group {list(state.members)}")
        runtime.agree(
            state, (describe_tensor(tensor, ctx, not staged), src, config, protocol), errors, "broadcast"
        )
        src_index = state.members.index(src)
        if staged:
            n = tensor.numel()
            return staged_launch(runtime, state, "broadcast", tensor, tensor, n, config, src_index=src_index)
        block = config.block_for(tensor.element_size())
        receivers = max(state.size - 1, 1)
        grid = (runtime.programs(triton.cdiv(triton.cdiv(tensor.numel(), block), receivers), config),)
        args = (tensor, tensor.numel(), src, src_index, *runtime.group_args(state), block)
        return broadcast_kernel, grid, args, config.num_warps

    return runtime.prepare_and_launch(key, prepare)
