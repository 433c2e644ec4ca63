"""Compile a Gluon kernel that issues every device op through ``iris.gluon.IrisDeviceCtx`` for sm_90.

Needs no GPU. Prints one JSON object: for the untraced and the traced variant (the
context tensor's dtype decides, as for Triton kernels), the PTX's system-scope atomics
and the call sites the traced one names, with the lines of the kernel's ops.

    IRIS_BACKEND=cuda python tests/codegen/compile_gluon.py
"""

from __future__ import annotations

import inspect
import json
import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/

import triton
from kernels import gluon_every_op
from ptx_only import ptx_only
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from iris.gluon import IrisDeviceCtx


def compiled(context_type: str):
    signature = {"IrisDeviceCtx": "constexpr", "context": context_type, "buf": "*fp32", "out": "*fp32"}
    signature.update(flags="*i32", BLOCK="constexpr")
    source = GluonASTSource(gluon_every_op, signature, {"IrisDeviceCtx": IrisDeviceCtx, "BLOCK": 128})
    with ptx_only():
        return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4})


if __name__ == "__main__":
    lines, first = inspect.getsourcelines(gluon_every_op.fn)
    ops = {
        text.rsplit("gluon site: ", 1)[1].strip(): first + i
        for i, text in enumerate(lines)
        if "gluon site:" in text
    }
    report = {"ops": ops}
    for name, context_type in (("untraced", "*i64"), ("traced", "*u64")):
        kernel = compiled(context_type)
        report[name] = {
            "sys_atomics": kernel.asm["ptx"].count("atom."),
            "sites": getattr(kernel.metadata, "iris_sites", None) or [],
        }
    print(json.dumps(report))
