"""Jobs that span nodes: topology settings, the cross-node path and its completion rule.

Ranks are grouped into "nodes" with ``IRIS_RANKS_PER_NODE`` (one host acting as
several), so every test here runs the cross-node path of the emulation backend.
The device-op suites' multi-rank tests also run across nodes, at four ranks as two
nodes of two (``conftest.CROSS_NODE``).
"""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from conftest import SMALL_WORLD, WORLD_SIZES, get_pool
from test_launch import EXAMPLES, verify_example

import iris
from iris import config
from iris.backends.base import Backend
from iris_trace import schema

pytestmark = pytest.mark.skipif(
    iris.BACKEND != "emulated", reason="the cross-node path runs under emulation only (docs/scale_out.md)"
)


def test_ranks_per_node_comes_from_the_setting_or_the_launcher(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.delenv("IRIS_RANKS_PER_NODE", raising=False)
    assert config.ranks_per_node() == 4
    monkeypatch.setenv("IRIS_RANKS_PER_NODE", "2")
    assert config.ranks_per_node() == 2
    monkeypatch.setenv("IRIS_RANKS_PER_NODE", "16")  # more than the world: one node
    assert config.ranks_per_node() == 8


@pytest.mark.parametrize("value", ["3", "0", "-2", "two"])
def test_a_ranks_per_node_that_does_not_divide_the_world_is_refused(monkeypatch, value):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("IRIS_RANKS_PER_NODE", value)
    with pytest.raises(
        ValueError, match=r"IRIS_RANKS_PER_NODE='?\S+'? (does not divide the 8|is not a whole num)"
    ):
        config.ranks_per_node()


def test_the_setting_must_be_there_before_import():
    # Device code is compiled for one node or several when iris is imported.
    code = (
        "import os, iris\n"
        "os.environ.update(IRIS_RANKS_PER_NODE='1', WORLD_SIZE='2', LOCAL_WORLD_SIZE='2')\n"
        "from iris.host.iris import _ranks_per_node\n"
        "_ranks_per_node(2)\n"
    )
    launcher = ("IRIS_RANKS_PER_NODE", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=90)
    assert result.returncode != 0
    assert "before importing iris" in result.stderr


def test_a_gpu_job_across_nodes_without_nvshmem_says_what_to_install(monkeypatch):
    import torch.distributed._symmetric_memory as symmetric_memory

    from iris.backends.cuda_nvshmem import NvshmemBackend

    monkeypatch.setattr(symmetric_memory, "is_nvshmem_available", lambda: False)
    with pytest.raises(RuntimeError, match="pip install nvidia-nvshmem-cu13"):
        NvshmemBackend()


def test_the_nvshmem_device_library_is_found_or_its_setting_named(monkeypatch, tmp_path):
    from torch.distributed._symmetric_memory._nvshmem_triton import NvshmemLibFinder

    from iris.backends.cuda_nvshmem import nvshmem_device_library

    monkeypatch.setattr(NvshmemLibFinder, "found_device_lib_path", None)
    monkeypatch.setenv("NVSHMEM_LIB_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="NVSHMEM_LIB_DIR"):
        nvshmem_device_library((9, 0))
    # Newer NVSHMEM wheels ship one bitcode per architecture.
    (tmp_path / "libnvshmem_device_sm_90.bc").write_bytes(b"")
    assert nvshmem_device_library((9, 0)) == str(tmp_path / "libnvshmem_device_sm_90.bc")


def test_backends_without_a_cross_node_path_say_so():
    Backend.check_nodes(SimpleNamespace(name="cuda"), 1)
    with pytest.raises(RuntimeError, match="cannot reach ranks on other nodes"):
        Backend.check_nodes(SimpleNamespace(name="cuda"), 2)


def _pool(world_size, per_node):
    if world_size not in WORLD_SIZES:
        pytest.skip(f"IRIS_TEST_WORLD_SIZES does not list {world_size}")
    return get_pool(world_size, IRIS_RANKS_PER_NODE=str(per_node))


@triton.jit
def _store_load_fence_load(buf, out, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    iris.store(buf + offs, tl.full([BLOCK], 7, tl.int32), cur_rank, peer, heap_bases)
    tl.store(out + offs, iris.load(buf + offs, cur_rank, peer, heap_bases))
    iris.fence()
    tl.store(out + BLOCK + offs, iris.load(buf + offs, cur_rank, peer, heap_bases))


def _completion_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        buf = ctx.zeros(16, dtype=torch.int32)
        out = ctx.full((32,), -1, dtype=torch.int32)
        ctx.barrier()
        if rank == 0:
            _store_load_fence_load[(1,)](buf, out, 0, 1, ctx.get_heap_bases(), BLOCK=16)
            # Not written until this rank completed its writes (NVSHMEM's quiet).
            assert torch.equal(out[:16], torch.zeros(16, dtype=torch.int32)), out
            assert torch.equal(out[16:], torch.full((16,), 7, dtype=torch.int32)), out
        ctx.barrier()


def _node_of_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        return [ctx.node_of(r) for r in range(world_size)], ctx.spans_nodes


@pytest.mark.parametrize("world_size, per_node", [(2, 1), (4, 2), (2, 2)])
def test_the_context_names_each_ranks_node(world_size, per_node):
    expected = ([r // per_node for r in range(world_size)], per_node < world_size)
    assert _pool(world_size, per_node).run(_node_of_body) == [expected] * world_size


def test_a_cross_node_store_lands_when_the_writer_completes_its_writes():
    _pool(2, 1).run(_completion_body)


def _vmem_across_nodes_body(rank, world_size):
    with iris.iris(1 << 20, allocator_type="vmem") as ctx:
        outside = torch.zeros(8, device=ctx.get_device())
        if ctx.get_device().type == "cpu":
            outside.share_memory_()  # what a vmem heap within one node would take in
        if rank == 0:  # the others do not call: nothing is asked of them
            with pytest.raises(RuntimeError, match="allocator_type='vmem'") as caught:
                ctx.as_symmetric(outside)
            assert "\n" not in str(caught.value) and "within one node" in str(caught.value)
        ctx.barrier()


def test_as_symmetric_of_outside_memory_across_nodes_is_refused_in_one_line():
    # allocator_type="vmem" maps outside memory within one node; across nodes it cannot.
    _pool(2, 1).run(_vmem_across_nodes_body)


@triton.jit
def _ping_kernel(data, flag, rounds, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for r in range(rounds):
        if cur_rank == 0:
            values = (r * BLOCK + offs).to(tl.int32)
            iris.store(data + r * BLOCK + offs, values, cur_rank, peer, heap_bases)
            iris.signal(flag, r + 1, cur_rank, peer, heap_bases)
        else:
            iris.wait_until(flag, "ge", r + 1, heap_bases=heap_bases)
            seen = tl.load(data + r * BLOCK + offs, volatile=True)
            tl.device_assert(seen == (r * BLOCK + offs), "a round's data arrived after its signal")


def _message_body(rank, world_size, rounds):
    with iris.iris(1 << 22) as ctx:
        block = 32
        data = ctx.zeros(rounds * block, dtype=torch.int32)
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.barrier()
        if rank < 2:
            _ping_kernel[(1,)](data, flag, rounds, rank, 1 - rank, ctx.get_heap_bases(), BLOCK=block)
        ctx.barrier()
        if rank == 1:
            assert torch.equal(data, torch.arange(rounds * block, dtype=torch.int32))


def test_message_passing_across_nodes_keeps_its_order():
    _pool(2, 1).run(_message_body, 40)


@triton.jit
def _traced_puts(src, dst, flag, cur_rank, world_size, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for peer in range(world_size):
        if peer != cur_rank:
            iris.put(src + offs, dst + cur_rank * BLOCK + offs, cur_rank, peer, heap_bases)
            iris.signal(flag, 1, cur_rank, peer, heap_bases, op="add")
    iris.wait_until(flag, "ge", world_size - 1, heap_bases=heap_bases)


def _traced_body(rank, world_size):
    block = 8
    with iris.iris(1 << 22) as ctx:
        src = ctx.full((block,), rank + 1, dtype=torch.float32)
        dst = ctx.zeros(world_size * block, dtype=torch.float32)
        flag = ctx.zeros(1, dtype=torch.int32)
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.barrier()
        _traced_puts[(1,)](src, dst, flag, rank, world_size, ctx.get_heap_bases(), BLOCK=block)
        ctx.barrier()
        events = ctx.tracing.events()
        for event in events:
            if event["event_id"] in (schema.PUT, schema.SIGNAL):
                far = event["target_rank"] // 2 != rank // 2
                assert event["path"] == (schema.PATH_CROSS_NODE if far else schema.PATH_MAPPED), event
        waits = events[events["event_id"] == schema.WAIT_UNTIL]
        assert len(waits) == 1 and waits[0]["path"] == schema.PATH_MAPPED
        expected = torch.arange(1, world_size + 1, dtype=torch.float32).repeat_interleave(block)
        expected[rank * block : (rank + 1) * block] = 0
        assert torch.equal(dst, expected)
        ctx.barrier()


def test_traces_say_which_path_each_op_took():
    _pool(4, 2).run(_traced_body)


@triton.jit
def _half_atomic_kernel(buf, cur_rank, peer, heap_bases):
    iris.atomic_add(buf, 1.0, cur_rank, peer, heap_bases)


@triton.jit
def _translate_kernel(buf, cur_rank, peer, heap_bases):
    tl.store(iris.translate(buf, cur_rank, peer, heap_bases), 1.0)


def _refusals_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        half = ctx.zeros(2, dtype=torch.float16)
        peer = 1 - rank
        try:
            _half_atomic_kernel[(1,)](half, rank, peer, ctx.get_heap_bases())
            raise AssertionError("a 16-bit atomic crossed nodes")
        except Exception as error:  # noqa: BLE001 - the interpreter wraps the assertion
            assert "16-bit atomics cannot reach another node" in str(error), error
        try:
            _translate_kernel[(1,)](half, rank, peer, ctx.get_heap_bases())
            raise AssertionError("a pointer was translated to another node")
        except Exception as error:  # noqa: BLE001
            assert "on another node, where no pointer reaches" in str(error), error
        ctx.barrier()


def test_what_cannot_cross_nodes_is_refused_with_a_reason():
    _pool(2, 1).run(_refusals_body)


def test_a_hang_across_nodes_names_the_culprits_node():
    from test_hang import _hang_pool, _unsignalled_body

    if SMALL_WORLD is None:
        pytest.skip("IRIS_TEST_WORLD_SIZES has no world size above 1")
    pool, _ = _hang_pool("crossnode", IRIS_RANKS_PER_NODE="1")
    message = pool.run(_unsignalled_body, timeout=120)[0][0]
    assert "Likely culprit: rank 1 (node 1)" in message, message


#: Every example but the four GEMM + all-scatter styles (09-12: example 13 runs their kernel
#: across nodes already, and each takes minutes under the interpreter), copy-engine puts
#: (14: copy engines reach only the GPUs of one node), Gluon (18: GPUs only, which these
#: emulated nodes are not) and as_symmetric (19: it maps outside memory within one node).
CROSS_NODE_EXAMPLES = [
    name for name in EXAMPLES if not name.startswith(("09_", "10_", "11_", "12_", "14_", "18_", "19_"))
]


@pytest.mark.skipif(SMALL_WORLD is None, reason="IRIS_TEST_WORLD_SIZES has no world size above 1")
@pytest.mark.parametrize("name", CROSS_NODE_EXAMPLES)
def test_examples_verify_themselves_across_nodes(name, tmp_path):
    verify_example(name, tmp_path, _pool(SMALL_WORLD, 1))
