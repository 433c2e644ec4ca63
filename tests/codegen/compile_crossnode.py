"""Compile the cross-node path for Hopper (sm_90), linked against NVSHMEM's device library.

Every device op is routed through the cross-node path (``IRIS_CROSS_NODE_ALWAYS=1``), or
with ``--nodes-of-one`` decided per op as in a job of one rank per node (then the ops of
those kernels, all between a rank and itself, keep both paths). The kernels of
``tests/test_crossnode_path.py`` are compiled the way a job that spans nodes compiles
them: through the hook that links ``_nvshmem_calls.ll`` and ``libnvshmem_device*.bc``
into every kernel (``iris.backends.cuda_nvshmem``). One line per kernel says what it
calls: NVSHMEM's transfer functions, and no function left unresolved, and how many CTA
barriers sit in loops of more than one entry (the atomics' barriers in a
compare-and-swap retry loop; 0 expected with every op routed across). No GPU is needed;
NVSHMEM's bitcode is (``NVSHMEM_LIB_DIR``, or the ``nvidia-nvshmem-cu13`` wheel).

    IRIS_BACKEND=cuda NVSHMEM_LIB_DIR=... python tests/codegen/compile_crossnode.py [--nodes-of-one]
"""

from __future__ import annotations

import os
import re
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")
if "--nodes-of-one" in sys.argv:
    os.environ.update(IRIS_RANKS_PER_NODE="1", WORLD_SIZE="2")
else:
    os.environ["IRIS_CROSS_NODE_ALWAYS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: the kernels
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton
from ptx_flow import barriers_in_multi_entry_loops
from test_crossnode_path import (
    _atomics_kernel,
    _rma_kernel,
    _scattered_kernel,
    _signal_kernel,
    _staged_kernel,
)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris
from iris.backends.cuda_nvshmem import _link_nvshmem_into_every_kernel, nvshmem_device_library

KERNELS = [
    (
        _rma_kernel,
        {
            **{name: "*fp32" for name in ("f32", "f32_out")},
            **{name: "*bf16" for name in ("bf16", "bf16_out")},
            **{name: "*i8" for name in ("i8", "i8_out")},
            **{name: "*i64" for name in ("i64", "i64_out", "heap_bases")},
        },
        {"BLOCK": 16, "LIVE": 11},
    ),
    (
        _atomics_kernel,
        {
            "counts": "*i64",
            "floats": "*fp32",
            "words": "*i32",
            "block_f32": "*fp32",
            "block_i32": "*i32",
            "out": "*i64",
            "heap_bases": "*i64",
        },
        {"ROUNDS": 8, "BLOCK": 16, "LIVE": 11},
    ),
    (_signal_kernel, {"data": "*i32", "flag": "*i32", "heap_bases": "*i64"}, {"ROUNDS": 8, "BLOCK": 16}),
    (
        _scattered_kernel,
        {"src": "*fp32", "dst": "*fp32", "gathered": "*fp32", "heap_bases": "*i64"},
        {"BLOCK": 16},
    ),
    (_staged_kernel, {"wide": "*fp32", "back": "*fp32", "heap_bases": "*i64"}, {"BLOCK": 16}),
]


def main() -> int:
    assert iris.config.SCALE_OUT, "the routing settings must be in place before iris is imported"
    library = nvshmem_device_library((9, 0))
    _link_nvshmem_into_every_kernel(library)
    for kernel, signature, constexprs in KERNELS:
        signature = {**signature, **{name: "constexpr" for name in constexprs}}
        signature = {name: signature[name] for name in kernel.arg_names}
        compiled = triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        transfers = sorted(set(re.findall(r"nvshmemi_transfer_(\w+?)I", ptx)))
        unresolved = re.findall(r"\.extern \.func[^\n]*?(\w+)\(", ptx)
        print(
            f"{kernel.fn.__name__} nvshmem_state={'nvshmemi_device_state_d' in ptx} "
            f"transfers={','.join(transfers)} unresolved={unresolved} cubin={len(compiled.asm['cubin']) > 0} "
            f"barriers_in_multi_entry_loops={barriers_in_multi_entry_loops(ptx)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
