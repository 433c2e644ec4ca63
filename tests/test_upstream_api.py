"""Upstream Iris's host API, names and module paths, as its programs use them."""

import subprocess
import sys
import textwrap

import pytest
import torch

import iris


def _host_api_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        # ctx.device is upstream's string, and still compares with the torch.device.
        assert isinstance(ctx.device, str) and ctx.device == str(ctx.get_device())
        assert ctx.device == ctx.get_device() and ctx.device.type == ctx.get_device().type
        assert torch.zeros(2, device=ctx.device).device == ctx.get_device()
        # heap.allocate(num_elements, dtype), upstream's signature.
        flat = ctx.heap.allocate(6, torch.float32)
        assert flat.shape == (6,) and ctx.is_symmetric(flat)
        # Sizes nested once more than usual, as upstream accepts them.
        assert ctx.zeros(((2, 3),)).shape == (2, 3)
        # out= of the right element count but another shape is viewed as the size.
        out = ctx.full((6,), 7.0)
        result = ctx.zeros(2, 3, out=out)
        assert result.shape == (2, 3) and result.data_ptr() == out.data_ptr() and not out.any()
        # linspace takes steps as a one-element tuple.
        assert torch.equal(ctx.linspace(0, 1, (5,)).cpu(), torch.linspace(0, 1, 5))
        # Complex dtypes live on the heap.
        c = ctx.ones(3, dtype=torch.complex64)
        assert c.dtype == torch.complex64 and ctx.is_symmetric(c)
        # memory_format: channels_last and channels_last_3d layouts on the heap.
        nhwc = ctx.empty(2, 3, 4, 5, memory_format=torch.channels_last)
        assert nhwc.is_contiguous(memory_format=torch.channels_last) and ctx.is_symmetric(nhwc)
        ndhwc = ctx.empty(1, 2, 3, 4, 5, memory_format=torch.channels_last_3d)
        assert ndhwc.is_contiguous(memory_format=torch.channels_last_3d)
        kept = ctx.zeros_like(nhwc)  # preserve_format keeps the input's layout
        assert kept.is_contiguous(memory_format=torch.channels_last) and not kept.any()
        # as_symmetric: a heap tensor is already symmetric.
        assert ctx.as_symmetric(flat) is flat


def test_host_api_matches_upstream(world):
    world.run(_host_api_body)


def test_upstream_names_and_module_paths():
    from iris.device.triton.context import Context as DeviceTritonContext
    from iris.host.iris import Iris
    from iris.host.logging.logging import IrisFormatter
    from iris.host.tracing.events import TraceEvent
    from iris.mem.triton import Tile, TileView
    from iris.mem.triton.context import Context

    assert Context is DeviceTritonContext is iris.Context is iris.DeviceContext
    assert Iris is iris.Iris and IrisFormatter is iris.IrisFormatter and TraceEvent is iris.TraceEvent
    assert Tile is iris.Tile and TileView is iris.TileView
    for name in ("TensorView", "make_tensor_view", "AllReduceConfig", "tensor_creation"):
        assert hasattr(iris, name), name


def test_iris_formatter_names_rank_and_level():
    import logging

    record = logging.LogRecord("iris", logging.INFO, __file__, 1, "hello", None, None)
    record.iris_rank, record.iris_num_ranks = 1, 4
    text = iris.IrisFormatter().format(record)
    assert text.endswith("INFO  [Iris] [1/4] hello")
    record = logging.LogRecord("iris", logging.WARNING, __file__, 1, "no rank", None, None)
    assert "[?/?] no rank" in iris.IrisFormatter().format(record)


def test_config_fields_can_be_set_and_are_checked():
    config = iris.ccl.Config()
    config.comm_sms = 8
    config.all_gather_variant = "partitioned"
    assert config.key() != iris.ccl.Config().key()
    with pytest.raises(ValueError, match="num_warps"):
        config.num_warps = 3
    assert config.num_warps == 8


def _run_script(directory, source: str, *, launcher: bool = False):
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_BACKEND")}
    env["IRIS_BACKEND"] = "emulated"
    path = directory / "script.py"
    path.write_text(textwrap.dedent(source))
    command = [sys.executable, "-m", "iris.run", "-n", "1", path] if launcher else [sys.executable, path]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# Triton imported, and a kernel defined, before ``import iris``: the kernel and
# Triton's own jit helpers (tl.max here, tl.min in Iris's flight recorder) still run.
TRITON_FIRST = """
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, flags, n: tl.constexpr):
        offs = tl.arange(0, n)
        values = tl.load(x + offs)
        tl.store(x + offs, values + tl.max(values, axis=0))
        tl.atomic_add(flags, 1)

    import iris

    ctx = iris.iris(1 << 20)
    x = ctx.arange(8, dtype=torch.float32)
    flags = ctx.zeros(1, dtype=torch.int32)
    kernel[(1,)](x, flags, 8)
    assert torch.equal(x.cpu(), torch.arange(8.0) + 7) and flags.item() == 1
    print("ok")
"""


def test_triton_imported_before_iris_runs_under_emulation(tmp_path):
    assert _run_script(tmp_path, TRITON_FIRST).strip().endswith("ok")


def test_iris_run_sets_the_interpreter_for_its_ranks(tmp_path):
    assert "ok" in _run_script(tmp_path, TRITON_FIRST, launcher=True)


def test_interpreter_has_bf16_constants_and_float_exchange(tmp_path):
    source = """
        import iris, torch, triton, triton.language as tl

        @triton.jit
        def kernel(out, swapped, old):
            offs = tl.arange(0, 4)
            tl.store(out + offs, tl.full([4], 1.5, tl.bfloat16))
            tl.store(old + offs, tl.atomic_xchg(swapped + offs, tl.full([4], 2.5, tl.float32)))

        out = torch.zeros(4, dtype=torch.bfloat16)
        swapped, old = torch.ones(4), torch.zeros(4)
        kernel[(1,)](out, swapped, old)
        assert (out == 1.5).all() and (swapped == 2.5).all() and (old == 1.0).all()
        print("ok")
    """
    assert "ok" in _run_script(tmp_path, source)
