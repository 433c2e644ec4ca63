"""Copy-engine puts (ctx.copy_engine) against SM-issued puts and NCCL, moving the same bytes.

Every rank sends S bytes to every peer at once (an all-gather's traffic):
  copy_engine   one cudaMemcpy2DAsync per peer, each on its own lane (no SM used); the puts
                are prepared once (ctx.copy_engine.prepare_put), as ctx.ops plans do
  iris_sm       ctx.ccl.all_gather: kernels whose programs store to the peers
  nccl          torch.distributed.all_gather_into_tensor
Reported: time per round (max over ranks, same fixed iterations everywhere) and the
bytes each rank sends per second, (world - 1) * S / time (= all-gather bus bandwidth).

    python -m iris.run -n 4 benchmarks/copy_engine.py --out benchmarks/results/copy_engine_h200x4.json
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from common import all_ranks_agree, require_own_gpu, time_loop, write_report

import iris


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-mib", type=int, default=1)
    parser.add_argument("--max-mib", type=int, default=256)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if iris.BACKEND != "cuda":
        raise SystemExit("this benchmark times GPUs: run it with IRIS_BACKEND=cuda")
    ctx = iris.iris(heap_size=2 * 4 * (args.max_mib << 20) + (256 << 20))
    require_own_gpu(ctx)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    rows, sizes = [], []
    mib = args.min_mib
    while mib <= args.max_mib:
        sizes.append(mib)
        mib *= 4
    largest = (args.max_mib << 20) // 4
    out = ctx.empty(world * largest)
    for mib in sizes:
        n = (mib << 20) // 4
        slots = out[: world * n].view(world, n)
        mine = slots[rank]
        mine.copy_(torch.randn(n, device=ctx.get_device(), generator=None) + rank)
        sends = [ctx.copy_engine.prepare_put(mine, mine, (rank + i) % world) for i in range(1, world)]

        def copy_engine():
            ctx.copy_engine.fork()
            for send in sends:
                send()
            ctx.copy_engine.join()

        inp = mine.clone()
        gathered = torch.empty(world * n, device=ctx.get_device())
        ms = {
            "copy_engine": time_loop(ctx, copy_engine, args.iters) * 1e3,
            "iris_sm": time_loop(ctx, lambda: ctx.ccl.all_gather(slots.view(-1), inp), args.iters) * 1e3,
            "nccl": time_loop(ctx, lambda: dist.all_gather_into_tensor(gathered, inp), args.iters) * 1e3,
        }
        # Correct: a fresh round of puts leaves every peer's block in its slot.
        mine.copy_(inp)
        ctx.barrier()
        copy_engine()
        torch.cuda.synchronize()
        ctx.barrier()
        correct = all_ranks_agree(torch.equal(slots.view(-1), gathered))
        sent = (world - 1) * (mib << 20)
        row = {"mib_per_peer": mib, "ms": ms, "gbs": {k: sent / (v / 1e3) / 1e9 for k, v in ms.items()}}
        row["correct"] = correct
        rows.append(row)
        if rank == 0:
            g = row["gbs"]
            print(
                f"{mib:5d} MiB/peer  copy_engine {ms['copy_engine']:8.3f} ms {g['copy_engine']:6.1f} GB/s  "
                f"iris_sm {ms['iris_sm']:8.3f} ms {g['iris_sm']:6.1f} GB/s  "
                f"nccl {ms['nccl']:8.3f} ms {g['nccl']:6.1f} GB/s  ok={correct}",
                flush=True,
            )
    write_report({"world_size": world, "iters": args.iters, "rows": rows}, args.out, world)
    ctx.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
