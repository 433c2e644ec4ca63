"""Every RMA op between every pair of ranks, across dtypes, with partial masks.

Each rank's data is fresh random values from a generator seeded by (rank, test),
so any rank can recompute what any other rank holds. Outputs start poisoned and
the padding past ``n`` must stay poisoned: masked-off lanes are never written.
"""

import pytest
import torch
import triton
import triton.language as tl

import iris

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64]
N, PAD, BLOCK = 300, 20, 128  # N is not a multiple of BLOCK: the last block is masked


def rank_data(rank: int, salt: int, dtype: torch.dtype, n: int = N) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * salt + rank)
    if dtype.is_floating_point:
        return torch.randn(n, generator=generator).to(dtype)
    return torch.randint(-(2**30), 2**30, (n,), generator=generator, dtype=dtype)


def poison(dtype: torch.dtype):
    return float("nan") if dtype.is_floating_point else -123456


def check_rows(rows: torch.Tensor, expected_rows: list[torch.Tensor], dtype):
    rows = rows.cpu()
    for index, expected in enumerate(expected_rows):
        assert torch.equal(rows[index, :N], expected), f"row {index} differs"
        tail = rows[index, N:]
        assert torch.isnan(tail).all() if dtype.is_floating_point else (tail == -123456).all(), (
            f"row {index}: masked-off lanes were written"
        )


@triton.jit
def load_kernel(source, out, n, row_stride, cur_rank, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    owner = tl.program_id(1)
    mask = offsets < n
    values = iris.load(source + offsets, cur_rank, owner, heap_bases, mask=mask)
    tl.store(out + owner * row_stride + offsets, values, mask=mask)


@triton.jit
def store_kernel(source, rows, n, row_stride, cur_rank, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    target = tl.program_id(1)
    mask = offsets < n
    values = tl.load(source + offsets, mask=mask)
    iris.store(rows + cur_rank * row_stride + offsets, values, cur_rank, target, heap_bases, mask=mask)


@triton.jit
def get_kernel(
    source,
    rows,
    n,
    row_stride,
    cur_rank,
    heap_bases,
    BLOCK: tl.constexpr,
    UPSTREAM_ORDER: tl.constexpr = False,
):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    owner = tl.program_id(1)
    mask = offsets < n
    dst = rows + owner * row_stride + offsets
    if UPSTREAM_ORDER:
        # Upstream Iris's programs pass (cur_rank, peer): the data still comes from the peer.
        iris.get(source + offsets, dst, cur_rank, owner, heap_bases, mask=mask)
    else:
        iris.get(source + offsets, dst, owner, cur_rank, heap_bases, mask=mask)


@triton.jit
def put_kernel(source, rows, n, row_stride, cur_rank, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    target = tl.program_id(1)
    mask = offsets < n
    iris.put(
        source + offsets, rows + cur_rank * row_stride + offsets, cur_rank, target, heap_bases, mask=mask
    )


@triton.jit
def copy_kernel(source, rows, n, row_stride, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    # Third-party copy: move rank (cur+1)'s source into rank (cur+2)'s row `cur`.
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    from_rank = (cur_rank + 1) % world_size
    to_rank = (cur_rank + 2) % world_size
    iris.copy(
        source + offsets,
        rows + cur_rank * row_stride + offsets,
        from_rank,
        to_rank,
        cur_rank,
        heap_bases,
        mask=mask,
    )


@triton.jit
def load_other_kernel(source, out, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    values = iris.load(source + offsets, cur_rank, peer, heap_bases, mask=offsets < n, other=-1)
    tl.store(out + offsets, values)


@triton.jit
def upstream_keywords_kernel(source, out, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    # Upstream Iris's newer keyword arguments: cache modifiers, volatile, other, hint.
    offsets = tl.arange(0, BLOCK)
    mask = offsets < n
    loaded = iris.load(
        source + offsets, cur_rank, peer, heap_bases, mask=mask, other=-1, cache_modifier=".cg", hint=16
    )
    tl.store(out + offsets, loaded)
    iris.store(
        out + BLOCK + offsets, loaded, cur_rank, peer, heap_bases, mask=mask, hint=16, cache_modifier=".wt"
    )
    iris.get(
        source + offsets,
        out + 2 * BLOCK + offsets,
        peer,
        cur_rank,
        heap_bases,
        mask=mask,
        other=0,
        load_cache_modifier=".cg",
        store_cache_modifier=".wb",
        hint=16,
    )
    iris.put(source + offsets, out + 3 * BLOCK + offsets, cur_rank, peer, heap_bases, mask=mask, hint=16)
    iris.copy(
        source + offsets, out + 4 * BLOCK + offsets, peer, peer, cur_rank, heap_bases, mask=mask, hint=16
    )
    volatile = iris.load(source + offsets, cur_rank, cur_rank, heap_bases, mask=mask, other=-1, volatile=True)
    tl.store(out + 5 * BLOCK + offsets, volatile)
    iris.atomic_add(out + 6 * BLOCK + offsets, 1, cur_rank, peer, heap_bases, mask=mask, hint=16)


def _upstream_keywords_body(rank, world_size):
    block, n = 64, 40
    peer, sender = (rank + 1) % world_size, (rank - 1) % world_size
    with iris.iris(1 << 22) as ctx:
        source = ctx.empty(block, dtype=torch.int32)
        source.copy_(rank_data(rank, 4, torch.int32, block))
        out = ctx.full((7, block), -7, dtype=torch.int32)
        out[6].zero_()
        ctx.barrier()
        upstream_keywords_kernel[(1,)](source, out, n, rank, peer, ctx.get_heap_bases(), BLOCK=block)
        ctx.barrier()
        out = out.cpu()
        mine, peers, senders = (rank_data(r, 4, torch.int32, block)[:n] for r in (rank, peer, sender))
        assert torch.equal(out[0, :n], peers) and (out[0, n:] == -1).all()  # loaded, other=-1 past n
        assert torch.equal(out[1, :n], rank_data((sender + 1) % world_size, 4, torch.int32, block)[:n])
        assert torch.equal(out[2, :n], peers) and (out[2, n:] == -7).all()  # get leaves masked lanes
        assert torch.equal(out[3, :n], senders) and (out[3, n:] == -7).all()
        assert torch.equal(out[4, :n], rank_data((sender + 1) % world_size, 4, torch.int32, block)[:n])
        assert torch.equal(out[5, :n], mine) and (out[5, n:] == -1).all()
        assert (out[6, :n] == 1).all() and (out[6, n:] == 0).all()
        ctx.barrier()


def _setup(ctx, rank, world_size, dtype, salt):
    source = ctx.empty(N, dtype=dtype)
    source.copy_(rank_data(rank, salt, dtype))
    rows = ctx.full((world_size, N + PAD), poison(dtype), dtype=dtype)
    ctx.barrier()
    return source, rows


def _pull_body(rank, world_size, kernel_name, dtype_name):
    dtype = getattr(torch, dtype_name)
    kernel = {"load": load_kernel, "get": get_kernel, "get_upstream_order": get_kernel}[kernel_name]
    order = {"UPSTREAM_ORDER": True} if kernel_name == "get_upstream_order" else {}
    with iris.iris(1 << 22) as ctx:
        source, rows = _setup(ctx, rank, world_size, dtype, salt=1)
        grid = (triton.cdiv(N, BLOCK), world_size)
        kernel[grid](source, rows, N, N + PAD, rank, ctx.get_heap_bases(), BLOCK=BLOCK, **order)
        ctx.barrier()
        check_rows(rows, [rank_data(owner, 1, dtype) for owner in range(world_size)], dtype)


def _push_body(rank, world_size, kernel_name, dtype_name):
    dtype = getattr(torch, dtype_name)
    kernel = {"store": store_kernel, "put": put_kernel}[kernel_name]
    with iris.iris(1 << 22) as ctx:
        source, rows = _setup(ctx, rank, world_size, dtype, salt=2)
        grid = (triton.cdiv(N, BLOCK), world_size)
        kernel[grid](source, rows, N, N + PAD, rank, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.barrier()
        check_rows(rows, [rank_data(writer, 2, dtype) for writer in range(world_size)], dtype)


def _copy_body(rank, world_size, dtype_name):
    dtype = getattr(torch, dtype_name)
    with iris.iris(1 << 22) as ctx:
        source, rows = _setup(ctx, rank, world_size, dtype, salt=3)
        copy_kernel[(triton.cdiv(N, BLOCK),)](
            source, rows, N, N + PAD, rank, world_size, ctx.get_heap_bases(), BLOCK=BLOCK
        )
        ctx.barrier()
        # Row c on this rank was filled by caller c with (c+1)'s data when c+2 == rank.
        for caller in range(world_size):
            row = rows[caller].cpu()
            if (caller + 2) % world_size == rank:
                assert torch.equal(row[:N], rank_data((caller + 1) % world_size, 3, dtype))
            else:
                assert torch.isnan(row).all() if dtype.is_floating_point else (row == -123456).all()


def _load_other_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        source = ctx.arange(64, dtype=torch.int32)
        out = ctx.zeros(64, dtype=torch.int32)
        ctx.barrier()
        load_other_kernel[(1,)](
            source, out, 40, rank, (rank + 1) % world_size, ctx.get_heap_bases(), BLOCK=64
        )
        expected = torch.cat([torch.arange(40, dtype=torch.int32), torch.full((24,), -1, dtype=torch.int32)])
        assert torch.equal(out.cpu(), expected)
        ctx.barrier()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["load", "get"])
def test_pull_ops_read_every_rank(world, op, dtype):
    world.run(_pull_body, op, str(dtype).split(".")[1])


def test_get_reads_the_peer_in_either_rank_order(world):
    world.run(_pull_body, "get_upstream_order", "float32")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["store", "put"])
def test_push_ops_write_every_rank(world, op, dtype):
    world.run(_push_body, op, str(dtype).split(".")[1])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.int64], ids=str)
def test_copy_between_two_other_ranks(world, dtype):
    world.run(_copy_body, str(dtype).split(".")[1])


def test_upstream_keyword_arguments_give_the_same_results(world):
    world.run(_upstream_keywords_body)


def test_load_fills_masked_lanes_with_other(world):
    world.run(_load_other_body)
