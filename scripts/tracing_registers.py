"""Registers and instruction counts of the tracing benchmark's GEMM + all-scatter, compiled offline.

``benchmarks/tracing_overhead.py`` times the kernel untraced, with tracing compiled in
(all of it, its compute scope only, its stores only, its stores only with their switch
read first or after an empty scope) and with tracing enabled; its
``--breakdown`` reports each variant's registers as the GPU loaded it. This prints the
same variants' registers, stack bytes and SASS instruction counts for Hopper (sm_90)
without a GPU, so a change to the device recorder can be judged before a GPU run.
The specialisation is a 2-or-more-rank launch's (``world_size`` not 1: the store loop
over ranks is a real loop).

    IRIS_BACKEND=cuda python scripts/tracing_registers.py [--dump DIR]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import re
import subprocess
import tempfile

import triton
from tracing_overhead import gemm_all_scatter
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

#: (compute scope's heap_bases, stores' heap_bases, SWITCH_FIRST, MARK_AFTER_LOOP) of each
#: variant: *u64 untraced, *i64 traced.
VARIANTS = {
    "untraced": ("*u64", "*u64", False, False),
    "traced": ("*i64", "*i64", False, False),
    "scope only": ("*i64", "*u64", False, False),
    "stores only": ("*u64", "*i64", False, False),
    "stores, switch first": ("*u64", "*i64", True, False),
    "stores, empty scope": ("*u64", "*i64", False, True),
}
TILES = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
#: Arguments a GPU launch sees as 16-divisible (pointers and the GEMM's sizes).
DIVISIBLE = ("a", "b", "c_all", "M", "N", "K", "scope_bases", "store_bases")


def compile_variant(scope_bases: str, store_bases: str, switch_first: bool = False, mark: bool = False):
    """The compiled kernel (as the benchmark launches it: 8 warps, 3 stages) for one variant."""
    signature = {"a": "*bf16", "b": "*bf16", "c_all": "*bf16", "M": "i32", "N": "i32", "K": "i32"}
    signature.update(cur_rank="i32", world_size="i32", scope_bases=scope_bases, store_bases=store_bases)
    signature.update({name: "constexpr" for name in TILES})
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name in DIVISIBLE}
    constants = {**TILES, "SWITCH_FIRST": switch_first, "MARK_AFTER_LOOP": mark}
    signature.update(SWITCH_FIRST="constexpr", MARK_AFTER_LOOP="constexpr")
    source = ASTSource(gemm_all_scatter, signature, constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 3})


def cubin_facts(cubin: bytes) -> tuple[int, int, str]:
    """(registers per thread, stack bytes, SASS) of a cubin, read with Triton's bundled cuobjdump."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", file.name], capture_output=True, text=True
        )
        sass = subprocess.run([cuobjdump, "-sass", file.name], capture_output=True, text=True).stdout
    registers, stack = (int(re.search(rf"{key}:(\d+)", usage.stdout).group(1)) for key in ("REG", "STACK"))
    return registers, stack, sass


def main() -> None:
    dump = sys.argv[sys.argv.index("--dump") + 1] if "--dump" in sys.argv else None
    print(f"{'variant':20} {'registers':>9} {'stack':>6} {'instructions':>12}")
    for name, variant in VARIANTS.items():
        registers, stack, sass = cubin_facts(compile_variant(*variant).asm["cubin"])
        count = sum(1 for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line))
        print(f"{name:20} {registers:9} {stack:6} {count:12}", flush=True)
        if dump:
            os.makedirs(dump, exist_ok=True)
            with open(os.path.join(dump, f"{name.replace(' ', '_')}.sass"), "w") as file:
                file.write(sass)


if __name__ == "__main__":
    main()
