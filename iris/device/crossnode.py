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

Every function here honours ``mask`` and takes the caller's (symmetric) pointer and the
target rank. Per backend, element by element over a block:

* ``put(ptr, value, rank, heap_bases, mask)``: write, complete at the next :func:`quiet`;
* ``get(ptr, rank, heap_bases, mask, other)``: read, complete on return;
* ``atomic(op, ptr, value, rank, heap_bases, mask)``: read-modify-write at the target,
  returning the old values (``op``: add, xchg, and, or, xor, min, max);
* ``cas(ptr, cmp, value, rank, heap_bases)``: compare-and-swap, returning the old value;
* ``quiet()``: complete every put this rank issued; the release ops of ``rma`` call it
  first, so data written before a ``signal`` is visible after the matching wait, as
  within a node.

``put_run``/``get_run`` move one run of bytes, and the ops of :mod:`iris.device.rma` call
the block forms here, :func:`store_block`, :func:`load_block`, :func:`put_block` and
:func:`get_block`, which pick between the two.

Blocks move as runs wherever the remote side allows. Memory-to-memory ops
(``iris.put``, ``iris.get``, and ``iris.copy`` where one side is the caller) go through
:func:`put_block` and :func:`get_block`, which move a block as one transfer
(``put_run`` / ``get_run``: NVSHMEM's block calls on GPUs) when it is one run of
consecutive elements on both sides: in row-major order of the block, element ``i`` at
``first + i``, and the active lanes (the mask) a prefix of that order, as ``base + offs``
under ``mask=offs < n`` gives. A 2-D block whose every row is such a run (a tile of a
wider matrix, masked by columns) moves as one transfer per row. Any other block goes
element by element. Over a network a transfer per element costs a message each; a run
is one.

Values in registers (``iris.load``, ``iris.store``, and the element-wise ends of the
above) have no memory of their own to move from or into, so a block whose remote side is
runs passes through the **staging area**: a slot of this rank's heap (its reserved
region, ``STAGING_SLOT_BYTES`` per slot, ``STAGING_SLOTS_PER_SM`` per SM), claimed with a
compare-and-swap for the one op and released after it. A store writes the block there
in row-major order and puts it as runs; a load gets the runs into the slot and reads the
block back. Blocks larger than a slot go element by element.

Atomics on 8- and 16-bit types do not cross nodes (NVSHMEM has none; ``rma``
refuses them when they would). Under the emulation backend the same calls run on
the mapped heaps with NVSHMEM's completion rule modelled
(``iris.backends.emulated.RemoteWrites``), so CI covers the routing and ordering.
On GPUs they are NVSHMEM calls (``_crossnode_cuda``, through ``_nvshmem_calls.ll``),
linked into every kernel by ``iris.backends.cuda_nvshmem``.

Example:
    >>> # A constant False in single-node jobs (``and`` short-circuits), so no branch is compiled.
    >>> if crossnode.SCALE_OUT and layout.off_node(heap_bases, cur_rank, peer):
    >>>     crossnode.store_block(buf + offs, values, peer, heap_bases, mask)
"""

import torch
import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from ..config import BACKEND
from ..config import SCALE_OUT as _SCALE_OUT
from . import blocks, layout
from . import intrinsics as hw

#: Whether device ops route by node (the job spans nodes); constant for the process.
SCALE_OUT: tl.constexpr = tl.constexpr(_SCALE_OUT)
if BACKEND == "emulated":
    from ._crossnode_emulated import atomic, cas, get, get_run, put, put_run, quiet
else:
    from ._crossnode_cuda import atomic, cas, get, get_run, put, put_run, quiet

__all__ = [
    "SCALE_OUT",
    "STAGING_SLOTS_PER_SM",
    "STAGING_SLOT_BYTES",
    "atomic",
    "cas",
    "get",
    "get_block",
    "load_block",
    "put",
    "put_block",
    "quiet",
    "row_runs",
    "run_bytes",
    "staging_pieces",
    "store_block",
]


#: Bytes of one staging slot: the largest block of register values that crosses as runs.
STAGING_SLOT_BYTES = 64 << 10
#: Staging slots per SM: one for each of two CTAs resident on an SM at once without waiting.
STAGING_SLOTS_PER_SM = 2
_SLOT_BYTES: tl.constexpr = tl.constexpr(STAGING_SLOT_BYTES)


def staging_pieces(sm_count: int) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """The ``(shape, dtype)`` pieces of the staging area in the heap's reserved region.

    The slots (``count x STAGING_SLOT_BYTES`` bytes), then one int32 claim flag per slot;
    the host reserves them in this order and writes their addresses to the context
    (``layout.STAGING_*``).

    Example:
        >>> staging_pieces(132)
        [((264, 65536), torch.uint8), ((264,), torch.int32)]
    """
    count = STAGING_SLOTS_PER_SM * max(1, sm_count)
    return [((count, STAGING_SLOT_BYTES), torch.uint8), ((count,), torch.int32)]


@triton.jit
def _claim_staging(heap_bases):
    # A free staging slot for this CTA, held until _release_staging: (its index, its address).
    area, flags, count = layout.staging(heap_bases)
    slot = hw.sm_id() % count
    while tl.atomic_cas(flags + slot, 0, 1, sem="acquire", scope="gpu") != 0:
        slot = (slot + 1) % count
    return slot, area + slot.to(tl.int64) * _SLOT_BYTES


@triton.jit
def _release_staging(heap_bases, slot):
    # Every thread is done with the slot (a CTA barrier), then it is free again.
    _, flags, _ = layout.staging(heap_bases)
    tl.debug_barrier()
    tl.atomic_xchg(flags + slot, 0, sem="release", scope="gpu")


@constexpr_function
def _fits_staging(block_type):
    # Decided when the kernel compiles: a larger block never takes the staged branch.
    return blocks.numel(block_type) * blocks.element_bytes(block_type) <= STAGING_SLOT_BYTES


@triton.jit
def _runs_of(ptr, mask):
    # Whether the block ``ptr`` is one run, or (2-D) a run per row, where ``mask`` is
    # active: (is runs, bytes of the one run or 0, its first address, then per row
    # (2-D only; else one unused entry) its bytes and first address).
    nbytes, first, _ = run_bytes(ptr, ptr, mask)
    runs = nbytes > 0
    if blocks.rank_of(ptr.type) == 2:
        row_bytes = tl.zeros([ptr.shape[0]], tl.int64)
        row_first = tl.zeros([ptr.shape[0]], tl.int64)
        if nbytes == 0:  # rows are looked at only where the block is not one run
            runs, row_bytes, row_first, _sources = row_runs(ptr, ptr, mask)
    else:
        row_bytes = tl.zeros([1], tl.int64)
        row_first = tl.zeros([1], tl.int64)
    return runs, nbytes, first, row_bytes, row_first


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
def _move_rows(PUT: tl.constexpr, row_bytes, row_dest, row_source, rank, heap_bases):
    # One run per row of a 2-D block (rows of 0 bytes skipped); per-row vectors as row_runs gives.
    ROWS: tl.constexpr = row_bytes.shape[0]
    row = tl.arange(0, ROWS)
    for r in range(ROWS):
        picked = row == r
        length = tl.sum(tl.where(picked, row_bytes, 0))
        if length > 0:
            at = tl.sum(tl.where(picked, row_dest, 0))
            start = tl.sum(tl.where(picked, row_source, 0))
            _move_run(PUT, at, start, length, rank, heap_bases)


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
                _move_rows(PUT, row_bytes, row_dest, row_source, rank, heap_bases)
                moved = moved + 1
    return moved


@triton.jit
def _move_staged(PUT: tl.constexpr, ptr, slot, nbytes, first, row_bytes, row_first, rank, heap_bases):
    # Between a staging slot (``ptr``'s elements in row-major order from address ``slot``)
    # and ``rank``'s ``ptr``, as the runs _runs_of found: a put from the slot or a get into it.
    if nbytes > 0:
        if PUT:
            put_run(first, slot, nbytes, rank, heap_bases)
        else:
            get_run(slot, first, nbytes, rank, heap_bases)
    else:
        if blocks.rank_of(ptr.type) == 2:
            ROW_BYTES: tl.constexpr = ptr.shape[1] * blocks.element_bytes(ptr.type)
            row_slot = slot + tl.arange(0, ptr.shape[0]).to(tl.int64) * ROW_BYTES
            if PUT:
                _move_rows(True, row_bytes, row_first, row_slot, rank, heap_bases)
            else:
                _move_rows(False, row_bytes, row_slot, row_first, rank, heap_bases)


@triton.jit
def put_block(dest, source, rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = ""):
    """Copy this rank's ``source`` into ``rank``'s ``dest`` (the caller's own address of it).

    One transfer when both are one run (:func:`run_bytes`), one per row when each row of
    a 2-D block is (:func:`row_runs`); else the source is loaded and written as
    :func:`store_block` writes values. Complete at the next :func:`quiet` either way.
    ``cache_modifier`` is that load's.

    Example:
        >>> crossnode.put_block(dst + offs, src + offs, peer, heap_bases, mask=offs < n)
    """
    moved = tl.full([], 0, tl.int32)
    if _may_be_runs(dest.type, source.type):
        moved = _move_by_runs(True, dest, source, rank, heap_bases, mask)
    if moved == 0:
        data = tl.load(source, mask=mask, other=other, cache_modifier=cache_modifier)
        store_block(dest, data, rank, heap_bases, mask)


@triton.jit
def get_block(dest, source, rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = ""):
    """Copy ``rank``'s ``source`` (the caller's own address of it) into this rank's ``dest``.

    One transfer when both are one run (:func:`run_bytes`), one per row when each row of
    a 2-D block is (:func:`row_runs`); else the source is read as :func:`load_block`
    reads it, then stored. Complete on return either way. Masked-off elements of
    ``dest`` are not written. ``cache_modifier`` is that store's.

    Example:
        >>> crossnode.get_block(dst + offs, src + offs, peer, heap_bases, mask=offs < n)
    """
    moved = tl.full([], 0, tl.int32)
    if _may_be_runs(dest.type, source.type):
        moved = _move_by_runs(False, dest, source, rank, heap_bases, mask)
    if moved == 0:
        data = load_block(source, rank, heap_bases, mask, other)
        tl.store(dest, data, mask=mask, cache_modifier=cache_modifier)


@triton.jit
def store_block(ptr, value, rank, heap_bases, mask=None):
    """Write ``value`` into ``rank``'s ``ptr`` (the caller's own address of it).

    Where ``ptr`` is one run, or a run per row, and the block fits a staging slot, the
    values pass through the staging area as block transfers; else one :func:`put` per
    element. Complete at the next :func:`quiet` either way.

    Example:
        >>> crossnode.store_block(dst + offs, values, peer, heap_bases, mask=offs < n)
    """
    staged = tl.full([], 0, tl.int32)
    if _may_be_runs(ptr.type, ptr.type):
        if _fits_staging(ptr.type):
            runs, nbytes, first, row_bytes, row_first = _runs_of(ptr, mask)
            if runs:
                slot, address = _claim_staging(heap_bases)
                ELEMENT: tl.constexpr = ptr.dtype.element_ty
                in_slot = address.to(tl.pointer_type(ELEMENT)) + blocks.row_major_index(ptr)
                tl.store(in_slot, tl.cast(value, ELEMENT), mask=mask)
                _move_staged(True, ptr, address, nbytes, first, row_bytes, row_first, rank, heap_bases)
                _release_staging(heap_bases, slot)
                staged = staged + 1
    if staged == 0:
        put(ptr, value, rank, heap_bases, mask)


@triton.jit
def load_block(ptr, rank, heap_bases, mask=None, other=None):
    """Read ``rank``'s ``ptr`` (the caller's own address of it); masked-off lanes read ``other`` (0).

    Where ``ptr`` is one run, or a run per row, and the block fits a staging slot, the
    data comes through the staging area as block transfers; else one :func:`get` per
    element. Complete on return either way.

    Example:
        >>> values = crossnode.load_block(src + offs, peer, heap_bases, mask=offs < n)
    """
    ELEMENT: tl.constexpr = ptr.dtype.element_ty
    staged = tl.full([], 0, tl.int32)
    values = tl.zeros(ptr.shape, ELEMENT)
    if _may_be_runs(ptr.type, ptr.type):
        if _fits_staging(ptr.type):
            runs, nbytes, first, row_bytes, row_first = _runs_of(ptr, mask)
            if runs:
                slot, address = _claim_staging(heap_bases)
                in_slot = address.to(tl.pointer_type(ELEMENT)) + blocks.row_major_index(ptr)
                _move_staged(False, ptr, address, nbytes, first, row_bytes, row_first, rank, heap_bases)
                if mask is None:
                    values = tl.load(in_slot)
                elif other is None:
                    values = tl.load(in_slot, mask=mask, other=tl.zeros([], ELEMENT))
                else:
                    values = tl.load(in_slot, mask=mask, other=tl.cast(other, ELEMENT))
                _release_staging(heap_bases, slot)
                staged = staged + 1
    if staged == 0:
        values = get(ptr, rank, heap_bases, mask, other)
    return values
