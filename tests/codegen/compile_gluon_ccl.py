"""Compile the Gluon collectives (``iris.ccl.gluon``) for sm_90, untraced and traced.

Needs no GPU. Prints one JSON object: for each kernel and variant, the PTX's vector stores
(``st.global.v*``), all global stores and atomics (the handshakes' signals and waits).

    IRIS_BACKEND=cuda python tests/codegen/compile_gluon_ccl.py
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")

import triton
from compile_ccl import ALIGNED, GROUP_ARGS
from ptx_only import ptx_only
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from iris.ccl.gluon import all_gather, all_to_all

WARPS = 8


def kernels():
    """(name, kernel, signature, constexprs) of each Gluon collective, fp32, at group size 4: the
    default tiles, and tiles smaller than a program's threads (``tests/test_ccl.py``'s), which
    the layouts then repeat over them."""
    tensors = {"out": "*fp32", "inp": "*fp32"}
    shape = {"rows": "i32", "cols": "i32", "in_stride": "i32", "out_stride": "i32"}
    for size, block, (block_m, block_n) in (("", 4096, (64, 64)), ("_small", 64, (8, 16))):
        yield f"all_gather{size}", all_gather.all_gather_kernel, {**tensors, "n": "i32"}, {"BLOCK": block}
        vec, lanes_n = all_to_all.tile_layout(block_n, 4)
        blocks = {"BLOCK_M": block_m, "BLOCK_N": block_n, "VEC": vec, "LANES_N": lanes_n}
        yield f"all_to_all{size}", all_to_all.all_to_all_kernel, {**tensors, **shape}, blocks


def compile_ptx(kernel, signature: dict, constexprs: dict, heap_bases: str) -> str:
    constexprs = {**constexprs, "GROUP": 4, "WARPS": WARPS}
    group = {**GROUP_ARGS, "group": (*GROUP_ARGS["group"][:-1], heap_bases)}
    full = {**signature, **group, **{key: "constexpr" for key in constexprs}}
    full = {name: full[name] for name in kernel.arg_names}
    # Aligned as Triton's launch specialises them (compile_ccl.py's rule; a tuple's path: its first).
    names = list(full)
    paths = [
        (i, 0) if isinstance(full[name], tuple) else (i,) for i, name in enumerate(names) if name in ALIGNED
    ]
    attrs = {path: [["tt.divisibility", 16]] for path in paths}
    source = GluonASTSource(kernel, full, constexprs, attrs=attrs)
    with ptx_only():
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS}).asm[
            "ptx"
        ]


if __name__ == "__main__":
    report = {}
    for name, kernel, signature, constexprs in kernels():
        # The context's dtype decides tracing, as for Triton kernels: *u64 heap bases are traced.
        for variant, heap_bases in (("untraced", "*i64"), ("traced", "*u64")):
            ptx = compile_ptx(kernel, signature, constexprs, heap_bases)
            report[f"{name}/{variant}"] = {
                "vector_stores": ptx.count("st.global.v"),
                "stores": ptx.count("st.global"),
                "atomics": ptx.count("atom."),
            }
            print(name, variant, report[f"{name}/{variant}"], file=sys.stderr, flush=True)
    print(json.dumps(report))
