"""Upstream Iris's HBM-staged all-gather + GEMM (``iris.ops.all_gather_matmul_hbm_buffer``)."""

import pytest
import torch
import torch.distributed as dist

import iris
import iris.ops as ops
from iris.ops.all_gather_matmul_hbm_buffer import _CHAMPION_CONFIGS, _auto_config

M, N, K_LOCAL = 96, 64, 32
#: 3 M tiles of 32, 2 N tiles of 32, K blocks of 16: two per rank's shard.
CONFIG = dict(block_size_m=32, block_size_n=32, block_size_k=16, group_size_m=2)


def _reference(ctx, a_shard, b, bias=None):
    parts = [torch.empty_like(a_shard) for _ in range(ctx.get_num_ranks())]
    dist.all_gather(parts, a_shard.contiguous())
    want = torch.cat(parts, 1).float() @ b.float()
    return want if bias is None else want + bias.float()[:, None]


def _inputs(ctx, rank, dtype):
    torch.manual_seed(30 + rank)
    a_shard = ctx.randn((M, K_LOCAL), dtype=dtype)
    b = ctx.randn((ctx.get_num_ranks() * K_LOCAL, N), dtype=dtype)
    dist.broadcast(b, 0)
    return a_shard, b


def _error(got, want):
    assert not got.isnan().any(), "some outputs were never written"
    return ((got.float() - want).abs().max() / want.abs().max()).item()


def _gemm_body(rank, world_size, layout, k_per_flag, stages, bias):
    with iris.iris(1 << 24) as ctx:
        a_shard, b = _inputs(ctx, rank, torch.float16)
        bias = torch.randn(M, dtype=torch.float16, device=ctx.device) if bias else None
        out = ctx.full((M, N), float("nan"), dtype=torch.float16)
        cfg = ops.FusedConfig(**CONFIG)
        ws = ops.all_gather_matmul_hbm_buffer_preamble(ctx, a_shard, b, cfg, k_per_flag, layout)
        # Few fetchers, stages of uneven size, a short last band: every fetch order is walked.
        ws = ops.all_gather_matmul_hbm_buffer(
            ctx, out, a_shard, b, bias=bias, config=cfg, workspace=ws, k_per_flag=k_per_flag,
            staged_a_layout=layout, num_fetch_sms=1, num_fetch_stages=stages, first_stage_fetch_sms=2,
        )  # fmt: skip
        assert ws.operation == "all_gather_matmul_hbm_buffer" and ws.variant == f"hbm_buffer_{layout}"
        assert ws.trace_data is None
        return _error(out, _reference(ctx, a_shard, b, bias))


@pytest.mark.parametrize(
    "layout, k_per_flag, stages, bias",
    [("k_contiguous", 1, 1, False), ("m_contiguous", 2, 2, True), ("k_contiguous", 4, 3, False)],
    ids=["k-contiguous", "m-contiguous-bias", "k-contiguous-3-stages"],
)
def test_hbm_buffer_matches_torch(world, layout, k_per_flag, stages, bias):
    if world.world_size * K_LOCAL // 16 % k_per_flag:
        pytest.skip("k_per_flag does not divide this world's K blocks")
    for error in world.run(_gemm_body, layout, k_per_flag, stages, bias):
        assert error < 2e-2


def _reuse_and_trace_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        a_shard, b = _inputs(ctx, rank, torch.bfloat16)
        cfg = ops.FusedConfig(**CONFIG)
        first, second = (ctx.full((M, N), float("nan"), dtype=torch.bfloat16) for _ in range(2))
        ws = ops.all_gather_matmul_hbm_buffer(ctx, first, a_shard, b, config=cfg, k_per_flag=1)
        staged = ws.aux_buffer
        ws = ops.all_gather_matmul_hbm_buffer(ctx, second, a_shard, b, config=cfg, k_per_flag=1, workspace=ws)
        assert ws.aux_buffer is staged, "a matching workspace is reused"
        assert torch.equal(first, second)
        used = ctx.heap.used
        for _ in range(3):  # no workspace: prepared again each time, on the context's buffers
            ops.all_gather_matmul_hbm_buffer(ctx, second, a_shard, b, config=cfg, k_per_flag=1)
        assert ctx.heap.used == used and torch.equal(first, second)
        traced = ops.all_gather_matmul_hbm_buffer(
            ctx, second, a_shard, b, config=cfg, k_per_flag=1, workspace=ws, trace=True, num_fetch_sms=2,
            first_stage_fetch_sms=2,
        )  # fmt: skip
        data = traced.trace_data
        grid = data["grid_size"]
        assert grid == 2 + 3 * 2 and data["start"].shape == (grid,)
        assert (data["end"] >= data["start"]).all() and (data["wait"] >= 0).all()
        return _error(first, _reference(ctx, a_shard, b))


def test_hbm_buffer_reuses_its_workspace_and_reports_program_timings(world):
    for error in world.run(_reuse_and_trace_body):
        assert error < 2e-2


def _errors_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        a_shard, b = _inputs(ctx, rank, torch.float16)
        out = ctx.empty((M, N), dtype=torch.float16)
        cfg = ops.FusedConfig(**CONFIG)
        with pytest.raises(ValueError, match="k_per_flag=3 must divide"):
            ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard, b, config=cfg, k_per_flag=3)
        with pytest.raises(ValueError, match="staged_a_layout"):
            ops.all_gather_matmul_hbm_buffer_preamble(ctx, a_shard, b, cfg, 1, "n_contiguous")
        with pytest.raises(ValueError, match="multiple of block_size_m"):
            ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard, b, config=ops.FusedConfig(block_size_m=64))
        with pytest.raises(ValueError, match="num_fetch_sms must be positive"):
            ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard, b, config=cfg, k_per_flag=1, num_fetch_sms=0)
        with pytest.raises(ValueError, match="fetch_block_m must be positive"):
            ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard, b, config=cfg, k_per_flag=1, fetch_block_m=0)
        with pytest.raises(ValueError, match="inner dims differ"):
            ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard[:, :16], b, config=cfg)
        if world_size > 1:
            outside = torch.randn(M, K_LOCAL, dtype=torch.float16, device=ctx.device)
            with pytest.raises(ValueError, match="on the heap"):
                ops.all_gather_matmul_hbm_buffer(ctx, out, outside, b, config=cfg, k_per_flag=1)


def test_hbm_buffer_says_what_is_wrong(world):
    world.run(_errors_body)


# ---------------------------------------------------------------- upstream's tuning (no ranks)
@pytest.mark.parametrize(
    "M, N, K, world_size",
    [
        (1024, 256, 1024, 8),
        (4096, 3584, 8192, 8),
        (8192, 8192, 16384, 8),
        (16384, 3584, 8192, 4),
        (256, 256, 512, 2),
    ],
)
def test_auto_config_gives_a_k_per_flag_that_divides_the_k_blocks(M, N, K, world_size):
    config, k_per_flag, fetchers, stages, first = _auto_config(M, N, K, world_size)
    assert (K // config.block_size_k) % k_per_flag == 0
    assert min(fetchers, stages, first) > 0


def test_auto_config_takes_upstreams_tuned_entries_and_rules():
    for (M, N, K), tuned in _CHAMPION_CONFIGS.items():
        config, *_ = _auto_config(M, N, K, world_size=8)
        assert (config.block_m, config.block_n, config.block_k, config.group_m) == (
            tuned["bm"], tuned["bn"], tuned["bk"], tuned["gm"],
        )  # fmt: skip
    assert _auto_config(8192, 3584, 8192)[0].block_m == 256
    assert _auto_config(1024, 3584, 8192)[0].block_m == 128
    assert {_auto_config(m, 3584, 8192)[0].block_n for m in (1024, 4096, 16384)} == {256}
