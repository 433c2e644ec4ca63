"""The problem examples 09 to 12 share, run in one overlap style (see docs/fused.md).

C = A x B with B sharded by columns: rank r holds A (M x K, the same everywhere)
and B_r (K x N/world), computes C_r = A x B_r, and every rank must end with the
whole C (M x N). Full size on GPUs, a small size under emulation; the result is
checked against torch and, on GPUs, the time per call printed.
"""

import torch

import iris
from iris.ops import default_config


def run(variant: str, label: str) -> int:
    """Run the shared problem with ``ctx.ops.matmul_all_gather`` in style ``variant``; 0 when correct."""
    ctx = iris.iris(heap_size=1 << 30 if iris.BACKEND == "cuda" else 1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    # Full size on GPUs; under emulation (kernels in the Triton interpreter) a small one.
    M, K, n = (8192, 8192, 8192 // world) if iris.BACKEND == "cuda" else (40, 40, 48)
    a = ctx.randn(M, K, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    b = ctx.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + rank))
    c = ctx.full((M, world * n), float("nan"), dtype=torch.bfloat16)
    config = default_config(iris.BACKEND, M, n, K, world, ctx.get_cu_count()).replace(variant=variant)

    ctx.ops.matmul_all_gather(c, a, b, dim=1, config=config)  # dim=1: blocks side by side
    ctx.barrier()

    # Every rank's B_r, regenerated from its seed: the whole C must be A x [B_0 ... B_world-1].
    b_all = [
        torch.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + r))
        for r in range(world)
    ]
    expected = a.float() @ torch.cat(b_all, dim=1).to(a.device).float()
    error = ((c.float() - expected).norm() / expected.norm()).item()
    if iris.BACKEND == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            ctx.ops.matmul_all_gather(c, a, b, dim=1, config=config)
        stop.record()
        ctx.barrier()
        print(f"rank {rank}: {variant} {start.elapsed_time(stop) / 10:.3f} ms per call")
    ctx.close()
    if error > 1e-2:
        print(f"rank {rank}: {label} MISMATCH: relative error {error:.2e}")
        return 1
    print(f"rank {rank}: {label} OK (M={M} N={world * n} K={K}, relative error {error:.1e})")
    return 0
