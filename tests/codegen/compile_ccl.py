"""Compile every collective kernel for Hopper (sm_90) and count its memory instructions.

Needs no GPU: it catches kernels that only the interpreter accepts, and shows
that flat collectives keep 16-byte vector accesses after heap translation.

    IRIS_BACKEND=cuda python tests/codegen/compile_ccl.py [fp32 bf16] [--dump DIR]

``--dump`` writes each kernel's instruction stream to ``DIR/<name>.ptx`` (as
``inspect_ptx.py --dump``), so a change that must not alter code is checked by a diff.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")

import triton
from inspect_ptx import dump_instructions, memory_ops
from ptx_flow import barriers_in_multi_entry_loops, print_barrier_hazards
from ptx_only import ptx_only
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris
from iris.ccl import all_gather, all_reduce, all_to_all, broadcast, low_latency, pushed, tile_reduce_scatter
from iris.ccl.staged import MODES, staged_kernel

#: ``group`` is (flags, ranks, world_size, max_programs, heap_bases): ``Runtime.group_args``.
GROUP_ARGS = {"group": ("*i32", "*i32", "i32", "i32", "*u64"), "my_index": "i32", "cur_rank": "i32"}
FLAT = {"out": "*{t}", "inp": "*{t}", "n": "i32"}


def kernels(dtype: str):
    """(name, kernel, signature, constexprs) for every collective at group size 4."""
    flat = {**{k: v.format(t=dtype) for k, v in FLAT.items()}, **GROUP_ARGS}
    reduce = {"GROUP": 4, "BLOCK": 4096, "OP": "sum"}
    for variant, kernel in all_reduce.KERNELS.items():
        yield f"all_reduce_{variant}", kernel, flat, reduce
    staged = {**flat, "src_index": "i32", "staging": f"*{dtype}", "calls": "*i32", "half": "i32"}
    for mode in MODES:
        yield f"{mode}_staged", staged_kernel, staged, {**reduce, "MODE": mode}
    ll = {
        "out": f"*{dtype}", "inp": f"*{dtype}", "words": "i32", "cols": "i32", "in_stride": "i32",
        "out_stride": "i32", "ranks": "*i32", "my_index": "i32", "cur_rank": "i32",
        "heap_bases": "*u64", "slots": "*i64", "slot_words": "i32", "calls": "*i32",
    }  # fmt: skip
    for mode, (scatter, reduced) in low_latency.MODES.items():
        constexprs = {"GROUP": 4, "BLOCK": low_latency.BLOCK_WORDS, "OP": "sum", "SCATTER": scatter}
        constexprs.update(REDUCE=reduced, ROWS=False)
        yield f"{mode}_low_latency", low_latency.low_latency_kernel, ll, constexprs
    for mode in pushed.MODES:
        signature = {**flat, "slots": f"*{dtype}"}
        yield f"{mode}_pushed", pushed.pushed_kernel, signature, {**reduce, "MODE": mode, "ROUND": 4}
    yield "all_gather", all_gather.all_gather_kernel, flat, {"GROUP": 4, "BLOCK": 4096}
    a2a = {
        "out": f"*{dtype}",
        "inp": f"*{dtype}",
        "rows": "i32",
        "cols": "i32",
        "in_stride": "i32",
        "out_stride": "i32",
        **GROUP_ARGS,
    }
    yield "all_to_all", all_to_all.all_to_all_kernel, a2a, {"GROUP": 4, "BLOCK_M": 64, "BLOCK_N": 64}
    tiles = {"GROUP": 4, "BLOCK_M": 32, "BLOCK_N": 64, "SWIZZLE_M": 4, "CONTIGUOUS": True, "OP": "sum"}
    yield "tile_reduce_scatter", tile_reduce_scatter.tile_reduce_scatter_kernel, a2a, tiles
    bcast = {"tensor": f"*{dtype}", "n": "i32", "src": "i32", "src_index": "i32", **GROUP_ARGS}
    yield "broadcast", broadcast.broadcast_kernel, bcast, {"GROUP": 4, "BLOCK": 4096}


#: Arguments compiled as 16-byte aligned pointers or multiples of 16, as Triton specialises typical launches
#: (``group``'s first element, the flags).
ALIGNED = ("out", "inp", "tensor", "n", "cols", "group", "staging", "half", "words", "slots", "slot_words")


def compile_ptx(kernel, signature: dict, constexprs: dict) -> str:
    signature = {**signature, **{key: "constexpr" for key in constexprs}}
    signature = {name: signature[name] for name in kernel.arg_names}  # the kernel's parameter order
    names = list(signature)
    aligned = [i for i, name in enumerate(names) if name in ALIGNED]
    # A tuple's path names its first element (``group``'s flags).
    paths = [(i, 0) if isinstance(signature[names[i]], tuple) else (i,) for i in aligned]
    attrs = {path: [["tt.divisibility", 16]] for path in paths}
    source = ASTSource(kernel, signature, constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


if __name__ == "__main__":
    if iris.BACKEND != "cuda":
        sys.exit("run with IRIS_BACKEND=cuda (no GPU is needed)")
    args = sys.argv[1:]
    dump = args[args.index("--dump") + 1] if "--dump" in args else None
    dtypes = [a for a in args if a not in ("--dump", dump)] or ["fp32", "bf16"]
    hazards = {}
    for dtype in dtypes:
        for name, kernel, signature, constexprs in kernels(dtype):
            with ptx_only():  # only PTX is read here
                ptx = compile_ptx(kernel, signature, constexprs)
            print(f"{name}[{dtype}]", memory_ops(ptx), flush=True)
            hazards[f"{name}[{dtype}]"] = barriers_in_multi_entry_loops(ptx)
            if dump:
                dump_instructions(dump, f"{name}[{dtype}]", ptx)
    print_barrier_hazards(hazards)
