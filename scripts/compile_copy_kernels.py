"""Compile the copy-engine kernels for Hopper (sm_90), untraced and traced; no GPU needed.

The handshake and sum kernels of ``iris.ops.copy_kernels`` and the two tracing kernels
of ``iris.device.dma_trace`` run on GPUs only as tiny launches beside cuBLAS; this
catches code that only the interpreter accepts before a GPU run does.

    IRIS_BACKEND=cuda python scripts/compile_copy_kernels.py
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")

from compile_ccl import compile_ptx

import iris
from iris.device.dma_trace import dma_record_kernel, dma_start_kernel
from iris.ops import copy_kernels


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


if __name__ == "__main__":
    if iris.BACKEND != "cuda":
        sys.exit("run with IRIS_BACKEND=cuda (no GPU is needed)")
    for bases, label in (("*u64", "untraced"), ("*i64", "traced")):
        for name, kernel, signature, constexprs in kernels(bases):
            ptx = compile_ptx(kernel, signature, constexprs)
            print(f"{name}[{label}] {len(ptx.splitlines())} lines", flush=True)
