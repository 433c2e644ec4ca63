"""Upstream Iris's host API, names and module paths, as its programs use them."""

import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl
from conftest import get_pool

import iris
from iris.device.utils import get_cu_id, get_xcc_id, read_realtime

# The interpreter's fixes (iris/backends/_interpreter_compat.py) reach into Triton's internals.
pytestmark = pytest.mark.triton_internals


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
        # ... and, as upstream, a layout for another rank gives a contiguous tensor.
        assert ctx.empty(2, 3, memory_format=torch.channels_last).is_contiguous()
        kept = ctx.zeros_like(nhwc)  # preserve_format keeps the input's layout
        assert kept.is_contiguous(memory_format=torch.channels_last) and not kept.any()
        # as_symmetric: a heap tensor is already symmetric.
        assert ctx.as_symmetric(flat) is flat


def test_host_api_matches_upstream(world):
    world.run(_host_api_body)


def _context_positions_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        untraced = ctx.get_device_context().clone()
        ctx.tracing.enable(max_events=1000)
        traced = ctx.get_device_context()
        # Upstream's positions, which its programs read: trace_enabled, then max_events.
        assert untraced[2 + world_size].item() == 0
        assert traced[2 + world_size].item() == 1 and traced[3 + world_size].item() == 1000
        assert traced.shape == untraced.shape


def test_the_context_tensor_holds_upstreams_tracing_fields_where_upstream_has_them(world):
    world.run(_context_positions_body)


def _tensor_creation_body(rank, world_size):
    from iris import tensor_creation as tc

    with iris.iris(1 << 22) as ctx:
        heap, device = ctx.heap, ctx.device
        # Upstream's module functions: (heap, iris_device, size, ...), size as *size was given.
        for size in ((2, 3), ((2, 3),), ([2, 3],)):
            made = tc.zeros(heap, device, size, dtype=torch.float16)
            assert made.shape == (2, 3) and made.dtype == torch.float16 and not made.any()
            assert ctx.is_symmetric(made)
        assert torch.equal(tc.ones(heap, device, (4,)).cpu(), torch.ones(4))
        assert torch.equal(tc.full(heap, device, (2, 2), 7).cpu(), torch.full((2, 2), 7))
        assert tc.empty(heap, device, (2, 3, 4, 5), memory_format=torch.channels_last).is_contiguous(
            memory_format=torch.channels_last
        )
        assert torch.equal(tc.arange(heap, device, 0, 10, 2).cpu(), torch.arange(0, 10, 2))
        assert torch.equal(tc.linspace(heap, device, 0, 1, (5,)).cpu(), torch.linspace(0, 1, 5))
        drawn = tc.randint(heap, device, 3, 9, (64,), generator=torch.Generator().manual_seed(rank))
        expected = torch.randint(3, 9, (64,), generator=torch.Generator().manual_seed(rank))
        assert torch.equal(drawn.cpu(), expected)
        normal = tc.randn(heap, device, (8,), generator=torch.Generator().manual_seed(1))
        assert torch.equal(normal.cpu(), torch.randn(8, generator=torch.Generator().manual_seed(1)))
        assert tc.rand(heap, device, (3,)).shape == (3,) and tc.uniform(
            heap, device, (3,), -1.0, 1.0
        ).shape == (3,)
        like = tc.zeros_like(heap, device, made)
        assert like.shape == made.shape and ctx.is_symmetric(like)
        # The methods are these functions on the rank's heap: both forms give the same values.
        torch.manual_seed(5)
        by_method = ctx.rand(16)
        torch.manual_seed(5)
        assert torch.equal(tc.rand(heap, device, (16,)).cpu(), by_method.cpu())
        # Helpers and upstream's error types.
        assert tc.parse_size(((2, 3),)) == ((2, 3), 6)
        assert tc.allocate(heap, 6, torch.int32).shape == (6,)
        assert tc.is_valid_device(None, device) and not tc.is_valid_device("meta", device)
        with pytest.raises(RuntimeError):
            tc.throw_if_invalid_device("meta", device)
        with pytest.raises(RuntimeError):
            tc.throw_if_invalid_output_tensor(heap, made, 5, torch.float16)
        with pytest.raises(RuntimeError):
            tc.throw_if_invalid_output_tensor(heap, torch.zeros(6, dtype=torch.float16), 6, torch.float16)
        with pytest.raises(ValueError):
            tc.apply_layout(made, torch.sparse_coo)
        with pytest.raises(ValueError):
            tc.arange(heap, device, 0, 10, 0)
        with pytest.raises(ValueError):
            tc.randint(heap, device, 5, 5, (2,))
        with pytest.raises(RuntimeError):
            tc.zeros(heap, device, (2,), device="meta")
        assert heap.is_symmetric(made)


def test_tensor_creation_module_has_upstreams_signatures(world):
    world.run(_tensor_creation_body)


def test_upstream_names_and_module_paths():
    from iris.device.triton.context import Context as DeviceTritonContext
    from iris.host.logging.logging import IrisFormatter
    from iris.host.tracing.events import TraceEvent
    from iris.mem.triton import Tile, TileView
    from iris.mem.triton.context import Context

    from iris.host.iris import Iris

    assert Context is DeviceTritonContext is iris.Context is iris.DeviceContext
    assert Iris is iris.Iris and IrisFormatter is iris.IrisFormatter and TraceEvent is iris.TraceEvent
    assert Tile is iris.Tile and TileView is iris.TileView
    for name in ("TensorView", "make_tensor_view", "AllReduceConfig", "tensor_creation"):
        assert hasattr(iris, name), name
    from iris.host.memory import tensors

    assert tensors is iris.host.memory.tensors


UPSTREAM_TOP_LEVEL = (
    "get_device_id_for_rank CUDAArrayInterface tensor_from_ptr experimental ops gluon is_simulation_env "
    "do_bench hip tensor_creation set_logger_level logger bench"
).split()


def test_upstreams_top_level_names_come_with_import_iris():
    # A fresh interpreter: nothing but ``import iris`` has run (``iris.ops.FusedConfig`` at once).
    code = f"import iris; print([n for n in {UPSTREAM_TOP_LEVEL!r} if not hasattr(iris, n)])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "[]", result.stderr[-2000:]
    from iris.experimental import gluon_context

    assert gluon_context is iris.device.gluon and iris.ops.FusedConfig is iris.ops.config.FusedConfig


def test_a_tensor_over_an_address_shares_its_memory_and_checks_its_size():
    from iris.host.memory.tensor_utils import tensor_from_ptr

    x = torch.arange(8, dtype=torch.float32)
    view = tensor_from_ptr(x.data_ptr(), 32, device="cpu")
    view[0] = 42
    assert x[0] == 42 and view.shape == (8,)
    halves = torch.ones(4, dtype=torch.bfloat16)
    assert iris.tensor_from_ptr(halves.data_ptr(), 8, torch.bfloat16, "cpu", (2, 2)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="needs 16 bytes, more than size_bytes=8"):
        tensor_from_ptr(x.data_ptr(), 8, torch.float32, "cpu", (4,))
    with pytest.raises(ValueError, match="ptr must be a positive int"):
        iris.CUDAArrayInterface(0, 8)


def test_upstreams_simulation_switch_takes_only_its_three_words(monkeypatch):
    for value in ("0", "", "yess", "1; rm -rf /", "true\nyes"):
        monkeypatch.setenv("IRIS_SIMULATION", value)
        assert not iris.is_simulation_env(), value
    monkeypatch.setenv("IRIS_SIMULATION", " YES ")
    assert iris.is_simulation_env()


def test_the_device_of_a_rank_wraps_only_where_ranks_share_devices(monkeypatch):
    monkeypatch.delenv("IRIS_SIMULATION", raising=False)
    monkeypatch.delenv("IRIS_RANKS_PER_GPU", raising=False)  # GPU passes set it where ranks share a GPU
    assert iris.get_device_id_for_rank(5) == 5
    monkeypatch.setenv("IRIS_SIMULATION", "1")
    from iris.host.platform import utils

    for devices, expected in ((2, 1), (0, 0)):
        monkeypatch.setattr(
            utils, "make_backend", lambda name, n=devices: type("B", (), {"device_count": lambda s: n})()
        )
        assert iris.get_device_id_for_rank(5) == expected
    with pytest.raises(ValueError, match="non-negative int"):
        iris.get_device_id_for_rank(-1)


def _newer_host_api_body(rank, world_size):
    import numpy as np

    from iris.host.distributed.helpers import distributed_allgather_multidim

    with iris.iris(1 << 22) as ctx:
        # arange's start, end and step by name, as upstream's tests call it.
        assert torch.equal(ctx.arange(start=1, end=7, step=2).cpu(), torch.arange(1, 7, 2))
        assert torch.equal(ctx.arange(end=3).cpu(), torch.arange(3))
        # pin_memory is taken (and means nothing for device memory), as upstream's.
        for factory in (ctx.empty, ctx.rand, ctx.randn):
            assert ctx.is_symmetric(factory(2, 3, pin_memory=True))
        # Upstream's view of the device barrier: one flags tensor per group, reused.
        ctx.device_barrier()
        flags = ctx._device_barrier_state[None]
        ctx.device_barrier()
        assert ctx._device_barrier_state[None].data_ptr() == flags.data_ptr()
        # Every rank's row, in rank order.
        rows = distributed_allgather_multidim(np.array([rank, 10 * rank]))
        assert rows.tolist() == [[r, 10 * r] for r in range(world_size)]


def test_newer_upstream_host_calls(world):
    world.run(_newer_host_api_body)


def _default_device_body(rank, world_size):
    # Upstream's flash-decode test sets a default device; the package's own host
    # tensors (flight report, context slots) must not follow it.
    try:
        torch.set_default_device("meta")
        with iris.iris(1 << 22) as ctx:
            x = ctx.ones(8)
            ctx.ccl.all_reduce(ctx.zeros(8), x)
            ctx.device_barrier()
            assert x.device.type != "meta"
    finally:
        torch.set_default_device(None)


def test_a_default_device_set_by_the_program_is_not_followed_by_iris_own_tensors(world):
    world.run(_default_device_body)


def test_upstream_platform_queries_and_do_bench():
    from iris.host.platform import hip

    assert iris.hip is hip
    assert hip.get_num_xcc() == 1 and hip.get_cu_count() >= 1 and hip.get_wall_clock_rate() == 10**6
    assert hip.count_devices() >= 1 and hip.get_device_id() >= 0 and isinstance(hip.get_arch_string(), str)
    calls = []
    times = iris.do_bench(lambda: calls.append(1), n_warmup=2, n_repeat=5, return_mode="all")
    assert len(calls) == 1 + 2 + 5 and len(times) == 5 and all(t >= 0 for t in times)
    low, high = iris.do_bench(lambda: None, n_warmup=0, n_repeat=4, quantiles=[0.0, 1.0])
    assert low <= high
    with pytest.raises(ValueError, match="return_mode"):
        iris.do_bench(lambda: None, return_mode="p99")


def _granularity_body(rank, world_size, allocator_type):
    with iris.iris((1 << 20) + 5, allocator_type=allocator_type) as ctx:
        granularity = iris.hip.get_allocation_granularity(ctx.gpu_id)
        aligned = ctx.heap.allocator.aligned_heap_size
        assert granularity >= 4096 and aligned % granularity == 0 and aligned >= (1 << 20) + 5


@pytest.mark.parametrize("allocator_type", ["torch", "vmem"])
def test_the_heap_is_a_whole_number_of_allocation_granules(world, allocator_type):
    world.run(_granularity_body, allocator_type)


@triton.jit
def _timed_kernel(out):
    start = read_realtime()
    tl.store(out + 1, get_cu_id() * 0 + get_xcc_id())
    tl.store(out, read_realtime() - start)


def test_read_realtime_times_a_kernel():
    from iris.mem.utils import read_realtime as upstream_path

    assert upstream_path is read_realtime
    out = torch.full((2,), -1, dtype=torch.int64, device="cpu" if iris.BACKEND == "emulated" else "cuda")
    _timed_kernel[(1,)](out)
    assert out[0] >= 0 and out[1] == 0


def test_iris_formatter_names_rank_and_level():
    import logging

    record = logging.LogRecord("iris", logging.INFO, __file__, 1, "hello", None, None)
    record.iris_rank, record.iris_num_ranks = 1, 4
    text = iris.IrisFormatter().format(record)
    assert text.endswith("INFO  [Iris] [1/4] hello")
    record = logging.LogRecord("iris", logging.WARNING, __file__, 1, "no rank", None, None)
    assert "[?/?] no rank" in iris.IrisFormatter().format(record)


def test_iris_formatter_names_the_module_of_the_librarys_own_records():
    import logging

    record = logging.LogRecord("iris", logging.INFO, "/x/all_gather.py", 1, "internal", None, None)
    record.iris_rank, record.iris_num_ranks, record.iris_internal = 0, 4, True
    assert iris.IrisFormatter().format(record).endswith("[Iris] [0/4] [all_gather] internal")


def _randint_argument_count_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        for args in ((10,), (0, 10, (2, 3), (4, 5))):
            with pytest.raises(TypeError, match="randint expects"):
                ctx.randint(*args)
            with pytest.raises(ValueError, match="randint expects"):
                ctx.randint(*args)


def test_randint_with_a_wrong_argument_count_raises_what_torch_and_upstream_raise():
    get_pool(1).run(_randint_argument_count_body)


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


def test_interpreter_computes_bf16_as_a_gpu_does(tmp_path):
    """The interpreter stores bf16 as its 16 bits; arithmetic on them used to run on the integers."""
    source = """
        import iris, torch, triton, triton.language as tl

        @triton.jit
        def kernel(x, y, out, less, n: tl.constexpr):
            o = tl.arange(0, n)
            a, b = tl.load(x + o), tl.load(y + o)
            tl.store(out + o, a + b)
            tl.store(out + n + o, a * b - a)
            tl.store(out + 2 * n + o, a / b)
            tl.store(out + 3 * n + o, tl.maximum(a, -b))
            tl.store(out + 4 * n + o, (a * 4).to(tl.int32).to(tl.bfloat16))
            tl.store(out + 5 * n, tl.sum(a))
            tl.store(out + 5 * n + 1, tl.min(a))
            tl.store(less + o, (a < b).to(tl.int32))
            tl.store(out + 6 * n + o, -a)
            tl.store(out + 7 * n + o, tl.abs(b))

        @triton.jit
        def matmul(x, y, out, n: tl.constexpr):
            o = tl.arange(0, n)
            a = tl.load(x + o[:, None] * n + o[None, :])
            b = tl.load(y + o[:, None] * n + o[None, :])
            tl.store(out + o[:, None] * n + o[None, :], tl.dot(a, b))

        n = 16
        g = torch.Generator().manual_seed(0)
        x, y = (torch.randn(n, generator=g).to(torch.bfloat16) for _ in range(2))
        out, less = torch.zeros(8 * n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.int32)
        kernel[(1,)](x, y, out, less, n)
        bf16 = lambda t: t.to(torch.bfloat16)
        assert torch.equal(out[:n], x + y)
        assert torch.equal(out[n : 2 * n], bf16(bf16(x.float() * y.float()).float() - x.float()))
        assert torch.equal(out[2 * n : 3 * n], x / y)
        assert torch.equal(out[3 * n : 4 * n], torch.maximum(x, -y))
        assert torch.equal(out[4 * n : 5 * n], bf16((x.float() * 4).int().float()))
        assert out[5 * n] == bf16(x.float().sum()) and out[5 * n + 1] == x.min()
        assert torch.equal(less, (x < y).int())
        assert torch.equal(out[6 * n : 7 * n], -x) and torch.equal(out[7 * n :], y.abs())
        a, b = (torch.randn(n, n, generator=g).to(torch.bfloat16) for _ in range(2))
        c = torch.zeros(n, n)
        matmul[(1,)](a, b, c, n)
        assert torch.allclose(c, a.float() @ b.float(), atol=1e-4)
        print("ok")
    """
    assert "ok" in _run_script(tmp_path, source)


def test_interpreter_patches_the_language_once_per_launch_not_per_helper_call(tmp_path):
    """Helpers called inside a launch reuse the launch's patches; the results stay right."""
    source = """
        import iris, torch, triton, triton.language as tl
        from triton.runtime import interpreter

        @triton.jit
        def add_one(x):
            return x + 1

        @triton.jit
        def kernel(out, CALLS: tl.constexpr):
            value = tl.zeros([4], tl.int32)
            for _ in tl.static_range(CALLS):
                value = add_one(value)
            tl.store(out + tl.arange(0, 4), value)

        patches = []
        original = interpreter._patch_builtin
        interpreter._patch_builtin = lambda *args: (patches.append(1), original(*args))[1]
        counts = {}
        for calls in (1, 20):
            out = torch.zeros(4, dtype=torch.int32)
            patches.clear()
            kernel[(2,)](out, calls)
            assert torch.equal(out, torch.full((4,), calls, dtype=torch.int32))
            counts[calls] = len(patches)
        assert counts[1] == counts[20] > 0, counts
        assert tl.load is tl.core.load  # every patch undone after the launch
        print("ok")
    """
    assert "ok" in _run_script(tmp_path, source)


def test_interpreter_reduces_with_a_combine_function_a_whole_array_at_a_time(tmp_path):
    """tl.reduce with a function of its own: the same answers as numpy, in ~log2(n) calls."""
    source = """
        import iris, numpy as np, torch, triton, triton.language as tl

        CALLS = []

        @triton.jit
        def add(a, b):
            CALLS.append(1)  # the interpreter runs the body as Python
            return a + b

        @triton.jit
        def first_nonzero(a, b):  # associative, not commutative: order must be kept
            return tl.where(a != 0, a, b)

        @triton.jit
        def add_pairs(a0, a1, b0, b1):
            return a0 + b0, a1 + b1

        @triton.jit
        def kernel(x, out, R: tl.constexpr, C: tl.constexpr):
            r, c = tl.arange(0, R), tl.arange(0, C)
            v = tl.load(x + r[:, None] * C + c[None, :])
            tl.store(out + c, tl.reduce(v, 0, add))
            tl.store(out + C + r, tl.reduce(v, 1, first_nonzero))
            flat, nonzero = tl.reshape(v, [R * C]), tl.reshape((v != 0).to(tl.int32), [R * C])
            total, count = tl.reduce((flat, nonzero), 0, add_pairs)
            tl.store(out + C + R, total)
            tl.store(out + C + R + 1, count.to(tl.float32))
            tl.store(out + C + R + 2 + r, tl.reshape(tl.reduce(v, 1, add, keep_dims=True), [R]))

        R, C = 8, 16
        x = torch.randn(R, C, generator=torch.Generator().manual_seed(0))
        x[x.abs() < 0.8] = 0
        out = torch.zeros(C + 2 * R + 2)
        kernel[(1,)](x, out, R, C)
        assert len(CALLS) == 3 + 4, len(CALLS)  # 8 rows -> 3 rounds, 16 columns -> 4 (not 232 calls)
        first = [row[row != 0][0] if (row != 0).any() else torch.tensor(0.0) for row in x]
        torch.testing.assert_close(out[:C], x.sum(0))
        assert torch.equal(out[C : C + R], torch.stack(first))
        torch.testing.assert_close(out[C + R], x.sum())
        assert out[C + R + 1] == (x != 0).sum()
        torch.testing.assert_close(out[C + R + 2 :], x.sum(1))
        print("ok")
    """
    assert "ok" in _run_script(tmp_path, source)
