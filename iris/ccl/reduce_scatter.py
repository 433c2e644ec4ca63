"""Reduce-scatter: member ``i`` reduces block ``i`` of every member's input into its output.

``inp`` holds ``group_size`` blocks of ``out.numel()`` elements, as in
:func:`torch.distributed.reduce_scatter_tensor`. Each rank pulls its own block
from every input (remote loads), so inputs must be on the heap and the output
may live anywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import device as ccl
from .config import ReduceOp
from .device import RANK_ARGS
from .runtime import REDUCIBLE_DTYPES, check_disjoint, check_tensor, describe_tensor, tensor_key


@triton.jit(do_not_specialize=RANK_ARGS)
def reduce_scatter_kernel(
    out,
    inp,
    n,
    flags,
    ranks,
    my_index,
    cur_rank,
    world_size,
    max_programs,
    heap_bases,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    OP: tl.constexpr,
):
    pid = tl.program_id(0)
    ccl.sync_row(
        ccl.flag_row(flags, ccl.READY, pid, max_programs, world_size), cur_rank, ranks, GROUP, heap_bases
    )
    src = inp + my_index.to(tl.int64) * n
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        total = ccl.reduce_tile(src + offsets, cur_rank, ranks, my_index, GROUP, heap_bases, mask, OP)
        tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
    ccl.sync_row(
        ccl.flag_row(flags, ccl.DONE, pid, max_programs, world_size), cur_rank, ranks, GROUP, heap_bases
    )


def reduce_scatter(runtime, out, inp, op=None, group=None, config=None) -> None:
    """Reduce block ``i`` of every member's ``inp`` into member ``i``'s ``out`` (``CCL.reduce_scatter``)."""
    op = ReduceOp.parse(op)
    state = runtime.group(group)
    key = runtime.key("reduce_scatter", state, config, op, tensor_key(out), tensor_key(inp))

    def prepare():
        ctx = runtime.ctx
        errors: list[str] = []
        usable = check_tensor(errors, ctx, out, "out", REDUCIBLE_DTYPES, on_heap=False)
        usable &= check_tensor(errors, ctx, inp, "inp", REDUCIBLE_DTYPES, on_heap=True)
        if usable:
            if out.dtype != inp.dtype:
                errors.append(f"out is {out.dtype} but inp is {inp.dtype}")
            if inp.numel() != state.size * out.numel():
                errors.append(
                    f"inp has {inp.numel()} elements; a group of {state.size} needs "
                    f"{state.size} x out.numel() = {state.size * out.numel()}"
                )
            check_disjoint(errors, out, inp, "out and inp")
        signature = (describe_tensor(out, ctx)[:2], describe_tensor(inp, ctx), op, config)
        runtime.agree(state, signature, errors, "reduce_scatter")
        block = config.block_for(out.element_size())
        grid = (runtime.programs(triton.cdiv(out.numel(), block), config),)
        args = (out, inp, out.numel(), *runtime.group_args(state), block, op.value)
        return reduce_scatter_kernel, grid, args, config.num_warps

    runtime.prepare(key, prepare)
    runtime.launch(key)
