"""The cross-node path of every device op, exercised where no second node exists.

``IRIS_CROSS_NODE_ALWAYS=1`` routes every op through the cross-node path, to the
calling rank itself included, so one rank checks it: under emulation the model of
NVSHMEM's completion rule, on a GPU NVSHMEM itself (one rank on one GPU, the most
NVSHMEM allows there). Results are checked element by element against torch.
"""

import pytest
import torch
import triton
import triton.language as tl
from conftest import get_pool

import iris
from iris.device import crossnode
from iris_trace import schema

BLOCK = 16
LIVE = 11  # elements BLOCK - LIVE .. are masked off everywhere
CTAS = 4
ROUNDS = 8


def _pool():
    return get_pool(1, IRIS_CROSS_NODE_ALWAYS="1")


@triton.jit
def _rma_kernel(
    f32,
    f32_out,
    bf16,
    bf16_out,
    i8,
    i8_out,
    i64,
    i64_out,
    heap_bases,
    BLOCK: tl.constexpr,
    LIVE: tl.constexpr,
):
    offs = tl.arange(0, BLOCK)
    live = offs < LIVE
    # put: a 32-, 16-, 8- and 64-bit block each, to this rank's second half
    iris.put(f32 + offs, f32 + BLOCK + offs, 0, 0, heap_bases, mask=live)
    iris.put(bf16 + offs, bf16 + BLOCK + offs, 0, 0, heap_bases, mask=live)
    iris.put(i8 + offs, i8 + BLOCK + offs, 0, 0, heap_bases, mask=live)
    iris.store(i64 + BLOCK + offs, tl.load(i64 + offs), 0, 0, heap_bases, mask=live)
    iris.fence()
    # get and load back, masked-off elements read ``other``
    iris.get(f32 + BLOCK + offs, f32_out + offs, 0, 0, heap_bases, mask=live, other=-1.0)
    iris.get(bf16 + BLOCK + offs, bf16_out + offs, 0, 0, heap_bases, mask=live, other=-1.0)
    iris.get(i8 + BLOCK + offs, i8_out + offs, 0, 0, heap_bases, mask=live, other=-1)
    tl.store(i64_out + offs, iris.load(i64 + BLOCK + offs, 0, 0, heap_bases, mask=live, other=-1))


def _rma_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        if iris.BACKEND == "cuda":
            assert type(ctx.backend).__name__ == "NvshmemBackend"
        g = torch.Generator().manual_seed(7)
        tensors = {}
        for name, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            tensors[name] = ctx.full((2 * BLOCK,), -7, dtype=dtype)
            tensors[name][:BLOCK] = torch.randn(BLOCK, generator=g).to(dtype)
        for name, dtype, high in (("i8", torch.int8, 100), ("i64", torch.int64, 1 << 60)):
            tensors[name] = ctx.full((2 * BLOCK,), -7, dtype=dtype)
            tensors[name][:BLOCK] = torch.randint(-high, high, (BLOCK,), generator=g, dtype=dtype)
        outs = {name: ctx.full((BLOCK,), 99, dtype=t.dtype) for name, t in tensors.items()}
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.barrier()
        args = [x for name in ("f32", "bf16", "i8", "i64") for x in (tensors[name], outs[name])]
        _rma_kernel[(1,)](*args, ctx.get_heap_bases(), BLOCK=BLOCK, LIVE=LIVE)
        ctx.barrier()
        for name, t in tensors.items():
            written = t[:BLOCK].clone()
            written[LIVE:] = -7
            assert torch.equal(t[BLOCK:].cpu(), written.cpu()), (name, t)
            read = written.clone()
            read[LIVE:] = -1 if name == "i64" else 99  # iris.load returns ``other``; iris.get skips
            assert torch.equal(outs[name].cpu(), read.cpu()), (name, outs[name])
        events = ctx.tracing.events()
        assert len(events) and (events["path"] == schema.PATH_CROSS_NODE).all(), events


@triton.jit
def _atomics_kernel(
    counts,
    floats,
    words,
    block_f32,
    block_i32,
    out,
    heap_bases,
    ROUNDS: tl.constexpr,
    BLOCK: tl.constexpr,
    LIVE: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    live = offs < LIVE
    for _ in range(ROUNDS):
        iris.atomic_add(counts, 1, 0, 0, heap_bases)  # native fetch-add, every CTA
        iris.atomic_add(counts + 1, 3, 0, 0, heap_bases, sem="relaxed")
        iris.atomic_add(floats, 0.5, 0, 0, heap_bases)  # compare-and-swap loop
        iris.atomic_max(counts + 2, pid * 10 + 5, 0, 0, heap_bases)
        iris.atomic_min(floats + 1, -1.5 * pid, 0, 0, heap_bases)
    iris.atomic_or(words, 1 << pid, 0, 0, heap_bases)
    iris.atomic_xor(words + 1, 1 << pid, 0, 0, heap_bases)
    iris.atomic_and(words + 2, ~(1 << pid), 0, 0, heap_bases)
    # block atomics: one element after another, masked-off elements untouched
    iris.atomic_add(block_f32 + offs, offs.to(tl.float32) + 0.25, 0, 0, heap_bases, mask=live)
    iris.atomic_add(block_i32 + offs, offs + 1, 0, 0, heap_bases, mask=live)
    if pid == 0:
        old = iris.atomic_cas(words + 3, 0, 42, 0, 0, heap_bases)
        again = iris.atomic_cas(words + 3, 0, 7, 0, 0, heap_bases)
        swapped = iris.atomic_xchg(counts + 3, 9, 0, 0, heap_bases)
        tl.store(out, old)
        tl.store(out + 1, again)
        tl.store(out + 2, swapped)


def _atomics_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        counts = ctx.zeros(4, dtype=torch.int64)
        counts[3] = 77
        floats = ctx.zeros(2, dtype=torch.float32)
        words = ctx.zeros(4, dtype=torch.int32)
        words[2] = -1
        block_f32 = ctx.full((BLOCK,), 1.0, dtype=torch.float32)
        block_i32 = ctx.full((BLOCK,), 5, dtype=torch.int32)
        out = ctx.full((3,), -1, dtype=torch.int64)
        ctx.barrier()
        tensors = (counts, floats, words, block_f32, block_i32, out)
        _atomics_kernel[(CTAS,)](*tensors, ctx.get_heap_bases(), ROUNDS=ROUNDS, BLOCK=BLOCK, LIVE=LIVE)
        ctx.barrier()
        calls = CTAS * ROUNDS
        expected_counts = [calls, 3 * calls, (CTAS - 1) * 10 + 5, 9]
        assert counts.cpu().tolist() == expected_counts, counts
        assert floats.cpu().tolist() == [0.5 * calls, -1.5 * (CTAS - 1)], floats
        every = (1 << CTAS) - 1
        assert words.cpu().tolist() == [every, every, ~every, 42], words
        index = torch.arange(BLOCK)
        live = index < LIVE
        f32 = torch.where(live, 1.0 + CTAS * (index + 0.25), torch.tensor(1.0))
        i32 = torch.where(live, 5 + CTAS * (index + 1), torch.tensor(5)).to(torch.int32)
        assert torch.equal(block_f32.cpu(), f32), block_f32
        assert torch.equal(block_i32.cpu(), i32), block_i32
        assert out.cpu().tolist() == [0, 42, 77], out


@triton.jit
def _signal_kernel(data, flag, heap_bases, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    # Program 0 writes a round and signals; program 1 waits for the round and checks it.
    offs = tl.arange(0, BLOCK)
    for r in range(ROUNDS):
        if tl.program_id(0) == 0:
            iris.store(data + r * BLOCK + offs, (r * BLOCK + offs).to(tl.int32), 0, 0, heap_bases)
            iris.signal(flag, r + 1, 0, 0, heap_bases)
        else:
            iris.wait_until(flag, "ge", r + 1, heap_bases=heap_bases, from_rank=0)
            seen = iris.load(data + r * BLOCK + offs, 0, 0, heap_bases)
            tl.device_assert(seen == r * BLOCK + offs, "a round's data arrived after its signal")


def _signal_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        data = ctx.zeros(ROUNDS * BLOCK, dtype=torch.int32)
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        _signal_kernel[(2,)](data, flag, ctx.get_heap_bases(), ROUNDS=ROUNDS, BLOCK=BLOCK)
        ctx.barrier()
        assert torch.equal(data.cpu(), torch.arange(ROUNDS * BLOCK, dtype=torch.int32))
        assert flag.item() == ROUNDS


@triton.jit
def _scattered_kernel(src, dst, gathered, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    # Blocks that are not one run go element by element: every other element, reversed.
    iris.put(src + 2 * offs, dst + 2 * offs, 0, 0, heap_bases)
    iris.fence()
    iris.get(dst + (BLOCK - 1 - offs), gathered + offs, 0, 0, heap_bases)
    # A 2-D block of whole rows is one run; with a column mask, a run per row.
    rows = tl.arange(0, 4)[:, None] * (BLOCK // 4) + tl.arange(0, BLOCK // 4)[None, :]
    iris.copy(src + rows, gathered + BLOCK + rows, 0, 0, 0, heap_bases)
    cols = tl.arange(0, BLOCK // 4)[None, :] + tl.zeros([4, 1], tl.int32)
    iris.copy(src + rows, gathered + 2 * BLOCK + rows, 0, 0, 0, heap_bases, mask=cols < 2)
    iris.put(src + rows, gathered + 3 * BLOCK + rows, 0, 0, heap_bases, mask=cols < 2)


def _scattered_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        src = ctx.arange(2 * BLOCK, dtype=torch.float32) + 1
        dst = ctx.full((2 * BLOCK,), -7.0)
        gathered = ctx.full((4 * BLOCK,), -7.0)
        ctx.barrier()
        _scattered_kernel[(1,)](src, dst, gathered, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.barrier()
        expected = torch.full((2 * BLOCK,), -7.0)
        expected[::2] = src.cpu()[::2]
        assert torch.equal(dst.cpu(), expected), dst
        assert torch.equal(gathered[:BLOCK].cpu(), expected[:BLOCK].flip(0)), gathered
        assert torch.equal(gathered[BLOCK : 2 * BLOCK].cpu(), src[:BLOCK].cpu()), gathered
        columns = torch.arange(BLOCK) % (BLOCK // 4) < 2
        partial = torch.where(columns, src[:BLOCK].cpu(), torch.tensor(-7.0))
        assert torch.equal(gathered[2 * BLOCK : 3 * BLOCK].cpu(), partial), gathered
        assert torch.equal(gathered[3 * BLOCK :].cpu(), partial), gathered


@triton.jit
def _staged_kernel(wide, back, heap_bases, BLOCK: tl.constexpr):
    # Each program stores a 4 x BLOCK/4 tile of register values into its rows of a matrix
    # BLOCK/2 wide (a run per row, through a staging slot), masked to 3 columns, then loads
    # the tile back (a run per row again) into ``back``.
    pid = tl.program_id(0)
    rows = 4 * pid + tl.arange(0, 4)[:, None]
    cols = tl.arange(0, BLOCK // 4)[None, :]
    values = (rows * 100 + cols).to(tl.float32)
    iris.store(wide + rows * (BLOCK // 2) + cols, values, 0, 0, heap_bases, mask=cols < 3)
    iris.fence()
    seen = iris.load(wide + rows * (BLOCK // 2) + cols, 0, 0, heap_bases, mask=cols < 3, other=-1.0)
    tl.store(back + rows * (BLOCK // 4) + cols, seen)


def _staged_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        # More programs than staging slots: a slot that was not freed would hang the claim.
        programs = 3 * crossnode.STAGING_SLOTS_PER_SM * ctx.get_cu_count()
        wide = ctx.full((4 * programs, BLOCK // 2), -7.0)
        back = ctx.full((4 * programs, BLOCK // 4), -9.0)
        ctx.barrier()
        _staged_kernel[(programs,)](wide, back, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.barrier()
        rows = torch.arange(4 * programs)[:, None].float()
        cols = torch.arange(BLOCK // 2)[None, :].float()
        expected = torch.where(cols < 3, rows * 100 + cols, torch.tensor(-7.0))
        assert torch.equal(wide.cpu(), expected), wide
        assert torch.equal(
            back.cpu(), torch.where(cols[:, : BLOCK // 4] < 3, expected[:, : BLOCK // 4], -1.0)
        )


BODIES = {
    "rma": _rma_body,
    "atomics": _atomics_body,
    "signal": _signal_body,
    "scattered": _scattered_body,
    "staged": _staged_body,
}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_every_op_takes_the_cross_node_path_to_this_rank(body):
    _pool().run(body)


@triton.jit
def _run_bytes_kernel(base, out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    rows = tl.arange(0, 4)[:, None]
    cols = tl.arange(0, BLOCK // 4)[None, :]
    tile = rows * (BLOCK // 4) + cols  # whole rows: one run
    gapped = rows * (BLOCK // 2) + cols  # rows with a gap between them
    cases = (
        crossnode.run_bytes(base + offs, base + BLOCK + offs),
        crossnode.run_bytes(base + offs, base + BLOCK + offs, offs < 11),
        crossnode.run_bytes(base + offs, base + BLOCK + offs, offs >= 5),
        crossnode.run_bytes(base + 2 * offs, base + 2 * offs),
        crossnode.run_bytes(base + BLOCK - 1 - offs, base + offs),
        crossnode.run_bytes(base + offs, base + 2 * offs),
        crossnode.run_bytes(base + tile, base + BLOCK + tile),
        crossnode.run_bytes(base + tile, base + BLOCK + tile, rows < 3),
        crossnode.run_bytes(base + tile, base + BLOCK + tile, cols < 2),
        crossnode.run_bytes(base + gapped, base + gapped),
        crossnode.run_bytes(base + offs, base + offs, offs < 0),
    )
    for i in tl.static_range(len(cases)):
        nbytes, first_dest, first_source = cases[i]
        tl.store(out + 3 * i, nbytes)
        tl.store(out + 3 * i + 1, first_dest - base.to(tl.int64))
        tl.store(out + 3 * i + 2, first_source - base.to(tl.int64))
    # Row by row: (all rows runs, then each row's bytes) per case, 5 words each.
    by_rows = (
        crossnode.row_runs(base + gapped, base + BLOCK + gapped),
        crossnode.row_runs(base + gapped, base + gapped, cols < 2),
        crossnode.row_runs(base + gapped, base + gapped, rows < 3),
        crossnode.row_runs(base + rows * (BLOCK // 2) + (BLOCK // 4 - 1 - cols), base + gapped),
    )
    for i in tl.static_range(len(by_rows)):
        whole, row_bytes, row_dest, row_source = by_rows[i]
        tl.store(out + 33 + 5 * i, whole.to(tl.int64))
        tl.store(out + 34 + 5 * i + tl.arange(0, 4), row_bytes)


def _run_bytes_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        base = ctx.zeros(4 * BLOCK, dtype=torch.float32)
        out = ctx.full((53,), -1, dtype=torch.int64)
        _run_bytes_kernel[(1,)](base, out, BLOCK=BLOCK)
        return out[:33].view(11, 3).cpu().tolist(), out[33:].view(4, 5).cpu().tolist()


def test_blocks_move_as_runs_only_where_they_are_runs():
    # fp32 elements: 4 bytes. (bytes, first dest, first source, in bytes from base) per case.
    ((cases, by_rows),) = _pool().run(_run_bytes_body)
    whole, prefix, four_rows, three_rows = 4 * BLOCK, 4 * 11, 4 * BLOCK, 3 * BLOCK
    assert [case[0] for case in cases] == [whole, prefix, 0, 0, 0, 0, four_rows, three_rows, 0, 0, 0]
    assert cases[0] == [whole, 0, 4 * BLOCK]
    assert cases[4][1:] == [4 * (BLOCK - 1), 0]  # the first element in the block's order
    row = 4 * (BLOCK // 4)  # a row of the 4 x BLOCK/4 tile, in bytes
    assert by_rows[0] == [1, row, row, row, row]  # a tile of a wider matrix: a run per row
    assert by_rows[1] == [1, 8, 8, 8, 8]  # masked to two columns
    assert by_rows[2] == [1, row, row, row, 0]  # the last row masked off
    assert by_rows[3][0] == 0  # rows reversed: element by element
