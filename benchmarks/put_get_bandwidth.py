"""Put/get bandwidth over the symmetric heap, beside NCCL in the same run.

Modes:
  put-uni   only rank 0 puts its buffer into rank 1        vs NCCL send (rank 0) / recv (rank 1)
  get-uni   only rank 0 gets rank 1's buffer
Every rank at once:
  put-one   rank r puts its buffer into rank r+1 (a ring)   vs NCCL send/recv ring
  get-one   rank r gets rank r+1's buffer                   vs NCCL send/recv ring
  put-all   rank r puts its buffer into every peer          vs NCCL all_gather
  get-all   rank r gets every peer's buffer                 vs NCCL all_gather

Bandwidth is bytes that crossed NVLink per rank (size, or size x (world-1) for the
*-all modes) over the time per iteration, the max over ranks. Every rank runs the
same fixed iteration count: warm-up, barrier, CUDA events around N iterations.
After timing, every destination element is checked against the source.

    python -m iris.run -n 2 benchmarks/put_get_bandwidth.py --out benchmarks/results/put_get_h200x2.json
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import triton
import triton.language as tl
from common import all_ranks_agree, require_own_gpu, time_loop, write_report

import iris

KIB = 1024


@triton.jit
def transfer_kernel(
    src,
    dst,
    n,
    cur_rank,
    world_size,
    heap_bases,
    GET: tl.constexpr,
    ALL_PEERS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Put ``src`` into the peers' ``dst``, or (``GET``) get the peers' ``src`` into ``dst``.

    With ``ALL_PEERS`` every peer has its own slot of ``dst``; otherwise only the next rank's.
    """
    pid = tl.program_id(0)
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n
        if ALL_PEERS:
            for i in range(1, world_size):
                _transfer(
                    src, dst, offsets, mask, n, cur_rank, (cur_rank + i) % world_size, heap_bases, GET, True
                )
        else:
            _transfer(
                src, dst, offsets, mask, n, cur_rank, (cur_rank + 1) % world_size, heap_bases, GET, False
            )


@triton.jit
def _transfer(src, dst, offsets, mask, n, cur_rank, peer, heap_bases, GET: tl.constexpr, SLOTS: tl.constexpr):
    if GET:
        slot = peer * n if SLOTS else 0
        iris.get(src + offsets, dst + slot + offsets, peer, cur_rank, heap_bases, mask=mask)
    else:
        slot = cur_rank * n if SLOTS else 0
        iris.put(src + offsets, dst + slot + offsets, cur_rank, peer, heap_bases, mask=mask)


def transfer(ctx, src, dst, n, grid, mode, all_peers, block, warps, active=True):
    """A launch of ``transfer_kernel`` for ``mode`` ("put-..." or "get-..."); a no-op where not ``active``."""
    rank, world, bases = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_heap_bases()
    get = mode.startswith("get")

    def launch():
        if active:
            transfer_kernel[grid](
                src, dst, n, rank, world, bases, GET=get, ALL_PEERS=all_peers, BLOCK=block, num_warps=warps
            )

    return launch


def iterations_for(nbytes: int) -> int:
    """Same on every rank: enough work to dwarf launch overhead, bounded for big sizes."""
    return 200 if nbytes <= 16 * KIB * KIB else max(10, int(200 * 16 * KIB * KIB / nbytes))


def nccl_one_way(send, recv, rank):
    if rank == 0:
        dist.send(send, 1)
    elif rank == 1:
        dist.recv(recv, 0)


def nccl_ring(send, recv, rank, world):
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % world), dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()


def run(args) -> dict:
    ctx = iris.iris(heap_size=args.heap_gib << 30)
    require_own_gpu(ctx)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if world < 2:
        raise SystemExit("put/get bandwidth needs at least 2 ranks")
    sms = ctx.get_cu_count()
    max_elems = (args.max_mib * KIB * KIB) // 4
    src = ctx.empty(max_elems)
    src.copy_(
        torch.randn(
            max_elems,
            generator=torch.Generator(device=ctx.get_device()).manual_seed(rank),
            device=ctx.get_device(),
        )
    )
    dst = ctx.empty(world * max_elems)
    nccl_send = torch.empty(max_elems, device=ctx.get_device())
    nccl_recv = torch.empty(world * max_elems, device=ctx.get_device())
    ctx.barrier()

    results = []
    nbytes = args.min_kib * KIB
    while nbytes <= args.max_mib * KIB * KIB:
        n = nbytes // 4
        iters = iterations_for(nbytes)
        grid = (min(triton.cdiv(n, args.block), sms * args.waves),)
        row = {"bytes": nbytes, "iters": iters}
        for mode in ("put-uni", "get-uni", "put-one", "get-one", "put-all", "get-all"):
            all_peers = mode.endswith("all")
            dst.fill_(float("nan"))
            ctx.barrier()
            active = rank == 0 or not mode.endswith("uni")
            launch = transfer(ctx, src, dst, n, grid, mode, all_peers, args.block, args.warps, active)
            seconds = time_loop(ctx, launch, iters)
            moved = nbytes * (world - 1 if all_peers else 1)
            row[mode] = {"us": seconds * 1e6, "GBps": moved / seconds / 1e9}
            row[mode]["correct"] = check(ctx, mode, dst, n, rank, world)
        nccl_send[:n].copy_(src[:n])
        seconds = time_loop(ctx, lambda: nccl_one_way(nccl_send[:n], nccl_recv[:n], rank), iters)
        row["nccl-uni"] = {"us": seconds * 1e6, "GBps": nbytes / seconds / 1e9}
        seconds = time_loop(ctx, lambda: nccl_ring(nccl_send[:n], nccl_recv[:n], rank, world), iters)
        row["nccl-sendrecv"] = {"us": seconds * 1e6, "GBps": nbytes / seconds / 1e9}
        seconds = time_loop(
            ctx, lambda: dist.all_gather_into_tensor(nccl_recv[: world * n], nccl_send[:n]), iters
        )
        row["nccl-allgather"] = {"us": seconds * 1e6, "GBps": nbytes * (world - 1) / seconds / 1e9}
        results.append(row)
        if rank == 0:
            print(format_row(row), flush=True)
        nbytes *= 4
    ctx.close()
    return {
        "world_size": world,
        "sms": sms,
        "block": args.block,
        "warps": args.warps,
        "waves": args.waves,
        "results": results,
    }


@triton.jit
def put_hinted_kernel(
    src,
    dst,
    n,
    cur_rank,
    world_size,
    heap_bases,
    CACHE: tl.constexpr,
    EVICT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    pid = tl.program_id(0)
    peer = (cur_rank + 1) % world_size
    for start in range(pid * BLOCK, n, tl.num_programs(0) * BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        mask = offsets < n
        data = tl.load(src + offsets, mask=mask, eviction_policy="evict_first")
        remote = iris.translate(dst + offsets, cur_rank, peer, heap_bases)
        tl.store(remote, data, mask=mask, cache_modifier=CACHE, eviction_policy=EVICT)


def sweep(args) -> dict:
    """put-one and get-one at one size for many launch configurations (to choose the defaults)."""
    ctx = iris.iris(heap_size=args.heap_gib << 30)
    require_own_gpu(ctx)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    n = args.sweep_mib * KIB * KIB // 4
    src, dst = ctx.randn(n), ctx.zeros(world * n)
    rows = []
    for block in (2048, 4096, 8192, 16384) if args.sweep_launch else ():
        for warps in (4, 8, 16, 32):
            for waves in (1, 2, 4, 8, 0):
                grid = (
                    triton.cdiv(n, block)
                    if waves == 0
                    else min(triton.cdiv(n, block), ctx.get_cu_count() * waves),
                )
                row = {"block": block, "warps": warps, "waves": waves}
                for mode in ("put-one", "get-one"):
                    launch = transfer(ctx, src, dst, n, grid, mode, False, block, warps)
                    row[mode] = n * 4 / time_loop(ctx, launch, 20) / 1e9
                rows.append(row)
                if rank == 0:
                    print(
                        f"block {block:6d} warps {warps:3d} waves {waves} put {row['put-one']:6.1f} "
                        f"get {row['get-one']:6.1f}",
                        flush=True,
                    )
    bases = ctx.get_heap_bases()
    for block, warps, waves in ((4096, 16, 2), (8192, 8, 4), (2048, 32, 0)):
        grid = (
            triton.cdiv(n, block) if waves == 0 else min(triton.cdiv(n, block), ctx.get_cu_count() * waves),
        )
        row = {"block": block, "warps": warps, "waves": waves}
        for mode in ("put-uni", "get-uni"):
            launch = transfer(ctx, src, dst, n, grid, mode, False, block, warps, active=rank == 0)
            row[mode] = n * 4 / time_loop(ctx, launch, 20) / 1e9
        for cache, evict in (("", ""), ("", "evict_first"), (".cs", ""), (".wt", ""), (".cg", "")):
            if True:
                launch = lambda: put_hinted_kernel[grid](
                    src,
                    dst,
                    n,
                    rank,
                    world,
                    bases,
                    CACHE=cache,
                    EVICT=evict,
                    BLOCK=block,
                    num_warps=warps,
                )
                row[f"put{cache}{evict}"] = n * 4 / time_loop(ctx, launch, 20) / 1e9
                launch_uni = lambda: launch() if rank == 0 else None
                row[f"put-uni{cache}{evict}"] = n * 4 / time_loop(ctx, launch_uni, 20) / 1e9
        rows.append(row)
        if rank == 0:
            print(
                json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}),
                flush=True,
            )
    ctx.close()
    return {"world_size": world, "sweep_bytes": n * 4, "sweep": rows}


def check(ctx, mode, dst, n, rank, world) -> bool:
    """Every destination element equals the source it came from."""
    torch.cuda.synchronize()
    ctx.barrier()
    ok = True
    expected_of = (
        lambda owner: torch.randn(  # noqa: E731
            dst.numel() // world,
            generator=torch.Generator(device=ctx.get_device()).manual_seed(owner),
            device=ctx.get_device(),
        )[:n]
    )
    if mode == "put-uni":
        ok = rank != 1 or torch.equal(dst[:n], expected_of(0))
    elif mode == "get-uni":
        ok = rank != 0 or torch.equal(dst[:n], expected_of(1))
    elif mode == "put-one":
        ok = torch.equal(dst[:n], expected_of((rank - 1) % world))
    elif mode == "get-one":
        ok = torch.equal(dst[:n], expected_of((rank + 1) % world))
    else:
        for peer in range(world):
            if peer != rank:
                ok &= torch.equal(dst[peer * n : peer * n + n], expected_of(peer))
    return all_ranks_agree(ok)


TABLE = (
    "put-uni",
    "get-uni",
    "nccl-uni",
    "put-one",
    "get-one",
    "nccl-sendrecv",
    "put-all",
    "get-all",
    "nccl-allgather",
)


def format_row(row) -> str:
    size = row["bytes"]
    label = f"{size // KIB} KiB" if size < KIB * KIB else f"{size // (KIB * KIB)} MiB"
    cells = " ".join(f"{row[m]['GBps']:8.1f}" for m in TABLE)
    ok = all(row[m]["correct"] for m in TABLE if "correct" in row[m])
    return f"{label:>9} {cells}  {'ok' if ok else 'WRONG'}"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-kib", type=int, default=4)
    parser.add_argument("--max-mib", type=int, default=1024)
    parser.add_argument("--block", type=int, default=4096)
    parser.add_argument("--warps", type=int, default=16)
    parser.add_argument("--waves", type=int, default=2, help="programs per SM")
    parser.add_argument("--heap-gib", type=int, default=6)
    parser.add_argument("--out", default=None)
    parser.add_argument("--sweep-mib", type=int, default=0, help="only sweep launch configs at this size")
    parser.add_argument(
        "--sweep-launch", action="store_true", help="with --sweep-mib: also sweep block/warps/grid"
    )
    args = parser.parse_args()
    if iris.BACKEND != "cuda":
        raise SystemExit("this benchmark measures NVLink: run it on GPUs")
    started = time.time()
    if os.environ.get("RANK", "0") == "0":
        header = [
            "size",
            "put-uni",
            "get-uni",
            "nccl-uni",
            "put-one",
            "get-one",
            "nccl-p2p",
            "put-all",
            "get-all",
            "nccl-ag",
        ]
        print(
            "GB/s per rank (max time over ranks)\n"
            + f"{header[0]:>9} "
            + " ".join(f"{h:>8}" for h in header[1:])
        )
    report = sweep(args) if args.sweep_mib else run(args)
    report["seconds"] = round(time.time() - started, 1)
    write_report(report, args.out, report["world_size"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
