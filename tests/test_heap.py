"""The symmetric heap and the tensor factories: placement, alignment, values, limits."""

import pytest
import torch

import iris
from iris.heap import ALIGNMENT


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
        context = ctx.get_device_context().cpu().tolist()
        assert context[:2] == [rank, world_size]
        assert [b & (2**64 - 1) for b in context[2 : 2 + world_size]] == bases
        # The heap-size slot bounds IRIS_DEBUG's checks: the user's bytes plus Iris's reserved state.
        assert context[2 + world_size] == ctx.heap.mapped_size >= (1 << 20) + ctx.heap.reserved
        return offsets


def test_allocations_land_at_the_same_offset_on_every_rank(world):
    offsets = world.run(_symmetry_body)
    assert all(o == offsets[0] for o in offsets)


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
