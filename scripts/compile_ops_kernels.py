"""Compile the ``ctx.ops`` kernels that CI runs only under the interpreter, for Hopper (sm_90).

The handshake and sum kernels of ``iris.ops.copy_kernels``, the two tracing kernels
of ``iris.device.dma_trace`` and the workgroup-specialised GEMM + all-scatter
(GPU-sized tiles), untraced and traced: this catches code that only the interpreter
accepts before a GPU run does. No GPU is needed.

    IRIS_BACKEND=cuda python scripts/compile_ops_kernels.py
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")

from compile_ccl import compile_ptx

import iris
from iris.device.dma_trace import dma_record_kernel, dma_start_kernel
from iris.ops import copy_kernels
from iris.ops.all_scatter import BOTH, workgroup_specialized_kernel


def kernels(bases: str):
    """(name, kernel, signature, constexprs) with ``heap_bases`` of type ``bases`` (*u64 or *i64)."""
    flag_args = {"epoch_ptr": "*i32", "cur_rank": "i32", "heap_bases": bases}
    enter = {"entry": "*i32", "world_size": "i32", **flag_args}
    yield "enter_call", copy_kernels.enter_call_kernel, enter, {}
    announce = {"landed": "*i32", "to_rank": "i32", **flag_args}
    yield "announce_landed", copy_kernels.announce_landed_kernel, announce, {}
    wait = {"landed": "*i32", "from_rank": "i32", "world_size": "i32", **flag_args}
    for every in (False, True):
        yield f"wait_landed[EVERY_PEER={every}]", copy_kernels.wait_landed_kernel, wait, {"EVERY_PEER": every}
    total = {"out": "*bf16", "landing": "*bf16", "rows": "i32", "cols": "i32", "stride_om": "i32"}
    total.update(stride_on="i32", slots="i32")
    yield "sum_landed", copy_kernels.sum_landed_kernel, total, {"BLOCK_M": 64, "BLOCK_N": 64}
    yield "dma_start", dma_start_kernel, {"stamps": "*i64", "lane": "i32"}, {}
    record = {"heap_bases": bases, "stamps": "*i64", "lane": "i32", "target_rank": "i32"}
    record.update(offset="i64", nbytes="i64")
    yield "dma_record", dma_record_kernel, record, {}
    fused = {"a": "*bf16", "b": "*bf16", "out_block": "*bf16", "flags": "*i32", "tickets": "*i32"}
    fused.update(entry="*i32", epoch_ptr="*i32", heap_bases=bases)
    for name in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"):
        fused[name] = "i32"
    fused.update(cur_rank="i32", world_size="i32", GEMM_PROGRAMS="i32")
    tiles = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "EVEN_K": True, "COMM_ROWS": 32}
    yield "workgroup_specialized", workgroup_specialized_kernel, fused, {**tiles, "ROLE": BOTH}


if __name__ == "__main__":
    if iris.BACKEND != "cuda":
        sys.exit("run with IRIS_BACKEND=cuda (no GPU is needed)")
    for bases, label in (("*u64", "untraced"), ("*i64", "traced")):
        for name, kernel, signature, constexprs in kernels(bases):
            ptx = compile_ptx(kernel, signature, constexprs)
            print(f"{name}[{label}] {len(ptx.splitlines())} lines", flush=True)
