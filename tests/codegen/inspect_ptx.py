"""Compile Iris's RMA ops for Hopper (sm_90) and list their memory instructions.

Needs no GPU: Triton compiles to PTX offline. It shows whether heap translation
keeps 16-byte vector accesses and which scope the atomics and flag reads use.

    IRIS_BACKEND=cuda python tests/codegen/inspect_ptx.py
    IRIS_BACKEND=cuda python tests/codegen/inspect_ptx.py --dump /tmp/ptx   (also each kernel's instructions)

``tracing_switch_reads`` counts a traced loop of puts' reads of tracing's run-time
switch, and how many of them sit inside the loop (0: read once per kernel);
``traced_put_cta_barriers`` the CTA barriers of one traced, masked put (the record's
reduction over the block; thread 0 claims the slot and writes the record alone). The last
lines name kernels with CTA barriers inside loops of more than one entry
(:func:`barriers_in_multi_entry_loops`) and wait kernels with CTA barriers inside
their spin loops (:func:`barriers_in_loops`); both should read ``{}``.

``--dump`` writes every kernel's instruction stream to ``DIR/<name>.ptx``: a refactor
that must not change code is checked by diffing two dumps.
"""

from __future__ import annotations

import os
import re
import sys

os.environ.setdefault("IRIS_BACKEND", "cuda")

import triton
import triton.language as tl
from ptx_flow import (
    barriers_in_loops,
    barriers_in_multi_entry_loops,
    instructions_in_loops,
    print_barrier_hazards,
)
from ptx_only import ptx_only
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import iris
from iris.device import wake


@triton.jit
def put_kernel(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases, mask=mask)


@triton.jit
def put_ring_kernel(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    # Many puts per program: tracing's run-time switch should be read once, before the loop.
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases, mask=offsets < n)


@triton.jit
def get_kernel(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    iris.get(src + offsets, dst + offsets, peer, cur_rank, heap_bases, mask=mask)


@triton.jit
def put_hinted_kernel(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    # Upstream Iris's spelling: a vectorisation hint and a cache modifier on the remote store.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    iris.put(
        src + offsets,
        dst + offsets,
        cur_rank,
        peer,
        heap_bases,
        mask=mask,
        store_cache_modifier=".wt",
        hint=16,
    )


@triton.jit
def get_volatile_cg_kernel(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    # Upstream's test spelling: a volatile remote load with a cache operator PTX cannot combine.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    data = iris.load(src + offsets, cur_rank, peer, heap_bases, mask, cache_modifier=".cg", volatile=True)
    tl.store(dst + offsets, data, mask=mask)


@triton.jit
def put_without_tracing(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None):
    # iris.put as it was before tracing existed: the same translation, no tracing calls.
    remote = iris.translate(to_ptr, from_rank, to_rank, heap_bases, mask, "iris.put")
    tl.store(remote, tl.load(from_ptr, mask=mask), mask=mask)


@triton.jit
def put_reference_kernel(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    put_without_tracing(src + offsets, dst + offsets, cur_rank, peer, heap_bases, mask=mask)


@triton.jit
def flag_kernel(flag, cur_rank, peer, heap_bases):
    iris.atomic_add(flag, 1, cur_rank, peer, heap_bases)
    iris.signal(flag, 1, cur_rank, peer, heap_bases)
    iris.wait_until(flag, "ge", 1)


@triton.jit
def context_kernel(context, buf, n, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    peer = (rank + 1) % world_size
    ctx.store(buf + offsets, ctx.load(buf + offsets, peer, mask=mask), peer, mask=mask)
    ctx.atomic_add(buf, 1, peer)
    ctx.signal(buf, 1, peer, op="add")
    ctx.wait_until(buf, "ge", 1)


@triton.jit
def tile_collectives_kernel(
    context, inp, partial, out, locks, M, N, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr
):
    # Every in-kernel tile collective on one 64 x 64 fp32 tile (upstream Iris's DeviceContext methods).
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    view = iris.TileView(tl.program_id(0) // 4, tl.program_id(0) % 4, BLOCK, BLOCK)
    src_view = iris.make_tensor_view(partial, M, N, N, 1)
    dst_view = iris.make_tensor_view(out, M, N, N, 1)
    data = ctx.gather(view, iris.make_tensor_view(inp, M, N, N, 1), (rank + 1) % world_size)
    tile = iris.Tile(view.pid_m, view.pid_n, BLOCK, BLOCK, data)
    ctx.all_reduce_atomic(tile, dst_view)
    ctx.all_reduce_spinlock(tile, dst_view, locks)
    ctx.all_reduce_one_shot(tile, src_view, dst_view, locks)
    ctx.all_reduce_two_shot(tile, src_view, dst_view, locks)
    ctx.all_reduce_ring(view, src_view, dst_view)
    ctx.reduce_scatter(tile, src_view, dst_view, locks)
    ctx.all_gather(tile, dst_view, 0)
    ctx.all_to_all(view, src_view, dst_view, 32)


@triton.jit
def wait_remote_kernel(flag, peer, heap_bases):
    iris.wait_until(flag, "eq", 1, heap_bases=heap_bases, from_rank=peer)


@triton.jit
def wait_plain_kernel(flag):
    iris.wait_until(flag, "ge", 1)


@triton.jit
def wait_timed_kernel(flag, heap_bases):
    iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)


PUT_SIGNATURE = {
    "src": "*fp32",
    "dst": "*fp32",
    "n": "i32",
    "cur_rank": "i32",
    "peer": "i32",
    "heap_bases": "*u64",
}

KERNELS = {
    "put_reference": (put_reference_kernel, PUT_SIGNATURE, {"BLOCK": 4096}),
    "put_traced": (put_kernel, {**PUT_SIGNATURE, "heap_bases": "*i64"}, {"BLOCK": 4096}),
    "put_ring_traced": (put_ring_kernel, {**PUT_SIGNATURE, "heap_bases": "*i64"}, {"BLOCK": 4096}),
    "put": (
        put_kernel,
        {"src": "*fp32", "dst": "*fp32", "n": "i32", "cur_rank": "i32", "peer": "i32", "heap_bases": "*u64"},
        {"BLOCK": 4096},
    ),
    "put_hinted": (
        put_hinted_kernel,
        {"src": "*fp32", "dst": "*fp32", "n": "i32", "cur_rank": "i32", "peer": "i32", "heap_bases": "*u64"},
        {"BLOCK": 4096},
    ),
    "load_volatile_cg": (get_volatile_cg_kernel, PUT_SIGNATURE, {"BLOCK": 1024}),
    "get": (
        get_kernel,
        {"src": "*fp32", "dst": "*fp32", "n": "i32", "cur_rank": "i32", "peer": "i32", "heap_bases": "*u64"},
        {"BLOCK": 4096},
    ),
    "context": (
        context_kernel,
        {"context": "*i64", "buf": "*i32", "n": "i32"},
        {"rank": 0, "world_size": 2, "BLOCK": 1024},
    ),
    "flags": (flag_kernel, {"flag": "*i32", "cur_rank": "i32", "peer": "i32", "heap_bases": "*u64"}, {}),
    "tile_collectives": (
        tile_collectives_kernel,
        {
            "context": "*i64",
            "inp": "*fp32",
            "partial": "*fp32",
            "out": "*fp32",
            "locks": "*i32",
            "M": "i32",
            "N": "i32",
        },
        {"rank": 0, "world_size": 2, "BLOCK": 64},
        range(7),  # tensors 16-byte aligned, M and N multiples of 16: a typical launch
    ),
    "wait_remote": (wait_remote_kernel, {"flag": "*i32", "peer": "i32", "heap_bases": "*u64"}, {}),
    "wait_plain": (wait_plain_kernel, {"flag": "*i32"}, {}),
    "wait_timed": (wait_timed_kernel, {"flag": "*i32", "heap_bases": "*u64"}, {}),
    "flags64": (flag_kernel, {"flag": "*i64", "cur_rank": "i32", "peer": "i32", "heap_bases": "*u64"}, {}),
    "wake_links": (
        wake.wake_links_kernel,
        {"heap": "*i32", "lines": "i32", "peers": "*i32", "folded": "*i32", "cur_rank": "i32"}
        | {"heap_bases": "*u64"},
        {"LINES": wake.LINES},
        (0, 2, 3),
    ),
}


def compile_ptx(name: str) -> str:
    """PTX of one of :data:`KERNELS` for sm_90."""
    kernel, signature, constexprs, *aligned = KERNELS[name]
    signature = {**signature, **{key: "constexpr" for key in constexprs}}
    # Pointers 16-byte aligned and n a multiple of 16, as Triton specialises typical launches.
    attrs = {(i,): [["tt.divisibility", 16]] for i in (aligned[0] if aligned else range(3))}
    source = ASTSource(kernel, signature, constexprs, attrs=attrs)
    with ptx_only():
        return triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]


def instructions(ptx: str) -> list[str]:
    """The instruction stream of ``ptx``: no comments, debug info, or kernel names."""
    body = ptx.split(".section\t.debug")[0]
    name = re.search(r"\.entry (\w+)", body).group(1)
    lines = []
    for line in body.splitlines():
        line = line.split("//")[0].strip()
        if line and not line.startswith((".loc", ".file", "$L__")):
            lines.append(line.replace(name, "KERNEL"))
    return lines


def dump_instructions(directory: str, name: str, ptx: str) -> None:
    """Write the instruction stream of ``ptx`` (:func:`instructions`) to ``directory/name.ptx``."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{name}.ptx"), "w") as file:
        file.write("\n".join(instructions(ptx)) + "\n")


def memory_ops(ptx: str) -> dict[str, int]:
    """Count of each global load, store and atomic instruction in ``ptx``."""
    pattern = (
        r"((?:\bld|\bst|\batom|\bred)\.global[\w.]*|\b(?:ld|atom)\.(?:acquire|relaxed|volatile)[\w.]*"
        r"|\bfence[\w.]*"
        r"|%globaltimer|%smid|\btrap\b)"
    )
    ops = re.findall(pattern, ptx)
    return {op: ops.count(op) for op in sorted(set(ops))}


if __name__ == "__main__":
    if iris.BACKEND != "cuda":
        sys.exit("run with IRIS_BACKEND=cuda (no GPU is needed)")
    dump = sys.argv[sys.argv.index("--dump") + 1] if "--dump" in sys.argv else None
    hazards, spin_hazards = {}, {}
    for kernel_name in KERNELS:
        ptx = compile_ptx(kernel_name)
        print(kernel_name, memory_ops(ptx))
        hazards[kernel_name] = barriers_in_multi_entry_loops(ptx)
        if kernel_name.startswith("wait_"):
            spin_hazards[kernel_name] = barriers_in_loops(ptx)
        if dump:
            dump_instructions(dump, kernel_name, ptx)
    same = instructions(compile_ptx("put")) == instructions(compile_ptx("put_reference"))
    print("untraced_put_equals_reference", same)
    ring = compile_ptx("put_ring_traced")
    in_loops = instructions_in_loops(ring, "ld.global.nc")
    print("tracing_switch_reads", ring.count("ld.global.nc"), "in_loops", in_loops)
    print("traced_put_cta_barriers", compile_ptx("put_traced").count("bar.sync"))
    print_barrier_hazards(hazards)
    print("barriers_in_wait_loops", {name: count for name, count in spin_hazards.items() if count})
