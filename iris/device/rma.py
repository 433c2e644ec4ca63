"""Remote memory access from Triton kernels: Iris's functional device API.

Every op takes a pointer into the *calling* rank's symmetric heap and the rank
whose heap it should touch. Because all ranks allocate identically, the remote
address is ``ptr - heap_bases[local] + heap_bases[remote]``; ``heap_bases`` holds
each rank's heap as mapped in this process (``Iris.get_heap_bases()``).

Argument order follows Iris: ``load(ptr, to_rank, from_rank, ...)`` reads
``from_rank``'s memory into ``to_rank`` (the caller); ``store(ptr, value,
from_rank, to_rank, ...)`` writes from ``from_rank`` (the caller) into ``to_rank``.

Ranks on other nodes (jobs that span nodes, ``docs/scale_out.md``) have no mapped
heap: each op decides per call, from the context tensor, whether its target is on
this node, and takes the cross-node path (:mod:`iris.device.crossnode`) when not.
Single-node jobs compile without that branch: ``crossnode.SCALE_OUT and ...`` is
the constant ``False`` there, so the test and the cross-node path are left out.

Memory model (see docs/memory_model.md): plain loads and stores are weak;
atomics default to ``sem="acq_rel"``, ``scope="sys"`` so they are coherent and
ordered across GPUs; ``signal`` is a release at system scope issued after a
CTA barrier, and ``wait_until`` an acquire followed by a CTA barrier, so data
written before a signal is visible after the matching wait.
"""

import triton
import triton.language as tl

from ..config import DEBUG as _DEBUG
from . import atomic_ops, blocks, crossnode, flight, layout, tracing
from . import intrinsics as hw

DEBUG: tl.constexpr = tl.constexpr(_DEBUG)
#: Heap bases are at least this aligned, so translation keeps vector widths.
HEAP_BASE_ALIGNMENT: tl.constexpr = tl.constexpr(4096)


@triton.jit
def _check_rank(rank, heap_bases, op: tl.constexpr):
    world_size = layout.world_size(heap_bases)
    rank64 = tl.cast(rank, tl.int64)
    hw.device_check((rank64 >= 0) & (rank64 < world_size), op + ": rank out of range")


@triton.jit
def _check_in_heap(ptr, local_rank, heap_bases, mask, op: tl.constexpr):
    offset = ptr.to(tl.int64) - layout.heap_base(heap_bases, local_rank)
    inside = (offset >= 0) & (offset < layout.heap_size(heap_bases))
    if mask is not None:
        inside = inside | (mask == 0)
    hw.device_check(inside, op + ": pointer is outside the symmetric heap")


@triton.jit
def _complete_for_release(sem: tl.constexpr):
    # A release orders every earlier write, cross-node puts included: complete them first.
    if crossnode.SCALE_OUT:
        if (sem == "release") or (sem == "acq_rel"):
            crossnode.quiet()


@triton.jit
def _crossing_atomic(pointer, op: tl.constexpr):
    tl.static_assert(
        pointer.dtype.element_ty.primitive_bitwidth >= 32,
        op + ": 8- and 16-bit atomics cannot reach another node (NVSHMEM has none)",
    )


@triton.jit
def translate(
    ptr,
    local_rank,
    remote_rank,
    heap_bases,
    mask=None,
    op: tl.constexpr = tl.constexpr("iris.translate"),
    hint: tl.constexpr = None,
):
    """Map ``ptr`` (in ``local_rank``'s heap) to the same object in ``remote_rank``'s heap.

    The result keeps the alignment and contiguity Triton knows of ``ptr``, so 16-byte
    vector accesses stay 16-byte after translation. ``hint`` (an int, or a tuple for
    N-D blocks) states more: the translated pointer is a multiple of it and runs
    contiguously for that many elements (``tl.multiple_of`` / ``tl.max_contiguous``).

    Example:
        >>> remote = iris.translate(buf + offs, rank, peer, heap_bases)
        >>> tl.store(remote, values)
    """
    if DEBUG:
        _check_rank(local_rank, heap_bases, op)
        _check_rank(remote_rank, heap_bases, op)
        _check_in_heap(ptr, local_rank, heap_bases, mask, op)
    if crossnode.SCALE_OUT:
        hw.device_check(
            layout.different_nodes(heap_bases, local_rank, remote_rank) == 0,
            op + ": the rank is on another node, where no pointer reaches (use iris.load/store/get/put)",
        )
    local_base = layout.heap_base(heap_bases, local_rank)
    remote_base = layout.heap_base(heap_bases, remote_rank)
    # The distance is counted in elements and added to the typed pointer: Triton's
    # alignment analysis then carries the pointer's divisibility and contiguity through
    # (both bases are page aligned). Byte arithmetic through an int8 pointer and back
    # loses them on Triton 3.9, which turns 16-byte accesses into 4-byte ones.
    BITS: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth
    # log2 of the element's bytes (1 to 16); the distance is a whole number of elements,
    # so an arithmetic shift divides it exactly, for one instruction.
    SHIFT: tl.constexpr = (BITS > 8) + (BITS > 16) + (BITS > 32) + (BITS > 64)
    distance = tl.multiple_of((remote_base - local_base) >> SHIFT, HEAP_BASE_ALIGNMENT >> SHIFT)
    remote = ptr + distance
    if hint is not None:
        remote = tl.max_contiguous(tl.multiple_of(remote, hint), hint)
    return remote


@triton.jit
def path_between(heap_bases, from_rank, to_rank):
    """How an op from ``from_rank`` reaches ``to_rank``, as trace records name it.

    ``tracing.PATH_CROSS_NODE`` where the op takes the cross-node path, else
    ``tracing.PATH_MAPPED`` (for :func:`iris.device.tracing.record_block`).

    Example:
        >>> tracing.record_block(heap_bases, start, tracing.STORE, peer, ptr, nbytes,
        ...                      path=rma.path_between(heap_bases, rank, peer))
    """
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, from_rank, to_rank):
        path = tracing.PATH_CROSS_NODE
    return path


@triton.jit
def load(
    pointer,
    to_rank,
    from_rank,
    heap_bases,
    mask=None,
    other=None,
    cache_modifier: tl.constexpr = tl.constexpr(""),
    volatile: tl.constexpr = tl.constexpr(False),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Load from ``from_rank``'s heap at the address ``pointer`` has in ``to_rank`` (the caller).

    ``cache_modifier`` and ``volatile`` go to ``tl.load`` (with ``volatile``, ``.ca`` and ``.cg``
    are dropped: PTX has no such load); ``hint`` to :func:`translate`.

    Example:
        >>> data = iris.load(buf + offs, cur_rank, peer, heap_bases, mask=offs < n)
    """
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, to_rank, from_rank):
        path = tracing.PATH_CROSS_NODE
        result = crossnode.load_block(pointer, from_rank, heap_bases, mask, other)
    else:
        remote = translate(pointer, to_rank, from_rank, heap_bases, mask, "iris.load", hint)
        if volatile and (cache_modifier == ".ca" or cache_modifier == ".cg"):
            # PTX has no volatile load with a cache operator (ptxas refuses ld.volatile.ca):
            # a volatile load already reads past L1, which is what .cg asks and more than .ca.
            result = tl.load(remote, mask=mask, other=other, volatile=True)
        else:
            result = tl.load(remote, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)
    tracing.end(heap_bases, start, tracing.LOAD, from_rank, pointer, mask, 0, pid_m, pid_n, path=path)
    return result


@triton.jit
def store(
    pointer,
    value,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    hint: tl.constexpr = None,
    cache_modifier: tl.constexpr = tl.constexpr(""),
    pid_m=-1,
    pid_n=-1,
):
    """Store ``value`` into ``to_rank``'s heap at the address ``pointer`` has in ``from_rank`` (the caller).

    ``cache_modifier`` goes to ``tl.store``; ``hint`` to :func:`translate`.

    Example:
        >>> iris.store(buf + offs, values, cur_rank, peer, heap_bases, mask=offs < n)
    """
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, from_rank, to_rank):
        path = tracing.PATH_CROSS_NODE
        crossnode.store_block(pointer, value, to_rank, heap_bases, mask)
    else:
        remote = translate(pointer, from_rank, to_rank, heap_bases, mask, "iris.store", hint)
        tl.store(remote, value, mask=mask, cache_modifier=cache_modifier)
    tracing.end(heap_bases, start, tracing.STORE, to_rank, pointer, mask, 0, pid_m, pid_n, path=path)


@triton.jit
def get(
    from_ptr,
    to_ptr,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    other=None,
    load_cache_modifier: tl.constexpr = tl.constexpr(""),
    store_cache_modifier: tl.constexpr = tl.constexpr(""),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Copy a peer's ``from_ptr`` into the caller's ``to_ptr``; the peer is whichever rank is not the caller.

    This package's order is ``get(from_ptr, to_ptr, peer, cur_rank, ...)``: read from
    ``from_rank``, the pointers in the caller's (``to_rank``) heap. Upstream Iris's
    code reads the other way round, ``get(from_ptr, to_ptr, cur_rank, peer, ...)``
    (its docstring says the first), and its programs are written that way. Both
    orders work: when ``from_rank`` is the caller, the data comes from ``to_rank``.
    With neither rank the caller, ``from_ptr`` is taken in ``to_rank``'s heap and
    read from ``from_rank``'s.

    Masked-off elements read ``other``. The cache modifiers go to the remote load and
    the local store; ``hint`` to :func:`translate`.

    Example:
        >>> iris.get(src + offs, dst + offs, peer, cur_rank, heap_bases, mask=offs < n)
        >>> iris.get(src + offs, dst + offs, cur_rank, peer, heap_bases, mask=offs < n)  # same
    """
    start = tracing.begin(heap_bases)
    caller = layout.cur_rank(heap_bases)
    upstream_order = from_rank == caller
    source = tl.where(upstream_order, to_rank, from_rank)
    space = tl.where(upstream_order, from_rank, to_rank)
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, caller, source):
        path = tracing.PATH_CROSS_NODE
        # The cross-node path names the object by the caller's own address of it.
        own = translate(from_ptr, space, caller, heap_bases, mask, "iris.get", hint)
        crossnode.get_block(to_ptr, own, source, heap_bases, mask, other, store_cache_modifier)
    else:
        remote = translate(from_ptr, space, source, heap_bases, mask, "iris.get", hint)
        data = tl.load(remote, mask=mask, other=other, cache_modifier=load_cache_modifier)
        tl.store(to_ptr, data, mask=mask, cache_modifier=store_cache_modifier)
    tracing.end(heap_bases, start, tracing.GET, source, from_ptr, mask, 0, pid_m, pid_n, path=path)


@triton.jit
def put(
    from_ptr,
    to_ptr,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    other=None,
    load_cache_modifier: tl.constexpr = tl.constexpr(""),
    store_cache_modifier: tl.constexpr = tl.constexpr(""),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Copy the caller's (``from_rank``) ``from_ptr`` into ``to_rank``'s heap at ``to_ptr``.

    The cache modifiers go to the local load and the remote store; ``hint`` to
    :func:`translate`.

    Example:
        >>> iris.put(src + offs, dst + offs, cur_rank, peer, heap_bases, mask=offs < n)
    """
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, from_rank, to_rank):
        path = tracing.PATH_CROSS_NODE
        crossnode.put_block(to_ptr, from_ptr, to_rank, heap_bases, mask, other, load_cache_modifier)
    else:
        remote = translate(to_ptr, from_rank, to_rank, heap_bases, mask, "iris.put", hint)
        data = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
        tl.store(remote, data, mask=mask, cache_modifier=store_cache_modifier)
    tracing.end(heap_bases, start, tracing.PUT, to_rank, to_ptr, mask, 0, pid_m, pid_n, path=path)


@triton.jit
def _copy_by_element(
    src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask, other, far_source, far_target,
    load_cache_modifier: tl.constexpr, store_cache_modifier: tl.constexpr, hint: tl.constexpr,
):  # fmt: skip
    # ``far_*``: whether that end is on another node (only ever true in jobs that span nodes).
    if far_source:
        data = crossnode.load_block(src_ptr, from_rank, heap_bases, mask, other)
    else:
        source = translate(src_ptr, cur_rank, from_rank, heap_bases, mask, "iris.copy", hint)
        data = tl.load(source, mask=mask, other=other, cache_modifier=load_cache_modifier)
    if far_target:
        crossnode.store_block(dst_ptr, data, to_rank, heap_bases, mask)
    else:
        target = translate(dst_ptr, cur_rank, to_rank, heap_bases, mask, "iris.copy", hint)
        tl.store(target, data, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def copy(
    src_ptr,
    dst_ptr,
    from_rank,
    to_rank,
    cur_rank,
    heap_bases,
    mask=None,
    other=None,
    load_cache_modifier: tl.constexpr = tl.constexpr(""),
    store_cache_modifier: tl.constexpr = tl.constexpr(""),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Copy ``from_rank``'s ``src_ptr`` to ``to_rank``'s ``dst_ptr``; both pointers are ``cur_rank``'s.

    Example:
        >>> iris.copy(src + offs, dst + offs, peer_a, peer_b, cur_rank, heap_bases)
    """
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT:
        far_source = layout.off_node(heap_bases, cur_rank, from_rank)
        far_target = layout.off_node(heap_bases, cur_rank, to_rank)
        if far_source | far_target:
            path = tracing.PATH_CROSS_NODE
        if far_source & (to_rank == cur_rank):
            # Memory to memory with the caller at one end: one transfer where the block is a run.
            crossnode.get_block(dst_ptr, src_ptr, from_rank, heap_bases, mask, other, store_cache_modifier)
        elif far_target & (from_rank == cur_rank):
            crossnode.put_block(dst_ptr, src_ptr, to_rank, heap_bases, mask, other, load_cache_modifier)
        else:
            _copy_by_element(
                src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask, other,
                far_source, far_target, load_cache_modifier, store_cache_modifier, hint,
            )  # fmt: skip
    else:
        _copy_by_element(
            src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask, other, False, False,
            load_cache_modifier, store_cache_modifier, hint,
        )  # fmt: skip
    tracing.end(heap_bases, start, tracing.COPY, to_rank, dst_ptr, mask, 0, pid_m, pid_n, path=path)


@triton.jit
def _recorded(
    heap_bases,
    start,
    event: tl.constexpr,
    sub: tl.constexpr,
    to_rank,
    pointer,
    mask,
    traced,
    value,
    compare,
    pid_m,
    pid_n,
    path,
):
    # The one instrumentation hook of an op that synchronises (atomics, signal): its
    # trace record, which keeps ``traced`` and ``sub`` (a signal's set or add), then its
    # flight-recorder entry, which keeps ``value`` and ``compare`` so a hang report can
    # say what was sent.
    tracing.end(heap_bases, start, event, to_rank, pointer, mask, traced, pid_m, pid_n, path=path, sub=sub)
    flight.record(heap_bases, event, sub, to_rank, pointer, value, compare, start, mask)


@triton.jit
def _atomic_rmw(
    op: tl.constexpr,
    event: tl.constexpr,
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask,
    sem: tl.constexpr,
    scope: tl.constexpr,
    hint: tl.constexpr,
    pid_m,
    pid_n,
):
    # The one body behind every atomic_<op>: translate, apply ``op`` remotely, trace.
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    _complete_for_release(sem)
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, from_rank, to_rank):
        path = tracing.PATH_CROSS_NODE
        _crossing_atomic(pointer, "iris.atomic_" + op)
        if op == "sub":
            old = crossnode.atomic("add", pointer, -val, to_rank, heap_bases, mask)
        else:
            old = crossnode.atomic(op, pointer, val, to_rank, heap_bases, mask)
    else:
        remote = translate(pointer, from_rank, to_rank, heap_bases, mask, "iris.atomic_" + op, hint)
        old = atomic_ops.apply(op, remote, val, mask, sem, scope)
    _recorded(heap_bases, start, event, 0, to_rank, pointer, mask, 0, val, 0, pid_m, pid_n, path)
    return old


@triton.jit
def atomic_add(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomically add ``val`` at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_add(counter, 1, cur_rank, peer, heap_bases)
    """
    return _atomic_rmw(
        "add",
        tracing.ATOMIC_ADD,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_sub(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomically subtract ``val`` at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_sub(counter, 1, cur_rank, peer, heap_bases)
    """
    return _atomic_rmw(
        "sub",
        tracing.ATOMIC_SUB,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_xchg(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomically swap in ``val`` at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_xchg(slot, 7, cur_rank, peer, heap_bases)
    """
    return _atomic_rmw(
        "xchg",
        tracing.ATOMIC_XCHG,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_xor(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomic bitwise xor at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_xor(bits, 0b1010, cur_rank, peer, heap_bases)
    """
    return _atomic_rmw(
        "xor",
        tracing.ATOMIC_XOR,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_and(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomic bitwise and at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_and(bits, 0xF0, cur_rank, peer, heap_bases)
    """
    return _atomic_rmw(
        "and",
        tracing.ATOMIC_AND,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_or(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomic bitwise or at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_or(bits, 1 << cur_rank, cur_rank, peer, heap_bases)
    """
    return _atomic_rmw(
        "or",
        tracing.ATOMIC_OR,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_min(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomic minimum at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_min(best, candidate, cur_rank, 0, heap_bases)
    """
    return _atomic_rmw(
        "min",
        tracing.ATOMIC_MIN,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_max(
    pointer,
    val,
    from_rank,
    to_rank,
    heap_bases,
    mask=None,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Atomic maximum at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_max(best, candidate, cur_rank, 0, heap_bases)
    """
    return _atomic_rmw(
        "max",
        tracing.ATOMIC_MAX,
        pointer,
        val,
        from_rank,
        to_rank,
        heap_bases,
        mask,
        sem,
        scope,
        hint,
        pid_m,
        pid_n,
    )


@triton.jit
def atomic_cas(
    pointer,
    cmp,
    val,
    from_rank,
    to_rank,
    heap_bases,
    sem: tl.constexpr = tl.constexpr("acq_rel"),
    scope: tl.constexpr = tl.constexpr("sys"),
    hint: tl.constexpr = None,
    pid_m=-1,
    pid_n=-1,
):
    """Compare-and-swap at ``to_rank``'s copy of ``pointer``; returns the old value.

    Example:
        >>> old = iris.atomic_cas(lock, 0, 1, cur_rank, peer, heap_bases)
    """
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    _complete_for_release(sem)
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, from_rank, to_rank):
        path = tracing.PATH_CROSS_NODE
        _crossing_atomic(pointer, "iris.atomic_cas")
        old = crossnode.cas(pointer, cmp, val, to_rank, heap_bases)
    else:
        remote = translate(pointer, from_rank, to_rank, heap_bases, None, "iris.atomic_cas", hint)
        old = tl.atomic_cas(remote, cmp, val, sem=sem, scope=scope)
    _recorded(
        heap_bases, start, tracing.ATOMIC_CAS, 0, to_rank, pointer, None, val, val, cmp, pid_m, pid_n, path
    )
    return old


@triton.jit
def fence():
    """Order this thread's earlier writes, to every rank, before its later ones (system scope).

    In jobs that span nodes it also completes this rank's cross-node puts. Use it before
    several ``signal(..., sem="relaxed")`` calls, so the signals share one fence.

    Example:
        >>> iris.fence()
        >>> for peer in range(world_size):
        >>>     iris.signal(flags + cur_rank, 1, cur_rank, peer, heap_bases, sem="relaxed")
    """
    hw.fence_system()
    if crossnode.SCALE_OUT:
        crossnode.quiet()


@triton.jit
def signal(
    pointer,
    value,
    from_rank,
    to_rank,
    heap_bases,
    op: tl.constexpr = tl.constexpr("set"),
    scope: tl.constexpr = tl.constexpr("sys"),
    pid_m=-1,
    pid_n=-1,
    sem: tl.constexpr = tl.constexpr("release"),
):
    """Set (``op="set"``) or add to (``op="add"``) a flag on ``to_rank``, after this program's writes.

    Everything this program stored before the call (to any rank) is visible to a
    thread that observes the new flag value with :func:`wait_until`. A program that
    signals several flags at once may fence once itself (:func:`fence`) and pass
    ``sem="relaxed"``: the signals then do not wait for one another's round trips.

    Example:
        >>> iris.put(src + offs, dst + offs, cur_rank, peer, heap_bases)
        >>> iris.signal(flag, 1, cur_rank, peer, heap_bases)
    """
    tl.static_assert(op == "set" or op == "add", "signal op must be 'set' or 'add'")
    start = tracing.begin(heap_bases)
    path = tracing.PATH_MAPPED
    if crossnode.SCALE_OUT and layout.off_node(heap_bases, from_rank, to_rank):
        path = tracing.PATH_CROSS_NODE
        _crossing_atomic(pointer, "iris.signal")
        tl.debug_barrier()
        _complete_for_release(sem)
        crossnode.atomic("xchg" if op == "set" else "add", pointer, value, to_rank, heap_bases)
    else:
        remote = translate(pointer, from_rank, to_rank, heap_bases, None, "iris.signal")
        # The barrier makes every thread's earlier stores precede the release below.
        tl.debug_barrier()
        _complete_for_release(sem)
        if op == "set":
            tl.atomic_xchg(remote, value, sem=sem, scope=scope)
        else:
            tl.atomic_add(remote, value, sem=sem, scope=scope)
    sub: tl.constexpr = flight.signal_sub(op)
    _recorded(
        heap_bases, start, tracing.SIGNAL, sub, to_rank, pointer, None, value, value, 0, pid_m, pid_n, path
    )


@triton.constexpr_function
def _known_scope(scope, op):
    # Checked at compile time: heap_bases passed by position lands here, in scope's place, and
    # would otherwise be taken silently (losing the timeout's report and the wait's trace).
    if not isinstance(scope, str) or scope not in ("sys", "gpu", "cta"):
        raise TypeError(
            f"{op}: scope must be 'sys', 'gpu' or 'cta', got a {type(scope).__name__}; pass heap_bases "
            "by name: wait_until(ptr, cmp, value, heap_bases=heap_bases)"
        )
    return scope


@triton.jit
def _satisfied(seen, cmp: tl.constexpr, value):
    if cmp == "eq":
        result = seen == value
    elif cmp == "ne":
        result = seen != value
    elif cmp == "gt":
        result = seen > value
    elif cmp == "ge":
        result = seen >= value
    elif cmp == "lt":
        result = seen < value
    else:
        tl.static_assert(cmp == "le", "cmp must be one of eq, ne, gt, ge, lt, le")
        result = seen <= value
    return result


@triton.jit
def _spin(pointer, cmp: tl.constexpr, value, scope: tl.constexpr, BACKOFF_NS: tl.constexpr):
    # No timeout: exactly the loop Iris always had.
    seen = hw.load_acquire(pointer, scope)
    while not _satisfied(seen, cmp, value):
        if BACKOFF_NS > 0:
            hw.sleep_ns(BACKOFF_NS)
        hw.progress()
        seen = hw.load_acquire(pointer, scope)
    return seen


#: A tensor this long holds a value from every thread of any program (1024 threads at most).
MAX_THREADS: tl.constexpr = tl.constexpr(1024)


@triton.jit
def _poll(polled, scope: tl.constexpr, heap_bases, far_rank):
    if crossnode.SCALE_OUT and far_rank >= 0:
        seen = crossnode.get(polled, far_rank, heap_bases)
        # An acquire: reads after the wait must not be served before this one.
        hw.fence_system()
    else:
        seen = hw.load_acquire(polled, scope)
    return seen


@triton.jit
def _spin_watched(
    pointer,
    cmp: tl.constexpr,
    value,
    scope: tl.constexpr,
    timeout,
    heap_bases,
    op: tl.constexpr,
    BACKOFF_NS: tl.constexpr,
    polled,
    far_rank=-1,
):
    # ``polled`` is where the flag is read: ``pointer``, or another rank's copy of it;
    # the flight records keep ``pointer``, whose heap offset names the flag. With
    # ``far_rank`` >= 0 the flag is that rank's, on another node, read through the
    # cross-node path.
    # The clock is read once every CHECK_EVERY spins, so a wait satisfied at once costs
    # the same as without a timeout. The first read marks the wait as slow: only then
    # does it enter the flight recorder (with heap_bases), as a pending entry; threads
    # leave this loop at different polls, so nothing here may use a CTA barrier.
    # Returns the flag and when the wait was first seen to be slow (0: never).
    seen = _poll(polled, scope, heap_bases, far_rank)
    spins = 0
    started = tl.cast(0, tl.int64)
    while not _satisfied(seen, cmp, value):
        spins += 1
        if spins % flight.CHECK_EVERY == 0:
            now = hw.timer_ns()
            if started == 0:
                started = now
                if heap_bases is not None:
                    flight.note_waiting(heap_bases, pointer, cmp, value, now, op)
            elif (timeout > 0) & (now - started > timeout):
                flight.expire(heap_bases, pointer, cmp, value, seen, now - started, timeout, op)
        if BACKOFF_NS > 0:
            hw.sleep_ns(BACKOFF_NS)
        hw.progress()
        seen = _poll(polled, scope, heap_bases, far_rank)
    return seen, started


@triton.jit
def wait_until(
    pointer,
    cmp: tl.constexpr,
    value,
    scope: tl.constexpr = tl.constexpr("sys"),
    heap_bases=None,
    pid_m=-1,
    pid_n=-1,
    op: tl.constexpr = tl.constexpr("iris.wait_until"),
    backoff_ns: tl.constexpr = tl.constexpr(0),
    from_rank=None,
):
    """Spin until the flag at ``pointer`` satisfies ``flag <cmp> value``; returns the flag.

    The flag is this rank's own unless ``from_rank`` (with ``heap_bases``) names a
    peer whose copy of it is polled over the interconnect, as upstream Iris's tile
    collectives poll a peer's lock; waiting on a local flag that the peer signals is
    cheaper when the protocol allows it.

    ``cmp`` is one of ``"eq"``, ``"ne"``, ``"gt"``, ``"ge"``, ``"lt"``, ``"le"``. The
    read is an acquire, followed by a CTA barrier, so everything the signalling
    rank wrote before its :func:`signal` is visible to the whole program afterwards.

    Pass ``heap_bases``: the wait then appears in traces (the stalls tracing
    measures) and, once it has spun a while, in the flight recorder, and it obeys the rank's wait timeout
    (``Iris.set_wait_timeout``, ``IRIS_WAIT_TIMEOUT``): past it, the kernel stops
    and the host raises an error naming rank, SM, program, ``op``, flag, expected
    and last seen value. Without ``heap_bases`` only the timeout fixed at import applies.
    ``op`` names the API that waits, for reports (e.g. ``"iris.ccl.all_reduce"``).
    ``backoff_ns`` > 0 sleeps that long between polls, so that other warps on the SM
    (a GEMM sharing it) keep issuing; the wait then ends up to that much later.

    Example:
        >>> iris.wait_until(flag, "ge", round + 1, heap_bases=heap_bases)
        >>> data = tl.load(buf + offs)
    """
    _known_scope(scope, op)
    if heap_bases is not None:
        start = tracing.begin(heap_bases)
        caller = layout.cur_rank(heap_bases)
        far_rank = tl.cast(-1, tl.int64)
        path = tracing.PATH_MAPPED
        if from_rank is None:
            polled = pointer
            owner = caller
        else:
            owner = from_rank
            if crossnode.SCALE_OUT and layout.off_node(heap_bases, caller, from_rank):
                path = tracing.PATH_CROSS_NODE
                polled = pointer
                far_rank = tl.cast(from_rank, tl.int64)
            else:
                polled = translate(pointer, caller, from_rank, heap_bases, None, op)
        seen, slow_since = _spin_watched(
            pointer,
            cmp,
            value,
            scope,
            flight.timeout_ns(heap_bases),
            heap_bases,
            op,
            backoff_ns,
            polled,
            far_rank,
        )
    elif hw.HAS_STATIC_TIMEOUT:
        seen, slow_since = _spin_watched(
            pointer, cmp, value, scope, hw.static_timeout_ns(), None, op, backoff_ns, pointer
        )
    else:
        seen = _spin(pointer, cmp, value, scope, backoff_ns)
    tl.debug_barrier()
    if heap_bases is not None:
        tracing.end(
            heap_bases,
            start,
            tracing.wait_event(op),
            owner,
            pointer,
            None,
            seen,
            pid_m,
            pid_n,
            path=path,
        )
        # Threads left the loop at their own polls, so each has its own slow_since; the
        # CTA-wide max makes the branch uniform (the records below use CTA barriers).
        slow_since = tl.max(blocks.spread(slow_since, MAX_THREADS, tl.int64), axis=0)
        if slow_since != 0:
            flight.clear_waiting(heap_bases)
            flight.record(
                heap_bases,
                flight.WAIT_BEGIN,
                flight.cmp_id(cmp),
                -1,
                pointer,
                value,
                0,
                slow_since,
                op=op,
                use_stamp=True,
            )
            flight.record(
                heap_bases,
                tracing.WAIT_UNTIL,
                flight.cmp_id(cmp),
                -1,
                pointer,
                value,
                seen,
                start,
                op=op,
                fresh=True,
            )
    return seen
