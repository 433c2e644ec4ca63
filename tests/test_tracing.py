"""Tracing: exact events for known kernels, overflow accounting, on/off, collection, alignment."""

import os

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
from conftest import get_pool
from kernels import ping_pong_rounds

import iris
from iris.device.tracing import TraceEvent, _region
from iris_trace import schema
from iris_trace.events import EVENT_NAMES, decode_records
from iris_trace.trace import Trace, TraceFileError

ID = {name: event_id for event_id, name in EVENT_NAMES.items()}
N, BLOCK = 50, 64


@triton.jit
def put_blocks(src, dst, n, k, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    for _ in range(k):
        for j in range(1, world_size):
            peer = (cur_rank + j) % world_size
            iris.put(src + offsets, dst + offsets, cur_rank, peer, heap_bases, mask=offsets < n)


@triton.jit
def every_op(buf, flag, cur_rank, world_size, heap_bases):
    peer = (cur_rank + 1) % world_size
    offsets = tl.arange(0, 4)
    value = iris.load(buf + offsets, cur_rank, peer, heap_bases)
    iris.store(buf + 4 + offsets, value, cur_rank, peer, heap_bases)
    iris.get(buf + offsets, buf + 8 + offsets, peer, cur_rank, heap_bases)
    iris.put(buf + offsets, buf + 12 + offsets, cur_rank, peer, heap_bases)
    iris.copy(buf + offsets, buf + 16 + offsets, peer, cur_rank, cur_rank, heap_bases)
    iris.atomic_add(buf + 20, 1, cur_rank, peer, heap_bases)
    iris.atomic_sub(buf + 20, 1, cur_rank, peer, heap_bases)
    iris.atomic_xchg(buf + 21, 1, cur_rank, peer, heap_bases)
    iris.atomic_xor(buf + 21, 1, cur_rank, peer, heap_bases)
    iris.atomic_and(buf + 21, 1, cur_rank, peer, heap_bases)
    iris.atomic_or(buf + 21, 1, cur_rank, peer, heap_bases)
    iris.atomic_min(buf + 21, 1, cur_rank, peer, heap_bases)
    iris.atomic_max(buf + 21, 1, cur_rank, peer, heap_bases)
    iris.atomic_cas(buf + 21, 1, 1, cur_rank, peer, heap_bases)
    iris.signal(flag, 7, cur_rank, cur_rank, heap_bases)
    iris.wait_until(flag, "eq", 7, heap_bases=heap_bases)
    # Fully masked off: moves nothing, so it is no event (and records no bogus address).
    iris.put(buf + offsets, buf + 24 + offsets, cur_rank, peer, heap_bases, mask=offsets < 0)


@triton.jit
def tiled_context_kernel(context, buf, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    ctx = ctx.with_tile(tl.program_id(0), 5)
    start = ctx.trace_begin()
    offsets = tl.arange(0, 16)
    ctx.store(buf + offsets, offsets, (rank + 1) % world_size)
    ctx.trace_end(start, scope=2)


def _counts_body(rank, world_size, programs, k):
    with iris.iris(1 << 22) as ctx:
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())  # max_events is split over the SMs
        put_blocks[(programs,)](src, dst, N, k, rank, world_size, ctx.get_heap_bases(), BLOCK=BLOCK)
        ev = ctx.tracing.events()
        assert ctx.tracing.dropped() == 0
        assert len(ev) == programs * k * (world_size - 1)
        assert (ev["event_id"] == ID["put"]).all() and (ev["cur_rank"] == rank).all()
        assert (ev["payload_bytes"] == N * 4).all()
        assert (ev["address"] == ctx.heap.offset_of(dst)).all()
        assert (ev["end_ns"] >= ev["start_ns"]).all()
        for pid in range(programs):
            mine = ev[ev["pid"] == pid]
            assert len(mine) == k * (world_size - 1)
            targets = sorted(mine["target_rank"].tolist())
            assert targets == sorted([(rank + j) % world_size for j in range(1, world_size)] * k)
            if iris.BACKEND == "emulated":
                assert (mine["cu_id"] == pid % ctx.get_cu_count()).all()
            else:  # a program never leaves its SM
                assert len(set(mine["cu_id"].tolist())) <= 1
        # op_index is the record's slot in the region it went to, and every region fills
        # from slot 0: fewer events hold slot k + 1 than slot k.
        held = np.bincount(ev["op_index"])
        assert (held > 0).all() and (np.diff(held) <= 0).all(), held


def test_put_events_are_exact(world):
    world.run(_counts_body, 3, 2)


def _upstream_export_body(rank, world_size, directory):
    import json

    with iris.iris(1 << 22) as ctx:
        assert ctx.tracing.trace_counter is None  # upstream's: no counter before enable
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        put_blocks[(2,)](src, dst, N, 1, rank, world_size, ctx.get_heap_bases(), BLOCK=BLOCK)
        puts = 2 * (world_size - 1)
        assert ctx.tracing.trace_counter.item() == puts
        path = os.path.join(directory, "trace.json")
        mine = ctx.tracing.export(path)  # upstream's default form: this rank's file, not collective
        with open(os.path.join(directory, f"trace_rank{rank}.json")) as handle:
            assert json.load(handle) == mine
        slices = [e for e in mine["traceEvents"] if e["ph"] != "M"]
        assert len(slices) == puts and {e["name"] for e in slices} == {"put"}
        assert {e["pid"] for e in slices} == {rank} and mine["metadata"]["world_size"] == world_size
        assert all(e["args"]["payload_size"] == N * 4 for e in slices)
        merged = ctx.tracing.export(path, merge=True)
        if rank == 0:
            with open(path) as handle:
                assert json.load(handle) == merged
            names = [e for e in merged["traceEvents"] if e.get("name") == "put" and e.get("ph") == "X"]
            assert sorted({e["pid"] for e in names}) == list(range(world_size))
            assert len(names) == world_size * puts and merged["metadata"]["total_events"] == world_size * puts
        else:
            assert merged == {}
        ctx.barrier()


def _upstream_buffers_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        assert ctx.tracing.trace_buffers is None  # upstream's: no buffers before enable
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        ctx.tracing.enable(max_events=1000)
        put_blocks[(2,)](src, dst, N, 1, rank, world_size, ctx.get_heap_bases(), BLOCK=BLOCK)
        puts = 2 * (world_size - 1)
        bufs = ctx.tracing.trace_buffers
        assert all(len(column) == 1000 for column in bufs.values())
        assert bufs["event_id"][:puts].tolist() == [int(TraceEvent().put)] * puts
        assert bufs["event_id"][puts:].eq(0).all() and bufs["cur_rank"][:puts].eq(rank).all()
        assert (bufs["duration_cycles"][:puts] >= bufs["timestamp"][:puts]).all()  # the end time
        assert bufs["payload_size"][:puts].eq(N * 4).all() and bufs["timestamp"].dtype == torch.int64
        assert (bufs["timestamp"][1:puts] >= bufs["timestamp"][: puts - 1]).all()  # in starting order
        ctx.barrier()


def test_upstream_trace_buffers_hold_this_ranks_events_by_field(multi_world):
    multi_world.run(_upstream_buffers_body)


def test_upstream_export_writes_its_files_and_returns_its_documents(multi_world, tmp_path):
    multi_world.run(_upstream_export_body, str(tmp_path))


def _every_op_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(32, dtype=torch.int32)
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.barrier()
        every_op[(1,)](buf, flag, rank, world_size, ctx.get_heap_bases())
        ev = ctx.tracing.events()
        names = [EVENT_NAMES[i] for i in ev["event_id"]]
        assert ctx.tracing.dropped() == 0
        device_ops = [name for i, name in sorted(EVENT_NAMES.items()) if i <= schema.WAIT_UNTIL]
        assert names == device_ops, names  # one event per op, in program order; none for the masked put
        assert ev[names.index("load")]["payload_bytes"] == 16
        assert ev[names.index("atomic_add")]["payload_bytes"] == 4
        assert ev[names.index("signal")]["value"] == 7
        assert ev[names.index("signal")]["sub"] == schema.SIGNAL_OPS.index("set")
        assert ev[names.index("wait_until")]["value"] == 7
        assert ev[names.index("wait_until")]["address"] == ctx.heap.offset_of(flag)
        assert ev[names.index("copy")]["target_rank"] == rank
        ctx.barrier()


def test_every_op_records_its_kind(world):
    world.run(_every_op_body)


@triton.jit
def masked_blocks(buf, cur_rank, heap_bases):
    rows = tl.arange(0, 4)[:, None]
    cols = tl.arange(0, 8)[None, :]
    # A 4 x 8 tile at element 16 whose mask cuts its end (3 x 5 active), then a range cut at its start.
    tile = buf + 16 + rows * 8 + cols
    iris.store(tile, rows + cols, cur_rank, cur_rank, heap_bases, mask=(rows < 3) & (cols < 5))
    offsets = tl.arange(0, 8)
    iris.store(buf + offsets, offsets, cur_rank, cur_rank, heap_bases, mask=offsets >= 2)
    # A mask of rows only (4 x 1), broadcast over the tile's 8 columns as tl.store does.
    iris.store(tile, rows + cols, cur_rank, cur_rank, heap_bases, mask=rows < 2)


def _masked_blocks_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(64, dtype=torch.int32)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        masked_blocks[(1,)](buf, rank, ctx.get_heap_bases())
        ev = ctx.tracing.events()
        # The address is the block's first element (row-major), the bytes its active elements.
        base = ctx.heap.offset_of(buf)
        assert ev["address"].tolist() == [base + 16 * 4, base, base + 16 * 4]
        assert ev["payload_bytes"].tolist() == [15 * 4, 6 * 4, 2 * 8 * 4]
        ctx.tracing.disable()


def test_block_ops_record_their_first_element_and_active_bytes():
    get_pool(1).run(_masked_blocks_body)


def _device_barrier_events(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.barrier()
        ctx.device_barrier()
        ev = ctx.tracing.events()
        ctx.tracing.disable()
        ctx.barrier()
    return ev


def test_library_waits_are_named_in_traces(multi_world):
    for ev in multi_world.run(_device_barrier_events):
        assert set(ev["event_id"].tolist()) >= {schema.DEVICE_BARRIER_WAIT}, ev["event_id"]
        assert schema.WAIT_UNTIL not in set(ev["event_id"].tolist())  # named, not a bare wait_until


def test_device_barrier_records_a_signal_and_a_wait_per_peer(multi_world):
    for rank, ev in enumerate(multi_world.run(_device_barrier_events)):
        peers = sorted(set(range(multi_world.world_size)) - {rank})
        signals = ev[ev["event_id"] == schema.SIGNAL]
        waits = ev[ev["event_id"] == schema.DEVICE_BARRIER_WAIT]
        assert sorted(signals["target_rank"].tolist()) == peers and (signals["value"] == 1).all()
        assert (waits["target_rank"] == rank).all() and (waits["value"] >= 1).all()
        # Each wait polls a peer's slot of the row whose slot ``rank`` the signals add to.
        slot = int(signals["payload_bytes"][0])
        assert len(set(signals["address"].tolist())) == 1
        offsets = sorted(((waits["address"] - signals["address"][0]) // slot).tolist())
        assert offsets == [peer - rank for peer in peers]
        assert signals["end_ns"].max() <= waits["start_ns"].min()  # arrive, then wait


def test_device_wait_ids_follow_the_schema():
    from iris.device import flight, tracing

    names = ("iris.wait_until", "iris.device_barrier", "iris.ccl.all_reduce", "iris.ops.scatter", "mine")
    for op in names:
        assert int(tracing.wait_event(op)) == schema.wait_event_id(op), op
    for op, ident in schema.OP_IDS.items():
        assert flight.op_id(op) == ident
    assert flight.op_id("iris.ccl.all_gather") == schema.OP_IDS["iris.ccl"]
    fields = schema.REPORT_FIELDS
    assert [flight.report_word(name) for name in fields] == list(range(len(fields)))
    assert len(schema.REPORT_FIELDS) <= schema.REPORT_WORDS


def test_every_event_id_reaches_the_device_and_trace_event_from_the_schema_alone():
    from iris.device import tracing

    for event in schema.Event:
        assert int(getattr(tracing, event.name)) == int(event) == getattr(schema, event.name)
    fields = dict(tracing._TRACE_EVENT_FIELDS)
    assert {name: fields[name] for name in ("put", "wait", "barrier")} == {
        "put": schema.PUT,
        "wait": schema.WAIT_UNTIL,
        "barrier": schema.DEVICE_BARRIER_WAIT,
    }
    assert set(fields) >= {event.name.lower() for event in schema.DEVICE_OPS}
    # The flight recorder's own kind shares the id space of its entries.
    assert schema.WAIT_BEGIN not in schema.EVENT_NAMES and schema.WAIT_BEGIN < schema.SCOPE_BASE


def _tile_and_scope_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(16, dtype=torch.int32)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.tracing.name_scope(2, "compute")
        ctx.barrier()
        tiled_context_kernel[(3,)](ctx.get_device_context(), buf, rank=rank, world_size=world_size)
        ev = ctx.tracing.events()
        stores, scopes = ev[ev["event_id"] == ID["store"]], ev[ev["event_id"] == 64 + 2]
        assert len(stores) == 3 and len(scopes) == 3
        assert sorted(stores["pid_m"].tolist()) == [0, 1, 2] and (stores["pid_n"] == 5).all()
        assert sorted(scopes["pid_m"].tolist()) == [0, 1, 2] and (scopes["target_rank"] == -1).all()
        for store, scope in zip(np.sort(stores, order="pid_m"), np.sort(scopes, order="pid_m")):
            assert scope["start_ns"] <= store["start_ns"] and store["end_ns"] <= scope["end_ns"]
        ctx.barrier()


def test_device_context_records_tiles_and_user_scopes(world):
    world.run(_tile_and_scope_body)


@triton.jit
def hand_recorded_kernel(context, buf, handles, rank: tl.constexpr, world_size: tl.constexpr):
    # Upstream Iris's spelling: bracket an op with ctx.tracing.record_event_start/end.
    ctx = iris.DeviceContext.initialize(context, rank, world_size, tracing=True)
    peer = (rank + 1) % world_size
    offsets = tl.arange(0, 16)
    mask = offsets < 10
    handle = ctx.tracing.record_event_start(iris.TraceEvent().put, peer, buf + offsets, 3, 4, mask)
    ctx.put(buf + 16 + offsets, buf + offsets, peer, mask=mask)
    ctx.tracing.record_event_end(handle)
    tl.store(handles, handle)


def _hand_recorded_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(32, dtype=torch.int32)
        handles = ctx.full((1,), -7, dtype=torch.int64)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.barrier()
        hand_recorded_kernel[(1,)](ctx.get_device_context(), buf, handles, rank=rank, world_size=world_size)
        ev = ctx.tracing.events()
        hand, op = ev[ev["pid_m"] == 3], ev[ev["pid_m"] == -1]
        assert len(hand) == 1 and len(op) == 1 and handles.item() >= 0
        assert hand["event_id"][0] == ID["put"] and hand["pid_n"][0] == 4
        assert hand["target_rank"][0] == (rank + 1) % world_size
        assert hand["address"][0] == ctx.heap.offset_of(buf) and hand["payload_bytes"][0] == 10 * 4
        assert hand["start_ns"][0] <= op["start_ns"][0] and op["end_ns"][0] <= hand["end_ns"][0]
        # Tracing disabled: nothing recorded, and the handle says so.
        ctx.tracing.disable()
        ctx.tracing.reset()
        hand_recorded_kernel[(1,)](ctx.get_device_context(), buf, handles, rank=rank, world_size=world_size)
        assert handles.item() == -1 and len(ctx.tracing.events()) == 0
        ctx.barrier()


def test_upstream_hand_recorded_events(world):
    world.run(_hand_recorded_body)


def _overflow_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        regions = ctx.get_cu_count()
        ctx.tracing.enable(max_events=regions)  # fewer slots than puts
        puts = 3 * regions
        put_blocks[(1,)](src, dst, N, puts, rank, 2, ctx.get_heap_bases(), BLOCK=BLOCK)
        recorded, dropped = len(ctx.tracing.events()), ctx.tracing.dropped()
        assert recorded + dropped == puts and 1 <= recorded < puts, (recorded, dropped)
        ctx.tracing.reset()
        assert len(ctx.tracing.events()) == 0 and ctx.tracing.dropped() == 0
        ctx.barrier()


def test_full_buffers_count_dropped_events(multi_world):
    multi_world.run(_overflow_body)


@triton.jit
def stashed_scopes(buf, n, heap_bases, CAPACITY: tl.constexpr):
    # n scopes kept in a stash of CAPACITY records, written when full and at the end.
    held, count = iris.device.tracing.stash_new(heap_bases, CAPACITY)
    for i in range(n):
        held, count = iris.device.tracing.stash_room(heap_bases, held, count, 1)
        start = iris.device.tracing.begin(heap_bases)
        held, count = iris.device.tracing.stash(
            heap_bases, held, count, start, iris.device.tracing.SCOPE_BASE + 3, -1, buf + i, 4, i, i, 7
        )
    iris.device.tracing.stash_write(heap_bases, held, count)


def _stash_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(8, dtype=torch.int32)
        ctx.tracing.enable(max_events=1 << 12)
        stashed_scopes[(1,)](buf, 5, ctx.get_heap_bases(), CAPACITY=2)
        ev = np.sort(ctx.tracing.events(), order="start_ns")
        assert ctx.tracing.dropped() == 0 and len(ev) == 5
        # the record its kind, place, size, value and tile, as an op's own record would be
        assert (ev["event_id"] == schema.SCOPE_BASE + 3).all()
        assert ev["address"].tolist() == [ctx.heap.offset_of(buf) + 4 * i for i in range(5)]
        assert ev["payload_bytes"].tolist() == [4] * 5 and ev["pid_m"].tolist() == list(range(5))
        assert (ev["pid_n"] == 7).all() and (ev["end_ns"] >= ev["start_ns"]).all()
        ctx.tracing.enable(max_events=1)  # a slot or two in all: the rest of the batch is dropped
        stashed_scopes[(1,)](buf, 5, ctx.get_heap_bases(), CAPACITY=8)
        recorded, dropped = len(ctx.tracing.events()), ctx.tracing.dropped()
        assert recorded + dropped == 5 and recorded >= 1, (recorded, dropped)
        ctx.tracing.disable()
        stashed_scopes[(1,)](buf, 5, ctx.get_heap_bases(), CAPACITY=2)  # untraced: nothing kept


def test_stashed_events_are_written_in_batches():
    get_pool(1).run(_stash_body)


@triton.jit
def reserved_scopes(buf, n, heap_bases):
    # n scopes whose slots are reserved at once before they begin, then written one by one.
    reservation = iris.device.tracing.reserve(heap_bases, n * iris.device.tracing.enabled(heap_bases))
    for i in range(n):
        start = iris.device.tracing.begin(heap_bases)
        iris.device.tracing.write_reserved(
            heap_bases, reservation, i, start, iris.device.tracing.SCOPE_BASE + 3, -1, buf + i, 4, i, i, 7
        )


@triton.jit
def _warp_skew():
    # Holds warp w back 200 * w ns, so a program's warps reach what follows at different times.
    tl.inline_asm_elementwise(
        "{ .reg .u32 t; mov.u32 t, %tid.x; shr.u32 t, t, 5; mul.lo.u32 t, t, 200; nanosleep.u32 t;"
        " mov.u32 $0, 0; }",
        "=r,r", [tl.arange(0, 256)], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def skewed_stash_writes(writes, heap_bases, CAPACITY: tl.constexpr):
    # ``writes`` stashes of CAPACITY scopes per program, each written while the warps are skewed.
    for w in range(writes):
        held, count = iris.device.tracing.stash_new(heap_bases, CAPACITY)
        for _ in range(CAPACITY):
            start = iris.device.tracing.begin(heap_bases)
            held, count = iris.device.tracing.stash(
                heap_bases, held, count, start, iris.device.tracing.SCOPE_BASE + 3, -1, None, 0, 0,
                tl.program_id(0), w,
            )  # fmt: skip
        _warp_skew()
        iris.device.tracing.stash_write(heap_bases, held, count)


def _skewed_stash_body(rank, world_size, programs, writes, capacity):
    with iris.iris(1 << 26) as ctx:
        ctx.tracing.enable(max_events=1 << 18)
        skewed_stash_writes[(programs,)](writes, ctx.get_heap_bases(), CAPACITY=capacity, num_warps=8)
        ev = ctx.tracing.events()
        return len(ev), ctx.tracing.dropped()


@pytest.mark.skipif(iris.BACKEND != "cuda", reason="warps read the clock apart only on a GPU")
def test_a_stash_lands_whole_when_its_warps_read_the_clock_apart():
    # Warps 1.4 us apart straddle a region's 16 us step in about one write in twelve; each
    # of a stash's records must still land in the region whose slots were claimed.
    programs, writes, capacity = 132, 20, 16
    recorded, dropped = get_pool(1).run(_skewed_stash_body, programs, writes, capacity)[0]
    assert (recorded, dropped) == (programs * writes * capacity, 0)


def _reserve_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(8, dtype=torch.int32)
        ctx.tracing.enable(max_events=1 << 12)
        reserved_scopes[(1,)](buf, 5, ctx.get_heap_bases())
        ev = np.sort(ctx.tracing.events(), order="start_ns")
        assert ctx.tracing.dropped() == 0 and len(ev) == 5
        assert (ev["event_id"] == schema.SCOPE_BASE + 3).all()
        assert ev["address"].tolist() == [ctx.heap.offset_of(buf) + 4 * i for i in range(5)]
        assert ev["payload_bytes"].tolist() == [4] * 5 and ev["value"].tolist() == list(range(5))
        assert ev["pid_m"].tolist() == list(range(5)) and (ev["pid_n"] == 7).all()
        assert (ev["end_ns"] >= ev["start_ns"]).all()


def test_reserved_slots_take_the_events_written_later():
    get_pool(1).run(_reserve_body)


def _reserve_overflow_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(8, dtype=torch.int32)
        ctx.tracing.enable(max_events=1)  # a slot or two in all: the rest of the reservation is dropped
        traced = ctx.get_heap_bases()
        reserved_scopes[(1,)](buf, 5, traced)
        recorded, dropped = len(ctx.tracing.events()), ctx.tracing.dropped()
        assert recorded + dropped == 5 and recorded >= 1, (recorded, dropped)
        ctx.tracing.reset()
        ctx.tracing.disable()
        reserved_scopes[(1,)](buf, 5, traced)  # the traced variant, switched off: nothing reserved or kept
        assert len(ctx.tracing.events()) == 0 and ctx.tracing.dropped() == 0


def test_reserved_slots_past_a_full_region_count_as_dropped():
    get_pool(1).run(_reserve_overflow_body)


def _record(event_id, cur_rank, target_rank, start):
    ident = event_id | cur_rank << schema.IDENT_CUR_RANK_SHIFT | target_rank << schema.IDENT_TARGET_SHIFT
    return [start, start + 10, 4096, 256, ident, 7, 3 | 5 << 32, 0]


def test_a_record_for_every_peer_decodes_into_one_event_per_peer():
    records = np.array([_record(ID["store"], 2, schema.EVERY_PEER, 100), _record(ID["signal"], 2, 1, 50)])
    events = decode_records(records.ravel(), np.array([2]), capacity=2, world_size=4)
    stores = events[events["event_id"] == ID["store"]]
    assert stores["target_rank"].tolist() == [3, 0, 1]  # the push's order: the next rank first
    for field, value in (("start_ns", 100), ("payload_bytes", 256), ("pid_m", 3), ("pid_n", 5), ("pid", 7)):
        assert (stores[field] == value).all(), field
    assert events[events["event_id"] == ID["signal"]]["target_rank"].tolist() == [1]


def test_a_slot_claimed_but_never_written_is_not_an_event():
    # A reservation whose op never ended (a wait that timed out) leaves its slot as reset left it.
    unwritten = [0] * schema.RECORD_WORDS
    records = np.array([_record(ID["signal"], 0, 1, 50), unwritten, _record(ID["wait_until"], 0, 1, 60)])
    events = decode_records(records.ravel(), np.array([3]), capacity=3)
    assert events["start_ns"].tolist() == [50, 60]


def test_a_record_for_every_peer_needs_the_world_size():
    records = np.array([_record(ID["store"], 0, schema.EVERY_PEER, 100)])
    with pytest.raises(ValueError, match="world_size"):
        decode_records(records.ravel(), np.array([1]), capacity=1)


@triton.jit
def region_of(out, sms, stops, num_regions, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out + offsets, _region(tl.load(sms + offsets), tl.load(stops + offsets), num_regions))


def _region_body(rank, world_size):
    # At any moment the SMs use distinct regions, and each SM moves to the next region
    # every 2^REGION_ROTATE_SHIFT ns, so few busy SMs still fill every region.
    with iris.iris(1 << 20) as ctx:
        regions, start = 8, 5 << 30
        same_time = ctx.zeros(regions, dtype=torch.int32)
        every_sm = torch.arange(regions, dtype=torch.int32, device=ctx.get_device())
        stops = torch.full((regions,), start, dtype=torch.int64, device=ctx.get_device())
        region_of[(1,)](same_time, every_sm, stops, regions, BLOCK=regions)
        assert sorted(same_time.tolist()) == list(range(regions))
        one_sm = ctx.zeros(regions, dtype=torch.int32)
        later = stops + (every_sm.to(torch.int64) << schema.REGION_ROTATE_SHIFT)
        region_of[(1,)](one_sm, torch.full_like(every_sm, 3), later, regions, BLOCK=regions)
        assert sorted(one_sm.tolist()) == list(range(regions))


def test_events_rotate_over_regions():
    get_pool(1).run(_region_body)  # the mapping alone: one rank is enough


def _off_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        with pytest.raises(RuntimeError, match="never enabled"):
            ctx.tracing.events()
        untraced = ctx.get_heap_bases()
        assert untraced.dtype == torch.uint64
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        traced = ctx.get_heap_bases()
        assert traced.dtype == torch.int64 and traced.data_ptr() == untraced.data_ptr()
        put_blocks[(1,)](src, dst, N, 1, rank, world_size, untraced, BLOCK=BLOCK)
        assert len(ctx.tracing.events()) == 0, "a kernel launched with the plain heap_bases is not traced"
        ctx.tracing.disable()
        assert ctx.get_heap_bases().dtype == torch.uint64
        put_blocks[(1,)](src, dst, N, 1, rank, world_size, traced, BLOCK=BLOCK)
        assert len(ctx.tracing.events()) == 0, "a traced kernel writes nothing while tracing is disabled"
        ctx.barrier()


def test_disabled_tracing_records_nothing(world):
    world.run(_off_body)


def _collect_body(rank, world_size, directory):
    with iris.iris(1 << 22) as ctx:
        src, dst = ctx.randn(BLOCK), ctx.zeros(BLOCK)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        put_blocks[(2,)](src, dst, N, 1, rank, world_size, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.barrier()
        trace = ctx.tracing.collect()
        path = ctx.tracing.collect(directory)
        assert os.path.exists(path)
        if rank != 0:
            assert trace is None
            return None
        assert trace.world_size == world_size and trace.dropped == [0] * world_size
        assert len(trace.events) == world_size * 2 * (world_size - 1)
        ranks_seen = sorted(set(trace.events["cur_rank"].tolist()))
        assert ranks_seen == (list(range(world_size)) if world_size > 1 else [])
        assert len(trace.clock_fits) == world_size
        return len(trace.events)


def test_collect_gathers_every_rank(world, tmp_path):
    counts = world.run(_collect_body, str(tmp_path))
    files = sorted(str(p) for p in tmp_path.glob("rank*.npz"))
    assert len(files) == world.world_size
    merged = Trace.from_files(files)
    assert len(merged.events) == counts[0]


def test_merging_rejects_incomplete_or_foreign_files(world, tmp_path):
    world.run(_collect_body, str(tmp_path))
    files = sorted(str(p) for p in tmp_path.glob("rank*.npz"))
    if world.world_size > 1:
        with pytest.raises(TraceFileError, match=r"no trace for rank\(s\) \[1"):
            Trace.from_files([files[0]])
    bad = tmp_path / "broken.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(TraceFileError, match="broken.npz"):
        Trace.from_files([str(bad)])
    with pytest.raises(TraceFileError, match="no such trace file"):
        Trace.from_files([str(tmp_path / "missing.npz")])


def _alignment_body(rank, world_size, rounds):
    with iris.iris(1 << 27) as ctx:
        data, flag, ack = ctx.randn(BLOCK), ctx.zeros(1, dtype=torch.int32), ctx.zeros(1, dtype=torch.int32)
        ctx.tracing.enable(max_events=4 * rounds * ctx.get_cu_count())  # 2 events a round, all on one SM
        if rank < 2:
            ping_pong_rounds[(1,)](data, flag, ack, rounds, rank, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.barrier()
        trace = ctx.tracing.collect()
        if trace is None:
            return None
        ev = trace.events
        signals = np.sort(ev[(ev["cur_rank"] == 0) & (ev["event_id"] == ID["signal"])], order="value")
        waits = np.sort(ev[(ev["cur_rank"] == 1) & (ev["event_id"] == ID["wait_until"])], order="value")
        assert trace.dropped == [0] * world_size
        assert len(signals) == len(waits) == rounds
        late = waits["end_ns"] - signals["start_ns"]
        return int(late.min()), trace.clock_fits[1].residual_ns, trace.clock_fits[1].rtt_ns


def test_aligned_waits_end_after_the_signal_that_released_them(multi_world):
    rounds = 1000 if iris.BACKEND == "cuda" else 50
    min_gap, residual, rtt = multi_world.run(_alignment_body, rounds)[0]
    assert min_gap > 0, f"a wait ended {-min_gap} ns before its signal started (residual {residual} ns)"
