"""Files in directories other users can write: nothing of ours is written through a planted
link, nothing planted blocks a start or a report, nothing of another user's is read
(iris_trace.files, docs/reliability.md)."""

import os
import stat
import subprocess
import sys
import textwrap

import pytest
from conftest import SMALL_WORLD, get_pool

from iris_trace import cli, files
from iris_trace import flight_file as fmt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AS_ROOT = os.geteuid() == 0
NOBODY = 65534


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---------------------------------------------------------------- the directory
def test_the_default_directory_is_this_users_own_and_private(tmp_path):
    directory = files.private_directory(str(tmp_path))
    assert directory == str(tmp_path / f"iris-{os.geteuid()}")
    assert _mode(directory) == 0o700 and os.lstat(directory).st_uid == os.geteuid()
    assert files.private_directory(str(tmp_path)) == directory  # found again, not remade


def _plant_link(path, target):
    os.symlink(target, path)


def _plant_file(path, target):
    open(path, "w").close()


def _plant_open_directory(path, target):
    os.mkdir(path)
    os.chmod(path, 0o777)


def _plant_foreign_directory(path, target):
    os.mkdir(path, 0o700)
    os.chown(path, NOBODY, NOBODY)


PLANTS = [_plant_link, _plant_file, _plant_open_directory]
if AS_ROOT:
    PLANTS.append(_plant_foreign_directory)


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.__name__[len("_plant_") :])
def test_a_planted_directory_name_is_refused(tmp_path, plant):
    target = tmp_path / "elsewhere"
    target.mkdir()
    plant(str(tmp_path / f"iris-{os.geteuid()}"), str(target))
    with pytest.raises(files.UnsafeFileError, match="IRIS_HANG_DIR"):
        files.private_directory(str(tmp_path))


# ---------------------------------------------------------------- writing
def test_files_are_made_new_private_and_never_through_a_link(tmp_path):
    fd = files.create_exclusive(str(tmp_path / "made.bin"), 4096)
    os.close(fd)
    assert _mode(tmp_path / "made.bin") == 0o600 and (tmp_path / "made.bin").stat().st_size == 4096
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, tmp_path / "planted.bin")
    for existing in ("made.bin", "planted.bin"):
        with pytest.raises(files.UnsafeFileError, match="exists already"):
            files.create_exclusive(str(tmp_path / existing), 4096)
    assert victim.read_text() == "precious"


def _dump_through_planted_links_body(rank, world_size, victim):
    import iris

    with iris.iris(1 << 20) as ctx:
        recorder = ctx.hang.recorder
        planted = [fmt.dump_path(recorder.directory, recorder.session, rank, seq) for seq in (1, 2)]
        for path in planted:
            os.symlink(victim, path)
        path = ctx.hang.dump("request")
        try:
            return path not in planted, stat.S_ISREG(os.lstat(path).st_mode), _mode(path)
        finally:
            for leftover in (path, *planted):
                os.unlink(leftover)


def test_a_dump_never_writes_through_a_planted_link(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    [(elsewhere, regular, mode)] = get_pool(1).run(_dump_through_planted_links_body, str(victim))
    assert elsewhere and regular and mode == 0o600
    assert victim.read_text() == "precious"


# ---------------------------------------------------------------- reading
def _fifo(path):
    os.mkfifo(path)


def _link_to_dev_zero(path):
    os.symlink("/dev/zero", path)


def _foreign_file(path):
    path.write_bytes(b"\0" * 64)
    os.chown(path, NOBODY, NOBODY)


def _oversized_file(path):
    with open(path, "wb") as handle:
        handle.truncate(fmt.MAX_FILE_BYTES + 1)


READ_PLANTS = [_fifo, _link_to_dev_zero, _oversized_file] + ([_foreign_file] if AS_ROOT else [])


@pytest.mark.parametrize("plant", READ_PLANTS, ids=lambda p: p.__name__.lstrip("_"))
def test_a_planted_flight_file_is_refused_in_one_line_without_blocking(tmp_path, plant, capsys):
    path = tmp_path / "iris-hang-0badc0de-rank0.bin"
    plant(path)
    with pytest.raises(fmt.FlightFileError) as refused:
        fmt.read_flight_file(str(path))
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)
    assert cli.main(["hang-report", str(path)]) == cli.EXIT_BAD_FILE
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # Looking in the directory: the planted file is not this user's flight file, so no session.
    assert fmt.find_sessions(str(tmp_path)) == {} or plant is _oversized_file


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_a_fifo_named_like_a_flight_file_blocks_no_start(tmp_path):
    # Every start looks for stale flight files; a FIFO among them must not stop it.
    os.mkfifo(tmp_path / "iris-flight-0badc0de-rank0.bin")
    script = tmp_path / "start.py"
    script.write_text("import iris\nctx = iris.iris(1 << 20)\nctx.close()\nprint('started OK')\n")
    env = {**os.environ, "IRIS_HANG_DIR": str(tmp_path)}
    command = [sys.executable, "-m", "iris.run", "-n", "2", "-t", "120", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=150, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.count("started OK") == 2
    assert stat.S_ISFIFO(os.lstat(tmp_path / "iris-flight-0badc0de-rank0.bin").st_mode)  # left alone


# ---------------------------------------------------------------- IRIS_DEBUG's bounds
DEBUG_BOUNDS = textwrap.dedent(
    """
    import os
    import torch, triton, triton.language as tl
    import iris


    @triton.jit
    def store_at(buf, index, value, rank, peer, heap_bases):
        iris.store(buf + index, value, rank, peer, heap_bases)


    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    out, ones = ctx.zeros(64, dtype=torch.float32), ctx.ones(64, dtype=torch.float32)
    ctx.device_barrier()                      # Iris's own kernels reach the reserved region under
    ctx.ccl.all_reduce(out, ones)             # the same checks
    ctx.barrier()
    assert torch.equal(out.cpu(), torch.full((64,), float(world))), out
    heap = ctx.zeros(ctx.heap.free // 4, dtype=torch.int32)   # the rest of the user heap, to its end
    assert ctx.heap.offset_of(heap) + heap.numel() * 4 == ctx.heap.size
    store_at[(1,)](heap, heap.numel() - 1, 7, rank, rank, ctx.get_heap_bases())   # last element: fine
    print(f"rank {rank}: in bounds OK", flush=True)
    try:
        store_at[(1,)](heap, heap.numel(), 7, rank, rank, ctx.get_heap_bases())   # one past the end
        ctx.backend.synchronize(ctx.get_device())
    except (iris.DeviceCheckError, RuntimeError) as error:   # a device assert on GPUs
        print(f"rank {rank}: refused: {str(error).splitlines()[0]}", flush=True)
    if ctx.backend.name == "cuda":
        os._exit(0)   # a device assert leaves the CUDA context unusable: no teardown
    ctx.barrier()
    """
)


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_debug_bounds_cover_exactly_the_users_heap(tmp_path):
    script = tmp_path / "bounds.py"
    script.write_text(DEBUG_BOUNDS)
    env = {**os.environ, "IRIS_DEBUG": "1"}
    command = [sys.executable, "-m", "iris.run", "-n", "2", "-t", "200", str(script)]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(2):
        assert f"rank {rank}: in bounds OK" in result.stdout and f"rank {rank}: refused: " in result.stdout
    # The interpreter raises the check's message; a GPU's device assert prints it.
    assert "iris.store: pointer is outside the symmetric heap" in result.stdout + result.stderr
