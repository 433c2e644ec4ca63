"""All-gather: every rank pushes its input into its slot of every member's output.

``out`` (on the heap, ``group_size * inp.numel()`` elements) receives member
``i``'s input at rows ``i * M .. (i + 1) * M``, as
:func:`torch.distributed.all_gather_into_tensor` does. Pushing (remote stores)
rather than pulling keeps every link busy in the direction GPUs write fastest.
Small calls use the low-latency protocol (:mod:`iris.ccl.low_latency`), then up to
the staging capacity they are staged (:mod:`iris.ccl.staged`); ``out`` may then
live anywhere (``Config.protocol``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..host.prepared import PreparedLaunch, tensor_key
from . import device as ccl
from .device import RANK_ARGS
from .low_latency import payload_bytes
from .protocols import protocol_launch
from .runtime import COPYABLE_DTYPES, check_out_and_inp, check_parts, describe_tensor, nbytes


@triton.jit(do_not_specialize=RANK_ARGS)
def all_gather_kernel(out, inp, n, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    ready = ccl.flag_row(flags, ccl.READY, pid, max_programs, world_size)
    ccl.sync_row(ready, cur_rank, ranks, GROUP, heap_bases)
    dst = out + my_index.to(tl.int64) * n
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        values = tl.load(inp + offsets, mask=mask)
        ccl.push_tile(dst + offsets, values, cur_rank, ranks, my_index, GROUP, heap_bases, mask)
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


def all_gather(runtime, out, inp, group=None, config=None) -> PreparedLaunch:
    """Gather every member's ``inp`` into ``out`` on every member (see :meth:`iris.ccl.CCL.all_gather`)."""
    state = runtime.group(group)
    key = runtime.key("all_gather", state, config, tensor_key(out), tensor_key(inp))

    def prepare(errors: list[str]):
        ctx = runtime.ctx
        protocol = runtime.protocol(errors, state, config, nbytes(inp), payload_bytes(nbytes(inp), out, inp))
        direct = protocol == "direct"
        if check_out_and_inp(errors, ctx, out, inp, COPYABLE_DTYPES, out_on_heap=direct, inp_on_heap=False):
            check_parts(errors, out, "out", inp, "inp", state.size)
        signature = (describe_tensor(out, ctx, direct), describe_tensor(inp, ctx, False), config, protocol)
        runtime.agree(state, signature, errors, "all_gather")
        launch = protocol_launch(protocol, runtime, state, "all_gather", out, inp, inp.numel(), config)
        if launch is not None:
            return launch
        block = config.block_for(inp.element_size())
        grid = (runtime.programs(triton.cdiv(inp.numel(), block), config),)
        args = (out, inp, inp.numel(), *runtime.group_args(state), block)
        if runtime.runs_gluon(config):
            from .gluon.all_gather import all_gather_kernel as gluon_kernel

            return gluon_kernel, grid, (*args, config.num_warps), config.num_warps
        return all_gather_kernel, grid, args, config.num_warps

    return runtime.prepare_and_launch(key, prepare)
