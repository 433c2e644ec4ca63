"""Launching ranks: ``python -m iris.run`` on every example, failure handling, ``iris.spawn``."""

import os
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch.multiprocessing as mp
from conftest import SMALL_WORLD, WORLD_SIZES, get_pool, small_world_pool

import iris
from iris import config
from iris_trace.cli import main as iris_trace_main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(
    f for f in os.listdir(os.path.join(ROOT, "examples")) if f[:2].isdigit() and f.endswith(".py")
)


def run_example(name: str, nprocs: int, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [
        sys.executable,
        "-m",
        "iris.run",
        "-n",
        str(nprocs),
        "-t",
        "240",
        os.path.join(ROOT, "examples", name),
        *args,
    ]
    environment = {**os.environ, **(env or {})}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=environment)


def test_examples_are_numbered_as_documented():
    assert EXAMPLES == [
        "00_load.py",
        "01_store.py",
        "02_all_load.py",
        "03_all_store.py",
        "04_atomic_add.py",
        "05_atomic_xchg.py",
        "06_message_passing.py",
        "07_tracing.py",
        "08_collectives.py",
        "09_gemm_all_scatter_bulk_synchronous.py",
        "10_gemm_all_scatter_fused_sequential.py",
        "11_gemm_all_scatter_workgroup_specialized.py",
        "12_gemm_all_scatter_producer_consumer.py",
        "13_traced_gemm_all_scatter.py",
        "14_copy_engine.py",
        "15_why_ranks_wait.py",
        "16_torch_profiler.py",
        "17_protocol_checks.py",
        "18_gluon.py",
        "19_as_symmetric.py",
    ]


#: The examples that write traces take the folder for them as their argument.
WRITES_TRACES = ("07_tracing.py", "13_traced_gemm_all_scatter.py", "16_torch_profiler.py")


def _run_example_body(rank, world_size, path, argv):
    # One rank of an example, run as ``__main__`` in a pool's rank process (as ``python
    # path argv...`` would run it, less the process start): returns what it printed.
    import contextlib
    import gc
    import io

    printed, saved_argv = io.StringIO(), sys.argv
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))  # 09-12 import the problem they share
    try:
        with open(path) as source, contextlib.redirect_stdout(printed):
            exec(compile(source.read(), path, "exec"), namespace)
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            said = printed.getvalue()[-2000:]
            raise AssertionError(f"exited with {exit_.code!r}; it printed:\n{said}") from None
    finally:
        sys.argv = saved_argv
        sys.path.remove(os.path.dirname(path))
        # What the example made goes now, heaps included, as at a process's exit: its
        # globals (a cache of heap tensors, say) outlive the run where Triton keeps its
        # kernels, and its functions and globals hold each other.
        namespace.clear()
        gc.collect()
    return printed.getvalue()


def verify_example(name: str, tmp_path, pool, *argv: str) -> str:
    """Run example ``name`` on every rank of ``pool`` (traces go to ``tmp_path``); check it verified itself.

    The examples run in the test pools' rank processes rather than under ``python -m
    iris.run`` (a launch costs seconds of process starts per example; the launcher has
    tests of its own, and the quick start, example 13, is launched as the README says).
    """
    path = os.path.join(ROOT, "examples", name)
    printed = "".join(
        pool.run(_run_example_body, path, [str(tmp_path)] if name in WRITES_TRACES else list(argv))
    )
    assert printed.count(" OK") >= 1, printed[-2000:]
    return printed


def _check_traces_are_clean(folder) -> None:
    traces = sorted(str(path) for path in folder.glob("rank*.npz"))
    if traces:  # the examples' protocols are correct: iris-trace check finds nothing
        assert iris_trace_main(["check", *traces]) == 0


#: Examples of Gluon kernels, which only GPUs run (the interpreter runs Triton kernels only).
GPU_ONLY = ("18_gluon.py",)


def _runs_here(name: str):
    skip = pytest.mark.skipif(iris.BACKEND != "cuda", reason="a Gluon kernel: GPUs only")
    return pytest.param(name, marks=skip) if name in GPU_ONLY else name


#: What an example needs set before CUDA starts, which the test pools' processes have started:
#: PyTorch's expandable segments for as_symmetric on GPUs (19 sets it itself when launched).
POOL_ENVIRONMENT = (
    {"19_as_symmetric.py": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}
    if iris.BACKEND == "cuda"
    else {}
)


@pytest.mark.parametrize("name", [_runs_here(name) for name in EXAMPLES if not name.startswith("13_")])
def test_example_verifies_itself(name, tmp_path):
    verify_example(name, tmp_path, small_world_pool(**POOL_ENVIRONMENT.get(name, {})))
    _check_traces_are_clean(tmp_path)


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_the_quick_start_runs_as_the_readme_says(tmp_path):
    result = run_example("13_traced_gemm_all_scatter.py", SMALL_WORLD, str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "13_traced_gemm_all_scatter OK" in result.stdout
    _check_traces_are_clean(tmp_path)
    ranks = [f"rank{r}.npz" for r in range(SMALL_WORLD)]
    expected = {*ranks, "trace.pftrace", "trace.json", "report.json", "timeline.png"}
    assert expected <= {p.name for p in tmp_path.iterdir()}, sorted(p.name for p in tmp_path.iterdir())
    assert "why ranks waited" in result.stdout


def _enough_devices(nprocs: int) -> bool:
    import torch

    return iris.BACKEND == "emulated" or torch.cuda.device_count() * config.ranks_per_gpu() >= nprocs


@pytest.mark.skipif(4 not in WORLD_SIZES, reason="IRIS_TEST_WORLD_SIZES does not list 4")
@pytest.mark.skipif(not _enough_devices(4), reason="needs 4 GPUs, or IRIS_RANKS_PER_GPU to share fewer")
@pytest.mark.parametrize("name", ["02_all_load.py", "04_atomic_add.py", "06_message_passing.py"])
def test_example_verifies_itself_on_four_ranks(name, tmp_path):
    verify_example(name, tmp_path, get_pool(4), *(["20"] if name.startswith("06") else []))


def test_run_stops_every_rank_when_one_fails(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(120)\n"
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "iris.run", "-n", "3", str(script)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 3
    assert time.monotonic() - started < 30


def test_run_timeout_stops_a_hung_job(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(120)\n")
    result = subprocess.run(
        [sys.executable, "-m", "iris.run", "-n", "2", "-t", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 124 and "timed out" in result.stderr


def _raise_on_last_rank(rank, world_size):
    if rank == world_size - 1:
        raise RuntimeError(f"planted failure on rank {rank}")


def test_spawn_raises_the_failing_ranks_error():
    with pytest.raises(mp.ProcessRaisedException, match="planted failure on rank 1"):
        iris.spawn(_raise_on_last_rank, nprocs=2, args=(2,))


def _join_the_group_and_sign_in(rank):
    import torch.distributed as dist

    from iris.host.distributed.helpers import init_distributed

    init_distributed("gloo")
    store = dist.distributed_c10d._get_default_store()
    while hasattr(store, "underlying_store"):  # past the process group's key prefixes
        store = store.underlying_store
    store.set(f"signed_in/{rank}", store.get("launcher/nonce"))


def test_ranks_rendezvous_on_the_store_the_launcher_hosts():
    # No rank binds a port of its own, so none can lose a race for it (EADDRINUSE).
    context = iris.spawn(_join_the_group_and_sign_in, nprocs=2, join=False)
    context.rendezvous_store.set("launcher/nonce", "5813")
    while not context.join():
        pass
    signed_in = [context.rendezvous_store.get(f"signed_in/{rank}") for rank in range(2)]
    assert signed_in == [b"5813", b"5813"]


def _rank_and_size(rank, world_size):
    return rank, world_size


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_a_test_pool_with_a_dead_rank_fails_one_test_and_is_replaced():
    from conftest import get_pool
    from harness import RankError

    pool = get_pool(SMALL_WORLD, IRIS_TEST_POOL="doomed")  # a pool of its own
    pool._procs[1].kill()
    pool._procs[1].join()
    with pytest.raises(RankError, match="rank 1 (is dead|died)"):
        pool.run(_rank_and_size, timeout=30)
    assert not pool.alive
    replaced = get_pool(SMALL_WORLD, IRIS_TEST_POOL="doomed").run(_rank_and_size)
    assert replaced == [(rank, SMALL_WORLD) for rank in range(SMALL_WORLD)]


def _write_and_exit(rank, world_size):
    # Rank 1 leaves a last word on stderr and exits without a result.
    if rank == 1:
        sys.stderr.write("rank 1 gives up here\n")
        sys.stderr.flush()
        os._exit(7)
    return rank


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_a_rank_that_dies_is_reported_with_its_exit_code_and_stderr():
    from conftest import get_pool
    from harness import RankError

    pool = get_pool(SMALL_WORLD, IRIS_TEST_POOL="last-words")  # a pool of its own
    with pytest.raises(RankError, match=r"(?s)rank 1 died .*exit code 7.*rank 1 gives up here"):
        pool.run(_write_and_exit, timeout=60)


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_one_test_body_runs_as_a_plain_launch():
    result = subprocess.run(
        [sys.executable, "-m", "iris.run", "-n", str(SMALL_WORLD), "-t", "120",
         os.path.join(ROOT, "scripts", "run_test_body.py"), "test_launch:_rank_and_size"],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(SMALL_WORLD):
        assert f"[rank {rank}] _rank_and_size(): ({rank}, {SMALL_WORLD})" in result.stdout


FIRST_KERNEL = """
import torch, triton, triton.language as tl
import iris


@triton.jit
def put_to_neighbour(buf, n, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    peer = (cur_rank + 1) % world_size
    iris.store(buf + offsets, offsets.to(tl.float32), cur_rank, peer, heap_bases, mask=offsets < n)


ctx = iris.iris(heap_size=1 << 20)
buf = ctx.zeros(256, dtype=torch.float32)
ctx.tracing.enable(max_events=1 << 10)
put_to_neighbour[(2,)](buf, 256, ctx.get_rank(), ctx.get_num_ranks(), ctx.get_heap_bases(), BLOCK=128)
ctx.barrier()
assert torch.equal(buf.cpu(), torch.arange(256, dtype=torch.float32))
ctx.tracing.collect()
print("done", flush=True)
# no ctx.close(): the README's first kernel does not close either
"""


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_a_traced_job_that_never_closes_exits_cleanly_every_time(tmp_path):
    # Exit used to abort now and then ("terminate called without an active exception") and
    # to leave flight files behind when the program never closed its context.
    script = tmp_path / "first_kernel.py"
    script.write_text(FIRST_KERNEL)
    hang_dir = tmp_path / "hang"
    hang_dir.mkdir()
    env = {**os.environ, "IRIS_HANG_DIR": str(hang_dir)}
    for attempt in range(6):
        result = subprocess.run(
            [sys.executable, "-m", "iris.run", "-n", str(SMALL_WORLD), "-t", "120", str(script)],
            capture_output=True,
            text=True,
            timeout=180,
            env=env,
        )
        assert result.returncode == 0, (attempt, result.stderr[-3000:])
        assert result.stdout.count("done") == SMALL_WORLD and "terminate" not in result.stderr
        assert not list(hang_dir.glob("iris-flight-*")), "a flight file outlived its process"


# ---------------------------------------------------------------- the store, and ranks that die
def _listening_on(port: int) -> list[str]:
    """The addresses that sockets in LISTEN state on ``port`` are bound to (IPv4 and IPv6)."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        with open(table) as handle:
            for line in handle.read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append("127.0.0.1" if address == "0100007F" else address[:width])
    return found


def test_the_launchers_store_listens_on_loopback_only():
    from iris.host.launch import host_rendezvous_store

    store = host_rendezvous_store()
    assert _listening_on(store.port) == ["127.0.0.1"]


KEEPS_MEETING = """
import os, sys, time
import iris
ctx = iris.iris(1 << 20)
with open(os.path.join(sys.argv[1], f"rank{ctx.get_rank()}.pid"), "w") as handle:
    handle.write(str(os.getpid()))
while True:
    ctx.barrier()
    time.sleep(0.02)
"""


def _wait_for_pids(directory, count: int, launcher) -> list[int]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and launcher.poll() is None:
        written = sorted(directory.glob("rank*.pid"))
        if len(written) == count and all(p.read_text() for p in written):
            return [int(p.read_text()) for p in written]
        time.sleep(0.1)
    raise AssertionError(f"the ranks did not start: {launcher.communicate()[1][-2000:]}")


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_rank_killed_mid_run_is_named_and_leaves_only_private_dumps(tmp_path, signum):
    from iris_trace.flight_file import pid_alive

    script, pids, hang, shm = tmp_path / "meet.py", tmp_path / "pids", tmp_path / "hang", tmp_path / "shm"
    for folder in (pids, hang, shm):
        folder.mkdir()
    script.write_text(KEEPS_MEETING)
    env = {**os.environ, "IRIS_HANG_DIR": str(hang), "IRIS_EMU_SHM_DIR": str(shm)}
    command = [sys.executable, "-m", "iris.run", "-n", "2", "-t", "200", str(script), str(pids)]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ranks = _wait_for_pids(pids, 2, launcher)
    os.kill(ranks[1], signum)
    killed = time.monotonic()
    _, stderr = launcher.communicate(timeout=60)
    assert time.monotonic() - killed < 10, "the job took longer than 10 s to end"
    assert not any(pid_alive(pid) for pid in ranks)
    said = [line for line in stderr.splitlines() if line.startswith("iris.run:")]
    assert launcher.returncode == 128 + signum, "\n".join(said) + "\n...\n" + stderr[-2500:]
    assert f"iris.run: rank 1 was killed by {signum.name}" in stderr
    # The survivor's own report comes only if it gets to print one before the launcher stops
    # it (under load it may not: the launcher names the rank, above); any report it printed
    # blames the dead rank, never itself (test_hang's early-exit test holds that it names it).
    assert "likely culprit: rank 0" not in stderr, stderr[-3000:]
    assert not list(shm.iterdir())
    left = sorted(hang.iterdir())
    assert left and all(p.name.startswith("iris-hang-") for p in left), left
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in left)


def test_a_rank_that_exits_with_a_status_is_named_with_it(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"
    )
    command = [sys.executable, "-m", "iris.run", "-n", "2", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "iris.run: rank 1 exited with status 3" in result.stderr


def test_a_rank_dying_by_a_signal_just_after_a_peer_failed_is_the_one_named(tmp_path):
    # Rank 0 fails first, as a peer does whose collective broke when the dying rank shut down.
    # Rank 1 says it is up; rank 0 then exits at once, and rank 1 dies 0.3 s later, however
    # late either started under load.
    script, up = tmp_path / "late.py", tmp_path / "up"
    script.write_text(
        "import os, signal, sys, time\n"
        "up = sys.argv[1]\n"
        "if os.environ['RANK'] == '0':\n"
        "    while not os.path.exists(up):\n        time.sleep(0.01)\n"
        "    sys.exit(1)\n"
        "open(up, 'w').close()\ntime.sleep(0.3)\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(60)\n"
    )
    command = [sys.executable, "-m", "iris.run", "-n", "2", str(script), str(up)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert "iris.run: rank 1 was killed by SIGINT" in result.stderr


@pytest.mark.parametrize("noted", ["before", "after"], ids=lambda when: f"noted_{when}_the_peer_failed")
def test_a_rank_that_noted_a_signal_is_named_while_its_shutdown_is_still_under_way(tmp_path, noted):
    # Rank 1 notes SIGINT as its context's handler does (before rank 0 fails, or 0.5 s after),
    # then takes longer to shut down than the launcher's grace; rank 0 fails as a peer whose
    # collective broke.
    script, up = tmp_path / "slow.py", tmp_path / "up"
    note = "note_signal(signal.SIGINT)\n"
    rank1 = (
        note + "open(up, 'w').close()\n"
        if noted == "before"
        else "open(up, 'w').close()\ntime.sleep(0.5)\n" + note
    )
    script.write_text(
        "import os, signal, sys, time\n"
        "from iris.host.signal_notes import note_signal\n"
        "up = sys.argv[1]\n"
        "if os.environ['RANK'] == '0':\n"
        "    while not os.path.exists(up):\n        time.sleep(0.01)\n"
        "    sys.exit(1)\n" + rank1 + "time.sleep(60)\n"
    )
    command = [sys.executable, "-m", "iris.run", "-n", "2", str(script), str(up)]
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 128 + signal.SIGINT, result.stderr
    assert "iris.run: rank 1 was killed by SIGINT" in result.stderr
    assert time.monotonic() - started < 30  # the launcher stopped rank 1 rather than wait for it


def test_a_signal_note_is_made_once_in_the_launchers_directory_and_nowhere_else(tmp_path, monkeypatch):
    from iris.host.signal_notes import SIGNAL_NOTES, note_signal, noted_signals

    monkeypatch.delenv(SIGNAL_NOTES, raising=False)
    monkeypatch.setenv("RANK", "3")
    note_signal(signal.SIGTERM)  # outside a launcher: nothing
    monkeypatch.setenv(SIGNAL_NOTES, str(tmp_path))
    note_signal(signal.SIGTERM)
    note_signal(signal.SIGINT)  # the first note stays
    (tmp_path / "stray").write_text("x")
    assert noted_signals(str(tmp_path)) == {3: signal.SIGTERM}
    monkeypatch.setenv("RANK", "../4")
    note_signal(signal.SIGINT)  # a rank that is no number: nothing
    (tmp_path / "rank3").unlink()
    (tmp_path / "rank3").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("RANK", "3")
    note_signal(signal.SIGINT)  # a link in the note's place is not followed
    assert not (tmp_path / "elsewhere").exists() and sorted(p.name for p in tmp_path.iterdir()) == [
        "rank3",
        "stray",
    ]


def test_ranks_that_all_end_between_two_looks_are_blamed_by_the_same_rules(tmp_path):
    # The launcher is stopped (as the OS may keep it off the CPU) while rank 0 exits with a
    # status and rank 1 dies by SIGTERM; it must still name rank 1, not the first in rank order.
    script, pids, go = tmp_path / "both.py", tmp_path / "pids", tmp_path / "go"
    pids.mkdir()
    script.write_text(
        "import os, signal, sys, time\n"
        "open(os.path.join(sys.argv[1], 'rank' + os.environ['RANK'] + '.pid'), 'w').write(str(os.getpid()))\n"
        "while not os.path.exists(sys.argv[2]):\n    time.sleep(0.01)\n"
        "if os.environ['RANK'] == '0':\n    sys.exit(1)\n"
        "time.sleep(0.2)\nos.kill(os.getpid(), signal.SIGTERM)\n"
    )
    command = [sys.executable, "-m", "iris.run", "-n", "2", str(script), str(pids), str(go)]
    launcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_pids(pids, 2, launcher)
    os.kill(launcher.pid, signal.SIGSTOP)
    try:
        go.touch()
        time.sleep(1.5)  # both ranks end meanwhile
    finally:
        os.kill(launcher.pid, signal.SIGCONT)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 128 + signal.SIGTERM, stderr
    assert "iris.run: rank 1 was killed by SIGTERM" in stderr


def test_a_rank_killed_by_a_signal_is_blamed_before_the_peers_that_failed_with_it():
    from iris.run import failures

    assert failures([1, -signal.SIGINT, None, 0]) == [(1, -signal.SIGINT), (0, 1)]
    assert failures([None, 3, 2]) == [(1, 3), (2, 2)]


def test_a_rank_ended_by_a_crash_is_named_with_what_to_try():
    from iris.run import describe_exit, shell_status

    assert describe_exit(1, -signal.SIGSEGV).startswith("rank 1 was killed by SIGSEGV (signal 11): ")
    assert "IRIS_DEBUG=1" in describe_exit(1, -signal.SIGSEGV)
    assert (shell_status(-signal.SIGKILL), shell_status(3), shell_status(0)) == (137, 3, 0)
