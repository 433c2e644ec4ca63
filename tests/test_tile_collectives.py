"""In-kernel tile collectives (``ctx.all_reduce_one_shot(tile, ...)`` ...), as upstream Iris has them.

Every rank's input is fresh random data seeded by its rank, so each rank can
recompute every peer's; outputs start poisoned (NaN) and every element is checked,
including that tiles a rank does not own stay poisoned.
"""

import pytest
import torch
import triton
import triton.language as tl

import iris

M, N, BM, BN = 40, 48, 16, 16  # 3 x 3 tiles, the last row and column partly masked
PROGRAMS = 4  # fewer programs than tiles: each walks several


def rank_input(rank: int, shape=(M, N), dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(77 + rank)).to(dtype)


@triton.jit
def _tile_of(tile_id, num_n, inp, stride_m, stride_n, rows, cols, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tile_id // num_n
    pid_n = tile_id % num_n
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mask = (rm[:, None] < rows) & (rn[None, :] < cols)
    data = tl.load(inp + rm[:, None] * stride_m + rn[None, :] * stride_n, mask=mask, other=0.0)
    return pid_m, pid_n, data, rm, rn, mask


@triton.jit
def reduce_kernel(
    context, inp, partial, out, locks, rows, cols, stride_m, stride_n,
    rank: tl.constexpr, world_size: tl.constexpr, VARIANT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    ctx = iris.DeviceContext.initialize(context, rank, world_size, tracing=False)
    num_n = tl.cdiv(cols, BN)
    for tile_id in range(tl.program_id(0), tl.cdiv(rows, BM) * num_n, tl.num_programs(0)):
        pid_m, pid_n, data, rm, rn, mask = _tile_of(
            tile_id, num_n, inp, stride_m, stride_n, rows, cols, BM, BN
        )
        tile = iris.Tile(pid_m, pid_n, BM, BN, data)
        src_view = iris.make_tensor_view(partial, rows, cols, stride_m, stride_n)
        dst_view = iris.make_tensor_view(out, rows, cols, stride_m, stride_n)
        if VARIANT == "atomic":
            ctx.all_reduce_atomic(tile, dst_view)
        elif VARIANT == "spinlock":
            ctx.all_reduce_spinlock(tile, dst_view, locks)
        elif VARIANT == "ring":  # no locks: every rank's input was written before the launch
            ctx.all_reduce_ring(tile, iris.make_tensor_view(inp, rows, cols, stride_m, stride_n), dst_view)
        else:
            # Upstream's protocol: publish the partial, then set this rank's ready lock.
            tl.store(partial + rm[:, None] * stride_m + rn[None, :] * stride_n, data, mask=mask)
            tl.debug_barrier()
            tl.atomic_xchg(locks + tile_id, 1, sem="release", scope="sys")
            if VARIANT == "one_shot":
                ctx.all_reduce_one_shot(tile, src_view, dst_view, locks)
            elif VARIANT == "two_shot":
                ctx.all_reduce_two_shot(tile, src_view, dst_view, locks)
            else:
                ctx.reduce_scatter(tile, src_view, dst_view, locks)


def _reduce_body(rank, world_size, variant, dtype):
    with iris.iris(1 << 22) as ctx:
        inp = ctx.zeros(M, N, dtype=dtype)
        inp.copy_(rank_input(rank, dtype=dtype).to(inp.device))
        partial = ctx.full((M, N), float("nan"), dtype=dtype)
        starts_at_zero = variant in ("atomic", "spinlock")
        out = ctx.zeros(M, N, dtype=dtype) if starts_at_zero else ctx.full((M, N), float("nan"), dtype=dtype)
        locks = ctx.zeros(9, dtype=torch.int32)
        ctx.barrier()
        reduce_kernel[(PROGRAMS,)](
            ctx.get_device_context(), inp, partial, out, locks, M, N, N, 1, rank, world_size, variant, BM, BN
        )
        ctx.barrier()
        total = sum(rank_input(r, dtype=dtype).float() for r in range(world_size))
        got = out.cpu().float()
        if variant == "reduce_scatter":
            share = 9 // world_size
            first, last = rank * share, (9 if rank == world_size - 1 else (rank + 1) * share)
            for tile in range(9):
                rows, cols = (
                    slice(tile // 3 * BM, tile // 3 * BM + BM),
                    slice(tile % 3 * BN, tile % 3 * BN + BN),
                )
                if first <= tile < last:
                    torch.testing.assert_close(got[rows, cols], total[rows, cols], rtol=1e-2, atol=1e-2)
                else:
                    assert torch.isnan(got[rows, cols]).all(), (
                        f"tile {tile} is not rank {rank}'s but was written"
                    )
            return
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        torch.testing.assert_close(got, total, rtol=tolerance, atol=tolerance * world_size)


@pytest.mark.parametrize("variant", ["atomic", "spinlock", "ring", "one_shot", "two_shot", "reduce_scatter"])
def test_tile_reductions_match_torch(world, variant):
    world.run(_reduce_body, variant, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tile_one_shot_reduces_half_types(multi_world, dtype):
    multi_world.run(_reduce_body, "one_shot", dtype)


@triton.jit
def move_kernel(
    context, inp, out, rows, cols, in_stride, out_stride, source,
    rank: tl.constexpr, world_size: tl.constexpr, VARIANT: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
):  # fmt: skip
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    if VARIANT == "all_gather" or VARIANT == "all_gather_columns":
        num_n = tl.cdiv(cols, BN)
        for tile_id in range(tl.program_id(0), tl.cdiv(rows, BM) * num_n, tl.num_programs(0)):
            pid_m, pid_n, data, rm, rn, mask = _tile_of(tile_id, num_n, inp, in_stride, 1, rows, cols, BM, BN)
            if VARIANT == "all_gather":
                dst_view = iris.make_tensor_view(out, rows * world_size, cols, out_stride, 1)
                ctx.all_gather(iris.Tile(pid_m, pid_n, BM, BN, data), dst_view, 0)
            else:
                dst_view = iris.make_tensor_view(out, rows, cols * world_size, out_stride, 1)
                ctx.all_gather(iris.Tile(pid_m, pid_n, BM, BN, data), dst_view, 1)
    elif VARIANT == "gather":
        num_n = tl.cdiv(cols, BN)
        for tile_id in range(tl.program_id(0), tl.cdiv(rows, BM) * num_n, tl.num_programs(0)):
            view = iris.TileView(tile_id // num_n, tile_id % num_n, BM, BN)
            src_view = iris.make_tensor_view(inp, rows, cols, in_stride, 1)
            values = ctx.gather(view, src_view, source)
            ptrs, mask = iris.make_tensor_view(out, rows, cols, out_stride, 1).tile_ptr(view)
            tl.store(ptrs, values, mask=mask)
    else:
        # All-to-all: ``cols`` is the whole width, world_size blocks of ``cols // world_size``.
        num_n = tl.cdiv(cols, BN)
        for tile_id in range(tl.program_id(0), tl.cdiv(rows, BM) * num_n, tl.num_programs(0)):
            view = iris.TileView(tile_id // num_n, tile_id % num_n, BM, BN)
            src_view = iris.make_tensor_view(inp, rows, cols, in_stride, 1)
            dst_view = iris.make_tensor_view(out, rows, cols, out_stride, 1)
            ctx.all_to_all(view, src_view, dst_view, cols // world_size)


def _move_body(rank, world_size, variant):
    per_rank = 12  # all_to_all block width: not a multiple of BN, so blocks split tiles
    shape = (M, per_rank * world_size) if variant == "all_to_all" else (M, N)
    with iris.iris(1 << 22) as ctx:
        inp = ctx.zeros(*shape)
        inp.copy_(rank_input(rank, shape).to(inp.device))
        out_rows = M * world_size if variant == "all_gather" else M
        out_cols = shape[1] * world_size if variant == "all_gather_columns" else shape[1]
        out = ctx.full((out_rows, out_cols), float("nan"))
        source = (rank + 1) % world_size
        ctx.barrier()
        move_kernel[(PROGRAMS,)](
            ctx.get_device_context(), inp, out, M, shape[1], shape[1], out_cols, source, rank, world_size,
            variant, BM, BN,
        )  # fmt: skip
        ctx.barrier()
        inputs = [rank_input(r, shape) for r in range(world_size)]
        if variant == "all_gather":
            expected = torch.cat(inputs, dim=0)
        elif variant == "all_gather_columns":
            expected = torch.cat(inputs, dim=1)
        elif variant == "gather":
            expected = inputs[source]
        else:
            blocks = [inputs[s][:, rank * per_rank : (rank + 1) * per_rank] for s in range(world_size)]
            expected = torch.cat(blocks, dim=1)
        assert torch.equal(out.cpu(), expected)


@pytest.mark.parametrize("variant", ["all_gather", "all_gather_columns", "gather", "all_to_all"])
def test_tile_data_movement_matches_torch(world, variant):
    world.run(_move_body, variant)
