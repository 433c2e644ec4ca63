"""What this GPU machine's NVSHMEM can do from Triton, as the scale-out path needs it.

Checks, each printed as one line: torch's NVSHMEM symmetric memory is available; the
device library (libnvshmem_device.bc) and which device functions it defines; a heap
allocated through torch's NVSHMEM backend; a Triton kernel linked against the device
library that puts, gets, fences, quiets, signals and updates atomically, element by
element over a masked tile, to each PE, with every element checked.

Run with one rank, or several ranks on one GPU to see whether NVSHMEM accepts that:
    python scripts/probe_nvshmem.py            # one rank
    python scripts/probe_nvshmem.py --ranks 2  # two processes on GPU 0
"""

import argparse
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Device functions the scale-out path would call; the probe says which the library defines.
_WANTED = [
    f"nvshmem_{t}_{op}"
    for t in ("float", "double", "half", "bfloat16", "int32", "int64", "uint32", "uint64")
    for op in (
        "p",
        "g",
        "atomic_fetch_add",
        "atomic_add",
        "atomic_swap",
        "atomic_compare_swap",
        "atomic_fetch_and",
        "atomic_fetch_or",
        "atomic_fetch_xor",
        "atomic_fetch",
        "atomic_set",
    )
] + [
    "nvshmem_fence",
    "nvshmem_quiet",
    "nvshmemx_signal_op",
    "nvshmem_signal_fetch",
    "nvshmem_ptr",
    "nvshmem_uint64_wait_until",
    "nvshmem_int_wait_until",
    "nvshmemx_putmem_block",
    "nvshmemx_getmem_block",
]


def _symbols(path):
    with open(path, "rb") as f:
        blob = f.read()
    # Bitcode's string table runs names together, so look each wanted name up (with a
    # following character that cannot continue an identifier would be exact; prefix is enough here).
    return [name for name in _WANTED if name.encode() in blob]


def _probe(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    import torch.distributed._symmetric_memory as symm_mem
    from torch.distributed._symmetric_memory import _nvshmem_triton as nvt

    say = lambda *a: print(f"[rank {rank}]", *a, flush=True)
    say("nvshmem available:", symm_mem.is_nvshmem_available())
    lib = nvt.NvshmemLibFinder.find_device_library()
    if rank == 0:
        names = _symbols(lib)
        say("device library:", lib)
        say("defined:", " ".join(names))
        say("missing:", " ".join(n for n in _WANTED if n not in names))
    symm_mem.set_backend("NVSHMEM")
    heap = symm_mem.empty(1 << 20, dtype=torch.uint8, device="cuda:0")
    # torch's rendezvous refuses one rank, but the allocation above has started NVSHMEM,
    # and device calls need only that: one rank probes against itself (PE 0).
    if world > 1:
        handle = symm_mem.rendezvous(heap, dist.group.WORLD.group_name)
        say("heap", hex(heap.data_ptr()), "buffer_ptrs", [hex(p) for p in handle.buffer_ptrs])

    import triton
    import triton.language as tl
    from triton.language import core

    @core.extern
    def _float_p(dest, value, pe, _semantic=None):
        return core.extern_elementwise(
            "",
            "",
            [dest, value, pe],
            {
                (core.dtype("int64"), core.dtype("fp32"), core.dtype("int32")): (
                    "nvshmem_float_p",
                    core.dtype("int32"),
                )
            },
            is_pure=False,
            _semantic=_semantic,
        )

    @core.extern
    def _float_g(src, pe, _semantic=None):
        return core.extern_elementwise(
            "",
            "",
            [src, pe],
            {(core.dtype("int64"), core.dtype("int32")): ("nvshmem_float_g", core.dtype("fp32"))},
            is_pure=False,
            _semantic=_semantic,
        )

    @core.extern
    def _fetch_add(dest, value, pe, _semantic=None):
        return core.extern_elementwise(
            "",
            "",
            [dest, value, pe],
            {
                (core.dtype("int64"), core.dtype("int64"), core.dtype("int32")): (
                    "nvshmem_uint64_atomic_fetch_add",
                    core.dtype("int64"),
                )
            },
            is_pure=False,
            _semantic=_semantic,
        )

    @triton.jit
    def kernel(base, pe, n, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        data = base.to(tl.pointer_type(tl.float32))
        mask = offs < n
        scratch = data + 4 * BLOCK  # masked-off lanes write here, never read
        dest = tl.where(mask, data + offs, scratch)
        _float_p(dest.to(tl.int64), offs.to(tl.float32) * 2.0 + 1.0, pe)
        nvt.fence()
        nvt.quiet()
        got = _float_g(dest.to(tl.int64), pe)
        tl.store(data + BLOCK + offs, tl.where(mask, got, -1.0))
        counter = (base + 8 * BLOCK).to(tl.pointer_type(tl.int64))
        _fetch_add(tl.where(mask, counter, counter + 1).to(tl.int64), tl.full([BLOCK], 1, tl.int64), pe)
        nvt.quiet()
        nvt.signal_op((base + 8 * BLOCK + 64).to(tl.int64), tl.full([], 7, tl.int64), 0, pe)
        nvt.quiet()

    try:
        jit = nvt.requires_nvshmem(kernel)
        peer = (rank + 1) % world
        heap.zero_()
        torch.cuda.synchronize()
        dist.barrier()
        jit[(1,)](heap, peer, 100, BLOCK=128)
        torch.cuda.synchronize()
        dist.barrier()
        floats = heap.view(torch.float32)
        got = floats[128:256].cpu()
        expect = torch.where(torch.arange(128) < 100, torch.arange(128).float() * 2 + 1, torch.tensor(-1.0))
        mine = floats[:100].cpu()
        counter = heap[1024:1032].view(torch.int64).item()
        flag = heap[1024 + 64 : 1032 + 64].view(torch.int64).item()
        say(
            "get after put exact:",
            torch.equal(got, expect),
            "| data put by a peer exact:",
            torch.equal(mine, torch.arange(100).float() * 2 + 1),
            "| fetch_add count",
            counter,
            "| signal",
            flag,
        )
    except Exception:
        say("kernel failed:\n" + traceback.format_exc())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=1)
    args = parser.parse_args()
    print("torch", torch.__version__, "device", torch.cuda.get_device_name(0), flush=True)
    mp.start_processes(_probe, args=(args.ranks, 29611 + args.ranks), nprocs=args.ranks, start_method="spawn")
    sys.exit(0)
