"""Reduce-scatter: member ``i`` reduces block ``i`` of every member's input into its output.

``inp`` holds ``group_size`` blocks of ``out.numel()`` elements, as in
:func:`torch.distributed.reduce_scatter_tensor`. Each rank pulls its own block
from every input (remote loads) and the output may live anywhere. Small calls
use the low-latency protocol (:mod:`iris.ccl.low_latency`), then up to the
staging capacity the inputs are staged (:mod:`iris.ccl.staged`); the inputs may
then live anywhere too. ``Config.protocol="pushed"`` instead stores every block
into its owner's receive slots (:mod:`iris.ccl.pushed`; inputs anywhere). Direct
calls need the inputs on the heap, and the kernel is the one-shot all-reduce run
on this rank's block: a pointer to block ``i`` on rank ``i`` reaches block ``i``
of every peer, because heap translation keeps the offset.
"""

from __future__ import annotations

import triton

from ..host.prepared import PreparedLaunch, tensor_key
from .all_reduce import one_shot_kernel
from .config import ReduceOp
from .low_latency import payload_bytes
from .protocols import protocol_launch
from .pushed import tile_bytes
from .runtime import (
    REDUCE_SCATTER_PUSHED_AUTO_BYTES,
    REDUCIBLE_DTYPES,
    check_out_and_inp,
    check_parts,
    describe_tensor,
    nbytes,
)


def reduce_scatter(runtime, out, inp, op=None, group=None, config=None) -> PreparedLaunch:
    """Reduce block ``i`` of every member's ``inp`` into member ``i``'s ``out`` (``CCL.reduce_scatter``)."""
    op = ReduceOp.parse(op)
    state = runtime.group(group)
    key = runtime.key("reduce_scatter", state, config, op, tensor_key(out), tensor_key(inp))

    def prepare(errors: list[str]):
        ctx = runtime.ctx
        protocol = runtime.protocol(
            errors,
            state,
            config,
            nbytes(inp),
            payload_bytes(nbytes(out), out, inp),
            pushed_bytes=tile_bytes(config, inp),
            auto_pushes=nbytes(inp) <= REDUCE_SCATTER_PUSHED_AUTO_BYTES,
        )
        direct = protocol == "direct"
        if check_out_and_inp(errors, ctx, out, inp, REDUCIBLE_DTYPES, out_on_heap=False, inp_on_heap=direct):
            check_parts(errors, inp, "inp", out, "out", state.size)
        signature = (
            describe_tensor(out, ctx, False),
            describe_tensor(inp, ctx, direct),
            op,
            config,
            protocol,
        )
        runtime.agree(state, signature, errors, "reduce_scatter")
        n = out.numel()
        launch = protocol_launch(protocol, runtime, state, "reduce_scatter", out, inp, n, config, op)
        if launch is not None:
            return launch
        block = config.block_for(out.element_size())
        grid = (runtime.programs(triton.cdiv(n, block), config),)
        my_block = inp.reshape(-1)[state.my_index * n : (state.my_index + 1) * n]
        args = (out, my_block, n, *runtime.group_args(state), block, op.value)
        return one_shot_kernel, grid, args, config.num_warps

    return runtime.prepare_and_launch(key, prepare)
