"""iris-trace check: protocol mistakes found in traces (iris_trace/check.py), and none in correct kernels."""

import json

import pytest
import torch
import triton
import triton.language as tl
from conftest import SMALL_WORLD, get_pool

import iris
from iris.device.utils import read_realtime
from iris_trace import check
from iris_trace.cli import main as iris_trace_main

N = 64
#: What rank 0 works between the rounds: far longer than rank 1 takes to reach its second wait.
WORK_NS = tl.constexpr(1_000_000_000)
#: What rank 1 works before it looks at its flag: long enough for rank 0 to raise it twice.
BUSY_NS = tl.constexpr(1_000_000_000)
pytestmark = pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")


@triton.jit
def work(DELAY_NS: tl.constexpr):
    """Work ``DELAY_NS`` (a clock spin)."""
    if DELAY_NS > 0:
        began = read_realtime()
        while read_realtime() - began < DELAY_NS:
            pass


@triton.jit
def send_after(data, flag, from_rank, to_rank, heap_bases, DELAY_NS: tl.constexpr, BLOCK: tl.constexpr):
    """Work ``DELAY_NS``, put ``BLOCK`` elements of ``data`` to ``to_rank``, raise its flag."""
    work(DELAY_NS)
    offsets = tl.arange(0, BLOCK)
    iris.put(data + offsets, data + offsets, from_rank, to_rank, heap_bases)
    iris.signal(flag, 1, from_rank, to_rank, heap_bases, op="set")


@triton.jit
def two_rounds_kernel(data, flag, ack, cur_rank, heap_bases, RESET: tl.constexpr, BLOCK: tl.constexpr):
    # Rank 0 sends two rounds to rank 1, each announced by setting rank 1's flag to 1. Rank 1
    # acknowledges the first round; rank 0 then works a while before sending the second.
    # Without RESET, rank 1 never sets its flag back to 0, so its second wait passes on the
    # first round's value, long before the second round is sent.
    for step in tl.static_range(2):  # unrolled: no loop around the waits' spin loops
        if cur_rank == 0:
            if step == 1:
                iris.wait_until(ack, "ge", 1, heap_bases=heap_bases)
            send_after(data, flag, 0, 1, heap_bases, WORK_NS if step == 1 else 0, BLOCK)
        elif cur_rank == 1:
            iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)
            if RESET:
                tl.atomic_xchg(flag, 0, sem="relaxed", scope="sys")
            if step == 0:
                iris.signal(ack, 1, 1, 0, heap_bases, op="set")


@triton.jit
def publish_kernel(data, flag, cur_rank, heap_bases, SIGNAL_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    # Rank 0 writes a block to rank 1 and raises rank 1's flag; rank 1 waits for the flag.
    # SIGNAL_FIRST raises the flag before the write: the reader may read stale data.
    offsets = tl.arange(0, BLOCK)
    if cur_rank == 0:
        if SIGNAL_FIRST:
            iris.signal(flag, 1, 0, 1, heap_bases, op="set")
            iris.put(data + offsets, data + offsets, 0, 1, heap_bases)
        else:
            iris.put(data + offsets, data + offsets, 0, 1, heap_bases)
            iris.signal(flag, 1, 0, 1, heap_bases, op="set")
    elif cur_rank == 1:
        iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)


@triton.jit
def two_sends_kernel(data, flag, ack, cur_rank, heap_bases, ACK: tl.constexpr, BLOCK: tl.constexpr):
    # Rank 0 sends two rounds to rank 1, each announced by setting rank 1's flag to 1.
    # Without ACK it does not wait for rank 1 to take the first round before sending the
    # second: rank 1, busy for a while, finds the flag set once for both.
    if cur_rank == 0:
        send_after(data, flag, 0, 1, heap_bases, 0, BLOCK)
        if ACK:
            iris.wait_until(ack, "ge", 1, heap_bases=heap_bases)
        send_after(data, flag, 0, 1, heap_bases, 0, BLOCK)
    elif cur_rank == 1:
        rounds: tl.constexpr = 2 if ACK else 1
        for step in tl.static_range(rounds):
            if not ACK:
                work(BUSY_NS)
            iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)
            tl.atomic_xchg(flag, 0, sem="relaxed", scope="sys")
            if ACK and step == 0:
                iris.signal(ack, 1, 1, 0, heap_bases, op="set")


@triton.jit
def shared_place_kernel(data, flag, cur_rank, heap_bases, HANDOFF: tl.constexpr, BLOCK: tl.constexpr):
    # Ranks 0 and 1 both write the same block of rank 0's data. With HANDOFF rank 0 raises
    # rank 1's flag after its write and rank 1 waits for it before writing its own: ordered.
    # Without, rank 1 only works a while first: the writes race, whatever the timing.
    offsets = tl.arange(0, BLOCK)
    if cur_rank == 0:
        iris.put(data + offsets, data + offsets, 0, 0, heap_bases)
        if HANDOFF:
            iris.signal(flag, 1, 0, 1, heap_bases, op="set")
    elif cur_rank == 1:
        if HANDOFF:
            iris.wait_until(flag, "ge", 1, heap_bases=heap_bases)
        else:
            work(BUSY_NS)
        iris.put(data + offsets, data + offsets, 1, 0, heap_bases)


def _findings(ctx):
    trace = ctx.tracing.collect()
    return None if trace is None else [(f.check, f.ranks, f.message) for f in check.run(trace)]


def _planted_body(rank, world_size, which, buggy):
    with iris.iris(1 << 20) as ctx:
        data = ctx.full((N,), float(rank))
        flag, ack = ctx.zeros(1, dtype=torch.int32), ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        ctx.tracing.enable(max_events=1 << 12)
        if which == "stale-flag":
            two_rounds_kernel[(1,)](data, flag, ack, rank, ctx.get_heap_bases(), RESET=not buggy, BLOCK=N)
        elif which == "raised-twice":
            two_sends_kernel[(1,)](data, flag, ack, rank, ctx.get_heap_bases(), ACK=not buggy, BLOCK=N)
        elif which == "racing-writes":
            shared_place_kernel[(1,)](data, flag, rank, ctx.get_heap_bases(), HANDOFF=not buggy, BLOCK=N)
        else:
            publish_kernel[(1,)](data, flag, rank, ctx.get_heap_bases(), SIGNAL_FIRST=buggy, BLOCK=N)
        ctx.barrier()
        return _findings(ctx)


@pytest.mark.parametrize("which", list(check.CHECKS))
def test_each_check_finds_its_planted_mistake(which):
    findings = get_pool(SMALL_WORLD).run(_planted_body, which, True)[0]
    culprits = (1, 0) if which == "stale-flag" else (0, 1)  # (the rank that erred, the other)
    assert [(name, ranks) for name, ranks, _ in findings] == [(which, culprits)]
    message = findings[0][2]
    assert "heap offset" in message and " us" in message and "SM " in message, message
    assert "(call sites: " in message and " · test_check.py:" in message, message  # the lines at fault


@pytest.mark.parametrize("which", list(check.CHECKS))
def test_the_corrected_kernel_is_clean(which):
    findings = get_pool(SMALL_WORLD).run(_planted_body, which, False)[0]
    assert findings == [], "\n".join(message for _, _, message in findings)


def test_the_device_spells_a_signals_op_as_the_schema_does():
    # raised-twice tells sets from adds by the record's sub field (iris_trace.schema.SIGNAL_OPS).
    from iris.device import flight
    from iris_trace import schema

    assert [flight.signal_sub(op) for op in schema.SIGNAL_OPS] == list(range(len(schema.SIGNAL_OPS)))


def _library_body(rank, world_size):
    # The library's own protocols, traced: collectives of every kind, the device barrier
    # and fused ops; none is a finding.
    with iris.iris(1 << 24) as ctx:
        x = ctx.full((4096,), float(rank + 1))
        out = ctx.zeros((world_size * 4096,))
        ctx.tracing.enable(max_events=1 << 16)
        for variant in ("one_shot", "two_shot", "ring", "atomic", "spinlock"):
            ctx.ccl.all_reduce(out[:4096], x, config=iris.ccl.Config(all_reduce_variant=variant))
        for _ in range(2):  # second rounds reuse every flag: epochs, resets
            ctx.ccl.all_reduce(out[:4096], x)
            ctx.ccl.all_gather(out, x)
            ctx.ccl.all_to_all(out[: 64 * world_size].view(1, -1), x[: 64 * world_size].view(1, -1))
            ctx.device_barrier()
            ctx.device_barrier()
        a, b = ctx.randn(64, 32), ctx.randn(32, 32)
        fused = ctx.zeros((world_size * 64, 32))
        ctx.ops.matmul_all_gather(fused, a, b)
        ctx.ops.matmul_all_gather(fused, a, b)
        # Upstream's HBM-staged op: local flags raised by fetchers, reset by the host between calls.
        staged = iris.ops.FusedConfig(block_size_m=32, block_size_n=32, block_size_k=16)
        shard, whole = ctx.randn(64, 16), ctx.randn(16 * world_size, 32)
        for _ in range(2):
            iris.ops.all_gather_matmul_hbm_buffer(ctx, fused[:64], shard, whole, config=staged, k_per_flag=1)
        ctx.barrier()
        return _findings(ctx)


def test_the_librarys_collectives_barrier_and_fused_ops_are_clean():
    findings = get_pool(SMALL_WORLD).run(_library_body)[0]
    assert findings == [], "\n".join(message for _, _, message in findings)


def _saved_body(rank, world_size, directory):
    with iris.iris(1 << 20) as ctx:
        data = ctx.full((N,), float(rank))
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        ctx.tracing.enable(max_events=1 << 12)
        publish_kernel[(1,)](data, flag, rank, ctx.get_heap_bases(), SIGNAL_FIRST=True, BLOCK=N)
        ctx.barrier()
        return ctx.tracing.collect(directory)


def test_the_command_exits_1_on_a_finding_and_writes_it_as_json(tmp_path, capsys):
    paths = get_pool(SMALL_WORLD).run(_saved_body, str(tmp_path))
    assert iris_trace_main(["check", *paths, "--json", str(tmp_path / "findings.json")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("data-after-signal: rank 0 SM") and "1 finding(s)" in out, out
    written = json.loads((tmp_path / "findings.json").read_text())
    assert written[0]["check"] == "data-after-signal" and written[0]["ranks"] == [0, 1]
    assert iris_trace_main(["check", *paths, "--only", "stale-flag"]) == 0
    assert iris_trace_main(["check", *paths, "--only", "no-such-check"]) == 2
    assert "unknown check(s) no-such-check" in capsys.readouterr().err
