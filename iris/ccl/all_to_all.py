"""All-to-all: block ``j`` of member ``i``'s input becomes block ``i`` of member ``j``'s output.

A 2-D tensor ``(M, N * group_size)`` is split by columns, as in Iris: member ``i``
sends ``inp[:, j*N:(j+1)*N]`` to ``out[:, i*N:(i+1)*N]`` of member ``j``. A 1-D
tensor is split into contiguous blocks, as in
:func:`torch.distributed.all_to_all_single` (pass ``t.view(-1)`` for torch's
row-block layout). Every rank pushes its blocks, so ``out`` must be on the heap,
except for small calls, which use the low-latency protocol
(:mod:`iris.ccl.low_latency`, ``Config.protocol``) and may use any tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..host.prepared import PreparedLaunch, tensor_key
from . import device as ccl
from .device import RANK_ARGS
from .low_latency import low_latency_launch, payload_bytes
from .runtime import COPYABLE_DTYPES, check_out_and_inp, describe_tensor


@triton.jit(do_not_specialize=RANK_ARGS)
def all_to_all_kernel(
    out, inp,
    rows, cols, in_stride, out_stride,
    group, my_index, cur_rank,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    # ``cols`` is one block's width; consecutive work units go to different members
    # (ccl.exchange_unit, which the Gluon kernel shares).
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    tiles_n = tl.cdiv(cols, BLOCK_N)
    units = tl.cdiv(rows, BLOCK_M) * tiles_n * GROUP
    for unit in range(pid, units, tl.num_programs(0)):
        target, row0, col0 = ccl.exchange_unit(unit, my_index, tiles_n, GROUP, BLOCK_M, BLOCK_N)
        r = row0 + tl.arange(0, BLOCK_M)[:, None]
        c = col0 + tl.arange(0, BLOCK_N)[None, :]
        ccl.exchange_tile(
            out, inp, r, c, rows, cols, in_stride, out_stride, target, my_index, cur_rank, ranks, heap_bases
        )
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


def _blocks(inp, group_size: int) -> tuple[int, int]:
    """(rows, columns) of one member's block of ``inp``; (0, 0) where the checks will fail."""
    if not isinstance(inp, torch.Tensor) or inp.dim() not in (1, 2) or inp.shape[-1] % group_size:
        return 0, 0
    return (inp.shape[0] if inp.dim() == 2 else 1), inp.shape[-1] // group_size


def all_to_all(runtime, out, inp, group=None, config=None) -> PreparedLaunch:
    """Exchange blocks between every pair of members; see :meth:`iris.ccl.CCL.all_to_all`."""
    state = runtime.group(group)
    key = runtime.key("all_to_all", state, config, tensor_key(out), tensor_key(inp))

    def prepare(errors: list[str]):
        ctx = runtime.ctx
        rows, cols = _blocks(inp, state.size)
        size = inp.element_size() if isinstance(inp, torch.Tensor) else 0
        payload = payload_bytes(rows * cols * size, out, inp, row_bytes=cols * size)
        protocol = runtime.protocol(errors, state, config, None, payload)
        direct = protocol == "direct"
        pair = dict(out_on_heap=direct, inp_on_heap=False, same_shape=True)
        if check_out_and_inp(errors, ctx, out, inp, COPYABLE_DTYPES, **pair):
            if inp.dim() not in (1, 2):
                errors.append(f"inp must be 1-D or 2-D (M, N x group size), got {inp.dim()}-D")
            elif inp.shape[-1] % state.size:
                errors.append(f"inp's last dimension {inp.shape[-1]} does not split into {state.size} blocks")
        signature = (describe_tensor(out, ctx, direct), describe_tensor(inp, ctx, False), config, protocol)
        runtime.agree(state, signature, errors, "all_to_all")
        in_stride = inp.stride(0) if inp.dim() == 2 else 0
        out_stride = out.stride(0) if out.dim() == 2 else 0
        if protocol == "low_latency":
            strides = (in_stride, out_stride)
            return low_latency_launch(
                runtime, state, "all_to_all", out, inp, config, rows=rows, strides=strides
            )
        # A 1-D tensor is one row: give its tile all the width.
        block_m, block_n = (
            (1, config.block_for(inp.element_size()))
            if inp.dim() == 1
            else (config.block_size_m, config.block_size_n)
        )
        units = triton.cdiv(rows, block_m) * triton.cdiv(cols, block_n) * state.size
        grid = (runtime.programs(units, config),)
        args = (out, inp, rows, cols, in_stride, out_stride, *runtime.group_args(state), block_m, block_n)
        if runtime.runs_gluon(config):
            from .gluon.all_to_all import all_to_all_kernel as gluon_kernel
            from .gluon.all_to_all import tile_layout

            layout = (*tile_layout(block_n, inp.element_size()), config.num_warps)
            return gluon_kernel, grid, (*args, *layout), config.num_warps
        return all_to_all_kernel, grid, args, config.num_warps

    return runtime.prepare_and_launch(key, prepare)
