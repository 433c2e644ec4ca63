"""Compile a traced kernel with two call sites for Hopper (sm_90) and print what the site pass gave it.

Needs no GPU. Prints one JSON object: the kernel's ``iris_sites`` metadata, the site ids
its PTX moves (``mov.u32 ..., <id>;`` with the pass's marker), how often it reads ``%gridid``, and
the call lines (from this file's source) that the sites should name.

    IRIS_BACKEND=cuda python tests/codegen/call_sites.py
"""

from __future__ import annotations

import inspect
import json
import os
import re

os.environ.setdefault("IRIS_BACKEND", "cuda")

import triton
import triton.language as tl
from ptx_only import ptx_only
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris
from iris.backends._cuda_call_sites import MARKER


@triton.jit
def two_puts(src, dst, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases)  # first call
    iris.put(src + offsets, dst + offsets, cur_rank, peer + 1, heap_bases)  # second call


def compiled(heap_bases_type: str):
    signature = {"src": "*fp32", "dst": "*fp32", "cur_rank": "i32", "peer": "i32"}
    signature.update(heap_bases=heap_bases_type, BLOCK="constexpr")
    source = ASTSource(two_puts, signature, {"BLOCK": 1024}, attrs={(0,): [["tt.divisibility", 16]]})
    with ptx_only():
        return triton.compile(source, target=GPUTarget("cuda", 90, 32))


if __name__ == "__main__":
    lines, first = inspect.getsourcelines(two_puts.fn)
    calls = [first + i for i, text in enumerate(lines) if text.rstrip().endswith("call")]
    traced, plain = compiled("*i64"), compiled("*u64")
    report = {
        "file": os.path.abspath(__file__),
        "call_lines": calls,
        "sites": getattr(traced.metadata, "iris_sites", None),
        "ptx_site_ids": [
            int(i) for i in re.findall(r"mov\.u32 \S+, (\d+); " + re.escape(MARKER), traced.asm["ptx"])
        ],
        "gridid_reads": traced.asm["ptx"].count("%gridid"),
        "untraced_markers": plain.asm["ptx"].count(MARKER),
    }
    print(json.dumps(report))
