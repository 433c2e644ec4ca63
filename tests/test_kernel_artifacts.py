"""IRIS_KERNEL_ARTIFACTS_DIR: every compiled kernel's stages and metadata on disk (kernel_artifacts)."""

import json
import os
import subprocess
import sys

import pytest
import triton
from conftest import SMALL_WORLD
from offline import ROOT, run_cuda_script

import iris
from iris.ccl import all_reduce
from iris.device import barrier
from iris.host.tracing import kernel_artifacts
from iris_trace.files import UnsafeFileError

STAGE_FILES = "kernel.cubin kernel.llir kernel.ptx kernel.sass kernel.ttgir kernel.ttir metadata.json"


@pytest.fixture(scope="module")
def offline_artifacts(tmp_path_factory):
    """A kernel compiled offline three times (two specializations) as rank 3: (root, listing rows)."""
    root = tmp_path_factory.mktemp("artifacts") / "arts"
    saved = {key: os.environ.get(key) for key in ("IRIS_KERNEL_ARTIFACTS_DIR", "RANK")}
    os.environ.update(IRIS_KERNEL_ARTIFACTS_DIR=str(root), RANK="3")
    try:
        listing = run_cuda_script("kernel_artifacts.py", timeout=300)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return root, dict(line.split(" ", 1) for line in listing.strip().splitlines())


@pytest.mark.codegen
def test_each_specialization_gets_every_stage_once(offline_artifacts):
    _, rows = offline_artifacts
    specs = sorted(path.split(os.sep)[3] for path in rows)
    assert specs == ["BLOCK1024_fp16_w4", "BLOCK2048_fp16_w4"], rows  # compiled three times, two codes
    for path, names in rows.items():
        assert path.split(os.sep)[:3] == ["inspect_ptx", "put_kernel", "rank_3"], path
        assert names == STAGE_FILES, path


@pytest.mark.codegen
def test_metadata_names_the_kernel_its_constexprs_and_its_code(offline_artifacts):
    root, rows = offline_artifacts
    path = next(path for path in rows if "BLOCK2048" in path)
    record = json.loads((root / path / "metadata.json").read_text())
    assert record["kernel_name"] == "put_kernel" and record["rank"] == 3
    assert record["constexprs"] == {"BLOCK": 2048} and record["signature"]["src"] == "*fp16"
    assert record["target"]["arch"] == 90 and record["num_warps"] == 4
    assert record["codegen_hash"] == path.split(os.sep)[-1]
    assert "ld.global" in (root / path / "kernel.ptx").read_text()
    assert "LDG" in (root / path / "kernel.sass").read_text()


@pytest.fixture
def restored_listener():
    before = triton.knobs.compilation.listener
    yield
    kernel_artifacts.disable()
    triton.knobs.compilation.listener = before


def test_iris_kernels_are_filed_under_their_module_and_user_kernels_under_their_file():
    assert kernel_artifacts._algorithm_of(all_reduce.one_shot_kernel) == "all_reduce"
    assert kernel_artifacts._algorithm_of(barrier.device_barrier_kernel) == "barrier"
    assert kernel_artifacts._algorithm_of(run_cuda_script_kernel) == "test_kernel_artifacts"


@triton.jit
def run_cuda_script_kernel(x):
    pass


def test_specialization_names_are_short_single_path_components():
    name = kernel_artifacts._spec_name({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 64, "EVEN": True}, "fp16", 8)
    assert name == "BM128_BN64_EVEN1_fp16_w8"
    long = kernel_artifacts._spec_name({f"P{i}": 10**6 for i in range(40)}, None, 4)
    assert len(long) <= 96 and os.sep not in long
    assert kernel_artifacts._safe("../evil/x") == "-evil-x"


def test_a_missing_directory_is_made_private(tmp_path, restored_listener):
    kernel_artifacts.enable(str(tmp_path / "new" / "arts"))
    assert kernel_artifacts.is_enabled()
    assert (os.stat(tmp_path / "new" / "arts").st_mode & 0o777) == 0o700


def test_a_directory_others_can_write_is_refused(tmp_path, restored_listener):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UnsafeFileError, match="writable by other users"):
        kernel_artifacts.enable(str(shared))
    assert not kernel_artifacts.is_enabled()


def test_disable_gives_the_programs_own_listener_back(tmp_path, restored_listener):
    def programs_listener(**kwargs):
        pass

    triton.knobs.compilation.listener = programs_listener
    kernel_artifacts.enable(str(tmp_path / "arts"))
    assert triton.knobs.compilation.listener is not programs_listener
    kernel_artifacts.disable()
    assert triton.knobs.compilation.listener is programs_listener


def test_a_path_that_is_a_file_fails_the_import_in_one_line(tmp_path):
    path = tmp_path / "file"
    path.write_text("")
    env = {**os.environ, "IRIS_KERNEL_ARTIFACTS_DIR": str(path), "PYTHONPATH": ROOT}
    result = subprocess.run([sys.executable, "-c", "import iris"], capture_output=True, text=True, env=env)
    assert result.returncode != 0
    assert "IRIS_KERNEL_ARTIFACTS_DIR" in result.stderr.strip().splitlines()[-1]


@pytest.mark.skipif(iris.BACKEND != "emulated", reason="the interpreter compiles nothing")
def test_under_the_interpreter_the_setting_says_nothing_will_be_written(tmp_path):
    env = {**os.environ, "IRIS_KERNEL_ARTIFACTS_DIR": str(tmp_path / "arts"), "PYTHONPATH": ROOT}
    code = "import iris; print(iris.kernel_artifacts.is_enabled())"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.stdout.strip() == "False"
    assert "nothing is compiled" in result.stderr


def _all_reduce_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        x = ctx.full((4096,), float(rank + 1))
        out = ctx.zeros_like(x)
        ctx.ccl.all_reduce(out, x)
        ctx.barrier()
        assert out.eq(world_size * (world_size + 1) / 2).all()
    return "ok"


@pytest.mark.skipif(iris.BACKEND == "emulated", reason="the interpreter compiles nothing")
@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
def test_a_job_files_a_collectives_kernels_under_its_module_for_each_rank(tmp_path):
    # A fresh launch with the setting in its environment, as a user runs it: the kernels
    # compiled from the first call on are written (a pool process has compiled them before).
    root = tmp_path / "arts"
    result = subprocess.run(
        [sys.executable, "-m", "iris.run", "-n", str(SMALL_WORLD), "-t", "240",
         os.path.join(ROOT, "scripts", "run_test_body.py"), "test_kernel_artifacts:_all_reduce_body"],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "IRIS_KERNEL_ARTIFACTS_DIR": str(root)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(SMALL_WORLD):
        listing = [
            (os.path.relpath(directory, root), sorted(names))
            for directory, _, names in os.walk(root)
            if "metadata.json" in names and os.sep + f"rank_{rank}" + os.sep in directory
        ]
        assert "all_reduce" in {path.split(os.sep)[0] for path, _ in listing}, (rank, listing)
        assert all(" ".join(names) == STAGE_FILES for _, names in listing), listing
