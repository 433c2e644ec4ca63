"""``DeviceContext``: the object-style device API, built from one context tensor.

The context tensor (``Iris.get_device_context()``, int64) is laid out as
``iris.device.layout`` describes; ``heap_bases``, the functional API's view of it,
starts at its heap-base slots.

Example:
    >>> @triton.jit
    >>> def kernel(context, buf, rank: tl.constexpr, world_size: tl.constexpr):
    >>>     ctx = DeviceContext.initialize(context, rank, world_size)
    >>>     data = ctx.load(buf + offs, from_rank=(rank + 1) % world_size)
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from . import layout, rma, tile_collectives, tracing
from .aggregate import aggregate
from .tiles import TensorView, Tile, TileView


@constexpr_function
def _heap_bases_type(context_type):
    # A uint64 context tensor is the traced variant (see iris.device.tracing); the
    # heap_bases it yields must then be int64, the type the RMA ops read as "traced".
    traced = context_type.element_ty == tl.uint64
    return tl.pointer_type(tl.int64 if traced else tl.uint64)


@aggregate
class DeviceTracing:
    """``ctx.tracing`` inside a kernel: upstream Iris's device-side event recording.

    The ops record themselves whenever the host has tracing enabled; these two
    calls are for upstream programs that bracket operations by hand, and for spans
    the ops do not cover (:func:`iris.device.tracing.record_event_start`).
    """

    heap_bases: tl.tensor
    pid_m: tl.tensor
    pid_n: tl.tensor

    @constexpr_function
    def __init__(self, heap_bases, pid_m, pid_n):
        self.heap_bases = heap_bases
        self.pid_m = pid_m
        self.pid_n = pid_n

    @triton.jit
    def record_event_start(
        self, event_id: tl.constexpr, target_rank, address, pid_m=None, pid_n=None, mask=None
    ):
        """Open an event; returns the handle for :meth:`record_event_end` (-1: nothing recorded).

        ``pid_m``/``pid_n`` default to the context's tile (:meth:`DeviceContext.with_tile`).

        Example:
            >>> handle = ctx.tracing.record_event_start(iris.TraceEvent().put, peer, ptrs, 0, 0, mask)
            >>> ctx.put(src, ptrs, peer, mask=mask)
            >>> ctx.tracing.record_event_end(handle)
        """
        if pid_m is None:
            pid_m = self.pid_m
        if pid_n is None:
            pid_n = self.pid_n
        return tracing.record_event_start(self.heap_bases, event_id, target_rank, address, pid_m, pid_n, mask)

    @triton.jit
    def record_event_end(self, handle):
        """Close the event ``handle`` (its end time: now).

        Example:
            >>> ctx.tracing.record_event_end(handle)
        """
        tracing.record_event_end(self.heap_bases, handle)


@aggregate
class DeviceContext:
    """This rank's view of the symmetric heaps, with the RMA ops as methods.

    ``pid_m``/``pid_n`` are the tile coordinates recorded with every traced op
    (-1 unless set with :meth:`with_tile`).
    """

    rank: tl.tensor
    world_size: tl.tensor
    #: ``rank`` and ``world_size`` under upstream's names (its Gluon context's fields).
    cur_rank: tl.tensor
    num_ranks: tl.tensor
    heap_bases: tl.tensor
    pid_m: tl.tensor
    pid_n: tl.tensor
    tracing: DeviceTracing

    @constexpr_function
    def __init__(self, rank, world_size, heap_bases, pid_m, pid_n):
        self.rank = rank
        self.world_size = world_size
        self.cur_rank = rank
        self.num_ranks = world_size
        self.heap_bases = heap_bases
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.tracing = DeviceTracing(heap_bases, pid_m, pid_n)

    @staticmethod
    @triton.jit
    def initialize(context_tensor, rank, world_size, tracing: tl.constexpr = False):
        """Build the context from ``Iris.get_device_context()`` inside a kernel.

        ``tracing`` is accepted for upstream Iris's signature and changes nothing:
        here the host's ``ctx.tracing.enable()`` decides, for every op, through the
        context tensor it hands the kernel.

        Example:
            >>> ctx = iris.DeviceContext.initialize(context, rank, world_size)
        """
        heap_bases = layout.heap_bases_of(context_tensor).to(
            _heap_bases_type(context_tensor.dtype), bitcast=True
        )
        no_tile = tl.cast(-1, tl.int32)
        return DeviceContext(
            tl.cast(rank, tl.int32), tl.cast(world_size, tl.int32), heap_bases, no_tile, no_tile
        )

    @triton.jit
    def with_tile(self, pid_m, pid_n):
        """The same context, recording ``(pid_m, pid_n)`` with every traced op."""
        return DeviceContext(
            self.rank, self.world_size, self.heap_bases, tl.cast(pid_m, tl.int32), tl.cast(pid_n, tl.int32)
        )

    @triton.jit
    def trace_begin(self):
        """Open a compute scope; see :func:`iris.trace_begin`."""
        return tracing.trace_begin(self.heap_bases)

    @triton.jit
    def trace_end(self, start, scope: tl.constexpr = 0):
        """Close a compute scope at this context's tile; see :func:`iris.trace_end`."""
        tracing.trace_end(self.heap_bases, start, scope, self.pid_m, self.pid_n)

    @triton.jit
    def load(
        self,
        pointer,
        from_rank,
        mask=None,
        other=None,
        cache_modifier: tl.constexpr = tl.constexpr(""),
        volatile: tl.constexpr = tl.constexpr(False),
        hint: tl.constexpr = None,
    ):
        """Load from ``from_rank``'s copy of ``pointer``; see :func:`iris.load`."""
        return rma.load(
            pointer,
            self.rank,
            from_rank,
            self.heap_bases,
            mask,
            other,
            cache_modifier,
            volatile,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def store(
        self,
        pointer,
        value,
        to_rank,
        mask=None,
        cache_modifier: tl.constexpr = tl.constexpr(""),
        hint: tl.constexpr = None,
    ):
        """Store ``value`` into ``to_rank``'s copy of ``pointer``; see :func:`iris.store`."""
        rma.store(
            pointer,
            value,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            hint,
            cache_modifier,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def get(
        self,
        from_ptr,
        to_ptr,
        from_rank,
        mask=None,
        other=None,
        load_cache_modifier: tl.constexpr = tl.constexpr(""),
        store_cache_modifier: tl.constexpr = tl.constexpr(""),
        hint: tl.constexpr = None,
    ):
        """Copy ``from_rank``'s ``from_ptr`` into this rank's ``to_ptr``; see :func:`iris.get`."""
        rma.get(
            from_ptr,
            to_ptr,
            from_rank,
            self.rank,
            self.heap_bases,
            mask,
            other,
            load_cache_modifier,
            store_cache_modifier,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def put(
        self,
        from_ptr,
        to_ptr,
        to_rank,
        mask=None,
        other=None,
        load_cache_modifier: tl.constexpr = tl.constexpr(""),
        store_cache_modifier: tl.constexpr = tl.constexpr(""),
        hint: tl.constexpr = None,
    ):
        """Copy this rank's ``from_ptr`` into ``to_rank``'s ``to_ptr``; see :func:`iris.put`."""
        rma.put(
            from_ptr,
            to_ptr,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            other,
            load_cache_modifier,
            store_cache_modifier,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def copy(
        self,
        src_ptr,
        dst_ptr,
        from_rank,
        to_rank,
        mask=None,
        other=None,
        load_cache_modifier: tl.constexpr = tl.constexpr(""),
        store_cache_modifier: tl.constexpr = tl.constexpr(""),
        hint: tl.constexpr = None,
    ):
        """Copy ``from_rank``'s ``src_ptr`` into ``to_rank``'s ``dst_ptr``; see :func:`iris.copy`."""
        rma.copy(
            src_ptr,
            dst_ptr,
            from_rank,
            to_rank,
            self.rank,
            self.heap_bases,
            mask,
            other,
            load_cache_modifier,
            store_cache_modifier,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_add(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic add on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_add(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_sub(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic subtract on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_sub(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_xchg(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic exchange on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_xchg(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_xor(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic xor on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_xor(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_and(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic and on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_and(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_or(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic or on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_or(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_min(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic min on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_min(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_max(
        self,
        pointer,
        val,
        to_rank,
        mask=None,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Atomic max on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_max(
            pointer,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            mask,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def atomic_cas(
        self,
        pointer,
        cmp,
        val,
        to_rank,
        sem: tl.constexpr = tl.constexpr("acq_rel"),
        scope: tl.constexpr = tl.constexpr("sys"),
        hint: tl.constexpr = None,
    ):
        """Compare-and-swap on ``to_rank``'s copy of ``pointer``; returns the old value."""
        return rma.atomic_cas(
            pointer,
            cmp,
            val,
            self.rank,
            to_rank,
            self.heap_bases,
            sem,
            scope,
            hint,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
        )

    @triton.jit
    def signal(self, pointer, value, to_rank, op: tl.constexpr = tl.constexpr("set")):
        """Set or add to ``to_rank``'s flag after this program's earlier writes."""
        rma.signal(
            pointer, value, self.rank, to_rank, self.heap_bases, op, pid_m=self.pid_m, pid_n=self.pid_n
        )

    @triton.jit
    def wait_until(
        self,
        pointer,
        cmp: tl.constexpr,
        value,
        from_rank=None,
        op: tl.constexpr = tl.constexpr("iris.wait_until"),
    ):
        """Spin until the flag satisfies ``flag <cmp> value``; returns the flag; see :func:`iris.wait_until`.

        The flag is this rank's, or ``from_rank``'s copy of it (polled remotely).
        """
        return rma.wait_until(
            pointer,
            cmp,
            value,
            heap_bases=self.heap_bases,
            pid_m=self.pid_m,
            pid_n=self.pid_n,
            op=op,
            from_rank=from_rank,
        )

    # ------------------------------------------------------------ tile collectives
    # Upstream Iris's in-kernel collectives; protocol and locks in iris.device.tile_collectives.

    @triton.jit
    def all_reduce_atomic(self, tile: Tile, dst_view: TensorView):
        """Atomically add ``tile.data`` into ``dst_view`` on every rank (``dst_view`` zeroed first).

        Example:
            >>> ctx.all_reduce_atomic(iris.Tile(pid_m, pid_n, BM, BN, acc), out_view)
        """
        tile_collectives.all_reduce_atomic(self, tile, dst_view)

    @triton.jit
    def all_reduce_spinlock(self, tile: Tile, dst_view: TensorView, locks):
        """Add ``tile.data`` into ``dst_view`` on every rank under each rank's tile lock (``locks`` zeroed).

        Example:
            >>> ctx.all_reduce_spinlock(tile, out_view, locks)
        """
        tile_collectives.all_reduce_spinlock(self, tile, dst_view, locks)

    @triton.jit
    def all_reduce_one_shot(self, tile: Tile, src_view: TensorView, dst_view: TensorView, locks):
        """Sum the tile of every rank's ``src_view`` (once its lock is 1) into this rank's ``dst_view``.

        Example:
            >>> ctx.all_reduce_one_shot(tile, partial_view, out_view, locks)
        """
        tile_collectives.all_reduce_one_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_two_shot(self, tile: Tile, src_view: TensorView, dst_view: TensorView, locks):
        """The tile's owner rank (``tile_id % world_size``) sums it and stores it on every rank.

        Example:
            >>> ctx.all_reduce_two_shot(tile, partial_view, out_view, locks)
        """
        tile_collectives.all_reduce_two_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_ring(self, tile: Tile, src_view: TensorView, dst_view: TensorView):
        """Sum every rank's ``src_view`` tile, read in ring order, into this rank's ``dst_view``.

        Every rank's ``src_view`` must be written before the kernel starts (no locks).

        Example:
            >>> ctx.all_reduce_ring(iris.TileView(pid_m, pid_n, BM, BN), inp_view, out_view)
        """
        tile_collectives.all_reduce_ring(self, tile, src_view, dst_view)

    @triton.jit
    def reduce_scatter(self, tile: Tile, src_view: TensorView, dst_view: TensorView, locks):
        """Rank r sums its contiguous share of the tiles into its own ``dst_view``.

        Example:
            >>> ctx.reduce_scatter(tile, partial_view, out_view, locks)
        """
        tile_collectives.reduce_scatter(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_gather(self, tile: Tile, dst_view: TensorView, dim: tl.constexpr):
        """Store ``tile.data`` on every rank at this rank's block of ``dst_view`` along ``dim``.

        Example:
            >>> ctx.all_gather(tile, gathered_view, dim=0)
        """
        tile_collectives.all_gather(self, tile, dst_view, dim)

    @triton.jit
    def gather(self, tile: TileView, src_view: TensorView, source_rank, hint: tl.constexpr = None):
        """The tile of ``src_view`` as ``source_rank`` holds it.

        Example:
            >>> values = ctx.gather(iris.TileView(pid_m, pid_n, BM, BN), view, source_rank=0)
        """
        return tile_collectives.gather(self, tile, src_view, source_rank, hint)

    @triton.jit
    def all_to_all(
        self, tile: TileView, src_view: TensorView, dst_view: TensorView, N_per_rank: tl.constexpr
    ):
        """Fill this rank's output tile with the ``N_per_rank``-column blocks the peers send it.

        Example:
            >>> ctx.all_to_all(iris.TileView(pid_m, pid_n, BM, BN), inp_view, out_view, N_per_rank)
        """
        tile_collectives.all_to_all(self, tile, src_view, dst_view, N_per_rank)


#: Upstream Iris's name for :class:`DeviceContext` (``iris.mem.triton.context.Context``).
Context = DeviceContext
