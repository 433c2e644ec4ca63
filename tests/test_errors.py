"""Bad input gets a clear Python error on every rank, never a hang or a crash."""

import pytest
import torch
import triton
import triton.language as tl
from conftest import WORLD_SIZES, get_pool
from harness import RankError

import iris


def _raises(expected_type, match):
    def check(callable_, *args, **kwargs):
        with pytest.raises(expected_type, match=match):
            callable_(*args, **kwargs)

    return check


def _heap_size_body(rank, world_size, sizes):
    with pytest.raises((ValueError, TypeError)) as info:
        iris.iris(sizes[rank])
    return str(info.value)


@pytest.mark.parametrize("bad", [0, -5, 1.5, "1GB"], ids=str)
def test_invalid_heap_size_fails_every_rank(world, bad):
    messages = world.run(_heap_size_body, [bad] * world.world_size)
    assert all("heap_size" in m for m in messages)


def test_invalid_heap_size_on_one_rank_fails_every_rank(multi_world):
    sizes = [1 << 20] * multi_world.world_size
    sizes[-1] = -1
    messages = multi_world.run(_heap_size_body, sizes)
    assert all(f"rank {multi_world.world_size - 1}" in m for m in messages)


def test_heap_size_mismatch_names_every_rank(multi_world):
    sizes = [(1 << 20) * (r + 1) for r in range(multi_world.world_size)]
    messages = multi_world.run(_heap_size_body, sizes)
    assert all("same on every rank" in m and "rank 1: 2097152" in m for m in messages)


def _allocator_body(rank, world_size):
    # The two heaps are shared differently (descriptors over sockets, or handles gathered):
    # mixed, they would wait on each other; instead every rank fails at once, naming them.
    with pytest.raises(ValueError) as info:
        iris.iris(1 << 20, allocator_type="vmem" if rank == 0 else "torch")
    return str(info.value)


def test_allocator_type_mismatch_names_every_rank(multi_world):
    messages = multi_world.run(_allocator_body)
    assert all("allocator_type must be the same" in m and "rank 1: 'torch'" in m for m in messages)


def _bad_tensor_args_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        _raises(TypeError, "int128|is not supported")(ctx.zeros, 4, dtype=torch.quint8)
        _raises(TypeError, "must be a torch.dtype")(ctx.zeros, 4, dtype="float32")
        _raises(TypeError, "sizes must be ints")(ctx.zeros, 2.5)
        _raises(ValueError, "non-negative")(ctx.zeros, -1)
        # Upstream Iris raises RuntimeError where Iris raised ValueError (and the reverse):
        # these raise iris.InvalidArgumentError, which is both.
        for error in (ValueError, RuntimeError):
            # upstream's messages
            _raises(error, "The output tensor is not on the symmetric heap")(
                ctx.zeros, 4, out=torch.zeros(4, device=ctx.get_device())
            )
            _raises(error, "has 4 elements, but 5 are required .heap tensors cannot be resized")(
                ctx.zeros, 5, out=ctx.zeros(4)
            )
            _raises(error, "has dtype torch.int32, but torch.float32 is required")(
                ctx.zeros, 4, dtype=torch.float32, out=ctx.zeros(4, dtype=torch.int32)
            )
            _raises(error, "does not match")(ctx.zeros, 4, device="meta")
            _raises(error, "low < high")(ctx.randint, 5, 5, (3,))
            _raises(error, "step must be non-zero")(ctx.arange, 0, 4, 0)
            _raises(error, "empty range")(ctx.arange, 4, 0)
        _raises(ValueError, "strided")(ctx.zeros, 4, layout=torch.sparse_coo)
        _raises(RuntimeError, "cannot map memory allocated outside")(ctx.as_symmetric, torch.zeros(2))
        _raises(ValueError, "src=")(ctx.broadcast, 1, src=world_size)
        _raises(ValueError, "not on this rank's symmetric heap")(ctx.heap.offset_of, torch.zeros(2))
        _raises(ValueError, "allocator_type")(iris.iris, 1 << 20, allocator_type="magic")


def test_bad_tensor_arguments(world):
    world.run(_bad_tensor_args_body)


def test_more_ranks_than_gpus_is_refused(monkeypatch):
    from iris.backends.cuda_ipc import CudaBackend

    monkeypatch.delenv("IRIS_RANKS_PER_GPU", raising=False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(RuntimeError, match="4 ranks on this host but only 2 GPU.*IRIS_RANKS_PER_GPU=2"):
        CudaBackend().select_device(local_rank=3, local_world_size=4)


def test_sharing_places_rank_r_on_gpu_r_mod_count():
    from iris.backends.cuda_ipc import gpu_for_rank

    assert [gpu_for_rank(r, 4, gpus=1, ranks_per_gpu=4) for r in range(4)] == [0, 0, 0, 0]
    assert [gpu_for_rank(r, 4, gpus=2, ranks_per_gpu=2) for r in range(4)] == [0, 1, 0, 1]
    assert [gpu_for_rank(r, 2, gpus=4, ranks_per_gpu=1) for r in range(2)] == [0, 1]
    with pytest.raises(RuntimeError, match="IRIS_RANKS_PER_GPU=2 allows at most 4: raise it"):
        gpu_for_rank(0, 5, gpus=2, ranks_per_gpu=2)


def test_shared_gpus_coordinate_through_gloo(monkeypatch):
    from iris.backends import cuda_ipc

    monkeypatch.setattr(cuda_ipc, "visible_gpu_count", lambda: 1)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("IRIS_RANKS_PER_GPU", "2")
    assert cuda_ipc.CudaBackend().dist_backend == "gloo"  # NCCL refuses two ranks on one GPU
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert cuda_ipc.CudaBackend().dist_backend == "nccl"
    monkeypatch.setenv("IRIS_RANKS_PER_GPU", "0")
    with pytest.raises(ValueError, match="IRIS_RANKS_PER_GPU='0' is not a whole number from 1"):
        iris.config.ranks_per_gpu()


def test_unknown_backend_name_is_refused(monkeypatch):
    from iris.backends import choose_backend_name

    monkeypatch.setenv("IRIS_BACKEND", "rocm")
    with pytest.raises(ValueError, match="IRIS_BACKEND='rocm'"):
        choose_backend_name()


@triton.jit
def wait_forever_kernel(flag):
    iris.wait_until(flag, "eq", 1)


def _wait_timeout_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        flag = ctx.zeros(1, dtype=torch.int32)
        with pytest.raises(Exception, match="iris.wait_until waited 1 s") as info:
            wait_forever_kernel[(1,)](flag)
        assert "last seen 0" in str(info.value)


@pytest.mark.skipif(iris.BACKEND != "emulated", reason="GPU spin-waits have no timeout in the core issue")
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_emulated_wait_without_signal_fails_with_a_clear_error(world_size):
    # Its own pool: the one-second timeout must not reach other tests' ranks.
    get_pool(world_size, IRIS_EMU_WAIT_TIMEOUT="1").run(_wait_timeout_body)


@triton.jit
def wait_with_heap_bases_kernel(flag, heap_bases):
    iris.wait_until(flag, "eq", 1, heap_bases=heap_bases)


def _one_error_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        flag = ctx.zeros(1, dtype=torch.int32)
        with pytest.raises(iris.WaitTimeoutError) as info:
            wait_with_heap_bases_kernel[(1,)](flag, ctx.get_heap_bases())
        error = info.value
        return type(error).__name__, error.__cause__, error.__context__, error.culprit


@pytest.mark.skipif(iris.BACKEND != "emulated", reason="on GPUs the timeout is raised by the host barrier")
def test_an_emulated_wait_timeout_is_one_iris_error_naming_the_culprit():
    # Not wrapped in one InterpreterError per @triton.jit frame: the README says to catch this.
    [(name, cause, context, culprit)] = get_pool(1, IRIS_EMU_WAIT_TIMEOUT="1").run(_one_error_body)
    assert (name, cause, context, culprit) == ("WaitTimeoutError", None, None, 0)


@triton.jit
def wait_with_heap_bases_by_position_kernel(flag, heap_bases):
    iris.wait_until(flag, "eq", 0, heap_bases)  # lands in scope's place


def _positional_heap_bases_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        flag = ctx.zeros(1, dtype=torch.int32)
        with pytest.raises(Exception) as refused:
            wait_with_heap_bases_by_position_kernel[(1,)](flag, ctx.get_heap_bases())
        # The compiler names the line and chains the reason; the interpreter wraps it.
        error, messages = refused.value, []
        while error is not None:
            messages.append(str(error))
            error = error.__cause__
        return any("pass heap_bases by name" in message for message in messages)


def test_heap_bases_passed_to_wait_until_by_position_is_refused():
    # The README's old table gave heap_bases as the fourth argument; it is scope's place.
    assert get_pool(1).run(_positional_heap_bases_body) == [True]


@triton.jit
def store_to_rank_kernel(buf, target, cur_rank, heap_bases):
    offsets = tl.arange(0, 4)
    iris.store(buf + offsets, offsets, cur_rank, target, heap_bases)


@triton.jit
def context_load_kernel(context, buf, source, rank: tl.constexpr, world_size: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    tl.store(buf, ctx.load(buf, source))


def _debug_rank_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        buf = ctx.zeros(4, dtype=torch.int32)
        with pytest.raises(Exception, match="iris.store: rank out of range"):
            store_to_rank_kernel[(1,)](buf, world_size, rank, ctx.get_heap_bases())
        with pytest.raises(Exception, match="iris.load: rank out of range"):
            context_load_kernel[(1,)](ctx.get_device_context(), buf, -1, rank=rank, world_size=world_size)
        outside = torch.zeros(4, dtype=torch.int32, device=ctx.get_device())
        with pytest.raises(Exception, match="iris.store: pointer is outside the symmetric heap"):
            store_to_rank_kernel[(1,)](outside, rank, rank, ctx.get_heap_bases())
        store_to_rank_kernel[(1,)](buf, rank, rank, ctx.get_heap_bases())  # valid use still works
        assert buf.cpu().tolist() == [0, 1, 2, 3]


@pytest.mark.skipif(iris.BACKEND != "emulated", reason="a device assert poisons the CUDA context")
def test_debug_mode_names_the_op_that_went_out_of_range():
    from conftest import small_world_pool

    small_world_pool(IRIS_DEBUG="1").run(_debug_rank_body)


def _failing_body(rank, world_size):
    if rank == world_size - 1:
        raise KeyError("planted")


def test_harness_reports_the_failing_rank(world):
    with pytest.raises(RankError, match=f"rank {world.world_size - 1}"):
        world.run(_failing_body)
