"""Stress: atomics on shared addresses with exact totals, long message passing checked every round,
and repeated heap set-up and tear-down without leaks.

The full sizes (10^6 atomics per rank, 10^4 rounds) run on GPUs. The interpreter is
about 10^5 times slower, so under emulation the counts are scaled down
(``IRIS_STRESS_SCALE`` overrides the scale on either backend).
"""

import gc
import os
import threading

import torch
import triton
import triton.language as tl

import iris

SCALE = float(os.environ.get("IRIS_STRESS_SCALE", "1" if iris.BACKEND == "cuda" else "0.0001"))
ADDRESSES = 4


@triton.jit
def hammer_kernel(counters, iterations, cur_rank, world_size, heap_bases, ADDRESSES: tl.constexpr):
    # Every program of every rank adds to the same few words of every rank.
    for i in range(iterations):
        for j in range(world_size):
            peer = (cur_rank + j) % world_size
            iris.atomic_add(counters + i % ADDRESSES, 1, cur_rank, peer, heap_bases)


def _atomics_body(rank, world_size, programs, iterations):
    with iris.iris(1 << 20) as ctx:
        counters = ctx.zeros(ADDRESSES, dtype=torch.int64)
        ctx.barrier()
        hammer_kernel[(programs,)](
            counters, iterations, rank, world_size, ctx.get_heap_bases(), ADDRESSES=ADDRESSES
        )
        ctx.barrier()
        per_address = world_size * programs * (iterations // ADDRESSES)
        assert counters.cpu().tolist() == [per_address] * ADDRESSES, counters.cpu().tolist()
        return programs * iterations * world_size


def test_atomics_on_the_same_addresses_of_every_peer_have_exact_totals(multi_world):
    world_size = multi_world.world_size
    # 10^6 operations issued per rank at full scale.
    programs = 128 if SCALE >= 1 else 2
    iterations = max(ADDRESSES, int(10**6 * SCALE) // (programs * world_size) // ADDRESSES * ADDRESSES)
    if SCALE >= 1:
        iterations = -(-(10**6) // (programs * world_size * ADDRESSES)) * ADDRESSES
    issued = multi_world.run(_atomics_body, programs, iterations)
    if SCALE >= 1:
        assert min(issued) >= 10**6


@triton.jit
def message_kernel(
    inbox, ready, ack, errors, rounds, n, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr
):
    # Each round: wait until the next rank consumed the last message, put a round-stamped
    # message into it, signal; receive from the previous rank and check every element.
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    nxt = (cur_rank + 1) % world_size
    prv = (cur_rank + world_size - 1) % world_size
    bad = tl.zeros([], tl.int32)
    for step in range(rounds):
        iris.wait_until(ack, "ge", step, heap_bases=heap_bases)
        message = (step * 7919 + cur_rank * 104729 + offsets).to(tl.int32)
        iris.store(inbox + offsets, message, cur_rank, nxt, heap_bases, mask=mask)
        iris.signal(ready, step + 1, cur_rank, nxt, heap_bases)
        iris.wait_until(ready, "ge", step + 1, heap_bases=heap_bases)
        got = tl.load(inbox + offsets, mask=mask, other=0)
        want = (step * 7919 + prv * 104729 + offsets).to(tl.int32)
        bad += tl.sum(((got != want) & mask).to(tl.int32))
        iris.signal(ack, step + 1, cur_rank, prv, heap_bases)
    tl.store(errors, bad)


#: Rounds when ranks share a GPU: each round then waits for time slices (milliseconds).
SHARED_GPU_ROUNDS = 300


def _messages_body(rank, world_size, rounds):
    with iris.iris(1 << 20) as ctx:
        if ctx.gpu_shared:
            rounds = min(rounds, SHARED_GPU_ROUNDS)
        n = 256
        inbox = ctx.zeros(n, dtype=torch.int32)
        ready = ctx.zeros(1, dtype=torch.int32)
        ack = ctx.zeros(1, dtype=torch.int32)
        errors = ctx.full((1,), -1, dtype=torch.int32)
        ctx.barrier()
        message_kernel[(1,)](
            inbox, ready, ack, errors, rounds, n, rank, world_size, ctx.get_heap_bases(), BLOCK=n
        )
        ctx.barrier()
        assert errors.item() == 0, f"{errors.item()} elements arrived wrong over {rounds} rounds"
        assert ready.item() == rounds and ack.item() == rounds
        prv = (rank - 1) % world_size
        expected = (rounds - 1) * 7919 + prv * 104729 + torch.arange(n)
        assert torch.equal(inbox.cpu(), expected.to(torch.int32))


def test_message_passing_checks_data_every_round(multi_world):
    rounds = max(20, int(10**4 * SCALE * 20)) if SCALE < 1 else 10**4
    multi_world.run(_messages_body, rounds)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _device_used_by_me() -> int | None:
    """Bytes of GPU memory this process holds (NVML), or None where that cannot be read.

    Not the device's free memory: other processes (ranks sharing the GPU, other test
    workers) allocate on it at the same time, so only a per-process figure shows a leak.
    """
    if iris.BACKEND != "cuda":
        return 0
    try:
        import pynvml
    except ImportError:
        return None
    torch.cuda.synchronize()
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(0).uuid}")
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - no NVML access here: no per-process figure
        return None
    mine = [p.usedGpuMemory for p in processes if p.pid == os.getpid() and p.usedGpuMemory is not None]
    return sum(mine) if mine else None


def _init_teardown_body(rank, world_size, cycles):
    heap = 64 << 20

    files = []  # every file a context made: its flight file, and its heap file under emulation

    def cycle():
        ctx = iris.iris(heap)
        x = ctx.ones(1024)
        ctx.device_barrier()
        assert x.sum().item() == 1024
        files.append(ctx.hang.recorder.path)
        if isinstance(ctx.heap._allocation.handle, str):
            files.append(ctx.heap._allocation.handle)
        ctx.close()
        del ctx, x
        gc.collect()

    cycle()  # first use loads libraries, compiles kernels and creates lasting fds (signal pipe)
    fds, threads, used = _open_fds(), threading.active_count(), _device_used_by_me()
    for _ in range(cycles):
        cycle()
    assert _open_fds() == fds, f"file descriptors: {fds} before, {_open_fds()} after {cycles} cycles"
    assert threading.active_count() == threads, "a watchdog thread outlived its context"
    left = [path for path in files if os.path.exists(path)]
    assert not left, f"files left behind: {left}"
    if iris.BACKEND == "cuda" and used is not None:
        # The heap (64 MiB) is cudaMalloc'ed per cycle: any leak of it shows.
        after = _device_used_by_me()
        assert after is not None and after <= used + (8 << 20), (
            f"device memory: {used} used before, {after} after"
        )


def test_repeated_init_and_teardown_leak_nothing(world):
    world.run(_init_teardown_body, 20 if iris.BACKEND == "cuda" else 4)
