"""Create, use and drop a context N times; print what the device holds after each round.

Dropping the last reference to a context must give back its heap, the peers' mappings,
its flight file and its watchdog, with no ``close()`` (upstream Iris's tests build an
8 GiB context per test and drop it so). Run it on every rank:

    python -m iris.run -n 2 scripts/context_rounds.py --rounds 6 --heap-gib 8
    python -m iris.run -n 2 scripts/context_rounds.py --close     # the same, with close()

Each rank prints one line per round: the device memory in use (GPUs: ``cudaMemGetInfo``;
emulation: this process's resident memory) and the threads and Iris files it holds. The
last line says whether memory came back to within 1% of the first round's.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading

import torch

import iris


def _memory_in_use(device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        free, total = torch.cuda.mem_get_info(device)
        return total - free
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--heap-gib", type=float, default=1.0, help="heap per rank, GiB")
    parser.add_argument("--close", action="store_true", help="call ctx.close() instead of dropping")
    options = parser.parse_args()
    heap_bytes = int(options.heap_gib * (1 << 30))
    hang_dir = iris.config.hang_dir()
    used = []
    rank = None
    for round_index in range(options.rounds):
        ctx = iris.iris(heap_bytes)
        rank, device = ctx.get_rank(), ctx.get_device()
        data = ctx.ones(min(heap_bytes // 2, 1 << 30) // 4, dtype=torch.float32)  # touch the heap
        ctx.tracing.enable(max_events=1 << 16)
        out = ctx.zeros(1 << 16, dtype=torch.float32)
        ctx.ccl.all_reduce(out, ctx.ones(1 << 16, dtype=torch.float32))
        ctx.barrier()
        assert float(out[0]) == ctx.get_num_ranks(), float(out[0])
        if options.close:
            ctx.close()
        del data, out, ctx
        gc.collect()
        in_use = _memory_in_use(device)
        used.append(in_use)
        files = [f for f in os.listdir(hang_dir) if f.startswith("iris-flight-")]
        print(
            f"rank {rank} round {round_index}: {in_use / (1 << 30):.2f} GiB in use on {device}, "
            f"{threading.active_count()} thread(s), {len(files)} live flight file(s)",
            flush=True,
        )
    back = used[-1] <= used[0] * 1.01
    verdict = "memory back within 1%" if back else "MEMORY NOT GIVEN BACK"
    first, last = used[0] / (1 << 30), used[-1] / (1 << 30)
    status = "OK" if back else "FAILED"
    print(f"rank {rank}: context_rounds {status}: {verdict} (first {first:.2f} GiB, last {last:.2f} GiB)")
    return 0 if back else 1


if __name__ == "__main__":
    sys.exit(main())
