"""The cross-node path: how a device op reaches a rank on another node.

Within a node every peer's heap is mapped into this process, so a remote op is a
plain load, store or atomic through a translated pointer (:mod:`iris.device.rma`).
A rank on another node has no mapped pointer: there the op becomes an NVSHMEM call
(``nvshmem_<type>_p`` / ``_g``, NVSHMEM atomics), which the NVSHMEM runtime carries
over NVLink or the network. The symmetric heap is an NVSHMEM allocation, so the
caller's own address of an object is the address NVSHMEM wants, with the target PE.

Which path an op takes is decided per op, from the context tensor (the ranks per
node, ``layout.off_node``), and only in jobs that span nodes: ``SCALE_OUT`` is fixed
when ``iris`` is imported (``IRIS_RANKS_PER_NODE`` or the launcher's
``LOCAL_WORLD_SIZE`` below the world size), and without it the cross-node branch is
not compiled at all, so single-node kernels are the same instructions as before.

Every function here works element by element over a block, honours ``mask``, and
takes the caller's (symmetric) pointer and the target rank:

* ``put(ptr, value, rank, heap_bases, mask)``: write, complete at the next :func:`quiet`;
* ``get(ptr, rank, heap_bases, mask, other)``: read, complete on return;
* ``atomic(op, ptr, value, rank, heap_bases, mask)``: read-modify-write at the target,
  returning the old values (``op``: add, xchg, and, or, xor, min, max);
* ``cas(ptr, cmp, value, rank, heap_bases)``: compare-and-swap, returning the old value;
* ``quiet()``: complete every put this rank issued; the release ops of ``rma`` call it
  first, so data written before a ``signal`` is visible after the matching wait, as
  within a node.

Memory-to-memory ops (``iris.put``, ``iris.get``, and ``iris.copy`` where one side is
the caller) go through :func:`put_block` and :func:`get_block`, which move a block as
one transfer (``put_run`` / ``get_run``: NVSHMEM's block calls on GPUs) when it is one
run of consecutive elements on both sides: in row-major order of the block, element
``i`` at ``first + i``, and the active lanes (the mask) a prefix of that order, as
``base + offs`` under ``mask=offs < n`` gives. A 2-D block whose every row is such a run
(a tile of a wider matrix, masked by columns) moves as one transfer per row. Any other
block goes element by element. Over a network a transfer per element costs a message
each; a run is one.

Atomics on 8- and 16-bit types do not cross nodes (NVSHMEM has none; ``rma``
refuses them when they would). Under the emulation backend the same calls run on
the mapped heaps with NVSHMEM's completion rule modelled
(``iris.backends.emulated.RemoteWrites``), so CI covers the routing and ordering.
On GPUs they are NVSHMEM calls (``_crossnode_cuda``, through ``_nvshmem_calls.ll``),
linked into every kernel by ``iris.backends.cuda_nvshmem``.

Example:
    >>> # A constant False in single-node jobs (``and`` short-circuits), so no branch is compiled.
    >>> if crossnode.SCALE_OUT and layout.off_node(heap_bases, cur_rank, peer):
    >>>     crossnode.put(buf + offs, values, peer, heap_bases, mask)
"""

import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from ..config import BACKEND
from ..config import SCALE_OUT as _SCALE_OUT
from . import blocks

#: Whether device ops route by node (the job spans nodes); constant for the process.
SCALE_OUT: tl.constexpr = tl.constexpr(_SCALE_OUT)
if BACKEND == "emulated":
    from ._crossnode_emulated import atomic, cas, get, get_run, put, put_run, quiet
else:
    from ._crossnode_cuda import atomic, cas, get, get_run, put, put_run, quiet

__all__ = [
    "SCALE_OUT",
    "atomic",
    "cas",
    "get",
    "get_block",
    "put",
    "put_block",
    "quiet",
    "row_runs",
    "run_bytes",
]


@constexpr_function
def _may_be_runs(dest_type, source_type):
    # Blocks of one shape and element type; anything else goes element by element.
    return (
        blocks.is_block(dest_type)
        and blocks.is_block(source_type)
        and list(dest_type.shape) == list(source_type.shape)
        and dest_type.element_ty == source_type.element_ty
        and len(dest_type.shape) <= 3
    )


@triton.jit
def run_bytes(dest, source, mask=None):
    """``(bytes, first dest address, first source address)`` of the one run both blocks are.

    Both blocks must hold consecutive elements in row-major order (element ``i`` at
    ``first + i``) wherever ``mask`` is active, and the active lanes must be a prefix
    of that order; ``bytes`` is 0 when they are not (or nothing is active).

    Example:
        >>> nbytes, first_dest, first_source = run_bytes(dst + offs, src + offs, offs < n)
    """
    ELEMENT: tl.constexpr = blocks.element_bytes(dest.type)
    index = blocks.row_major_index(dest)
    if mask is None:
        active = index >= 0
    else:
        active = tl.broadcast_to(mask != 0, dest.shape)
    count = tl.sum(active.to(tl.int32))
    dest_addresses = dest.to(tl.int64)
    source_addresses = source.to(tl.int64)
    first_dest = tl.sum(tl.where(index == 0, dest_addresses, 0))
    first_source = tl.sum(tl.where(index == 0, source_addresses, 0))
    step = index.to(tl.int64) * ELEMENT
    in_place = (dest_addresses == first_dest + step) & (source_addresses == first_source + step)
    fits = (active == (index < count)) & tl.where(active, in_place, True)
    whole = tl.min(fits.to(tl.int32)) != 0
    return tl.where(whole, count.to(tl.int64) * ELEMENT, 0), first_dest, first_source


@triton.jit
def row_runs(dest, source, mask=None):
    """``(all rows are runs, bytes, first dest address, first source address)``, per row of a 2-D block.

    Like :func:`run_bytes` for each row on its own: a row's elements consecutive in both
    blocks wherever ``mask`` is active, and its active lanes a prefix of the row (rows
    may differ in length). The last three are vectors of one entry per row.

    Example:
        >>> rows_ok, row_bytes, row_dest, row_source = row_runs(dst + tile, src + tile, cols < n)
    """
    ELEMENT: tl.constexpr = blocks.element_bytes(dest.type)
    column = tl.arange(0, dest.shape[1])[None, :] + tl.zeros(dest.shape, tl.int32)
    if mask is None:
        active = column >= 0
    else:
        active = tl.broadcast_to(mask != 0, dest.shape)
    count = tl.sum(active.to(tl.int32), axis=1)
    dest_addresses = dest.to(tl.int64)
    source_addresses = source.to(tl.int64)
    first_dest = tl.sum(tl.where(column == 0, dest_addresses, 0), axis=1)
    first_source = tl.sum(tl.where(column == 0, source_addresses, 0), axis=1)
    step = column.to(tl.int64) * ELEMENT
    in_place = (dest_addresses == first_dest[:, None] + step) & (
        source_addresses == first_source[:, None] + step
    )
    fits = (active == (column < count[:, None])) & tl.where(active, in_place, True)
    whole = tl.min(tl.min(fits.to(tl.int32), axis=1), axis=0) != 0
    return whole, count.to(tl.int64) * ELEMENT, first_dest, first_source


@triton.jit
def _move_run(PUT: tl.constexpr, dest, source, nbytes, rank, heap_bases):
    if PUT:
        put_run(dest, source, nbytes, rank, heap_bases)
    else:
        get_run(dest, source, nbytes, rank, heap_bases)


@triton.jit
def _move_by_runs(PUT: tl.constexpr, dest, source, rank, heap_bases, mask):
    # Moves the block as one run, or a 2-D block as one run per row; returns 1 if it did.
    moved = tl.full([], 0, tl.int32)
    nbytes, first_dest, first_source = run_bytes(dest, source, mask)
    if nbytes > 0:
        _move_run(PUT, first_dest, first_source, nbytes, rank, heap_bases)
        moved = moved + 1
    else:
        if blocks.rank_of(dest.type) == 2:
            rows_ok, row_bytes, row_dest, row_source = row_runs(dest, source, mask)
            if rows_ok:
                ROWS: tl.constexpr = dest.shape[0]
                row = tl.arange(0, ROWS)
                for r in range(ROWS):
                    picked = row == r
                    length = tl.sum(tl.where(picked, row_bytes, 0))
                    if length > 0:
                        at = tl.sum(tl.where(picked, row_dest, 0))
                        start = tl.sum(tl.where(picked, row_source, 0))
                        _move_run(PUT, at, start, length, rank, heap_bases)
                moved = moved + 1
    return moved


@triton.jit
def put_block(dest, source, rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = ""):
    """Copy this rank's ``source`` into ``rank``'s ``dest`` (the caller's own address of it).

    One transfer when both are one run (:func:`run_bytes`), one per row when each row of
    a 2-D block is (:func:`row_runs`), else a load and :func:`put` per element; complete
    at the next :func:`quiet` either way. ``cache_modifier`` is the element-wise load's.

    Example:
        >>> crossnode.put_block(dst + offs, src + offs, peer, heap_bases, mask=offs < n)
    """
    moved = tl.full([], 0, tl.int32)
    if _may_be_runs(dest.type, source.type):
        moved = _move_by_runs(True, dest, source, rank, heap_bases, mask)
    if moved == 0:
        data = tl.load(source, mask=mask, other=other, cache_modifier=cache_modifier)
        put(dest, data, rank, heap_bases, mask)


@triton.jit
def get_block(dest, source, rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = ""):
    """Copy ``rank``'s ``source`` (the caller's own address of it) into this rank's ``dest``.

    One transfer when both are one run (:func:`run_bytes`), one per row when each row of
    a 2-D block is (:func:`row_runs`), else :func:`get` and a store per element; complete
    on return either way. Masked-off elements of ``dest`` are not written.
    ``cache_modifier`` is the element-wise store's.

    Example:
        >>> crossnode.get_block(dst + offs, src + offs, peer, heap_bases, mask=offs < n)
    """
    moved = tl.full([], 0, tl.int32)
    if _may_be_runs(dest.type, source.type):
        moved = _move_by_runs(False, dest, source, rank, heap_bases, mask)
    if moved == 0:
        data = get(source, rank, heap_bases, mask, other)
        tl.store(dest, data, mask=mask, cache_modifier=cache_modifier)
