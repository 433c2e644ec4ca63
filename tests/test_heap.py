"""The symmetric heap and the tensor factories: placement, alignment, values, limits."""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.device import flight, layout
from iris.host.memory.heap import ALIGNMENT
from iris_trace import schema


def _symmetry_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        a = ctx.zeros(3, dtype=torch.int8)
        b = ctx.ones(10, 10, dtype=torch.float16)
        c = ctx.empty(0, dtype=torch.float32)
        d = ctx.full((5,), 2.5)
        offsets = [ctx.heap.offset_of(t) for t in (a, b, c, d)]
        assert all(offset % ALIGNMENT == 0 for offset in offsets)
        assert offsets == sorted(offsets) and len(set(offsets[:2] + offsets[3:])) == 3
        bases = ctx.get_heap_bases().tolist()
        assert len(bases) == world_size and bases[rank] == ctx.heap.base
        return offsets


def test_allocations_land_at_the_same_offset_on_every_rank(world):
    offsets = world.run(_symmetry_body)
    assert all(o == offsets[0] for o in offsets)


@triton.jit
def layout_kernel(out, heap_bases):
    rank = layout.cur_rank(heap_bases)
    tl.store(out + 0, rank)
    tl.store(out + 1, layout.world_size(heap_bases))
    tl.store(out + 2, layout.heap_base(heap_bases, rank))
    tl.store(out + 3, layout.heap_size(heap_bases))
    enabled = tl.load(layout.tracing_slots(heap_bases) + schema.SLOT_ENABLED)
    tl.store(out + 4, enabled.to(tl.int64, bitcast=True))
    timeout = tl.load(layout.flight_slots(heap_bases) + flight.SLOT_TIMEOUT_NS)
    tl.store(out + 5, timeout.to(tl.int64, bitcast=True))


def _layout_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        context = ctx.get_device_context().cpu().tolist()
        assert len(context) == layout.context_length(world_size)
        assert [context[layout.RANK_SLOT], context[layout.WORLD_SIZE_SLOT]] == [rank, world_size]
        bases = [b & (2**64 - 1) for b in context[layout.heap_bases_slots(world_size)]]
        assert bases == ctx.get_heap_bases().tolist() and bases[rank] == ctx.heap.base
        ctx.tracing.enable(max_events=64 * ctx.get_cu_count())
        ctx.hang.set_timeout(7.5)
        context = ctx.get_device_context().cpu().tolist()
        assert context[layout.tracing_slot(world_size, schema.SLOT_ENABLED)] == 1
        timeout_ns = context[layout.flight_slot(world_size, flight.SLOT_TIMEOUT_NS)]
        assert timeout_ns == 7_500_000_000
        # The kernels' accessors read the same slots, from heap_bases (traced and untraced).
        # The heap-size slot bounds IRIS_DEBUG's checks: the user's bytes in the user's context,
        # the whole mapping (Iris's reserved state too) in the copy Iris's own kernels take.
        views = {
            ctx.heap.size: (ctx.get_heap_bases(), ctx.heap_bases),
            ctx.heap.mapped_size: (ctx._heap_bases_for_iris(), ctx._iris_heap_bases),
        }
        for heap_size, heap_bases_views in views.items():
            for heap_bases in heap_bases_views:
                out = ctx.full((6,), -1, dtype=torch.int64)
                layout_kernel[(1,)](out, heap_bases)
                assert out.tolist() == [rank, world_size, ctx.heap.base, heap_size, 1, timeout_ns]
        assert ctx.heap.size == 1 << 20 and ctx.heap.mapped_size >= (1 << 20) + ctx.heap.reserved
        ctx.tracing.disable()


def test_context_layout_is_what_kernels_read(world):
    world.run(_layout_body)


def _factories_body(rank, world_size):
    with iris.iris(1 << 22) as ctx:
        device = ctx.get_device()
        checks = {
            "zeros": (ctx.zeros(2, 3), torch.zeros(2, 3)),
            "zeros_tuple": (ctx.zeros((2, 3), dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32)),
            "ones": (ctx.ones([4], dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)),
            "full_int": (ctx.full((3,), 7), torch.full((3,), 7)),
            "full_float": (ctx.full((3,), 1.5), torch.full((3,), 1.5)),
            "full_bool": (ctx.full((2,), True), torch.full((2,), True)),
            "arange": (ctx.arange(0, 10, 3), torch.arange(0, 10, 3)),
            "arange_end": (ctx.arange(5), torch.arange(5)),
            "arange_float": (ctx.arange(0.0, 1.0, 0.25), torch.arange(0.0, 1.0, 0.25)),
            "linspace": (ctx.linspace(0, 1, 5), torch.linspace(0, 1, 5)),
            "randn": (
                ctx.randn(8, generator=torch.Generator().manual_seed(3)),
                torch.randn(8, generator=torch.Generator().manual_seed(3)),
            ),
            "rand": (
                ctx.rand(2, 4, generator=torch.Generator().manual_seed(4)),
                torch.rand(2, 4, generator=torch.Generator().manual_seed(4)),
            ),
            "randint": (
                ctx.randint(3, 9, (50,), generator=torch.Generator().manual_seed(5)),
                torch.randint(3, 9, (50,), generator=torch.Generator().manual_seed(5)),
            ),
            "randint_high": (
                ctx.randint(9, (5,), generator=torch.Generator().manual_seed(6)),
                torch.randint(9, (5,), generator=torch.Generator().manual_seed(6)),
            ),
        }
        for name, (got, expected) in checks.items():
            assert ctx.is_symmetric(got), name
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            assert torch.equal(got.cpu(), expected), name
        base = ctx.randn(3, 4, dtype=torch.float16)
        for name, made, value in [
            ("zeros_like", ctx.zeros_like(base), 0),
            ("ones_like", ctx.ones_like(base), 1),
            ("full_like", ctx.full_like(base, 3), 3),
        ]:
            assert made.shape == base.shape and made.dtype == base.dtype and (made == value).all(), name
        assert ctx.empty_like(base, dtype=torch.int64).dtype == torch.int64
        uniform = ctx.uniform((1000,), low=-2.0, high=-1.0)
        assert ((uniform >= -2.0) & (uniform < -1.0)).all() and uniform.dtype == torch.float32
        grad = ctx.zeros(3, requires_grad=True)
        assert grad.requires_grad
        out = ctx.empty(4)
        assert ctx.zeros(4, out=out) is out and (out == 0).all()
        assert ctx.zeros(2, device="cuda").device == device  # Iris code says device="cuda"
        assert not ctx.is_symmetric(torch.zeros(3, device=device))
        # Upstream's allocator asks the same question as owns_tensor.
        assert ctx.heap.allocator.owns_tensor(out) and not ctx.heap.allocator.owns_tensor(torch.zeros(3))


def test_factories_match_torch(world):
    world.run(_factories_body)


def _exhaust_body(rank, world_size):
    heap_size = 1 << 16
    with iris.iris(heap_size) as ctx:
        # Iris's own state (barrier arrivals, collective flags for every SM) is reserved past
        # heap_size, so even a heap smaller than that state is entirely the user's.
        assert ctx.heap.used == 0 and ctx.heap.free == heap_size and ctx.heap.reserved > 0
        first = ctx.zeros(1000, dtype=torch.int8)
        used_before = ctx.heap.used
        ctx.zeros(ctx.heap.free - (ALIGNMENT - ctx.heap.used % ALIGNMENT) % ALIGNMENT, dtype=torch.int8)
        assert ctx.heap.free == 0 and used_before < ctx.heap.used == heap_size
        with pytest.raises(MemoryError) as info:
            ctx.zeros(1, dtype=torch.float32)
        message = str(info.value)
        assert "4 bytes" in message and f"0 of {heap_size} bytes free" in message
        assert first.shape == (1000,)


def test_heap_reports_requested_free_and_total_when_full(world):
    world.run(_exhaust_body)


def _rewind_body(rank, world_size):
    with iris.iris(1 << 20) as ctx:
        allocator = ctx.heap.allocator  # upstream's path
        mark = allocator.heap_offset
        first = ctx.zeros(256)
        assert allocator.heap_offset > mark
        allocator.heap_offset = mark
        again = ctx.zeros(256)
        assert again.data_ptr() == first.data_ptr() and ctx.heap.used == allocator.heap_offset
        for bad in (-1, (1 << 20) + 1, 1.5, True, "0"):
            with pytest.raises(ValueError, match="heap_offset must be an int"):
                allocator.heap_offset = bad


def test_upstreams_heap_offset_rewinds_the_allocator(world):
    world.run(_rewind_body)


def _close_body(rank, world_size):
    for _ in range(3):
        ctx = iris.iris(1 << 20)
        ctx.zeros(10)
        ctx.close()
        ctx.close()  # closing twice is harmless
        with pytest.raises(RuntimeError, match="closed"):
            ctx.zeros(10)


def test_repeated_init_and_close(world):
    world.run(_close_body)
