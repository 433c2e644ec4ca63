"""Device collectives against torch.distributed on the same inputs, at every world size.

Sizes are deliberately not multiples of the block sizes. References are computed
from ``dist.all_gather`` of the inputs (exact for copies, fp32 sums for
reductions), so the check covers every dtype the backends' torch.distributed
does not reduce itself.
"""

import dataclasses

import pytest
import reference
import torch
import torch.distributed as dist
import triton
import triton.language as tl
from offline import run_cuda_script

import iris
from iris import ccl as ccl_api
from iris.ccl import CollectiveError, Config
from iris.ccl import device as ccl
from iris.ccl.all_reduce import ATOMIC_DTYPES
from iris.errors import WorkspaceTooSmallError

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "int32": torch.int32}
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.int32: 0}
SMALL = Config(block_size=64, block_size_m=8, block_size_n=16, comm_sms=3)
N = 301  # elements per rank: five 64-element tiles, the last one partial
on_gpu = pytest.mark.skipif(iris.BACKEND == "emulated", reason="CUDA graphs need a GPU")


def _random(ctx, shape, dtype, seed):
    """Fresh random values of ``dtype`` in a new heap tensor (integers for int32)."""
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.int32:
        values = torch.randint(-50, 50, shape, generator=generator)
    else:
        values = torch.randn(shape, generator=generator)
    tensor = ctx.empty(*shape, dtype=dtype)
    tensor.copy_(values.to(dtype).to(tensor.device))
    return tensor


def _gather(tensor, group=None):
    """Every member's ``tensor`` (as fp32 on the CPU where possible), through torch.distributed."""
    size = dist.get_world_size(group)
    parts = [torch.empty_like(tensor) for _ in range(size)]
    reference.all_gather(parts, tensor, group=group)
    return [p.cpu().to(torch.float32 if p.is_floating_point() else p.dtype) for p in parts]


def _close(actual, expected, dtype):
    actual = actual.cpu().to(expected.dtype)
    tol = TOLERANCE[dtype]
    scale = expected.abs().max().clamp(min=1)
    return bool(((actual - expected).abs() <= tol * scale).all())


def _reduce(parts, op):
    stacked = torch.stack(parts)
    return {"sum": stacked.sum(0), "max": stacked.amax(0), "min": stacked.amin(0)}[op]


# ---------------------------------------------------------------- all_reduce
def _all_reduce_body(rank, world_size, variant, op):
    with iris.iris(1 << 22) as ctx:
        results = {}
        for name, dtype in DTYPES.items():
            if variant == "atomic" and (op != "sum" or dtype not in ATOMIC_DTYPES):
                continue
            if variant == "atomic" and dtype.itemsize < 4 and ctx.spans_nodes:
                continue  # 16-bit atomics do not cross nodes (docs/scale_out.md)
            inp = _random(ctx, (N,), dtype, seed=rank * 7 + 1)
            out = ctx.full((N,), 99, dtype=dtype)
            config = Config(block_size=64, comm_sms=3, all_reduce_variant=variant)
            ctx.ccl.all_reduce(out, inp, op=op, config=config)
            expected = _reduce(_gather(inp), op)
            results[name] = _close(out, expected, dtype)
        return results


@pytest.mark.parametrize("variant", ["one_shot", "two_shot", "ring", "atomic", "spinlock"])
def test_all_reduce_sums_like_torch(world, variant):
    for results in world.run(_all_reduce_body, variant, "sum"):
        assert all(results.values()), results


@pytest.mark.parametrize("variant", ["two_shot", "spinlock"])
@pytest.mark.parametrize("op", ["max", "min"])
def test_all_reduce_max_min(multi_world, op, variant):
    for results in multi_world.run(_all_reduce_body, variant, op):
        assert all(results.values()), results


def _all_reduce_vs_dist_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        inp = _random(ctx, (1000,), torch.float32, seed=rank)
        out = ctx.empty(1000)
        ctx.ccl.all_reduce(out, inp)
        expected = inp.clone()
        reference.all_reduce(expected)
        return torch.allclose(out, expected, rtol=1e-5, atol=1e-5)


def test_all_reduce_auto_matches_dist_all_reduce(world):
    assert all(world.run(_all_reduce_vs_dist_body))


def _one_shot_rounds_body(rank, world_size):
    # Small calls are staged (two halves used by turns, inputs anywhere); 10000 fp32 is
    # past this 1 MiB heap's staging half (16 KiB) and runs with a done phase instead.
    staged, past_half = 3000, 10000
    with iris.iris(1 << 20) as ctx:
        ok = [staged * 4 <= ctx.ccl._runtime._staging_capacity() < past_half * 4]
        for round_, n in enumerate([64, staged, 64, past_half, staged, 1, 64]):
            inp = torch.randn(n, generator=torch.Generator().manual_seed(rank * 100 + round_)).to(ctx.device)
            if n == past_half:
                inp = ctx.zeros(n).copy_(inp)  # past the staging half: one-shot reads it in place
            out = torch.full((n,), float("nan"), device=ctx.device)
            ctx.ccl.all_reduce(
                out, inp, config=Config(block_size=64, comm_sms=3, all_reduce_variant="one_shot")
            )
            ok.append(_close(out, _reduce(_gather(inp), "sum"), torch.float32))
        return ok


def test_one_shot_rounds_of_changing_sizes_stage_small_inputs(multi_world):
    for ok in multi_world.run(_one_shot_rounds_body):
        assert all(ok), ok


def test_auto_picks_one_shot_small_and_two_shot_large():
    assert ccl_api.pick_variant(Config(), 64 << 10, 4) == "one_shot"
    assert ccl_api.pick_variant(Config(), 256 << 20, 4) == "two_shot"
    assert ccl_api.pick_variant(Config(all_reduce_variant="ring"), 1, 4) == "ring"


# ---------------------------------------------------------------- the others
def _all_gather_body(rank, world_size, gluon=False):
    with iris.iris(1 << 22) as ctx:
        results = {}
        for name, dtype in DTYPES.items():
            inp = _random(ctx, (N // 7, 7), dtype, seed=rank + 10)
            out = ctx.full((world_size * (N // 7), 7), 99, dtype=dtype)
            ctx.ccl.all_gather(out, inp, config=dataclasses.replace(SMALL, use_gluon=gluon))
            results[name] = torch.equal(
                out.cpu().to(torch.float32), torch.cat(_gather(inp)).to(torch.float32)
            )
        return results


# use_gluon: the Gluon kernels on GPUs (iris.ccl.gluon); the Triton ones under emulation.
@pytest.mark.parametrize("gluon", [False, True], ids=["triton", "use_gluon"])
def test_all_gather_concatenates_like_torch(world, gluon):
    for results in world.run(_all_gather_body, gluon):
        assert all(results.values()), results


def _reduce_scatter_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        results = {}
        for name, dtype in DTYPES.items():
            inp = _random(ctx, (world_size * N,), dtype, seed=rank + 20)
            out = ctx.full((N,), 99, dtype=dtype)
            ctx.ccl.reduce_scatter(out, inp, config=SMALL)
            expected = _reduce(_gather(inp), "sum")[rank * N : (rank + 1) * N]
            results[name] = _close(out, expected, dtype)
        return results


def test_reduce_scatter_keeps_this_ranks_block(world):
    for results in world.run(_reduce_scatter_body):
        assert all(results.values()), results


def _owned_tiles(shape, config, member, members):
    """Upstream's tile owners, written out in Python: a mask of ``member``'s elements."""
    rows, cols = shape
    bm, bn, swizzle = config.block_size_m, config.block_size_n, config.swizzle_size
    tiles_m, tiles_n = triton.cdiv(rows, bm), triton.cdiv(cols, bn)
    total = tiles_m * tiles_n
    if config.all_reduce_distribution == 1:
        share = triton.cdiv(total, members)
        numbers = range(member * share, min((member + 1) * share, total))
    else:
        numbers = range(member, total, members)
    owned = torch.zeros(shape, dtype=torch.bool)
    for tile in numbers:
        first_m = tile // (swizzle * tiles_n) * swizzle
        height = min(tiles_m - first_m, swizzle)
        pid_m = first_m + tile % (swizzle * tiles_n) % height
        pid_n = tile % (swizzle * tiles_n) // height
        owned[pid_m * bm : (pid_m + 1) * bm, pid_n * bn : (pid_n + 1) * bn] = True
    return owned


def _full_shape_reduce_scatter_body(rank, world_size, distribution):
    # Upstream's form: out and inp (M, N); each member reduces its own tiles, the rest stay.
    shape = (70, 90)  # 3 x 6 tiles of 32 x 16 with swizzle 2: partial tiles on both edges
    config = Config(block_size_m=32, block_size_n=16, swizzle_size=2, all_reduce_distribution=distribution)
    with iris.iris(1 << 22) as ctx:
        groups = [None]
        if world_size == 4:  # a strided pair too: members 0, 2 and 1, 3
            pairs = [dist.new_group([0, 2]), dist.new_group([1, 3])]
            groups.append(pairs[rank % 2])
        results = []
        for group in groups:
            members = dist.get_process_group_ranks(group) if group else list(range(world_size))
            for cfg in (config, None):  # None: upstream's default tiles (32 x 64, contiguous)
                inp = _random(ctx, shape, torch.float32, seed=rank + 60 + distribution)
                out = ctx.full(shape, float("nan"))
                ctx.ccl.reduce_scatter(out, inp, group=group, config=cfg)
                expected = _reduce(_gather(inp, group=group), "sum")
                owned = _owned_tiles(shape, cfg or ccl_api.tile_reduce_scatter.UPSTREAM_DEFAULT,
                                     members.index(rank), len(members))  # fmt: skip
                got = out.cpu()
                # A member can own no tile (upstream's 6 default tiles over 4 members).
                reduced = not owned.any() or _close(got[owned], expected[owned], torch.float32)
                results.append(reduced and bool(got[~owned].isnan().all()))
        return results


@pytest.mark.parametrize("distribution", [0, 1], ids=["strided", "contiguous"])
def test_full_shape_reduce_scatter_reduces_each_members_tiles_as_upstream(multi_world, distribution):
    for results in multi_world.run(_full_shape_reduce_scatter_body, distribution):
        assert all(results), results


def test_config_takes_upstreams_launch_settings():
    config = Config(swizzle_size=8, num_stages=2, num_xcds=1, chunk_size=4, use_gluon=False, waves_per_eu=2)
    assert (config.swizzle_size, config.num_stages, config.waves_per_eu) == (8, 2, 2)
    assert Config().all_reduce_distribution == 1  # upstream's default
    config.all_reduce_num_rings = 2  # set after construction, as upstream's tests do
    assert config.all_reduce_num_rings == 2


def _group_kernels():
    from iris.ccl import all_gather, all_reduce, all_to_all, broadcast, pushed, staged, tile_reduce_scatter

    kernels = [all_gather.all_gather_kernel, all_to_all.all_to_all_kernel, broadcast.broadcast_kernel]
    kernels += [pushed.pushed_kernel, staged.staged_kernel, tile_reduce_scatter.tile_reduce_scatter_kernel]
    return [*kernels, *all_reduce.KERNELS.values()]


@pytest.mark.parametrize("kernel", _group_kernels(), ids=lambda kernel: kernel.fn.__name__)
def test_every_rank_of_a_group_runs_one_compiled_collective(kernel):
    # Runtime.group_args gives (group, my_index, cur_rank, GROUP): the rank arguments stay out
    # of the tuple, which Triton would specialise element by element (a rank of 1 as a constant).
    names = kernel.arg_names
    start = names.index("group")
    assert names[start : start + 4] == ["group", "my_index", "cur_rank", "GROUP"]
    # A compiled kernel keeps do_not_specialize; the interpreter's keeps its jit keywords.
    listed = getattr(kernel, "do_not_specialize", None) or kernel.kwargs["do_not_specialize"]
    unspecialised = {names[i] if isinstance(i, int) else i for i in listed}
    assert set(ccl.RANK_ARGS) <= unspecialised


def _group_info_body(rank, world_size):
    from iris.ccl.utils import extract_group_info

    with iris.iris(1 << 20) as ctx:
        groups = {"all": None}
        if world_size == 4:
            groups["strided"] = [dist.new_group([0, 2]), dist.new_group([1, 3])][rank % 2]
            groups["uneven"] = dist.new_group([0, 1, 3])
        found = {}
        for name, group in groups.items():
            try:
                found[name] = extract_group_info(group, ctx)
            except (NotImplementedError, RuntimeError) as error:
                found[name] = type(error).__name__
        return found


def test_extract_group_info_addresses_groups_as_upstream(world):
    results = world.run(_group_info_body)
    for rank, found in enumerate(results):
        assert found["all"] == (rank, rank, len(results), 0, 1)
        if len(results) == 4:
            assert found["strided"] == (rank // 2, rank, 2, rank % 2, 2)
            assert found["uneven"] == ("RuntimeError" if rank == 2 else "NotImplementedError")


def _workspace_reuse_body(rank, world_size, variant):
    with iris.iris(1 << 22) as ctx:
        inp, out = ctx.randn((128, 128)), ctx.zeros((128, 128))
        coarse = Config(all_reduce_variant=variant, block_size_m=64, block_size_n=64)
        fine = Config(all_reduce_variant=variant, block_size_m=32, block_size_n=32)
        workspace = ctx.ccl.all_reduce_preamble(out, inp, config=coarse)
        assert (workspace.variant, workspace.tiles) == (variant, 4)
        try:
            ctx.ccl.all_reduce(out, inp, config=fine, workspace=workspace)
        except WorkspaceTooSmallError as error:
            return str(error)
        finally:
            ctx.barrier()


@pytest.mark.parametrize("variant, array", [("spinlock", "Lock"), ("ring", "Flags")])
def test_all_reduce_refuses_a_workspace_prepared_for_fewer_tiles(world, variant, array):
    """Upstream sizes these variants' per-tile arrays at the preamble and refuses such a reuse."""
    for message in world.run(_workspace_reuse_body, variant):
        assert message.startswith(f"{array} array too small: have 4 but need 16.")


def _foreign_workspace_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        inp, out = ctx.randn(256), ctx.zeros(256)
        with pytest.raises(TypeError, match="all_reduce_preamble"):
            ctx.ccl.all_reduce(out, inp, workspace=object())
        ctx.barrier()


def test_all_reduce_says_what_a_workspace_must_be(world):
    world.run(_foreign_workspace_body)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(swizzle_size=0), "swizzle_size"),
        (dict(all_reduce_distribution=2), "all_reduce_distribution"),
        (dict(block_size_n=64, all_reduce_ring_slice_n=48), "all_reduce_ring_slice_n"),
        (dict(waves_per_eu=-1), "waves_per_eu"),
    ],
    ids=["swizzle", "distribution", "ring-slice", "waves"],
)
def test_config_refuses_what_upstream_refuses(settings, message):
    with pytest.raises(ValueError, match=message):
        Config(**settings)


def _all_to_all_body(rank, world_size, two_d, gluon=False):
    with iris.iris(1 << 22) as ctx:
        results = {}
        for name, dtype in DTYPES.items():
            shape = (13, 5 * world_size) if two_d else (37 * world_size,)
            inp = _random(ctx, shape, dtype, seed=rank + 30)
            out = ctx.full(shape, 99, dtype=dtype)
            ctx.ccl.all_to_all(out, inp, config=dataclasses.replace(SMALL, use_gluon=gluon))
            parts = _gather(inp)
            if two_d:
                expected = torch.cat([p[:, rank * 5 : (rank + 1) * 5] for p in parts], dim=1)
            else:
                expected = torch.cat([p[rank * 37 : (rank + 1) * 37] for p in parts])
            results[name] = torch.equal(out.cpu().to(expected.dtype), expected)
        return results


@pytest.mark.parametrize("gluon", [False, True], ids=["triton", "use_gluon"])
@pytest.mark.parametrize("two_d", [True, False], ids=["columns", "flat"])
def test_all_to_all_exchanges_blocks(world, two_d, gluon):
    for results in world.run(_all_to_all_body, two_d, gluon):
        assert all(results.values()), results


def _broadcast_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        src = world_size - 1
        tensor = _random(ctx, (N,), torch.bfloat16, seed=rank + 40)
        expected = tensor.clone()
        reference.broadcast(expected, src=src)
        ctx.ccl.broadcast(tensor, src=src, config=SMALL)
        return torch.equal(tensor, expected)


def test_broadcast_copies_from_src(world):
    assert all(world.run(_broadcast_body))


def _past_staging_body(rank, world_size):
    # 20000 fp32 (80 KB) is past this 4 MiB heap's staging half (64 KiB): these calls
    # push (all_gather), pull in place (reduce_scatter) and fan out from owners (broadcast).
    big = Config(block_size=2048)
    n = 20000
    with iris.iris(1 << 22) as ctx:
        ok = {}
        inp = _random(ctx, (n,), torch.float32, seed=rank + 60)
        gathered = ctx.full((world_size * n,), float("nan"))
        ctx.ccl.all_gather(gathered, inp, config=big)
        ok["all_gather"] = torch.equal(gathered.cpu(), torch.cat(_gather(inp)))
        blocks = _random(ctx, (world_size * n,), torch.float32, seed=rank + 70)
        mine = torch.full((n,), float("nan"), device=ctx.device)
        ctx.ccl.reduce_scatter(mine, blocks, config=big)
        ok["reduce_scatter"] = _close(
            mine, _reduce(_gather(blocks), "sum")[rank * n : (rank + 1) * n], torch.float32
        )
        for src in range(world_size):
            tensor = _random(ctx, (n,), torch.float32, seed=rank + 80 + src)
            expected = tensor.clone()
            reference.broadcast(expected, src=src)
            ctx.ccl.broadcast(tensor, src=src, config=big)
            ok[f"broadcast from {src}"] = torch.equal(tensor, expected)
        return ok


def test_collectives_past_the_staging_half_push_pull_and_fan_out(world):
    for ok in world.run(_past_staging_body):
        assert all(ok.values()), ok


def _staged_anywhere_body(rank, world_size):
    # Staged calls read only staging halves: inputs and outputs may live off the heap,
    # and alternating calls of every kind keep the halves' turns in step.
    staged = dataclasses.replace(SMALL, protocol="staged")
    with iris.iris(1 << 22) as ctx:
        ok = []
        for step in range(3):
            inp = _random(ctx, (N,), torch.float32, seed=100 * step + rank).clone()  # off the heap
            gathered = torch.full((world_size * N,), float("nan"), device=ctx.device)
            ctx.ccl.all_gather(gathered, inp, config=staged)
            ok.append(torch.equal(gathered.cpu(), torch.cat(_gather(inp))))
            mine = torch.full((N // world_size,), float("nan"), device=ctx.device)
            ctx.ccl.reduce_scatter(mine, inp[: world_size * (N // world_size)], config=staged)
            block = slice(rank * (N // world_size), (rank + 1) * (N // world_size))
            ok.append(
                _close(
                    mine, _reduce(_gather(inp), "sum")[: world_size * (N // world_size)][block], torch.float32
                )
            )
            src = step % world_size
            expected = inp.clone()
            reference.broadcast(expected, src=src)
            ctx.ccl.broadcast(inp, src=src, config=staged)
            ok.append(torch.equal(inp, expected))
        return ok


def test_staged_calls_take_tensors_anywhere_and_alternate_halves(world):
    for ok in world.run(_staged_anywhere_body):
        assert all(ok), ok


def _low_latency_body(rank, world_size, dtype_name):
    # Every mode of the low-latency protocol on tensors off the heap, over three calls
    # (both halves, then the first again); n = 2050 words spans three tiles, which
    # comm_sms=2 makes one program loop over.
    dtype = DTYPES[dtype_name]
    words = 2050
    n = words * 4 // torch.tensor([], dtype=dtype).element_size()
    config = Config(protocol="low_latency", comm_sms=2)
    with iris.iris(1 << 24) as ctx:
        ok = {}
        for step in range(3):
            inp = _random(ctx, (world_size * n,), dtype, seed=100 * step + rank).clone()
            parts = _gather(inp)
            total = _reduce(parts, "sum")
            mine = slice(rank * n, (rank + 1) * n)

            out = torch.full((n,), 99, dtype=dtype, device=ctx.device)
            ctx.ccl.all_reduce(out, inp[:n], config=config)
            ok[f"all_reduce {step}"] = _close(out, total[:n], dtype)
            out = torch.full((n,), 99, dtype=dtype, device=ctx.device)
            ctx.ccl.reduce_scatter(out, inp, config=config)
            ok[f"reduce_scatter {step}"] = _close(out, total[mine], dtype)
            out = torch.full((world_size * n,), 99, dtype=dtype, device=ctx.device)
            ctx.ccl.all_gather(out, inp[:n], config=config)
            expected = torch.cat([p[:n] for p in parts])
            ok[f"all_gather {step}"] = torch.equal(out.cpu().to(expected.dtype), expected)
            out = torch.full((world_size * n,), 99, dtype=dtype, device=ctx.device)
            ctx.ccl.all_to_all(out, inp, config=config)
            expected = torch.cat([p[mine] for p in parts])
            ok[f"all_to_all {step}"] = torch.equal(out.cpu().to(expected.dtype), expected)
            # Columns of a 2-D tensor: 6 rows of 10 elements per member (whole words).
            columns = inp[: 60 * world_size].reshape(6, 10 * world_size)
            out = torch.full(columns.shape, 99, dtype=dtype, device=ctx.device)
            ctx.ccl.all_to_all(out, columns, config=config)
            blocks = [p[: 60 * world_size].reshape(6, 10 * world_size) for p in parts]
            expected = torch.cat([b[:, rank * 10 : (rank + 1) * 10] for b in blocks], dim=1)
            ok[f"all_to_all columns {step}"] = torch.equal(out.cpu().to(expected.dtype), expected)
        return ok


@pytest.mark.parametrize("dtype_name", ["fp16", "bf16", "fp32", "int32"])
def test_low_latency_calls_match_torch_off_the_heap(world, dtype_name):
    for ok in world.run(_low_latency_body, dtype_name):
        assert all(ok.values()), ok


def _pushed_body(rank, world_size, dtype_name):
    # Pushed calls over rounds of four columns in both slot halves: 16 columns of
    # 64-element tiles on 3 programs, so program 0 takes a full round and a partial one
    # per call; sizes end in partial tiles, and alternating all_reduce and reduce_scatter
    # calls share one round count per program.
    dtype = DTYPES[dtype_name]
    config = dataclasses.replace(SMALL, protocol="pushed")
    n = 16 * 64 * world_size - 37
    block = 16 * 64 - 5
    with iris.iris(1 << 24) as ctx:  # the slots take at most 1/16 of the heap
        ok = {"rounds of four": ctx.ccl._runtime.push_round_tiles(64 * dtype.itemsize) == 4}
        for step in range(3):
            inp = _random(ctx, (world_size * block,), dtype, seed=100 * step + rank).clone()  # off the heap
            parts = _gather(inp)
            total = _reduce(parts, "sum")
            out = ctx.full((n,), 99, dtype=dtype)
            ctx.ccl.all_reduce(out, inp[:n], config=config)
            ok[f"all_reduce {step}"] = _close(out, total[:n], dtype)
            mine = torch.full((block,), 99, dtype=dtype, device=ctx.device)
            ctx.ccl.reduce_scatter(mine, inp, config=config)
            ok[f"reduce_scatter {step}"] = _close(mine, total[rank * block : (rank + 1) * block], dtype)
        return ok


@pytest.mark.parametrize("dtype_name", ["bf16", "fp32", "int32"])
def test_pushed_calls_match_torch(world, dtype_name):
    for ok in world.run(_pushed_body, dtype_name):
        assert all(ok.values()), ok


def _auto_protocol_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:  # staging halves of 256 KiB
        runtime = ctx.ccl._runtime
        state = runtime.group(None)
        # Tiles as large as this heap's push slots hold (their size depends on the SM count).
        tile = runtime._push_slot_bytes()
        assert tile > 0

        def pick(nbytes, auto_pushes):
            return runtime.protocol([], state, Config(), nbytes, pushed_bytes=tile, auto_pushes=auto_pushes)

        return [pick(64 << 10, True), pick(4 << 20, True), pick(64 << 20, True), pick(64 << 20, False)]


def test_auto_stages_then_pushes_where_the_collective_asks(world):
    for picks in world.run(_auto_protocol_body):
        assert picks == ["staged", "pushed", "pushed", "direct"]


def _forced_protocol_body(rank, world_size, collective):
    with iris.iris(1 << 22) as ctx:
        tensor = ctx.randn(64 * world_size)
        try:
            if collective == "broadcast":
                ctx.ccl.broadcast(tensor, config=Config(protocol="low_latency"))
            elif collective == "all_to_all":
                ctx.ccl.all_to_all(ctx.empty(64 * world_size), tensor, config=Config(protocol="staged"))
            elif collective == "all_gather":
                ctx.ccl.all_gather(ctx.empty(64 * world_size**2), tensor, config=Config(protocol="pushed"))
            else:
                odd = ctx.randn(63).to(torch.float16)  # 126 bytes: not whole 4-byte words
                ctx.ccl.all_reduce(torch.empty_like(odd), odd, config=Config(protocol="low_latency"))
        except CollectiveError as error:
            return str(error)
        return None


@pytest.mark.parametrize("collective", ["broadcast", "all_to_all", "all_gather", "all_reduce"])
def test_forcing_a_protocol_that_cannot_run_raises_on_every_rank(world, collective):
    messages = world.run(_forced_protocol_body, collective)
    assert all(m is not None and "cannot run this call" in m for m in messages), messages


# ---------------------------------------------------------------- reuse, groups, async
def _many_calls_body(rank, world_size):
    # Epochs come from device counters: interleaved collectives and variants must
    # keep agreeing call after call.
    with iris.iris(1 << 22) as ctx:
        out = ctx.empty(N)
        gathered = ctx.empty(world_size * N)
        ok = []
        for step in range(6):
            inp = _random(ctx, (N,), torch.float32, seed=100 * step + rank)
            variant = ["one_shot", "two_shot", "ring", "atomic", "spinlock"][step % 5]
            ctx.ccl.all_reduce(out, inp, config=Config(block_size=64, all_reduce_variant=variant))
            ok.append(_close(out, _reduce(_gather(inp), "sum"), torch.float32))
            ctx.ccl.all_gather(gathered, inp, config=SMALL)
            ok.append(torch.equal(gathered.cpu(), torch.cat(_gather(inp))))
        return ok


def test_repeated_mixed_calls_stay_in_step(world):
    for ok in world.run(_many_calls_body):
        assert all(ok), ok


def _replay_body(rank, world_size):
    # The second call replays the first one's launch (same objects, same options);
    # a tensor re-pointed in place, or another op, must not.
    with iris.iris(1 << 22) as ctx:
        out, inp = ctx.empty(N), _random(ctx, (N,), torch.float32, seed=rank)
        ok = []
        for seed in (10, 20):
            inp.copy_(_random(ctx, (N,), torch.float32, seed=seed + rank))
            ctx.ccl.all_reduce(out, inp)
            ok.append(_close(out, _reduce(_gather(inp), "sum"), torch.float32))
        inp.set_(_random(ctx, (N,), torch.float32, seed=30 + rank))  # same object, new memory
        ctx.ccl.all_reduce(out, inp)
        ok.append(_close(out, _reduce(_gather(inp), "sum"), torch.float32))
        ctx.ccl.all_reduce(out, inp, op="max")
        ok.append(_close(out, _reduce(_gather(inp), "max"), torch.float32))
        return ok


def test_repeated_calls_replay_only_while_nothing_changed(world):
    for ok in world.run(_replay_body):
        assert all(ok), ok


def _subgroup_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        halves = [
            dist.new_group(list(range(0, world_size // 2))),
            dist.new_group(list(range(world_size // 2, world_size))),
        ]
        mine = halves[0] if rank < world_size // 2 else halves[1]
        inp = _random(ctx, (N,), torch.float32, seed=rank + 50)
        out = ctx.empty(N)
        gathered = ctx.full((world_size // 2 * N,), 99.0)
        ctx.ccl.all_reduce(out, inp, group=mine, config=SMALL)
        ctx.ccl.all_gather(gathered, inp, group=mine, config=SMALL)
        work = ctx.ccl.all_reduce(out, inp, group=mine, config=SMALL, async_op=True)
        work.wait()
        parts = _gather(inp, group=mine)
        return _close(out, _reduce(parts, "sum"), torch.float32) and torch.equal(
            gathered.cpu(), torch.cat(parts)
        )


def test_subgroups_reduce_and_gather_among_members_only(multi_world):
    assert all(multi_world.run(_subgroup_body))


def _one_shot_out_anywhere_body(rank, world_size):
    # One-shot writes only its own out, so ranks may place it differently: on the heap
    # at different offsets, or off the heap.
    with iris.iris(1 << 22) as ctx:
        inp = _random(ctx, (N,), torch.float32, seed=rank)
        if rank % 2:
            ctx.empty(7)  # shifts this rank's next heap offset
            out = ctx.empty(N)
        else:
            out = torch.empty(N, device=ctx.get_device())
        config = dataclasses.replace(SMALL, all_reduce_variant="one_shot", protocol="direct")
        ctx.ccl.all_reduce(out, inp, config=config)
        return _close(out, _reduce(_gather(inp), "sum"), torch.float32)


def test_one_shot_output_may_sit_anywhere_on_each_rank(world):
    assert all(world.run(_one_shot_out_anywhere_body))


# ---------------------------------------------------------------- errors on every rank
def _mismatch_body(rank, world_size, problem):
    with iris.iris(1 << 22) as ctx:
        n = 64 + (rank if problem == "shape" else 0)
        inp = ctx.randn(n)
        out = ctx.empty(n, dtype=torch.float16 if problem == "dtype" and rank == 0 else torch.float32)
        config = SMALL
        if problem == "off_heap":
            # direct two-shot reads peers' inputs (the other protocols take inputs anywhere)
            config = dataclasses.replace(SMALL, all_reduce_variant="two_shot", protocol="direct")
            if rank == world_size - 1:
                inp = torch.randn(n, device=ctx.get_device())
        try:
            ctx.ccl.all_reduce(out, inp, config=config)
        except CollectiveError as error:
            return str(error)
        return None


@pytest.mark.parametrize(
    "problem, expected",
    [
        ("shape", "called it with"),
        ("dtype", "out is torch.float16"),
        ("off_heap", "not on the symmetric heap"),
    ],
)
def test_bad_arguments_raise_on_every_rank(multi_world, problem, expected):
    messages = multi_world.run(_mismatch_body, problem)
    assert all(m is not None and expected in m for m in messages), messages


def _bad_shape_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        try:
            ctx.ccl.all_gather(ctx.empty(5), ctx.empty(5))
        except CollectiveError as error:
            return str(error)


def test_all_gather_output_size_is_checked(world):
    if world.world_size == 1:
        pytest.skip("a group of one gathers into an output of the input's size")
    assert all("needs" in m for m in world.run(_bad_shape_body))


def test_config_rejects_unknown_variant():
    with pytest.raises(ValueError, match="all_reduce_variant"):
        Config(all_reduce_variant="tree")
    with pytest.raises(ValueError, match="power of two"):
        Config(block_size=100)


# ---------------------------------------------------------------- tracing and user kernels
def _traced_body(rank, world_size):
    with iris.iris(1 << 24) as ctx:
        inp = _random(ctx, (N,), torch.float32, seed=rank)
        out = ctx.empty(N)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        direct = Config(block_size=64, all_reduce_variant="two_shot", protocol="direct")  # remote loads
        ctx.ccl.all_reduce(out, inp, config=direct)
        events = ctx.tracing.events()
        ctx.tracing.disable()
        return sorted(set(events["event_id"].tolist()))


def test_collectives_are_traced(multi_world):
    from iris.device import tracing

    for kinds in multi_world.run(_traced_body):
        assert {
            tracing.LOAD.value,
            tracing.STORE.value,
            tracing.SIGNAL.value,
            tracing.WAIT_UNTIL.value,
        } <= set(kinds)


@triton.jit
def user_all_gather_kernel(
    out, inp, n, flags, ranks, cur_rank, heap_bases, GROUP: tl.constexpr, BLOCK: tl.constexpr
):
    # A collective of the whole world written from the tile functions: ``ranks`` is 0..GROUP - 1
    # (a member's index is its rank), and each program syncs on its own row of ``flags``.
    pid = tl.program_id(0)
    rows = tl.num_programs(0)
    ccl.sync_row(ccl.flag_row(flags, 0, pid, rows, GROUP), cur_rank, ranks, GROUP, heap_bases)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    values = tl.load(inp + offsets, mask=mask) * 2
    ccl.push_tile(out + cur_rank * n + offsets, values, cur_rank, ranks, cur_rank, GROUP, heap_bases, mask)
    ccl.sync_row(ccl.flag_row(flags, 1, pid, rows, GROUP), cur_rank, ranks, GROUP, heap_bases)


def _user_kernel_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        inp = _random(ctx, (N,), torch.float32, seed=rank)
        out = ctx.full((world_size * N,), 99.0)
        grid = (triton.cdiv(N, 128),)
        flags = ctx.zeros(2, grid[0], world_size, dtype=torch.int32)
        ranks = torch.arange(world_size, dtype=torch.int32, device=ctx.get_device())
        ctx.barrier()
        user_all_gather_kernel[grid](out, inp, N, flags, ranks, rank, ctx.get_heap_bases(), world_size, 128)
        return torch.equal(out.cpu(), torch.cat(_gather(inp)) * 2)


def test_tile_functions_build_a_user_collective(world):
    assert all(world.run(_user_kernel_body))


# ---------------------------------------------------------------- CUDA graphs
def _graph_body(rank, world_size):
    with iris.iris(1 << 29) as ctx:  # room for the pushed protocol's slots (1/16 of the heap)
        inp = ctx.empty(4099)
        reduced = ctx.empty(4099)
        gathered = ctx.empty(world_size * 4099)
        scattered = ctx.empty(4099)
        big = ctx.empty(world_size * 4099)
        pushed_reduced, pushed_scattered = ctx.empty(4099), ctx.empty(4099)
        pushed = Config(protocol="pushed")
        calls = lambda: (
            ctx.ccl.all_reduce(reduced, inp),
            ctx.ccl.all_gather(gathered, inp),
            ctx.ccl.reduce_scatter(scattered, big),
            ctx.ccl.all_reduce(pushed_reduced, inp, config=pushed),
            ctx.ccl.reduce_scatter(pushed_scattered, big, config=pushed),
        )
        inp.normal_()
        big.normal_()
        calls()  # compile and check arguments before capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            calls()
        ok = []
        for replay in range(20):
            generator = torch.Generator(device=inp.device).manual_seed(replay * 100 + rank)
            inp.copy_(torch.randn(4099, generator=generator, device=inp.device))
            big.copy_(torch.randn(world_size * 4099, generator=generator, device=inp.device))
            for t in (reduced, gathered, scattered, pushed_reduced, pushed_scattered):
                t.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            parts, big_parts = _gather(inp), _gather(big)
            ok.append(_close(reduced, _reduce(parts, "sum"), torch.float32))
            ok.append(torch.equal(gathered.cpu(), torch.cat(parts)))
            mine = _reduce(big_parts, "sum")[rank * 4099 : (rank + 1) * 4099]
            ok.append(_close(scattered, mine, torch.float32))
            ok.append(_close(pushed_reduced, _reduce(parts, "sum"), torch.float32))
            ok.append(_close(pushed_scattered, mine, torch.float32))
        return ok


@on_gpu
def test_collectives_replay_under_cuda_graphs(world):
    for ok in world.run(_graph_body):
        assert all(ok), ok


# ---------------------------------------------------------------- Hopper code
@pytest.mark.codegen
@pytest.mark.timeout(900)  # 19 kernels compiled cold take 1-2 minutes on one core
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_every_collective_compiles_for_hopper_with_vector_accesses(dtype):
    stdout = run_cuda_script("compile_ccl.py", dtype, timeout=900)
    lines = dict(line.split(" ", 1) for line in stdout.splitlines())
    # 5 all-reduce variants, 4 staged modes, 4 low-latency modes, 2 pushed modes,
    # all_gather, all_to_all, upstream's full-shape reduce_scatter, broadcast; reduce_scatter
    # runs all_reduce_one_shot on its block when no other protocol applies.
    assert len(lines) == 20, stdout  # and the barrier check's line
    assert lines["barriers_in_multi_entry_loops"] == "{}", stdout
    if dtype == "bf16":
        # Hopper adds bf16 atomically in hardware (atom or red, by Triton version), no compare-swap loop.
        bf16_adds = lines["all_reduce_atomic[bf16]"]
        assert ".add.noftz." in bf16_adds and "bf16" in bf16_adds, stdout
    checked = (
        "all_reduce_one_shot[fp32]",
        "all_reduce_two_shot[bf16]",
        "all_gather[fp32]",
        "all_reduce_one_shot[bf16]",
        "all_reduce_staged[bf16]",
        "all_reduce_pushed[bf16]",
        "reduce_scatter_pushed[fp32]",
        "all_gather_staged[fp32]",
        "reduce_scatter_staged[bf16]",
        "broadcast[bf16]",
    )
    for name in (name for name in checked if name.endswith(f"[{dtype}]")):
        assert "ld.global.v4.b32" in lines[name] and "st.global.v4.b32" in lines[name], (name, lines[name])
    low_latency = ("all_reduce_low_latency[bf16]", "all_to_all_low_latency[fp32]")
    for name in (name for name in low_latency if name.endswith(f"[{dtype}]")):
        # Payload words pack into 16-byte stores of two (epoch, data) words.
        assert "st.global.v2.b64" in lines[name] and "ld.global.v4.b32" in lines[name], (name, lines[name])
