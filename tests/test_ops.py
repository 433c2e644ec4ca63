"""ctx.ops: every fused op and overlap style against torch.matmul + torch.distributed on the same inputs.

Shapes are small and divide none of the tile sizes (the emulated default tiles are
32 x 32 x 32; K = 40 leaves a partial K step); each op is called twice with new data,
so per-tile flags are reused without any host reset in between (styles without flags
run once, to keep the interpreter's time down).
"""

import pytest
import reference
import torch
from offline import run_cuda_script

import iris
from iris.ops import FusedConfig, choose_variant
from iris.ops.config import last_wave_split, registers_beside, split_sm_registers
from iris.ops.copy_plans import chunk_bounds
from iris.ops.gemm import SCOPE_GEMM
from iris.ops.matmul import matmul_launch, tma_compatible
from iris.ops.selection import gather_share
from iris_trace import schema
from iris_trace.events import DMA_PUT

M, N, K = 40, 48, 40
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _inputs(ctx, rank, shape_a, shape_b, dtype, call):
    generator = torch.Generator().manual_seed(1000 * call + rank)
    a = ctx.randn(*shape_a, dtype=dtype, generator=generator)
    b = ctx.randn(*shape_b, dtype=dtype, generator=generator)
    return a, b


def _relative_error(got, expected):
    expected = expected.float().cpu()
    return ((got.float().cpu() - expected).norm() / expected.norm()).item()


def _calls(variant):
    # copy_engine: on GPUs the first call runs its plan, the second records and replays it.
    if variant == "copy_engine":
        return 3
    return 2 if variant in ("fused", "workgroup_specialized", "producer_consumer") else 1


def _config(variant, **changes):
    return FusedConfig(
        block_m=32, block_n=32, block_k=32, group_m=2, num_stages=1, comm_sms=2, comm_rows=16, variant=variant
    ).replace(**changes)


def _refused_across_nodes(ctx, variant, call) -> bool:
    """Across nodes the copy_engine variant is refused with its reason; True when it was."""
    if variant != "copy_engine" or not ctx.spans_nodes:
        return False
    with pytest.raises(ValueError, match="reaches only the GPUs of this node"):
        call()
    return True


def _matmul_all_gather_body(rank, world_size, variant, dim, dtype_name, changes):
    dtype = DTYPES[dtype_name]
    with iris.iris(1 << 24) as ctx:
        shape = (world_size * M, N) if dim == 0 else (M, world_size * N)
        out = ctx.full(shape, float("nan"), dtype=dtype)
        errors = []
        for call in range(_calls(variant)):
            a, b = _inputs(ctx, rank, (M, K), (K, N), dtype, call)
            call_op = lambda: ctx.ops.matmul_all_gather(
                out, a, b, dim=dim, config=_config(variant, **changes)
            )  # noqa: E731
            if _refused_across_nodes(ctx, variant, call_op):
                return [0.0]
            ctx.ops.matmul_all_gather(out, a, b, dim=dim, config=_config(variant, **changes))
            ctx.barrier()
            local = a.float().cpu() @ b.float().cpu()
            parts = torch.empty(world_size * M, N)
            reference.all_gather_into_tensor(parts, local)
            expected = parts if dim == 0 else torch.cat(parts.split(M), dim=1)
            errors.append(_relative_error(out, expected))
            ctx.barrier()
        return errors


@pytest.mark.parametrize(
    "variant,dim,dtype,changes",
    [
        ("workgroup_specialized", 1, "bf16", {}),
        ("workgroup_specialized", 0, "fp16", {}),
        # 6 tiles of 16 x 32 on 4 GEMM programs: 4 whole, the last wave's 2 in halves
        ("workgroup_specialized", 1, "bf16", {"block_m": 16, "comm_sms": 4, "split_last_wave": True}),
        ("workgroup_specialized", 1, "bf16", {"split_last_wave": True}),  # one wave: all in halves
        ("producer_consumer", 1, "fp16", {"block_m": 16, "comm_sms": 4, "split_last_wave": True}),
        ("producer_consumer", 1, "bf16", {}),
        ("producer_consumer", 0, "fp16", {"consumer_warps": 2}),
        ("fused_sequential", 1, "fp16", {}),
        ("bulk_synchronous", 0, "bf16", {}),
        ("unfused", 1, "bf16", {}),
        ("copy_engine", 1, "bf16", {}),
        ("copy_engine", 0, "fp16", {}),
        ("copy_engine", 1, "bf16", {"sm_tail": False}),  # every chunk by the copy engines
        ("copy_engine", 0, "fp16", {"copy_chunks": 3, "copy_tail_rows": 8, "sm_tail": True}),
    ],
)
def test_matmul_all_gather_matches_torch(multi_world, variant, dim, dtype, changes):
    for errors in multi_world.run(_matmul_all_gather_body, variant, dim, dtype, changes):
        assert max(errors) < 1e-2, errors


def _all_gather_matmul_body(rank, world_size, variant, dtype_name):
    dtype = DTYPES[dtype_name]
    with iris.iris(1 << 24) as ctx:
        out = ctx.full((world_size * M, N), float("nan"), dtype=dtype)
        errors = []
        for call in range(_calls(variant)):
            a, _ = _inputs(ctx, rank, (M, K), (K, N), dtype, call)
            _, b = _inputs(ctx, 0, (M, K), (K, N), dtype, call)  # B is the same on every rank
            if _refused_across_nodes(
                ctx, variant, lambda: ctx.ops.all_gather_matmul(out, a, b, config=_config(variant))
            ):
                return [0.0]
            ctx.ops.all_gather_matmul(out, a, b, config=_config(variant))
            ctx.barrier()
            gathered = torch.empty(world_size * M, K)
            reference.all_gather_into_tensor(gathered, a.float().cpu())
            errors.append(_relative_error(out, gathered @ b.float().cpu()))
            ctx.barrier()
        return errors


@pytest.mark.parametrize(
    "variant,dtype", [("fused", "bf16"), ("fused", "fp16"), ("unfused", "bf16"), ("copy_engine", "bf16")]
)
def test_all_gather_matmul_matches_torch(multi_world, variant, dtype):
    for errors in multi_world.run(_all_gather_matmul_body, variant, dtype):
        assert max(errors) < 1e-2, errors


def _gemm_reduce_body(rank, world_size, op, variant, dtype_name):
    dtype = DTYPES[dtype_name]
    rows = world_size * M if op == "matmul_reduce_scatter" else M
    with iris.iris(1 << 24) as ctx:
        out = ctx.full((M, N), float("nan"), dtype=dtype)
        errors = []
        for call in range(_calls(variant)):
            a, b = _inputs(ctx, rank, (rows, K), (K, N), dtype, call)
            if _refused_across_nodes(
                ctx, variant, lambda: getattr(ctx.ops, op)(out, a, b, config=_config(variant))
            ):
                return [0.0]
            getattr(ctx.ops, op)(out, a, b, config=_config(variant))
            ctx.barrier()
            partial = a.float().cpu() @ b.float().cpu()
            if op == "matmul_all_reduce":
                reference.all_reduce(partial)
                expected = partial
            else:
                expected = torch.empty(M, N)
                reference.reduce_scatter_tensor(expected, partial)
            errors.append(_relative_error(out, expected))
            ctx.barrier()
        return errors


@pytest.mark.parametrize(
    "op,variant,dtype",
    [
        ("matmul_all_reduce", "fused", "bf16"),
        ("matmul_all_reduce", "fused", "fp16"),
        ("matmul_all_reduce", "unfused", "bf16"),
        ("matmul_reduce_scatter", "fused", "bf16"),
        ("matmul_reduce_scatter", "fused", "fp16"),
        ("matmul_reduce_scatter", "unfused", "fp16"),
        ("matmul_reduce_scatter", "copy_engine", "bf16"),
    ],
)
def test_gemm_reduce_matches_torch(multi_world, op, variant, dtype):
    for errors in multi_world.run(_gemm_reduce_body, op, variant, dtype):
        assert max(errors) < 1e-2, errors


def _single_rank_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        a, b = _inputs(ctx, rank, (M, K), (K, N), torch.bfloat16, 0)
        expected = a.float() @ b.float()
        out = ctx.empty(M, N, dtype=torch.bfloat16)
        ctx.ops.matmul_all_gather(out, a, b, config=_config("workgroup_specialized"))
        ctx.ops.matmul_all_reduce(out, a, b, config=_config("fused"))
        ctx.barrier()
        return _relative_error(out, expected)


def _plain_gemm_body(rank, world_size):
    # Row-major matrices go through tensor descriptors, a column-major B through pointer
    # loads; 33 rows and K = 24 leave partial tiles and a partial K step at every edge.
    with iris.iris(1 << 24) as ctx:
        config = _config("bulk_synchronous")
        results = []
        ctx.tracing.enable(max_events=1 << 12)
        for rows, cols, depth, column_major in ((33, 56, 24, False), (40, 48, 40, True)):
            a, b = _inputs(ctx, rank, (rows, depth), (depth, cols), torch.bfloat16, 0)
            if column_major:
                b = b.t().contiguous().t()
            out = ctx.full((rows, cols), float("nan"), dtype=torch.bfloat16)
            step = matmul_launch(a, b, out, config, ctx.get_cu_count(), ctx.get_heap_bases())
            step()
            tiles = -(-rows // 32) * -(-cols // 32)
            results.append((step.kernel.fn.__name__, _relative_error(out, a.float() @ b.float()), tiles))
        events = ctx.tracing.events()
        ctx.tracing.disable()
        return results, int((events["event_id"] == 64 + 8).sum())


def test_the_plain_gemm_uses_tensor_descriptors_where_the_layout_allows(world):
    if world.world_size != 1:
        pytest.skip("one-rank case")
    results, gemm_scopes = world.run(_plain_gemm_body)[0]
    assert [kernel for kernel, _, _ in results] == ["matmul_tma_kernel", "matmul_kernel"]
    assert all(error < 1e-2 for _, error, _ in results), results
    assert gemm_scopes == sum(tiles for _, _, tiles in results)  # each tile traced once


def test_tensor_descriptors_need_unit_inner_strides_and_aligned_rows():
    matrix = torch.empty(64, 256, dtype=torch.bfloat16)
    assert tma_compatible(matrix)
    assert not tma_compatible(matrix.t())  # column-major
    assert not tma_compatible(matrix[:, 1:])  # base 2 bytes off the 16-byte grid
    assert not tma_compatible(torch.empty(64, 12, dtype=torch.bfloat16))  # 24-byte rows
    a, b, c = (torch.empty(64, 64, dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(ValueError, match="tma=True needs 16-bit inputs"):
        matmul_launch(a, b.t(), c, _config("bulk_synchronous"), 4, None, tma=True)


def test_last_wave_split_is_the_first_tile_of_the_last_wave():
    assert last_wave_split(256, 132) == 132
    assert last_wave_split(264, 132) == 132
    assert last_wave_split(265, 132) == 264
    assert last_wave_split(124, 132) == 0


def test_one_rank_is_a_plain_gemm(world):
    if world.world_size != 1:
        pytest.skip("one-rank case")
    assert world.run(_single_rank_body)[0] < 1e-2


def _traced_body(rank, world_size, variant="workgroup_specialized"):
    with iris.iris(1 << 24) as ctx:
        a, b = _inputs(ctx, rank, (M, K), (K, N), torch.bfloat16, 0)
        out = ctx.empty(M, world_size * N, dtype=torch.bfloat16)
        ctx.tracing.enable(max_events=1 << 14)
        ctx.ops.matmul_all_gather(out, a, b, dim=1, config=_config(variant))
        ctx.barrier()
        events, dropped = ctx.tracing.events(), ctx.tracing.dropped()
        ctx.tracing.disable()
        return events, dropped


def test_traced_workgroup_specialized_records_tiles_and_pushes(multi_world):
    tiles = 2 * 2  # 40 x 48 in 32 x 32 tiles
    peers = multi_world.world_size - 1
    for events, dropped in multi_world.run(_traced_body):
        stores = events[events["event_id"] == schema.STORE]
        assert (events["event_id"] == schema.SCOPE_BASE + SCOPE_GEMM).sum() == tiles and dropped == 0
        # every element of the 40 x 48 bf16 block goes to every peer once
        assert stores["payload_bytes"].sum() == M * N * 2 * peers
        assert len(stores) == tiles * peers  # a tile's push to a peer is one event, whatever its steps
        for peer in range(multi_world.world_size):
            assert (stores["target_rank"] == peer).sum() == (0 if peer == stores["cur_rank"][0] else tiles)


def test_traced_tile_waits_end_before_the_push_they_let_through(multi_world):
    # A pusher records its wait for a tile after pushing it (iris.ops.all_scatter.wait_for_unit),
    # with the times the wait had: it ends before the push's store events begin.
    for events, _ in multi_world.run(_traced_body):
        waits = events[(events["event_id"] == schema.WAIT_UNTIL) & (events["pid_m"] >= 0)]
        stores = events[events["event_id"] == schema.STORE]
        pairs = 0
        for wait in waits:
            same = stores[(stores["pid"] == wait["pid"]) & (stores["pid_m"] == wait["pid_m"])]
            same = same[same["pid_n"] == wait["pid_n"]]
            assert wait["start_ns"] <= wait["end_ns"] <= same["start_ns"].min(initial=wait["end_ns"])
            pairs += len(same) > 0
        assert pairs > 0


@pytest.mark.parametrize("variant", ["workgroup_specialized", "fused_sequential"])
def test_traced_entry_waits_are_one_per_peer_per_pushing_program(multi_world, variant):
    # Each program that pushes waits once for every peer to enter the call (a wait on the
    # peer's word of this rank's entry flags), fused_sequential after its first tile only.
    peers = multi_world.world_size - 1
    for rank, (events, dropped) in enumerate(multi_world.run(_traced_body, variant)):
        entry_waits = events[(events["event_id"] == schema.WAIT_UNTIL) & (events["pid_m"] < 0)]
        assert dropped == 0 and len(entry_waits) > 0
        assert (entry_waits["target_rank"] == rank).all() and (entry_waits["value"] >= 1).all()
        for pid in set(entry_waits["pid"].tolist()):
            mine = entry_waits[entry_waits["pid"] == pid]
            assert len(mine) == peers and len(set(mine["address"].tolist())) == peers


def _errors_body(rank, world_size):
    messages = []
    with iris.iris(1 << 24) as ctx:
        a, b = _inputs(ctx, rank, (M, K), (K, N), torch.bfloat16, 0)
        attempts = [
            lambda: ctx.ops.matmul_all_gather(torch.empty(M, N), a, b),  # not on the heap, wrong shape
            lambda: ctx.ops.matmul_all_reduce(ctx.empty(M, N, dtype=torch.bfloat16), a, b.t()),
            lambda: ctx.ops.matmul_all_reduce(torch.empty(M, N, dtype=torch.bfloat16), a, b),
            lambda: ctx.ops.matmul_reduce_scatter(ctx.empty(M, N), ctx.randn(world_size * M + 1, K), b),
        ]
        for attempt in attempts:
            try:
                attempt()
            except (ValueError, TypeError) as error:
                messages.append(str(error))
        ctx.barrier()
    return messages


def test_bad_arguments_fail_with_a_message(world):
    messages = world.run(_errors_body)[0]
    assert len(messages) == 4
    assert all(m.startswith("iris.ops.") for m in messages)


def test_auto_fuses_only_large_multi_rank_problems():
    cfg = FusedConfig()
    assert choose_variant(cfg, 1024, 512, 4096, 4, 132) == "unfused"
    assert choose_variant(cfg, 8192, 2048, 8192, 4, 132) == "fused"
    assert choose_variant(cfg, 8192, 2048, 8192, 1, 132) == "unfused"
    # GEMM + all-scatter to one peer: the copy engines from 2^22 elements; below, or across
    # nodes, pushed by the computing programs, and below two waves (1.9 tiles per SM)
    # left to cuBLAS and the all-scatter kernel
    assert choose_variant(cfg, 4096, 7168, 4096, 2, 132, "matmul_all_gather") == "copy_engine"
    assert choose_variant(cfg, 1024, 4096, 8192, 2, 132, "matmul_all_gather") == "copy_engine"
    assert choose_variant(cfg, 1024, 2048, 4096, 2, 132, "matmul_all_gather") == "unfused"
    gather = dict(world_size=2, num_sms=132, op="matmul_all_gather", spans_nodes=True)
    assert choose_variant(cfg, 1024, 7168, 4096, **gather) == "fused_sequential"
    assert choose_variant(cfg, 1024, 4096, 8192, **gather) == "unfused"
    assert choose_variant(cfg, 4096, 4096, 8192, 2, 132, "matmul_all_reduce") == "fused"
    assert choose_variant(cfg, 4096, 2048, 8192, 4, 132, "matmul_all_gather") == "fused"
    assert choose_variant(cfg, 8, 8, 8, 2, 8, interpreted=True) == "fused"
    assert choose_variant(cfg.replace(variant="unfused"), 8192, 8192, 8192, 4, 132) == "unfused"


def test_auto_with_one_peer_follows_the_two_gpu_measurements():
    # Per-rank (rows, cols, k) of benchmarks/fused_ops.py's shapes on two ranks; the
    # expected picks are the fastest styles of results/fused_ops_h200x2.json.
    cfg = FusedConfig()

    def pick(op, rows, cols, k, world_size=2, spans_nodes=False):
        return choose_variant(cfg, rows, cols, k, world_size, 132, op, spans_nodes=spans_nodes)

    for rows, cols, k in ((4096, 8192, 2048), (4096, 14336, 2048), (1024, 8192, 4096), (1024, 14336, 2048)):
        assert pick("matmul_reduce_scatter", rows, cols, k) == "copy_engine"
    assert pick("matmul_reduce_scatter", 512, 4096, 4096) == "unfused"  # 2^21 elements
    for rows in (16384, 4096, 1024):
        for cols, k in ((4096, 8192), (7168, 4096)):
            assert pick("all_gather_matmul", rows, cols, k) == "copy_engine"
            assert pick("matmul_all_gather", rows, cols, k) == "copy_engine"
    assert pick("matmul_all_reduce", 16384, 8192, 4096) == "fused"
    assert pick("matmul_all_reduce", 4096, 8192, 4096) == "fused"
    for rows, cols, k in ((16384, 14336, 2048), (4096, 14336, 2048), (1024, 8192, 4096), (1024, 14336, 2048)):
        assert pick("matmul_all_reduce", rows, cols, k) == "unfused"
    # Copy engines reach no other node; with three peers the 4-GPU rules apply.
    assert pick("matmul_reduce_scatter", 4096, 8192, 2048, spans_nodes=True) == "unfused"
    assert pick("all_gather_matmul", 4096, 4096, 8192, spans_nodes=True) == "unfused"
    assert pick("all_gather_matmul", 4096, 4096, 8192, world_size=4) == "unfused"
    assert pick("matmul_all_reduce", 1024, 14336, 1024, world_size=4) == "fused"


def test_auto_gemm_all_scatter_with_three_peers_follows_the_four_gpu_measurements():
    # Per-rank (rows, cols, k) of benchmarks/fused_ops.py's shapes on four ranks; the
    # expected picks are the fastest styles of results/fused_ops_h200x4.json.
    cfg, op = FusedConfig(), "matmul_all_gather"
    assert choose_variant(cfg, 16384, 2048, 8192, 4, 132, op) == "producer_consumer"  # 15.5 tiles per SM
    assert choose_variant(cfg, 16384, 3584, 4096, 4, 132, op) == "producer_consumer"  # 27
    assert choose_variant(cfg, 4096, 2048, 8192, 4, 132, op) == "fused"  # 3.9
    assert choose_variant(cfg, 4096, 3584, 4096, 4, 132, op) == "fused"  # 6.8
    assert choose_variant(cfg, 1024, 3584, 4096, 4, 132, op) == "fused"  # 1.7
    assert choose_variant(cfg, 1024, 2048, 8192, 4, 132, op) == "fused_sequential"  # 0.97: one wave


def test_gemm_all_scatter_gives_few_sms_to_pushers_that_fit_behind_the_gemm():
    from iris.ops import default_config
    from iris.ops.selection import FEW_PUSHERS, scatter_link_share

    op = "matmul_all_gather"
    assert scatter_link_share(8192, 4) < 1 < scatter_link_share(4096, 4)
    for rows in (8192, 16384, 32768):  # K = 8192: the pushes take 0.70 of the GEMM's time
        config = default_config(rows, 2048, 8192, 4, 132, op)
        assert (config.comm_sms, config.num_stages, config.consumer_warps) == (FEW_PUSHERS, 4, 0)
    assert default_config(16384, 3584, 4096, 4, 132, op).comm_sms == 24  # K = 4096: 1.39
    assert default_config(4096, 2048, 8192, 4, 132, op).consumer_warps == 2  # sharing saves a wave first
    assert default_config(16384, 2048, 8192, 2, 132, op).comm_sms == 16  # one peer: rules 4, 10, 11
    assert default_config(16384, 2048, 8192, 4, 132, "matmul_all_reduce").num_stages == 3


def test_the_descriptor_gemm_keeps_the_stages_that_fit_beside_its_output_tile():
    from iris.ops.config import descriptor_stages

    # 128 x 256 x 64 bf16: 48 KiB a stage and a 64 KiB output tile (262176 bytes at 4 stages on sm_90).
    assert descriptor_stages(FusedConfig(block_n=256, num_stages=4), 2) == 3
    assert descriptor_stages(FusedConfig(block_n=256, num_stages=3), 2) == 3
    assert descriptor_stages(FusedConfig(block_n=128, num_stages=4), 2) == 4


def test_consumers_share_the_sms_only_where_that_saves_a_gemm_wave():
    from iris.ops import default_config

    op = "matmul_all_gather"
    assert default_config(4096, 2048, 8192, 4, 132, op).consumer_warps == 2  # 256 tiles: 2 waves, not 3
    assert default_config(4096, 3584, 4096, 4, 132, op).consumer_warps == 0  # 448 tiles
    assert default_config(16384, 2048, 8192, 4, 132, op).consumer_warps == 0  # 1024 tiles
    assert default_config(1024, 8192, 2048, 4, 132, "matmul_reduce_scatter").comm_rows == 32


def test_plain_gemm_tiles_fill_the_last_wave_or_save_one():
    from iris.ops.config import flatten_tile_loop, gemm_config

    assert gemm_config(1024, 2048, 8192, 132).block_n == 128  # 64 wide tiles: half the SMs idle
    assert gemm_config(4096, 3584, 4096, 132).block_n == 128  # 7 narrow waves beat 4 wide ones
    assert gemm_config(4096, 14336, 1024, 132).block_n == 256  # at 16 K-steps narrow tiles cost too much
    assert gemm_config(16384, 8192, 2048, 132).block_n == 256
    assert flatten_tile_loop(gemm_config(1024, 8192, 2048, 132))
    assert not flatten_tile_loop(gemm_config(1024, 2048, 8192, 132))


def test_a_consumer_gets_the_registers_the_gemm_leaves_on_its_sm():
    assert registers_beside(224, 8, 4) == 64  # 57344 + 128 x 64 = 65536
    assert registers_beside(224, 8, 1) == 248  # 255 at most, in steps of 8
    assert registers_beside(250, 8, 4) == 0  # 12 per thread left: too few
    assert registers_beside(168, 2, 8) == 208  # the GEMM beside a consumer: 214 left, in steps of 8


def _compiles_to(registers, spills_when_capped=0):
    # A stand-in compiler: (registers, spilled) for a cap, as ptxas would report them.
    return lambda cap: (registers, 0) if cap is None else (min(registers, cap), spills_when_capped)


def test_the_gemm_gives_up_registers_it_can_spare_for_its_consumer():
    assert split_sm_registers(_compiles_to(200), _compiles_to(168), 8, 2) == (None, None)  # both fit
    assert split_sm_registers(_compiles_to(220), _compiles_to(168), 8, 2) == (208, None)
    # capped, the GEMM would spill: the consumer takes what it leaves (65536 - 220 x 256 = 9216)
    assert split_sm_registers(_compiles_to(220, 4), _compiles_to(168), 8, 2) == (None, 144)
    assert split_sm_registers(_compiles_to(252, 4), _compiles_to(168), 8, 4) == (None, None)  # too few left


def test_auto_all_gather_matmul_fuses_from_eight_tiles_per_sm():
    cfg, op = FusedConfig(), "all_gather_matmul"
    assert choose_variant(cfg, 4096, 3584, 4096, 4, 132, op) == "unfused"  # 6.8 tiles per SM
    assert choose_variant(cfg, 16384, 2048, 8192, 4, 132, op) == "fused"  # 15.5 tiles per SM


def test_auto_all_gather_matmul_fuses_only_where_the_gather_is_a_large_share_of_the_gemm():
    cfg, op = FusedConfig(), "all_gather_matmul"
    assert round(gather_share(2048, 4), 2) == 0.70 and round(gather_share(3584, 4), 2) == 0.40
    assert choose_variant(cfg, 16384, 3584, 4096, 4, 132, op) == "unfused"  # 27 tiles per SM, share 0.40


def test_auto_reduce_scatter_uses_the_copy_engines_from_four_million_elements():
    cfg, op = FusedConfig(), "matmul_reduce_scatter"
    for rows, cols, k in ((16384, 8192, 2048), (4096, 14336, 1024), (4096, 8192, 2048)):
        assert choose_variant(cfg, rows, cols, k, 4, 132, op) == "copy_engine"  # 2^22 or more per peer
    for rows, cols, k in ((1024, 8192, 4096), (1024, 14336, 2048)):
        assert choose_variant(cfg, rows, cols, k, 2, 132, op) == "copy_engine"  # one peer: the whole output
    assert choose_variant(cfg, 1024, 2048, 2048, 4, 132, op) == "unfused"  # 2^21 elements, under one wave
    assert choose_variant(cfg, 16384, 8192, 2048, 4, 8, op, interpreted=True) == "fused"


def test_auto_reduce_scatter_with_small_blocks_per_peer_fuses_only_a_shallow_gemm():
    cfg, op = FusedConfig(), "matmul_reduce_scatter"
    h100 = dict(memory_bandwidth=3.35e12)  # bytes per second of HBM3
    assert choose_variant(cfg, 1024, 14336, 1024, 4, 132, op, **h100) == "fused"  # 3.5 Mi per peer, K 1024
    assert choose_variant(cfg, 1024, 8192, 2048, 4, 132, op, **h100) == "unfused"  # 2 Mi per peer, K 2048
    assert choose_variant(cfg, 1024, 8192, 2048, 4, 132, op) == "unfused"  # memory not known: as on H100s


def test_auto_reduce_scatter_keeps_small_blocks_on_the_copy_engines_with_fast_memory():
    cfg, op = FusedConfig(), "matmul_reduce_scatter"
    h200 = dict(memory_bandwidth=4.8e12)  # bytes per second of HBM3e
    for rows, cols, k in ((1024, 14336, 1024), (1024, 8192, 2048)):
        assert choose_variant(cfg, rows, cols, k, 4, 132, op, **h200) == "copy_engine"
    assert choose_variant(cfg, 1024, 8192, 2048, 4, 132, op, spans_nodes=True, **h200) != "copy_engine"


def test_auto_never_picks_the_copy_engines_when_the_job_spans_nodes():
    cfg, op = FusedConfig(), "matmul_reduce_scatter"
    assert choose_variant(cfg, 16384, 8192, 2048, 4, 132, op, spans_nodes=True) != "copy_engine"


def _gpu_default_body(rank, world_size, dtype_name):
    # Default (GPU-sized) configs on shapes that divide neither the tiles nor 16.
    dtype = DTYPES[dtype_name]
    m, n, k = 1000, 1500, 700
    errors = {}
    with iris.iris(1 << 30) as ctx:
        a, b = _inputs(ctx, rank, (m, k), (k, n), dtype, 0)
        local = a.float() @ b.float()
        scatter_variants = ("fused", "unfused", "bulk_synchronous", "fused_sequential", "producer_consumer")
        if not ctx.spans_nodes:  # the copy engines reach only this node's GPUs
            scatter_variants += ("copy_engine",)
        scatter = {variant: _default(ctx, m, n, k, variant) for variant in scatter_variants}
        for warps in (1, 4):  # consumers beside the GEMM on every SM
            scatter[f"producer_consumer[{warps} warps]"] = scatter["producer_consumer"].replace(
                consumer_warps=warps
            )
        for label, config in scatter.items():
            out = ctx.full((m, world_size * n), float("nan"), dtype=dtype)
            ctx.ops.matmul_all_gather(out, a, b, dim=1, config=config)
            ctx.barrier()
            parts = torch.empty(world_size * m, n, device=a.device)
            reference.all_gather_into_tensor(parts, local)
            errors[f"all_gather/{label}"] = _relative_error(out, torch.cat(parts.split(m), dim=1).cpu())
        for variant in ("fused", "unfused") if ctx.spans_nodes else ("fused", "unfused", "copy_engine"):
            if variant != "copy_engine":
                out = ctx.full((m, n), float("nan"), dtype=dtype)
                ctx.ops.matmul_all_reduce(out, a, b, config=_default(ctx, m, n, k, variant))
                ctx.barrier()
                expected = local.clone()
                reference.all_reduce(expected)
                errors[f"all_reduce/{variant}"] = _relative_error(out, expected.cpu())
            rows = (m // world_size) * world_size
            out = ctx.full((rows // world_size, n), float("nan"), dtype=dtype)
            ctx.ops.matmul_reduce_scatter(out, a[:rows], b, config=_default(ctx, m, n, k, variant))
            ctx.barrier()
            expected = torch.empty(rows // world_size, n, device=a.device)
            reference.reduce_scatter_tensor(expected, local[:rows].contiguous())
            errors[f"reduce_scatter/{variant}"] = _relative_error(out, expected.cpu())
            out = ctx.full((world_size * m, n), float("nan"), dtype=dtype)
            ctx.ops.all_gather_matmul(out, a, b[:, :n], config=_default(ctx, m, n, k, variant))
            ctx.barrier()
            gathered = torch.empty(world_size * m, k, device=a.device)
            reference.all_gather_into_tensor(gathered, a.float())
            errors[f"all_gather_matmul/{variant}"] = _relative_error(out, (gathered @ b.float()).cpu())
    return errors


def _default(ctx, m, n, k, variant):
    return ctx.ops.default_config(m, n, k).replace(variant=variant)


@pytest.mark.skipif(iris.BACKEND != "cuda", reason="GPU-sized tiles: the interpreter would take minutes")
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gpu_default_configs_match_torch(multi_world, dtype):
    for errors in multi_world.run(_gpu_default_body, dtype):
        assert max(errors.values()) < 1e-2, errors


def _graph_body(rank, world_size):
    # Fused variants captured once and replayed on fresh inputs: the side stream, its
    # stream wait on the producers' start count and the copy lanes all replay.
    dtype, (m, n, k) = torch.bfloat16, (1000, 1500, 700)
    rows = (m // world_size) * world_size
    with iris.iris(1 << 30) as ctx:
        a, b = ctx.empty(m, k, dtype=dtype), ctx.empty(k, n, dtype=dtype)
        outs = {
            "matmul_all_gather": ctx.empty(m, world_size * n, dtype=dtype),
            "matmul_all_reduce": ctx.empty(m, n, dtype=dtype),
            "matmul_reduce_scatter": ctx.empty(m // world_size, n, dtype=dtype),
        }

        def config(variant, **changes):
            return _default(ctx, m, n, k, variant).replace(**changes)

        def call(op, cfg):
            if op == "matmul_all_gather":
                ctx.ops.matmul_all_gather(outs[op], a, b, dim=1, config=cfg)
            elif op == "matmul_all_reduce":
                ctx.ops.matmul_all_reduce(outs[op], a, b, config=cfg)
            else:
                ctx.ops.matmul_reduce_scatter(outs[op], a[:rows], b, config=cfg)

        def expected(op):
            local = a.float() @ b.float()
            if op == "matmul_all_gather":
                parts = torch.empty(world_size * m, n, device=a.device)
                reference.all_gather_into_tensor(parts, local)
                return torch.cat(parts.split(m), dim=1)
            if op == "matmul_all_reduce":
                reference.all_reduce(local)
                return local
            scattered = torch.empty(rows // world_size, n, device=a.device)
            reference.reduce_scatter_tensor(scattered, local[:rows].contiguous())
            return scattered

        cases = [
            ("matmul_all_gather", config("producer_consumer", consumer_warps=2)),
            ("matmul_all_gather", config("producer_consumer")),
            ("matmul_all_gather", config("fused")),
            ("matmul_all_gather", config("copy_engine")),
            ("matmul_all_reduce", config("fused")),
            ("matmul_reduce_scatter", config("copy_engine")),
        ]
        if ctx.spans_nodes:  # the copy engines reach only this node's GPUs
            cases = [(op, cfg) for op, cfg in cases if cfg.variant != "copy_engine"]
        errors = {}
        for op, cfg in cases:
            a.normal_(), b.normal_()
            call(op, cfg)  # compile, check arguments and allocate workspaces before capture
            torch.cuda.synchronize()
            ctx.barrier()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call(op, cfg)
            for replay in range(3):
                generator = torch.Generator(device=a.device).manual_seed(100 * replay + rank)
                a.copy_(torch.randn(m, k, generator=generator, device=a.device))
                b.copy_(torch.randn(k, n, generator=generator, device=a.device))
                outs[op].fill_(float("nan"))
                ctx.barrier()
                graph.replay()
                torch.cuda.synchronize()
                ctx.barrier()
                label = f"{op}/{cfg.variant}/consumer_warps={cfg.consumer_warps}/replay {replay}"
                errors[label] = _relative_error(outs[op], expected(op).cpu())
            ctx.barrier()
        return errors


@pytest.mark.skipif(iris.BACKEND != "cuda", reason="CUDA graphs need a GPU")
def test_gpu_fused_ops_replay_under_cuda_graphs(multi_world):
    for errors in multi_world.run(_graph_body):
        assert max(errors.values()) < 1e-2, errors


def _replay_body(rank, world_size):
    # The same tensors refilled in place: the second call replays the first call's
    # recorded plan (prepared launches), including the copy of a non-contiguous A.
    dtype = torch.bfloat16
    with iris.iris(1 << 24) as ctx:
        a = ctx.empty(M, K, dtype=dtype)
        a_t = ctx.empty(K, M, dtype=dtype).t()  # non-contiguous row shard
        b = ctx.empty(K, N, dtype=dtype)
        gathered_out = ctx.full((world_size * M, N), float("nan"), dtype=dtype)
        reduced_out = ctx.full((M, N), float("nan"), dtype=dtype)
        errors = []
        for call in range(2):
            generator = torch.Generator().manual_seed(500 * call + rank)
            for tensor in (a, a_t, b):
                tensor.copy_(torch.randn(tensor.shape, generator=generator).to(dtype))
            ctx.ops.all_gather_matmul(gathered_out, a_t, b, config=_config("unfused"))
            ctx.ops.matmul_all_reduce(reduced_out, a, b, config=_config("fused"))
            ctx.barrier()
            shards = torch.empty(world_size * M, K)
            reference.all_gather_into_tensor(shards, a_t.float().cpu().contiguous())
            errors.append(_relative_error(gathered_out, shards @ b.float().cpu()))
            total = a.float().cpu() @ b.float().cpu()
            reference.all_reduce(total)
            errors.append(_relative_error(reduced_out, total))
            ctx.barrier()
        return errors


def test_repeated_calls_replay_their_plan_with_new_values(multi_world):
    for errors in multi_world.run(_replay_body):
        assert max(errors) < 1e-2, errors


@pytest.mark.codegen
def test_ops_kernels_compile_for_hopper():
    stdout = run_cuda_script("compile_ops_kernels.py")
    # 12 kernels (wait_landed twice), untraced and traced, the barrier check, then the
    # register split beside 3 consumers
    lines = stdout.splitlines()
    assert len(lines) == 28, stdout
    assert "barriers_in_multi_entry_loops {}" in lines, stdout
    # The plain GEMM moves its tiles with bulk tensor copies, traced or not.
    assert sum("matmul_tma[" in line and "bulk_tensor_copies=" in line for line in lines) == 2, stdout


def test_copy_chunks_cover_the_block_once_with_the_tail_last():
    assert chunk_bounds(4096, 0) == [(0, 1024), (1024, 2048), (2048, 3072), (3072, 4096)]
    assert chunk_bounds(4096, 0, tail_rows=512)[-2:] == [(3072, 3584), (3584, 4096)]
    assert chunk_bounds(4096, 3) == [(0, 1536), (1536, 3072), (3072, 4096)]  # whole 256-row tiles
    assert chunk_bounds(1024, 0, tail_rows=512) == [(0, 512), (512, 1024)]  # no shorter than the chunks: none
    assert chunk_bounds(0, 0, tail_rows=512) == []
    for rows, chunks, tail in [(4096, 0, 512), (16384, 0, 1024), (1000, 7, 3), (5, 8, 0)]:
        bounds = chunk_bounds(rows, chunks, tail)
        assert bounds[0][0] == 0 and bounds[-1][1] == rows
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(bounds, bounds[1:], strict=False))


def _replayed_copy_plan_body(rank, world_size, traced):
    # Three calls of the copy-engine plan on the same tensors, refilled in place (on GPUs:
    # run, record and replay, replay): every call's result is right, and when traced,
    # every chunk's put of every call is one dma_put event.
    dtype = torch.bfloat16
    with iris.iris(1 << 24) as ctx:
        out = ctx.empty((M, world_size * N), dtype=dtype)
        a, b = ctx.empty(M, K, dtype=dtype), ctx.empty(K, N, dtype=dtype)
        config = _config("copy_engine", sm_tail=False)
        chunks = len(chunk_bounds(M, config.copy_chunks, config.copy_tail_rows))
        if traced:
            ctx.tracing.enable(max_events=4096)
        errors = []
        for call in range(3):
            fresh_a, fresh_b = _inputs(ctx, rank, (M, K), (K, N), dtype, call)
            a.copy_(fresh_a), b.copy_(fresh_b)
            out.fill_(float("nan"))
            ctx.barrier()
            run = lambda: ctx.ops.matmul_all_gather(out, a, b, dim=1, config=config)  # noqa: E731
            if _refused_across_nodes(ctx, "copy_engine", run):
                return [0.0], 0, 0
            run()
            ctx.barrier()
            parts = torch.empty(world_size * M, N)
            reference.all_gather_into_tensor(parts, a.float().cpu() @ b.float().cpu())
            errors.append(_relative_error(out, torch.cat(parts.split(M), dim=1)))
            ctx.barrier()
        if not traced:
            return errors, 0, 0
        events = ctx.tracing.events()
        ctx.tracing.disable()
        puts = int((events["event_id"] == DMA_PUT).sum())
        return errors, puts, 3 * chunks * (world_size - 1)


@pytest.mark.parametrize("traced", [False, True])
def test_copy_engine_plans_give_the_same_result_when_replayed(multi_world, traced):
    for errors, puts, expected in multi_world.run(_replayed_copy_plan_body, traced):
        assert max(errors) < 1e-2, errors
        assert puts == expected
