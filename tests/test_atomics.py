"""Atomics from every rank onto every rank at once; every total is checked exactly."""

import pytest
import torch
import triton
import triton.language as tl

import iris

PROGRAMS, ITERS, SLOTS = 4, 8, 64


@triton.jit
def add_everywhere(
    counters, slots, iters, cur_rank, world_size, heap_bases, SUB: tl.constexpr, BLOCK: tl.constexpr
):
    offsets = tl.arange(0, BLOCK)
    mask = offsets < slots
    for _ in range(iters):
        for target in range(world_size):
            if SUB:
                iris.atomic_sub(counters + offsets, 1, cur_rank, target, heap_bases, mask=mask)
            else:
                iris.atomic_add(counters + offsets, 1, cur_rank, target, heap_bases, mask=mask)


@triton.jit
def bitwise_kernel(words, cur_rank, world_size, heap_bases):
    bit = 1 << cur_rank
    for target in range(world_size):
        iris.atomic_or(words + 0, bit, cur_rank, target, heap_bases)
        iris.atomic_and(words + 1, ~bit, cur_rank, target, heap_bases)
        iris.atomic_xor(words + 2, bit, cur_rank, target, heap_bases)
        iris.atomic_xor(words + 3, bit, cur_rank, target, heap_bases)
        iris.atomic_xor(words + 3, bit, cur_rank, target, heap_bases)


@triton.jit
def minmax_kernel(values, cur_rank, world_size, heap_bases):
    for target in range(world_size):
        iris.atomic_max(values + 0, cur_rank * 10 - 7, cur_rank, target, heap_bases)
        iris.atomic_min(values + 1, cur_rank * 10 - 7, cur_rank, target, heap_bases)


@triton.jit
def xchg_kernel(slot, replaced, cur_rank, heap_bases):
    old = iris.atomic_xchg(slot, cur_rank, cur_rank, 0, heap_bases)
    tl.store(replaced, old)


@triton.jit
def locked_increment(lock, counter, iters, cur_rank, heap_bases):
    # A spin lock on rank 0 protects a plain (non-atomic) read-modify-write there.
    for _ in range(iters):
        while iris.atomic_cas(lock, 0, 1, cur_rank, 0, heap_bases, sem="acquire") != 0:
            pass
        value = iris.load(counter, cur_rank, 0, heap_bases)
        iris.store(counter, value + 1, cur_rank, 0, heap_bases)
        iris.atomic_xchg(lock, 0, cur_rank, 0, heap_bases, sem="release")


def _add_body(rank, world_size, dtype_name, sub):
    dtype = getattr(torch, dtype_name)
    start = PROGRAMS * ITERS * world_size if sub else 0
    with iris.iris(1 << 20) as ctx:
        counters = ctx.full((SLOTS,), start, dtype=dtype)
        ctx.barrier()
        add_everywhere[(PROGRAMS,)](
            counters, SLOTS, ITERS, rank, world_size, ctx.get_heap_bases(), SUB=sub, BLOCK=SLOTS
        )
        ctx.barrier()
        expected = 0 if sub else PROGRAMS * ITERS * world_size
        assert torch.equal(counters.cpu(), torch.full((SLOTS,), expected, dtype=dtype)), counters[:4]


def _bitwise_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        words = ctx.zeros(4, dtype=torch.int32)
        words[1] = -1
        ctx.barrier()
        bitwise_kernel[(1,)](words, rank, world_size, ctx.get_heap_bases())
        ctx.barrier()
        everyone = (1 << world_size) - 1
        assert words.cpu().tolist() == [everyone, -1 & ~everyone, everyone, 0]


def _minmax_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        values = ctx.zeros(2, dtype=torch.int64)
        values[0], values[1] = -(2**40), 2**40
        ctx.barrier()
        minmax_kernel[(1,)](values, rank, world_size, ctx.get_heap_bases())
        ctx.barrier()
        assert values.cpu().tolist() == [(world_size - 1) * 10 - 7, -7]


def _xchg_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        slot = ctx.full((1,), -1, dtype=torch.int32)
        replaced = ctx.full((1,), -2, dtype=torch.int32)
        ctx.barrier()
        xchg_kernel[(1,)](slot, replaced, rank, ctx.get_heap_bases())
        ctx.barrier()
        return int(replaced.item()), int(slot.item())


def _cas_lock_body(rank, world_size, iters):
    with iris.iris(1 << 20) as ctx:
        lock = ctx.zeros(1, dtype=torch.int32)
        counter = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        locked_increment[(1,)](lock, counter, iters, rank, ctx.get_heap_bases())
        ctx.barrier()
        return int(counter.item())


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32], ids=str)
def test_atomic_add_under_contention_is_exact(world, dtype):
    world.run(_add_body, str(dtype).split(".")[1], False)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_atomic_sub_under_contention_is_exact(world, dtype):
    world.run(_add_body, str(dtype).split(".")[1], True)


def test_bitwise_atomics_combine_every_rank(world):
    world.run(_bitwise_body)


def test_min_max_see_every_rank(world):
    world.run(_minmax_body)


def test_xchg_chain_loses_no_value(world):
    results = world.run(_xchg_body)
    final = results[0][1]
    olds = [old for old, _ in results]
    assert sorted(olds + [final]) == [-1, *range(world.world_size)]


def test_cas_spin_lock_gives_mutual_exclusion(world):
    iters = 20
    counts = world.run(_cas_lock_body, iters)
    assert counts[0] == iters * world.world_size
