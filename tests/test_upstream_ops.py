"""Upstream Iris's fused ops (``iris.ops``) as its programs call them: shapes, config, workspace."""

import pytest
import torch
import torch.distributed as dist

import iris
import iris.ops as ops
from iris.errors import WorkspaceTooSmallError
from iris.ops.workspace import upstream_lock_tiles

M, N, K = 96, 80, 64
#: 3 x 3 tiles of 32 x 32: at 2 and 4 ranks the last rank owns more tiles than the others.
CONFIG = dict(block_size_m=32, block_size_n=32, block_size_k=16)


def _same_everywhere(tensor):
    dist.broadcast(tensor, 0)
    return tensor


def _gathered(tensor, dim):
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts, dim)


def _max_error(got, want):
    """Largest error relative to the largest expected value (float32 dots run as TF32 on GPUs)."""
    assert not got.isnan().any(), "some outputs were never written"
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


# ---------------------------------------------------------------- config (no ranks)
def test_fused_config_takes_upstreams_field_names():
    cfg = ops.FusedConfig(block_size_m=64, block_size_n=32, block_size_k=16, group_size_m=4)
    assert (cfg.block_m, cfg.block_n, cfg.block_k, cfg.group_m) == (64, 32, 16, 4)
    assert (cfg.block_size_m, cfg.block_size_n, cfg.block_size_k, cfg.group_size_m) == (64, 32, 16, 4)
    assert cfg == ops.FusedConfig(block_m=64, block_n=32, block_k=16, group_m=4)
    assert cfg.replace(block_size_m=32).block_m == 32


def test_fused_config_keeps_upstream_only_settings_with_upstreams_defaults():
    cfg = ops.FusedConfig(all_reduce_variant="spinlock", num_xcds=8, allow_tf32=False)
    assert (cfg.all_reduce_variant, cfg.num_xcds, cfg.allow_tf32) == ("spinlock", 8, False)
    default = ops.FusedConfig()
    assert (default.num_sms, default.all_reduce_variant) == (None, "two_shot")
    assert default.cache_modifier_a == ".ca"
    assert cfg.replace(num_sms=64).num_sms == 64 and cfg.replace(num_sms=64).num_xcds == 8
    assert len({cfg, cfg.replace(num_xcds=8), default}) == 2  # hashable, equal by value


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(all_reduce_variant="tree"), "all_reduce_variant"),
        (dict(num_xcds=0), "num_xcds"),
        (dict(num_sms=-1), "num_sms"),
        (dict(all_reduce_num_rings=0), "all_reduce_num_rings"),
    ],
    ids=["variant", "xcds", "sms", "rings"],
)
def test_fused_config_refuses_what_upstream_validate_refuses(settings, message):
    with pytest.raises(ValueError, match=message):
        ops.FusedConfig(**settings)


def test_fused_config_validate_applies_upstreams_ring_rule():
    ring = ops.FusedConfig(block_size_n=32, all_reduce_variant="ring")
    ring.validate(world_size=4)
    with pytest.raises(ValueError, match="divisible"):
        ring.validate(world_size=3)


def test_fused_config_refuses_both_names_of_one_field():
    with pytest.raises(TypeError, match="block_size_m and block_m"):
        ops.FusedConfig(block_m=64, block_size_m=64)


# ---------------------------------------------------------------- all_gather_matmul by columns
def _column_gather_body(rank, world_size, dtype_name, form, k_local=None):
    dtype = getattr(torch, dtype_name)
    k_local = k_local or K // world_size
    with iris.iris(1 << 24) as ctx:
        torch.manual_seed(10 + rank)
        a_shard = ctx.randn((M, k_local), dtype=dtype)
        b = _same_everywhere(ctx.randn((world_size * k_local, N), dtype=dtype))
        bias = torch.randn(M, dtype=dtype, device=ctx.device)
        out = ctx.full((M, N), float("nan"), dtype=dtype)
        cfg = ops.FusedConfig(**CONFIG)
        if form == "module":
            ws = ops.all_gather_matmul(ctx, out, a_shard, b, bias=bias, config=cfg)
            assert ws.operation == "all_gather_matmul" and ws.shape == (M, N, b.shape[0]) and ws.prepared
        else:
            ctx.ops.all_gather_matmul(out, a_shard, b, bias, config=cfg)  # bias positional, as upstream
        want = _gathered(a_shard.float(), 1) @ b.float() + bias.float()[:, None]
        return _max_error(out, want)


@pytest.mark.parametrize("form", ["module", "method"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_all_gather_matmul_gathers_columns_as_upstream(world, dtype, form):
    tolerance = 1e-2 if dtype == "float32" else 5e-2
    for error in world.run(_column_gather_body, dtype, form):
        assert error < tolerance


def test_all_gather_matmul_by_columns_masks_a_ragged_last_k_step(world):
    # 24 columns per rank in steps of 16: every shard, the peers' too, ends in a half step.
    for error in world.run(_column_gather_body, "float32", "method", 24):
        assert error < 1e-2


def _column_gather_errors_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        b = ctx.randn((K, N))
        out = ctx.empty((M, N))
        with pytest.raises(ValueError, match="world_size \\* K_local"):
            ops.all_gather_matmul(ctx, out, ctx.randn((M, K // world_size + 1)), b)
        if world_size > 1:
            with pytest.raises(ValueError, match="symmetric heap"):
                ctx.ops.all_gather_matmul(out, torch.randn(M, K // world_size, device=ctx.device), b)
            with pytest.raises(ValueError, match="fused only"):
                cfg = ops.FusedConfig(variant="unfused", **CONFIG)
                ctx.ops.all_gather_matmul(out, ctx.randn((M, K // world_size)), b, config=cfg)
            with pytest.raises(ValueError, match="bias must have"):
                ctx.ops.all_gather_matmul(
                    out, ctx.randn((M, K // world_size)), b, bias=torch.zeros(N, device=ctx.device)
                )


def test_all_gather_matmul_by_columns_says_what_is_wrong(world):
    world.run(_column_gather_errors_body)


# ---------------------------------------------------------------- matmul_reduce_scatter by tiles
def _owned_tiles(rank, world_size, block_m, block_n, device):
    tiles_n = -(-N // block_n)
    total = -(-M // block_m) * tiles_n
    share = total // world_size
    last = total if rank == world_size - 1 else (rank + 1) * share
    owned = torch.zeros(M, N, dtype=torch.bool, device=device)
    for t in range(rank * share, last):
        pid_m, pid_n = divmod(t, tiles_n)
        owned[pid_m * block_m : (pid_m + 1) * block_m, pid_n * block_n : (pid_n + 1) * block_n] = True
    return owned


def _tile_scatter_body(rank, world_size, form):
    with iris.iris(1 << 24) as ctx:
        torch.manual_seed(20 + rank)
        a, b = ctx.randn((M, K)), ctx.randn((K, N))
        out = ctx.full((M, N), float("nan"))
        cfg = ops.FusedConfig(**CONFIG)
        errors = []
        for _ in range(2):  # a second call reuses the locks and partials
            if form == "module":
                ws = ops.matmul_reduce_scatter_preamble(ctx, out, a, b, config=cfg)
                ops.matmul_reduce_scatter(ctx, out, a, b, config=cfg, workspace=ws)
            else:
                ctx.ops.matmul_reduce_scatter(out, a, b, config=cfg)
            total = a @ b
            dist.all_reduce(total)
            want = torch.where(_owned_tiles(rank, world_size, 32, 32, out.device), total, 0.0)
            errors.append(_max_error(out, want))
            a.copy_(torch.randn(M, K, device=a.device))
            ctx.barrier()
        return max(errors)


@pytest.mark.parametrize("form", ["module", "method"])
def test_matmul_reduce_scatter_keeps_each_ranks_tiles_as_upstream(world, form):
    for error in world.run(_tile_scatter_body, form):
        assert error < 1e-2


# ---------------------------------------------------------------- matmul_all_gather and matmul_all_reduce
def _all_gather_bias_body(rank, world_size, async_op):
    with iris.iris(1 << 24) as ctx:
        torch.manual_seed(30 + rank)
        a, b = ctx.randn((M, K)), _same_everywhere(ctx.randn((K, N)))
        bias = torch.randn(M, device=ctx.device)
        out = ctx.full((world_size * M, N), float("nan"))
        ops.matmul_all_gather(ctx, out, a, b, bias=bias, async_op=async_op, config=ops.FusedConfig(**CONFIG))
        if async_op:
            ctx.device_barrier()
        return _max_error(out, _gathered(a @ b + bias[:, None], 0))


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_matmul_all_gather_adds_each_ranks_bias_as_upstream(world, async_op):
    for error in world.run(_all_gather_bias_body, async_op):
        assert error < 1e-2


def _all_reduce_workspace_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        torch.manual_seed(40 + rank)
        a, b = ctx.randn((M, K)), ctx.randn((K, N))
        out = ctx.full((M, N), float("nan"))
        cfg = ops.FusedConfig(all_reduce_variant="one_shot", **CONFIG)
        ws = ops.matmul_all_reduce_preamble(ctx, out, a, b, config=cfg)
        assert ws.matches("matmul_all_reduce", (M, N, K), torch.float32, world_size, "one_shot")
        again = ops.matmul_all_reduce(ctx, out, a, b, config=cfg, workspace=ws)
        assert again is ws
        total = a @ b
        dist.all_reduce(total)
        with pytest.raises(ValueError, match="bias is not supported"):
            ctx.ops.matmul_all_reduce(out, a, b, torch.zeros(N, device=ctx.device))
        with pytest.raises(TypeError, match="FusedWorkspace"):
            ctx.ops.matmul_all_reduce(out, a, b, workspace=out)
        return _max_error(out, total)


def test_matmul_all_reduce_module_form_returns_its_workspace(world):
    for error in world.run(_all_reduce_workspace_body):
        assert error < 1e-2


def test_a_workspace_reused_for_smaller_tiles_is_refused_as_upstream():
    a, b = torch.zeros(512, 64), torch.zeros(64, 512)
    coarse = ops.FusedConfig(block_size_m=128, block_size_n=128)
    fine = ops.FusedConfig(block_size_m=64, block_size_n=64)
    ws = ops.FusedWorkspace()
    ws.prepare("matmul_all_reduce", a, b, 2, "one_shot", upstream_lock_tiles(a, b, coarse))
    assert ws.lock_tiles == 16
    with pytest.raises(WorkspaceTooSmallError, match="Lock array too small: have 16 but need 64"):
        ws.reuse("matmul_all_reduce", a, b, 2, "one_shot", upstream_lock_tiles(a, b, fine))
    ws.reuse("matmul_all_reduce", a, b, 4, "one_shot", 64)  # another call: prepared again
    assert ws.lock_tiles == 64 and ws.world_size == 4
    ws.reuse("matmul_all_reduce", a, b, 4, "one_shot", 16)  # fewer tiles fit
    assert ws.lock_tiles == 64


def test_a_reduce_scatter_preparation_checks_the_old_locks_first():
    a, b = torch.zeros(512, 64), torch.zeros(64, 512)
    ws = ops.FusedWorkspace()
    ws.prepare("matmul_reduce_scatter", a, b, 2, "two_shot", 16, check=True)
    with pytest.raises(ValueError, match="Lock array too small: have 16 but need 64"):
        ws.prepare("matmul_reduce_scatter", a, b, 2, "two_shot", 64, check=True)
    ws.clear()
    ws.prepare("matmul_reduce_scatter", a, b, 2, "two_shot", 64, check=True)
    assert ws.lock_tiles == 64


def _small_workspace_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        a, b, out = ctx.zeros((M, K)), ctx.zeros((K, N)), ctx.zeros((M, N))
        coarse = ops.FusedConfig(**{**CONFIG, "block_size_m": 64, "block_size_n": 64})
        fine = ops.FusedConfig(**CONFIG)
        refused = []
        ws = ops.matmul_all_reduce_preamble(ctx, out, a, b, config=coarse)
        scattered = ops.matmul_reduce_scatter_preamble(ctx, out, a, b, config=coarse)
        for call in (
            lambda: ops.matmul_all_reduce(ctx, out, a, b, config=fine, workspace=ws),
            lambda: ctx.ops.matmul_all_reduce(out, a, b, config=fine, workspace=ws),
            lambda: ops.matmul_reduce_scatter_preamble(ctx, out, a, b, config=fine, workspace=scattered),
        ):
            with pytest.raises(WorkspaceTooSmallError) as error:
                call()
            refused.append(str(error.value).split(".")[0])
        ctx.barrier()
        return refused


def test_ops_refuse_a_workspace_prepared_for_fewer_tiles(world):
    for refused in world.run(_small_workspace_body):
        assert refused == ["Lock array too small: have 4 but need 9"] * 3


def test_upstream_names_of_the_ops_module():
    from iris.ops.matmul_all_reduce import matmul_all_reduce_preamble
    from iris.ops.matmul_reduce_scatter import matmul_reduce_scatter

    assert matmul_reduce_scatter is ops.matmul_reduce_scatter  # the module path keeps the function
    assert matmul_all_reduce_preamble is ops.matmul_all_reduce_preamble
    assert ops.OpsNamespace is ops.Ops
    for name in (
        "matmul_all_reduce_preamble",
        "all_gather_matmul_preamble",
        "matmul_all_gather_preamble",
        "matmul_reduce_scatter_preamble",
    ):
        assert callable(getattr(ops, name))
    ws = ops.FusedWorkspace(operation="x", prepared=True)
    ws.reset()
    assert not ws.prepared
    ws.clear()
    assert ws.locks is None and ws.aux_buffer is None


# ---------------------------------------------------------------- tracing
def _traced_body(rank, world_size):
    from iris.device import tracing

    with iris.iris(1 << 24) as ctx:
        a_shard, b = ctx.randn((M, K // world_size)), ctx.randn((K, N))
        out = ctx.empty((M, N))
        cfg = ops.FusedConfig(**CONFIG)
        ctx.tracing.enable(max_events=4096)
        ctx.ops.all_gather_matmul(out, a_shard, b, config=cfg)
        pulled = ctx.tracing.events()
        ctx.tracing.reset()
        ctx.ops.matmul_reduce_scatter(out, ctx.randn((M, K)), b, config=cfg)
        scattered = ctx.tracing.events()
        ctx.tracing.disable()
        loads = pulled[pulled["event_id"] == tracing.LOAD.value]
        return sorted(set(loads["target_rank"].tolist())), sorted(set(scattered["event_id"].tolist()))


def test_upstream_ops_are_traced(multi_world):
    from iris.device import tracing

    results = multi_world.run(_traced_body)
    for rank, (load_targets, scatter_kinds) in enumerate(results):
        assert load_targets == [r for r in range(len(results)) if r != rank]
        assert {tracing.SIGNAL.value, tracing.LOAD.value} <= set(scatter_kinds)
