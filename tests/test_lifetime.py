"""A context's life: how a job may start it, what it gives back when dropped, and the heaps
and trace buffers it refuses up front (docs/reliability.md)."""

import gc
import os
import socket
import subprocess
import sys
import threading
import weakref

import pytest
import torch
from conftest import SMALL_WORLD, get_pool

import iris
from iris import config
from iris.backends import emulated

HERE = os.path.dirname(os.path.abspath(__file__))
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_upstream_first_example_runs_in_its_own_shape():
    # mp.spawn + init_process_group(init_method="tcp://...") and no launcher variables: one node.
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    command = [sys.executable, os.path.join(HERE, "upstream_first_example.py"), "2", str(_free_port())]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "upstream_first_example OK" in result.stdout


def test_a_job_whose_group_the_program_made_is_one_node(monkeypatch):
    for name in LAUNCHER_VARIABLES + ("IRIS_RANKS_PER_NODE",):
        monkeypatch.delenv(name, raising=False)
    assert config.ranks_per_node(4) == 4
    monkeypatch.setenv("IRIS_RANKS_PER_NODE", "2")
    assert config.ranks_per_node(4) == 2


# ---------------------------------------------------------------- dropping a context
def _held() -> dict:
    """What this process holds that a context could leak."""
    with open("/proc/self/status") as status:
        rss_kib = next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    with open("/proc/self/maps") as maps:
        heap_maps = sum(1 for line in maps if "iris-heap-" in line)
    return {
        "rss": rss_kib * 1024,
        "heap_maps": heap_maps,
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "files": sorted(os.listdir(config.hang_dir())),
    }


def _create_and_drop_body(rank, world_size, rounds, heap_bytes, collect):
    samples = []
    for _ in range(rounds):
        ctx = iris.iris(heap_bytes)
        data = ctx.ones(heap_bytes // 8, dtype=torch.float32)  # touch half the heap
        ctx.tracing.enable(max_events=1024)
        ctx.barrier()
        del data, ctx
        if collect:
            gc.collect()
        samples.append(_held())
    return samples


def test_dropped_contexts_give_everything_back(multi_world):
    # Twenty rounds of create, use, drop (no close): memory, mappings, threads, files and
    # descriptors all come back (memory within 1%; a kept heap would add 64 MiB a round).
    heap_bytes = 1 << 26
    for samples in multi_world.run(_create_and_drop_body, 20, heap_bytes, True):
        first, last = samples[0], samples[-1]
        assert last["rss"] <= first["rss"] * 1.01, [s["rss"] >> 20 for s in samples]
        assert all(s["heap_maps"] == 0 for s in samples)
        assert last["threads"] == first["threads"] and last["fds"] <= first["fds"]
        assert all(not name.startswith("iris-flight-") for s in samples for name in s["files"])


def _drop_without_collecting_body(rank, world_size):
    ctx = iris.iris(1 << 22)
    _ = ctx.ccl, ctx.ops, ctx.copy_engine  # every part of the context made
    ctx.tracing.enable(max_events=256)
    alive = weakref.ref(ctx)
    flight = ctx.hang.recorder.path
    ctx.barrier()
    del ctx
    return alive() is None, os.path.exists(flight)


def test_the_last_reference_frees_the_context_at_once(world):
    # No reference cycle holds a context: it goes with its last reference, not at the next GC.
    gc.disable()
    try:
        for gone, flight_file_left in world.run(_drop_without_collecting_body):
            assert gone and not flight_file_left
    finally:
        gc.enable()


def _half_made_body(rank, world_size):
    iris_module = sys.modules["iris.host.iris"]
    original = iris_module.Hang

    def failing_hang(ctx):
        raise RuntimeError("planted failure after the heap was made")

    iris_module.Hang = failing_hang
    try:
        with pytest.raises(RuntimeError, match="planted failure"):
            iris.iris(1 << 22)
    finally:
        iris_module.Hang = original
    gc.collect()
    return _held()["heap_maps"]


def test_a_context_that_fails_half_way_gives_back_what_it_made():
    assert get_pool(1).run(_half_made_body) == [0]


# ---------------------------------------------------------------- heaps the machine cannot back
def _heap_size_body(rank, world_size, heap_size):
    # This process's files only: other test workers make and remove heaps in the same directory.
    def mine():
        return sorted(name for name in os.listdir(emulated._shm_dir()) if name.endswith(f"-pid{os.getpid()}"))

    before = mine()
    with pytest.raises(MemoryError) as refused:
        iris.iris(heap_size)
    return str(refused.value), mine() == before


@pytest.mark.parametrize("heap_size", [1 << 60, 1 << 63], ids=["1EiB", "8EiB"])
def test_a_heap_the_machine_cannot_back_fails_in_one_line_before_anything_is_made(heap_size):
    for message, nothing_left in get_pool(1).run(_heap_size_body, heap_size):
        assert "\n" not in message and nothing_left
        assert "does not fit" in message and "free" in message
        assert "IRIS_EMU_SHM_DIR" in message or iris.BACKEND != "emulated"


def test_heap_files_of_a_dead_process_are_removed_by_the_next_start(tmp_path, monkeypatch):
    monkeypatch.setenv("IRIS_EMU_SHM_DIR", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"iris-heap-0123abcd-rank1-pid{dead.pid}"
    live = tmp_path / f"iris-heap-0123abcd-rank0-pid{os.getpid()}"
    stale.write_bytes(b"\0" * 4096)
    live.write_bytes(b"\0" * 4096)
    assert emulated.EmulatedBackend().heap_problem(4096, torch.device("cpu")) == ""
    assert not stale.exists() and live.exists()


# ---------------------------------------------------------------- tracing buffers
def _enable_too_much_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        used = ctx.heap.used
        with pytest.raises(MemoryError, match=r"needs \d+ bytes of symmetric heap .* has \d+ free"):
            ctx.tracing.enable(max_events=1 << 20)  # 64 MiB of records in a 1 MiB heap
        assert ctx.heap.used == used and not ctx.tracing.enabled
        ctx.tracing.enable(max_events=256)  # tracing still works afterwards
        assert ctx.tracing.enabled and ctx.tracing.events().shape == (0,)
        return True


def test_a_tracing_enable_that_cannot_fit_changes_nothing(world):
    assert all(world.run(_enable_too_much_body))


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize(
    "name, value",
    [
        ("IRIS_WAIT_TIMEOUT", "abc"),
        ("IRIS_EMU_WAIT_TIMEOUT", "nan"),
        ("IRIS_HOST_TIMEOUT", "-1"),
        ("IRIS_EMU_NUM_SMS", "-4"),
        ("IRIS_FLIGHT_ENTRIES", "3"),
        ("IRIS_RANKS_PER_GPU", "0"),
        ("IRIS_LOG_LEVEL", "LOUD"),
        ("IRIS_HANG_SIGNALS", "maybe"),
        ("IRIS_HANG_DIR", "/nonexistent/iris"),
    ],
)
def test_a_malformed_setting_is_refused_in_one_line_naming_it(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(iris.SettingError) as refused:
        config._validate_environment()
    assert "\n" not in str(refused.value) and f"{name}={value!r}" in str(refused.value)


def test_a_malformed_setting_fails_the_import():
    env = {**os.environ, "IRIS_WAIT_TIMEOUT": "abc"}
    result = subprocess.run([sys.executable, "-c", "import iris"], capture_output=True, text=True, env=env)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith("IRIS_WAIT_TIMEOUT='abc' is not a number of seconds (0 or more)")
    )
