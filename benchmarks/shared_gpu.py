"""What sharing a GPU between ranks costs: a flag round trip, a device barrier, a small all_reduce.

With ``IRIS_RANKS_PER_GPU`` several ranks run on one GPU. Their kernels do not run
side by side: the GPU gives each process's context a time slice in turn, so a rank
spinning on a flag that another rank will set waits until that rank's slice comes.
This benchmark measures that cost on the three synchronisation patterns every
multi-rank program has, so the same command run with and without sharing shows it:

    python -m iris.run -n 2 benchmarks/shared_gpu.py --out dedicated.json          # 2 GPUs
    CUDA_VISIBLE_DEVICES=0 IRIS_RANKS_PER_GPU=2 \\
        python -m iris.run -n 2 benchmarks/shared_gpu.py --out shared.json         # 1 GPU

``round_trip_us`` is one flag ping-pong between ranks 0 and 1 (inside one kernel
each), ``device_barrier_us`` one ``ctx.device_barrier()``, ``all_reduce_4k_us`` one
``ctx.ccl.all_reduce`` of 1024 fp32; each the time per call over a fixed count,
the max over ranks. It is the one benchmark that runs shared on purpose: the others
refuse (``common.require_own_gpu``).
"""

from __future__ import annotations

import argparse

import torch
import triton
from common import time_loop, write_report

import iris


@triton.jit(do_not_specialize=["base"])  # one compiled kernel whatever base is divisible by
def ping_pong_kernel(flag, rounds, base, cur_rank, heap_bases):
    # Round r: rank 0 raises rank 1's flag to base + r + 1 and waits for its own to get
    # there; rank 1 answers. ``base`` grows from call to call, so the flags never need resetting.
    for step in range(rounds):
        value = base + step + 1
        if cur_rank == 0:
            iris.signal(flag, value, 0, 1, heap_bases)
            iris.wait_until(flag, "ge", value, heap_bases=heap_bases)
        elif cur_rank == 1:
            iris.wait_until(flag, "ge", value, heap_bases=heap_bases)
            iris.signal(flag, value, 1, 0, heap_bases)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200, help="flag round trips per kernel")
    parser.add_argument("--iters", type=int, default=50, help="timed calls of each pattern")
    parser.add_argument("--out", default=None, help="JSON report path (rank 0)")
    args = parser.parse_args()

    ctx = iris.iris(heap_size=1 << 28)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    flag = ctx.zeros(1, dtype=torch.int32)
    inp = ctx.randn(1024, generator=torch.Generator().manual_seed(rank))
    out = ctx.empty(1024)
    ctx.barrier()

    calls = [0]

    def ping_pong():
        ping_pong_kernel[(1,)](flag, args.rounds, calls[0] * args.rounds, rank, ctx.get_heap_bases())
        calls[0] += 1

    results = {}
    if world > 1:
        per_kernel = time_loop(ctx, ping_pong, max(args.iters // 10, 2), warmup=2, shared_ok=True)
        results["round_trip_us"] = per_kernel / args.rounds * 1e6
    results["device_barrier_us"] = time_loop(ctx, ctx.device_barrier, args.iters, shared_ok=True) * 1e6
    all_reduce = lambda: ctx.ccl.all_reduce(out, inp)  # noqa: E731
    results["all_reduce_4k_us"] = time_loop(ctx, all_reduce, args.iters, align=True, shared_ok=True) * 1e6

    expected = inp.cpu()
    torch.distributed.all_reduce(expected)  # reference on CPU copies: works shared or not
    assert torch.allclose(out.cpu(), expected, rtol=1e-5, atol=1e-5), "all_reduce result differs"
    if rank == 0:
        sharing = "shared" if ctx.gpu_shared else "one per GPU"
        print(f"{world} ranks on {torch.cuda.device_count()} GPU(s) ({sharing}):")
        for name, value in results.items():
            print(f"  {name:20s} {value:12.1f}")
    report = {
        "world_size": world,
        "gpus": torch.cuda.device_count(),
        "ranks_share_gpu": ctx.gpu_shared,
        "rounds": args.rounds,
        "iters": args.iters,
        "results": results,
    }
    write_report(report, args.out, world)
    ctx.close()


if __name__ == "__main__":
    main()
