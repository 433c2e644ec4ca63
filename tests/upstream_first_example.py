"""Upstream Iris's first example in its own shape: ``torch.multiprocessing.spawn`` and a process
group the program makes itself (``init_method="tcp://..."``), with no launcher variables.

Rank 0 stores ones into rank 1's buffer; rank 1 checks every element. Upstream's README uses
NCCL on GPUs; where ranks share a GPU (NCCL refuses that) and under emulation, gloo.

    python tests/upstream_first_example.py [world_size] [port]
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import triton
import triton.language as tl

import iris


@triton.jit
def kernel(buffer, buffer_size: tl.constexpr, block_size: tl.constexpr, heap_bases_ptr):
    pid = tl.program_id(0)
    offsets = pid * block_size + tl.arange(0, block_size)
    mask = offsets < buffer_size
    iris.store(buffer + offsets, 1, 0, 1, heap_bases_ptr, mask=mask)


def _worker(rank: int, world_size: int, port: int):
    shared = int(os.environ.get("IRIS_RANKS_PER_GPU", "1")) > 1
    backend = "nccl" if torch.cuda.is_available() and not shared else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(
        backend=backend, init_method=f"tcp://127.0.0.1:{port}", world_size=world_size, rank=rank
    )
    ctx = iris.iris(1 << 24)
    buffer = ctx.zeros(4096, device="cuda", dtype=torch.float32)
    if ctx.get_rank() == 0:
        kernel[(4,)](buffer, 4096, 1024, ctx.get_heap_bases())
    ctx.barrier()
    if rank == 1:
        assert torch.equal(buffer.cpu(), torch.ones(4096)), "rank 1 did not receive rank 0's ones"
        print(f"rank 1: upstream_first_example OK on {ctx.get_device()} ({backend})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 29500
    mp.spawn(_worker, args=(world, port), nprocs=world, join=True)
