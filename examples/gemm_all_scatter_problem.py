"""The problem examples 09 to 12 share, and its check; each example brings its kernels.

C = A x B with B sharded by columns: rank r holds A (M x K, the same everywhere) and
B_r (K x n), computes C_r = A x B_r, and every rank must end with the whole C
(M x world*n): C_r at columns r*n .. (r+1)*n of every rank's C. Full size on GPUs, a
small one under emulation (kernels in the Triton interpreter); C is poisoned with NaN
before the call, every element is checked against torch, and with one rank per GPU
the time per call is printed.
"""

import torch

import iris


def tile_sizes(ctx) -> dict:
    """Tile sizes of the examples' kernels: GPU-sized, or small for the interpreter."""
    if ctx.backend.interpreted:
        return dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
    return dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)


def run(label: str, gemm_all_scatter) -> int:
    """Check ``gemm_all_scatter(ctx, a, b, c, call)`` on the shared problem; 0 when every element is right.

    ``call`` counts the calls from 1 (kernels use it as the epoch of their flags).
    """
    ctx = iris.iris(heap_size=1 << 30 if iris.BACKEND == "cuda" else 1 << 24)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    M, K, n = (64, 64, 48) if ctx.backend.interpreted else (8192, 8192, 8192 // world)
    a = ctx.randn(M, K, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(0))
    b = ctx.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + rank))
    c = ctx.full((M, world * n), float("nan"), dtype=torch.bfloat16)
    ctx.barrier()  # every rank's C is poisoned before any rank writes into it

    gemm_all_scatter(ctx, a, b, c, 1)
    ctx.barrier()  # every rank's kernels have finished: C is complete everywhere

    # Every rank's B_r, regenerated from its seed: the whole C must be A x [B_0 ... B_world-1].
    b_all = [
        torch.randn(K, n, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(1 + r))
        for r in range(world)
    ]
    expected = a.float() @ torch.cat(b_all, dim=1).to(a.device).float()
    error = ((c.float() - expected).norm() / expected.norm()).item()
    written = not c.isnan().any().item()
    if not ctx.backend.interpreted and not ctx.gpu_shared:  # ranks sharing a GPU take turns: no timing
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for call in range(2, 12):
            gemm_all_scatter(ctx, a, b, c, call)
        stop.record()
        ctx.barrier()
        print(f"rank {rank}: {label} {start.elapsed_time(stop) / 10:.3f} ms per call")
    ctx.close()
    if error > 1e-2 or not written:
        print(f"rank {rank}: {label} MISMATCH: relative error {error:.2e}, every element written: {written}")
        return 1
    print(f"rank {rank}: {label} OK (M={M} N={world * n} K={K}, relative error {error:.1e})")
    return 0
