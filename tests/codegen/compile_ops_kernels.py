"""Compile the ``ctx.ops`` kernels that CI runs only under the interpreter, for Hopper (sm_90).

The handshake and sum kernels of ``iris.ops.copy_kernels``, the two tracing kernels
of ``iris.device.dma_trace``, the workgroup-specialised GEMM + all-scatter, the
plain GEMM through tensor descriptors (GPU-sized tiles) and the kernels of upstream
Iris's conventions (``pull_gather``, ``tile_reduce_scatter``, the HBM-staged
all-gather + GEMM), untraced and traced: this
catches code that only the interpreter accepts before a GPU run does. No GPU is needed.

It then checks that a consumer can share SMs with the GEMM
(``FusedConfig.consumer_warps``): the producer and consumers of 1, 2 and 4 warps,
compiled to cubins with the specialisation a launch gives them, must split an
SM's registers between them (``iris.ops.config.split_sm_registers``).

    IRIS_BACKEND=cuda python tests/codegen/compile_ops_kernels.py [--dump DIR]
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")

import re
import subprocess
import tempfile

import triton
from compile_ccl import compile_ptx
from inspect_ptx import dump_instructions
from ptx_flow import barriers_in_multi_entry_loops, print_barrier_hazards
from ptx_only import ptx_only
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris
from iris.device.dma_trace import dma_record_kernel, dma_start_kernel
from iris.ops import copy_kernels
from iris.ops._plans import SHARING_BACKOFF_NS
from iris.ops.all_gather_matmul_hbm_buffer import hbm_buffer_kernel
from iris.ops.all_scatter import BOTH, CONSUMER, PRODUCER, workgroup_specialized_kernel
from iris.ops.config import SM_REGISTERS, split_sm_registers
from iris.ops.gemm import matmul_tma_kernel
from iris.ops.pull_gather import pull_gather_matmul_kernel
from iris.ops.selection import default_config
from iris.ops.tile_reduce_scatter import tile_reduce_scatter_kernel


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
    yield (
        "workgroup_specialized",
        workgroup_specialized_kernel,
        fused_signature(bases),
        {**TILES, "ROLE": BOTH},
    )
    tiles = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}
    descriptors = {
        "a_desc": "tensordesc<bf16[128, 64]>",
        "b_desc": "tensordesc<bf16[64, 256]>",
        "c_desc": "tensordesc<bf16[128, 256]>",
    }
    plain = {**descriptors, "M": "i32", "N": "i32", "K": "i32", "heap_bases": bases}
    yield "matmul_tma", matmul_tma_kernel, plain, {**tiles, "GROUP_M": 8, "FLATTEN": True}
    # Upstream Iris's conventions: A gathered by columns (pulled), C scattered by tiles.
    square = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}
    strides = {
        name: "i32" for name in ("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
    }
    pull = {"a_shard": "*bf16", "b": "*bf16", "out": "*bf16", "bias": "*bf16", "M": "i32", "N": "i32"}
    pull.update(
        K_local="i32", stride_bias="i32", cur_rank="i32", world_size="i32", heap_bases=bases, **strides
    )
    yield (
        "pull_gather_matmul",
        pull_gather_matmul_kernel,
        pull,
        {**square, "GROUP_M": 8, "EVEN_K": True, "HAS_BIAS": True},
    )
    context = "*i64" if bases == "*u64" else "*u64"  # the traced context is the uint64 view
    scatter = {"a": "*bf16", "b": "*bf16", "partial": "*bf16", "out": "*bf16", "locks": "*i32", "M": "i32"}
    scatter.update(N="i32", K="i32", stride_pm="i32", stride_pn="i32", context=context, **strides)
    scatter.update(cur_rank="i32", world_size="i32")
    yield "tile_reduce_scatter", tile_reduce_scatter_kernel, scatter, {**square, "EVEN_K": True}
    staged = {"a_shard": "*bf16", "b": "*bf16", "out": "*bf16", "bias": "*bf16", "staged": "*bf16"}
    staged.update(flags="*i32", timings="*i64", M="i32", N="i32", **strides, stride_sm="i32", stride_sk="i32")
    staged.update(stride_bias="i32", cur_rank="i32", heap_bases=bases)
    stages = dict(M_TILES=32, N_TILES=16, K_BLOCKS=64, K_LOCAL_BLOCKS=16, K_PER_FLAG=8, FETCHERS=32)
    stages.update(FIRST_FETCHERS=64, STAGES=2, HAS_BIAS=True, TIMINGS=True)
    yield (
        "hbm_buffer",
        hbm_buffer_kernel,
        staged,
        {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, **stages},
    )


def fused_signature(bases: str) -> dict:
    """The workgroup-specialised kernel's argument types with ``heap_bases`` of type ``bases``."""
    signature = {"a": "*bf16", "b": "*bf16", "out_block": "*bf16", "flags": "*i32", "tickets": "*i32"}
    signature.update(entry="*i32", epoch_ptr="*i32", heap_bases=bases)
    for name in ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"):
        signature[name] = "i32"
    signature.update(cur_rank="i32", world_size="i32", GEMM_PROGRAMS="i32", SPLIT_FROM="i32")
    return signature


#: The GPU defaults of the shape where consumers share SMs (4 x H200, 4096 x 8192 x 8192).
SHARING = default_config(4096, 2048, 8192, 4, 132, "matmul_all_gather")

#: The GPU default tile of a large GEMM + all-scatter (iris.ops.selection.default_config).
TILES = {
    "BLOCK_M": 128,
    "BLOCK_N": 256,
    "BLOCK_K": 64,
    "GROUP_M": 8,
    "EVEN_K": True,
    "COMM_ROWS": 32,
    "BACKOFF_NS": 0,
}


def resources(role, num_warps: int, num_stages: int, maxnreg=None) -> tuple:
    """Registers per thread and stack bytes (spills) of the all-scatter kernel in ``role``.

    Specialised as a GPU launch is: a launch sees 16-divisible pointers and sizes
    and unit inner strides; register counts depend on that, so they are compiled in
    here rather than left generic.
    """
    signature = fused_signature("*u64")
    unit = ("stride_ak", "stride_bn", "stride_cn")
    constexprs = {
        **TILES,
        "ROLE": role,
        "BACKOFF_NS": SHARING_BACKOFF_NS if role == CONSUMER else 0,
        "COMM_ROWS": SHARING.comm_rows if role == CONSUMER else TILES["COMM_ROWS"],
        **{name: 1 for name in unit},
    }
    signature = {**signature, **{name: "constexpr" for name in constexprs}}
    signature = {name: signature[name] for name in workgroup_specialized_kernel.arg_names}
    rank_args = ("cur_rank", "world_size", "GEMM_PROGRAMS", "SPLIT_FROM")
    divisible = [
        i for i, (name, kind) in enumerate(signature.items()) if kind != "constexpr" and name not in rank_args
    ]
    source = ASTSource(
        workgroup_specialized_kernel,
        signature,
        constexprs,
        attrs={(i,): [["tt.divisibility", 16]] for i in divisible},
    )
    options = dict(num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        usage = subprocess.run(
            [cuobjdump, "--dump-resource-usage", cubin.name], capture_output=True, text=True
        )
    return tuple(int(re.search(rf"{key}:(\d+)", usage.stdout).group(1)) for key in ("REG", "STACK"))


def check_consumer_budget() -> bool:
    """Print how the producer and each consumer split an SM's registers; True if every pair fits."""
    fits = True
    for warps in (1, 2, 4):

        def producer(cap):
            return resources(PRODUCER, num_warps=8, num_stages=3, maxnreg=cap)

        def consumer(cap, warps=warps):
            return resources(CONSUMER, num_warps=warps, num_stages=1, maxnreg=cap)

        producer_cap, consumer_cap = split_sm_registers(producer, consumer, 8, warps)
        (gemm, gemm_stack), (comm, comm_stack) = producer(producer_cap), consumer(consumer_cap)
        fits &= gemm * 8 * 32 + comm * warps * 32 <= SM_REGISTERS
        print(
            f"consumer[warps={warps}]: producer {gemm} registers (cap {producer_cap}), {gemm_stack} B stack; "
            f"consumer {comm} registers (cap {consumer_cap}), {comm_stack} B stack"
        )
    return fits


if __name__ == "__main__":
    if iris.BACKEND != "cuda":
        sys.exit("run with IRIS_BACKEND=cuda (no GPU is needed)")
    dump = sys.argv[sys.argv.index("--dump") + 1] if "--dump" in sys.argv else None
    hazards = {}
    for bases, label in (("*u64", "untraced"), ("*i64", "traced")):
        for name, kernel, signature, constexprs in kernels(bases):
            with ptx_only():  # the register budget below compiles its kernels whole
                ptx = compile_ptx(kernel, signature, constexprs)
            # Tensor-descriptor kernels move tiles with the TMA engine's bulk copies.
            bulk = ptx.count("cp.async.bulk.tensor")
            copies = f" bulk_tensor_copies={bulk}" if bulk else ""
            print(f"{name}[{label}] {len(ptx.splitlines())} lines{copies}", flush=True)
            hazards[f"{name}[{label}]"] = barriers_in_multi_entry_loops(ptx)
            if dump:
                dump_instructions(dump, f"{name}[{label}]", ptx)
    print_barrier_hazards(hazards)
    if not check_consumer_budget():
        sys.exit("a consumer and the GEMM kernel do not fit on one SM (split_sm_registers)")
