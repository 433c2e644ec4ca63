"""Planted deadlocks end within the wait timeout, naming the right culprit; what the flight recorder holds.

Each planted deadlock runs on its own pool of ``conftest.SMALL_WORLD`` ranks with a short timeout and its own
hang directory. On GPUs a timed-out wait traps, which ends the rank's CUDA context,
so those pools are discarded after each test.
"""

import atexit
import io
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
import torch
import triton
import triton.language as tl
from conftest import CROSS_NODE, SMALL_WORLD, get_pool, layout_id, layout_pool
from harness import RankError

import iris
from iris_trace import flight_file as fmt
from iris_trace.cli import main as iris_trace_main
from iris_trace.hang import HangReport

TIMEOUT_S = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@triton.jit
def wait_flag_kernel(flag, value, heap_bases):
    iris.wait_until(flag, "eq", value, heap_bases=heap_bases)


@triton.jit
def sync_ops_kernel(buf, flag, cur_rank, world_size, heap_bases):
    peer = (cur_rank + 1) % world_size
    offsets = tl.arange(0, 4)
    iris.put(buf + offsets, buf + 4 + offsets, cur_rank, peer, heap_bases)
    iris.atomic_add(buf + 8, 3, cur_rank, peer, heap_bases)
    iris.atomic_cas(buf + 9, 0, 7, cur_rank, peer, heap_bases)
    iris.signal(flag, 5, cur_rank, peer, heap_bases, op="add")
    iris.wait_until(flag, "ge", 5, heap_bases=heap_bases)


#: The planted hangs run at the smallest multi-rank size, and across nodes (``conftest.CROSS_NODE``).
HANG_LAYOUTS = ([(SMALL_WORLD, None)] + ([CROSS_NODE] if CROSS_NODE else [])) if SMALL_WORLD else [None]
across_layouts = pytest.mark.parametrize("layout", HANG_LAYOUTS, ids=layout_id)


def _hang_pool(tag: str, layout=(SMALL_WORLD, None), **env: str):
    if SMALL_WORLD is None:  # the only case with no layout (HANG_LAYOUTS is [None])
        pytest.skip("IRIS_TEST_WORLD_SIZES has no world size above 1")
    directory = tempfile.mkdtemp(prefix=f"iris-hang-{tag}-")
    atexit.register(shutil.rmtree, directory, True)  # the dead ranks' flight files and dumps
    pool = layout_pool(
        layout, IRIS_WAIT_TIMEOUT=str(TIMEOUT_S), IRIS_HANG_DIR=directory, IRIS_TEST_POOL=tag, **env
    )
    return pool, directory


def _close(ctx):
    # A trapped GPU kernel leaves the CUDA context unusable: only the host side can still meet.
    if iris.BACKEND == "emulated":
        ctx.close()
    else:
        ctx._comm.barrier()


def _unsignalled_body(rank, world_size):
    ctx = iris.iris(1 << 20)
    flag = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()
    message, started = None, time.monotonic()
    if rank == 0:
        with pytest.raises(Exception) as info:
            wait_flag_kernel[(1,)](flag, 1, ctx.get_heap_bases())
            ctx.hang.guard(ctx.backend.synchronize, ctx.device)
        message = str(info.value)
        ctx._comm.barrier()
    else:
        ctx._comm.barrier()  # rank 1 never signals: it waits on the host
    elapsed = time.monotonic() - started
    session = ctx.hang.recorder.session
    _close(ctx)
    return message, elapsed, session, ctx.heap.offset_of(flag) if not ctx.heap._closed else None


@across_layouts
def test_a_wait_nobody_signals_ends_within_the_timeout_naming_the_culprit(layout):
    pool, directory = _hang_pool("deadlock", layout)
    try:
        results = pool.run(_unsignalled_body, timeout=120)
    finally:
        if iris.BACKEND != "emulated":
            pool.close(kill=True)
    message, elapsed, session, _ = results[0]
    assert elapsed < TIMEOUT_S + 30, elapsed
    assert "waiting for eq 1" in message or "flag == 1" in message, message
    assert "last seen 0" in message and "rank 0" in message and "program 0" in message, message
    assert "Likely culprit: rank 1" in message or "likely culprit: rank 1" in message, message
    # The dump outlives the ranks; the command line reads it.
    report = HangReport.from_directory(directory, session)
    assert report.ranks[0].timeout is not None and report.ranks[0].timeout.seen == 0


def _exit_early_body(rank, world_size, out_pattern):
    ctx = iris.iris(1 << 20)
    ctx.barrier()
    ctx.device_barrier()
    if rank == 1:
        os._exit(0)  # leaves without a word: no close, no second barrier
    lines = []
    try:
        ctx.device_barrier()
        ctx.hang.guard(ctx.backend.synchronize, ctx.device)
    except Exception as error:
        lines.append(str(error))
    started = time.monotonic()
    try:
        ctx._comm.barrier()
    except iris.HostTimeoutError as error:
        lines.append(str(error))
    lines.append(f"host barrier failed after {time.monotonic() - started:.1f} s")
    with open(out_pattern.format(rank=rank), "w") as handle:
        handle.write("\n=====\n".join(lines))
    return None


@across_layouts
def test_a_rank_that_exits_early_is_named_by_the_others(tmp_path, layout):
    pool, _ = _hang_pool("exit-early", layout)
    out_pattern = str(tmp_path / "rank{rank}.txt")
    with pytest.raises(RankError, match="rank 1 died"):
        pool.run(_exit_early_body, out_pattern, timeout=120)
    pool.close(kill=True)
    # Rank 0 answered before the pool saw rank 1 die, so its file is complete; each rank
    # writes its own (the others may be killed mid-write once rank 1's death is seen).
    device_error, host_error, took = open(out_pattern.format(rank=0)).read().split("\n=====\n")
    assert "iris.device_barrier" in device_error and "arrivals of rank 1" in device_error, device_error
    assert "rank 1" in device_error and ("is gone" in device_error or "no flight file" in device_error)
    # Rank 1 is named; at more than two ranks the others may still be in their own
    # device barrier's timeout when rank 0 gives up, and are named with it.
    missing = re.search(r"rank\(s\) \[([\d, ]+)\] never reached this host barrier", host_error)
    assert missing is not None, host_error
    named = [int(rank) for rank in missing.group(1).split(",")]
    assert 1 in named and 0 not in named, host_error
    assert float(took.split()[-2]) < 30


def _mismatched_body(rank, world_size):
    ctx = iris.iris(1 << 20)
    ctx.barrier()
    message = None
    if rank == 0:
        ctx.device_barrier()
        with pytest.raises(Exception) as info:
            ctx.device_barrier()  # rank 1 calls it once only
            ctx.hang.guard(ctx.backend.synchronize, ctx.device)
        message = str(info.value)
    else:
        ctx.device_barrier()
    ctx._comm.barrier()
    _close(ctx)
    return message


@across_layouts
def test_mismatched_collective_calls_name_the_rank_that_called_fewer(layout):
    pool, _ = _hang_pool("deadlock", layout)
    try:
        message = pool.run(_mismatched_body, timeout=120)[0]
    finally:
        if iris.BACKEND != "emulated":
            pool.close(kill=True)
    assert "iris.device_barrier" in message and "last seen 1" in message, message
    assert "culprit: rank 1" in message and "arrivals of rank 1" in message, message


def _missing_rank_body(rank, world_size, sleep_s):
    if rank == 1:
        time.sleep(sleep_s)  # never arrives in time
        return None
    started = time.monotonic()
    with pytest.raises(iris.HostTimeoutError) as info:
        iris.iris(1 << 20)
    return str(info.value), time.monotonic() - started


@across_layouts
def test_a_rank_that_never_arrives_fails_the_host_side_within_the_host_timeout(layout):
    # The timeout bounds the pool's own start too (gloo's connect, which took over 2 s once
    # on a loaded 2-core machine): 5 s leaves that room, and rank 1 stays away for 8.
    pool, _ = _hang_pool("missing", layout, IRIS_HOST_TIMEOUT="5")
    try:
        message, took = pool.run(_missing_rank_body, 8.0, timeout=120)[0]
    finally:
        pool.close(kill=True)
    assert took < 15, took
    assert "rank(s) [1] never reached" in message, message


def _kinds(ctx):
    return [fmt.KIND_NAMES[k] for k in ctx.hang.recorder.state().entries["kind"]]


def _flight_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        buf = ctx.zeros(16, dtype=torch.int32)
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        sync_ops_kernel[(1,)](buf, flag, rank, world_size, ctx.get_heap_bases())
        ctx.barrier()
        entries = ctx.hang.recorder.state().entries
        names = _kinds(ctx)
        # The put is not recorded, every synchronisation op is, in program order;
        # the wait only if it spun long enough to be a hang suspect.
        assert names[:3] == ["atomic_add", "atomic_cas", "signal"], names
        assert names[3:] in ([], ["wait_begin", "wait_end"]), names
        peer = (rank + 1) % world_size
        assert list(entries["target_rank"][:3]) == [peer] * 3
        assert entries["offset"][0] == ctx.heap.offset_of(buf) + 32 and entries["value"][0] == 3
        assert entries["value"][1] == 7 and entries["extra"][1] == 0  # cas: swapped-in value, compared
        assert entries["value"][2] == 5 and entries["sub"][2] == 1  # signal add 5
        assert (entries["cur_rank"] == rank).all()
        assert not ctx.hang.recorder.state().pending
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        traced_bases = ctx.get_heap_bases()
        ctx.barrier()
        sync_ops_kernel[(1,)](buf, flag, rank, world_size, traced_bases)
        ctx.barrier()
        # Traced too: data ops go to the trace, not the ring.
        traced = _kinds(ctx)[len(names) :]
        assert traced[:3] == ["atomic_add", "atomic_cas", "signal"], traced
        ctx.tracing.disable()
        # The traced variant with tracing off reads no clock for the trace; the ring's
        # entries still carry real times.
        sync_ops_kernel[(1,)](buf, flag, rank, world_size, traced_bases)
        ctx.barrier()
        entries = ctx.hang.recorder.state().entries
        assert len(entries) >= 9 and (entries["time_ns"] > 0).all(), entries["time_ns"]
        report = ctx.hang.report()
        assert report.culprit()[0] is None and "last sent" in report.format()


def test_the_flight_recorder_holds_each_ranks_sync_ops(multi_world):
    multi_world.run(_flight_body)


@triton.jit
def signal_flag_kernel(flag, cur_rank, to_rank, heap_bases):
    iris.signal(flag, 1, cur_rank, to_rank, heap_bases, op="set")


def _wait_until_pending(path, limit_s=120.0):
    # A fixed sleep is not enough on a loaded machine: the waiting rank's launch, or its
    # first CHECK_EVERY spins under the interpreter, can outlast it. Ask that rank to
    # publish until its flight file shows the wait as pending (as ``iris-trace hang-report`` does).
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        fmt.request_publish([path], wait_s=1.0)
        if fmt.read_flight_file(path).pending:
            return
        time.sleep(0.05)
    raise AssertionError(f"{path} showed no pending wait within {limit_s:g} s")


def _slow_wait_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        recorded = len(_kinds(ctx))
        if rank == 0:
            wait_flag_kernel[(1,)](flag, 1, ctx.get_heap_bases())
        elif rank == 1:
            recorder = ctx.hang.recorder
            _wait_until_pending(fmt.flight_path(recorder.directory, recorder.session, 0))
            signal_flag_kernel[(1,)](flag, 1, 0, ctx.get_heap_bases())
        ctx.barrier()
        if rank == 0:
            entries = ctx.hang.recorder.state().entries[recorded:]
            assert [fmt.KIND_NAMES[k] for k in entries["kind"]] == ["wait_begin", "wait_end"]
            assert (entries["offset"] == ctx.heap.offset_of(flag)).all() and entries["extra"][1] == 1
            assert entries["time_ns"][1] - entries["time_ns"][0] > 0


def test_a_wait_that_spins_is_recorded_begin_and_end(multi_world):
    multi_world.run(_slow_wait_body)


def _timeout_setting_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        ctx.set_wait_timeout(5)
        assert ctx.get_wait_timeout() == 5
        ctx.set_wait_timeout(0)
        assert ctx.get_wait_timeout() == 0
        with pytest.raises(ValueError, match="non-negative"):
            ctx.set_wait_timeout(-1)


def test_wait_timeout_is_settable(world):
    world.run(_timeout_setting_body)


def _dumps_for_one_reason_body(rank, world_size, report_s):
    # Two threads dump for the same reason, as a signal's handler and the watchdog do; the
    # second returns the dump's path without printing, but only once the first has printed.
    with iris.iris(1 << 20) as ctx:
        report = ctx.hang.report

        def slow_report():
            time.sleep(report_s)
            return report()

        ctx.hang.report = slow_report
        stderr, sys.stderr = sys.stderr, io.StringIO()
        try:
            first = threading.Thread(target=ctx.hang.dump, args=("planted",))
            first.start()
            while "planted" not in ctx.hang._dumped:
                time.sleep(0.001)
            started = time.monotonic()
            ctx.hang.dump("planted")
            waited = time.monotonic() - started
            printed = sys.stderr.getvalue()
            first.join()
        finally:
            sys.stderr = stderr
    return waited, printed.count("flight recorder dumped")


def test_a_second_dump_for_the_same_reason_returns_once_the_first_has_printed():
    # A SIGTERM once ended a process with nothing printed: the main thread's handler found
    # the watchdog's dump under way, returned at once and killed the process mid-report.
    [(waited, dumps)] = get_pool(1).run(_dumps_for_one_reason_body, 0.5)
    assert dumps == 1
    assert waited > 0.3


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import sys
    import iris
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def wait_forever(flag, heap_bases):
        iris.wait_until(flag, "eq", 1, heap_bases=heap_bases)

    ctx = iris.iris(1 << 20)
    ctx.set_wait_timeout(0)
    flag = ctx.zeros(1, dtype=torch.int32)
    print("ready", ctx.hang.recorder.session, flush=True)
    wait_forever[(1,)](flag, ctx.get_heap_bases())
    """
)


@pytest.mark.skipif(iris.BACKEND != "emulated", reason="single-process hang without a second GPU rank")
def test_sigterm_dumps_the_flight_recorder(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text(SIGTERM_SCRIPT)
    env = {**os.environ, "IRIS_HANG_DIR": str(tmp_path), "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    session = proc.stdout.readline().split()[1]
    _wait_until_pending(fmt.flight_path(str(tmp_path), session, 0))
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), (proc.returncode, stderr)
    assert "flight recorder dumped" in stderr and "SIGTERM" in stderr, stderr
    assert "waiting in iris.wait_until" in stderr, stderr
    report = HangReport.from_directory(str(tmp_path), session)
    assert report.ranks[0].pending and int(report.ranks[0].pending[0]["value"]) == 1


def test_hang_report_cli(tmp_path, capsys):
    # A rank file written by hand: rank 0 waits on a flag that rank 1 signalled once.
    session = "c0ffee"
    for rank in range(2):
        words = [0] * ((fmt.RING_OFFSET + 8 * 64) // 8)
        header = {fmt.H_MAGIC: fmt.MAGIC, fmt.H_VERSION: fmt.VERSION, fmt.H_RANK: rank, fmt.H_WORLD: 2}
        header.update({fmt.H_PID: 2**22 + 12345, fmt.H_REGIONS: 1, fmt.H_ENTRIES: 8})
        for word, value in header.items():
            words[word] = value
        ring = fmt.RING_OFFSET // 8
        if rank == 0:  # a wait that began on flag 0x100 for >= 2
            words[ring : ring + 8] = [1, 17 | (3 << 8) | (0xFFFF << 32), 1 << 32, 0x100, 2, 10, 0, 0]
        else:  # signal add 1 to rank 0's 0x100
            words[ring : ring + 8] = [1, 15 | (1 << 8) | (1 << 16), 0, 0x100, 1, 5, 0, 0]
        meta = f'{{"session": "{session}"}}'.encode()
        data = bytearray(b"".join(w.to_bytes(8, "little", signed=True) for w in words))
        data[fmt.META_OFFSET : fmt.META_OFFSET + len(meta)] = meta
        data[fmt.H_META_BYTES * 8 : fmt.H_META_BYTES * 8 + 8] = len(meta).to_bytes(8, "little")
        (tmp_path / f"iris-hang-{session}-rank{rank}.bin").write_bytes(bytes(data))
    assert iris_trace_main(["hang-report", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "waiting in iris.wait_until" in out and "flag >= 2 at heap offset 0x100" in out, out
    assert "signal add 1 -> rank 0 @0x100" in out and "released by: rank 1" in out, out
    assert "likely culprit: rank 1" in out, out


def _signal_dumps_body(rank, world_size):
    import glob

    with iris.iris(1 << 20) as ctx:
        recorder = ctx.hang.recorder
        first = ctx.hang.dump("SIGINT")
        second = ctx.hang.dump("SIGTERM")  # a Ctrl-C'd job is then stopped by its launcher
        pattern = fmt.dump_path(recorder.directory, recorder.session, rank).replace(".bin", "*.bin")
        made = sorted(glob.glob(pattern))
        for path in made:
            os.unlink(path)
        return first == second, made == [first]


def test_a_ctrl_c_followed_by_sigterm_dumps_once():
    assert get_pool(1).run(_signal_dumps_body) == [(True, True)]


def _phases_in_a_barrier_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        seen = {}
        synchronize, host_barrier = ctx.backend.synchronize, ctx._comm.barrier

        def synchronize_and_look(*args):
            seen["device"] = ctx.hang.report().format()
            return synchronize(*args)

        def host_barrier_and_look(*args):
            seen["host"] = ctx.hang.report().format()
            return host_barrier(*args)

        ctx.backend.synchronize, ctx._comm.barrier = synchronize_and_look, host_barrier_and_look
        try:
            ctx.barrier()
        finally:
            ctx.backend.synchronize, ctx._comm.barrier = synchronize, host_barrier
        return seen


def test_a_report_tells_a_rank_whose_own_kernel_runs_on_from_one_waiting_for_its_peers():
    # A kernel spinning on a flag in a loop of its own is invisible to the flight recorder:
    # the barrier's phase still says that the rank waits for its own GPU work.
    seen = get_pool(1).run(_phases_in_a_barrier_body)[0]
    assert "waiting for its own GPU work to finish" in seen["device"], seen["device"]
    assert "in no Iris wait: its kernel runs on" in seen["device"], seen["device"]
    assert "is in a host barrier:" in seen["host"] and "own GPU work" not in seen["host"], seen["host"]
