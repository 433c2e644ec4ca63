"""GEMM + all-scatter, in the four overlap styles of the taxonomy (docs/fused.md).

Every rank computes its block ``C_r = A @ B_r`` of a matrix that every rank
holds whole, and writes the block into every rank's copy at the same place
(``out_block`` is a view of the symmetric ``out``; its pointer is valid on every
heap). The styles differ in who moves the finished tiles and when:

* bulk-synchronous: :func:`iris.ops.gemm.matmul_kernel`, then :func:`all_scatter_kernel`
* fused sequential: :func:`fused_sequential_kernel` stores each tile to every peer itself
* workgroup-specialised: :func:`workgroup_specialized_kernel` with ``ROLE=BOTH``: the
  first ``GEMM_PROGRAMS`` programs compute, the rest push tiles as their flags rise
* producer-consumer: the same kernel launched twice, ``ROLE=PRODUCER`` and
  ``ROLE=CONSUMER``, on two streams

Per-tile flags (one int32 per tile, on the heap) hold the call's epoch ``e``: the
computing program sets ``2e - 1`` after its tile is stored (``iris.signal``: CTA
barrier, then release), and whichever program *claims* the tile (compare-and-swap
to ``2e``, an acquire) pushes it. Flags only grow, so no host reset is needed
between calls and CUDA graphs can replay the launch.

In the workgroup-specialised kernel the GEMM programs that run out of tiles join
the pushers: with ``T`` tiles on ``G`` GEMM programs the last wave keeps only
``T % G`` of them busy, and the idle ones drain the backlog instead of waiting
for the kernel to end. Pushers take tiles from one ticket counter, in the order
the GEMM finishes them. A program never waits for a higher-numbered one (the
emulation backend runs a launch's programs in order): a GEMM program passes over
an unfinished tile of a higher-numbered program, and the dedicated pushers (the
highest numbers) finally sweep their share of the tiles for any passed over.

Flags, tickets and pushes count *work units*: whole tiles, except that with
``FusedConfig(split_last_wave=True)`` the last wave of tiles is computed and pushed in
halves of ``BLOCK_N / 2`` columns (units from ``split_from`` on, :func:`unit_tile`;
otherwise ``split_from`` is the number of tiles). A wave of whole tiles ends all at
once and leaves all its data to push after the GEMM; halves end in two steps, and
the first step's data travels while the second is computed.

Before its first store into a peer's ``out``, a program waits until that peer has
entered the same call (``entry`` flags holding the call's epoch, a device counter
the host bumps before each call): a rank that runs ahead never overwrites an
``out`` that a slower peer is still reading from the previous call.
"""

import triton
import triton.language as tl

from ..device import blocks, crossnode, rma, tracing
from .gemm import SCOPE_GEMM, tile_coords, tile_gemm, tile_offsets, traced_tile_gemm

#: Records a traced GEMM program of :func:`workgroup_specialized_kernel` keeps in
#: registers before it writes them (``iris.device.tracing.stash``): eight units' scopes
#: and flag signals.
STASH_RECORDS: tl.constexpr = tl.constexpr(16)

#: Roles of :func:`workgroup_specialized_kernel`.
BOTH: tl.constexpr = tl.constexpr(0)
PRODUCER: tl.constexpr = tl.constexpr(1)
CONSUMER: tl.constexpr = tl.constexpr(2)


@triton.jit
def announce_entry(entry, epoch, cur_rank, world_size, heap_bases):
    """Tell every peer that this rank has entered call ``epoch`` (``entry[cur_rank] = epoch`` there).

    Example:
        >>> if tl.program_id(0) == 0:
        >>>     announce_entry(entry, epoch, rank, world, heap_bases)
    """
    for i in range(1, world_size):
        peer = (cur_rank + i) % world_size
        rma.signal(entry + cur_rank, epoch, cur_rank, peer, heap_bases, op="set")


@triton.jit
def wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases):
    """Wait until every peer has entered call ``epoch`` (see :func:`announce_entry`).

    Traced, the waits' slots are reserved before the first (:func:`iris.device.tracing.reserve`)
    and each is written as its wait ends, so no record waits for a slot claim's reply
    while the waits have something to wait for.

    Example:
        >>> wait_for_peers(entry, epoch, rank, world, heap_bases)
        >>> iris.store(out + offs, tile, rank, peer, heap_bases)
    """
    reservation = tracing.reserve_if_recording(heap_bases, world_size - 1)
    plain = tracing.untraced(heap_bases)
    for i in range(1, world_size):
        peer = (cur_rank + i) % world_size
        began = tracing.begin(heap_bases)
        seen = rma.wait_until(entry + peer, "ge", epoch, heap_bases=plain)
        tracing.write_reserved(
            heap_bases, reservation, i - 1, began, tracing.WAIT_UNTIL, cur_rank, entry + peer, value=seen
        )


@triton.jit
def push_tile(
    out_block, pid_m, pid_n,
    rows, cols, stride_m, stride_n,
    cur_rank, world_size, heap_bases,
    before,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMM_ROWS: tl.constexpr,
):  # fmt: skip
    """Copy tile ``(pid_m, pid_n)`` of the local ``out_block`` to the same place on every peer.

    Rows go ``COMM_ROWS`` at a time: one load, then a store per peer, so a whole tile
    never has to sit in registers. Traced, the tile's push to each peer is one store
    event, not one per step. Within one node the push is one event for all its peers
    (``tracing.EVERY_PEER``), which the reader expands: the steps interleave the peers,
    so each peer's store spans the same time. The push reserves its trace slots before
    it starts (:func:`iris.device.tracing.reserve`) and writes them after, so no slot
    claim's round trip waits behind its stores (a claim per event made traced calls with
    dedicated pushers up to 60% slower). ``before`` more slots are reserved ahead of the
    push's own, for the caller's events (the wait that let the tile through); the
    reservation is returned for it to write them (slots ``0 .. before - 1``).

    Example:
        >>> reservation = push_tile(out_block, pid_m, pid_n, M, N, N, 1, rank, world, heap_bases, 0,
        ...                         128, 256, 32)
    """
    start = tracing.begin(heap_bases)
    plain = tracing.untraced(heap_bases)
    traced = (start >= 0) & (world_size > 1)
    if crossnode.SCALE_OUT:
        pushed = tl.where(traced, world_size - 1, 0)  # a record per peer: each names its path
    else:
        pushed = traced.to(tl.int32)
    reservation = tracing.reserve(heap_bases, before + pushed)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    for r0 in range(0, BLOCK_M, COMM_ROWS):
        rm = pid_m * BLOCK_M + r0 + tl.arange(0, COMM_ROWS)
        offsets = rm[:, None] * stride_m + rn[None, :] * stride_n
        mask = (rm[:, None] < rows) & (rn[None, :] < cols)
        values = tl.load(out_block + offsets, mask=mask)
        # Start at the next rank so the ranks do not all hit rank 0's links first.
        for i in range(1, world_size):
            peer = (cur_rank + i) % world_size
            rma.store(out_block + offsets, values, cur_rank, peer, plain, mask=mask)
    if traced:
        first = out_block + pid_m * BLOCK_M * stride_m + pid_n * BLOCK_N * stride_n
        tile_rows = tl.minimum(rows - pid_m * BLOCK_M, BLOCK_M)
        tile_cols = tl.minimum(cols - pid_n * BLOCK_N, BLOCK_N)
        nbytes = tile_rows.to(tl.int64) * tile_cols * blocks.element_bytes(out_block.type)
        if crossnode.SCALE_OUT:
            for i in range(1, world_size):
                peer = (cur_rank + i) % world_size
                path = rma.path_between(heap_bases, cur_rank, peer)
                tracing.write_reserved(
                    heap_bases, reservation, before + i - 1, start, tracing.STORE, peer, first, nbytes, 0,
                    pid_m, pid_n, path,
                )  # fmt: skip
        else:
            tracing.write_reserved(
                heap_bases, reservation, before, start, tracing.STORE, tracing.EVERY_PEER, first, nbytes, 0,
                pid_m, pid_n,
            )  # fmt: skip
    return reservation


@triton.jit
def all_scatter_kernel(
    out_block, entry, epoch_ptr,
    rows, cols, stride_m, stride_n,
    cur_rank, world_size, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMM_ROWS: tl.constexpr,
):  # fmt: skip
    """The communication kernel of the bulk-synchronous style: push the whole local block.

    Example:
        >>> all_scatter_kernel[(num_sms,)](block, entry, epoch, M, N, *block.stride(), rank, world,
        ...                                ctx.get_heap_bases(), 128, 256, 32)
    """
    epoch = tl.load(epoch_ptr)
    if tl.program_id(0) == 0:
        announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
    wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)
    num_pid_n = tl.cdiv(cols, BLOCK_N)
    total = tl.cdiv(rows, BLOCK_M) * num_pid_n
    for tile_id in range(tl.program_id(0), total, tl.num_programs(0)):
        push_tile(
            out_block, tile_id // num_pid_n, tile_id % num_pid_n, rows, cols, stride_m, stride_n, cur_rank,
            world_size, heap_bases, 0, BLOCK_M, BLOCK_N, COMM_ROWS,
        )  # fmt: skip


@triton.jit
def fused_sequential_kernel(
    a, b, out_block, entry, epoch_ptr,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """Persistent GEMM whose programs store every finished tile to every rank themselves.

    Example:
        >>> fused_sequential_kernel[(num_sms,)](a, b, block, entry, epoch, M, N, K, *a.stride(),
        ...     *b.stride(), *block.stride(), rank, world, ctx.get_heap_bases(), 128, 256, 64, 8, K % 64 == 0)
    """
    epoch = tl.load(epoch_ptr)
    if tl.program_id(0) == 0:
        announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    for tile_id in range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = traced_tile_gemm(
            a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, heap_bases, BLOCK_M,
            BLOCK_N, BLOCK_K, EVEN_K,
        )  # fmt: skip
        tile = acc.to(out_block.dtype.element_ty)
        offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
        tl.store(out_block + offsets, tile, mask=mask)
        # Waiting after the first tile, not before the loop, lets its GEMM hide the
        # handshake; the peers stay entered for the rest of the call.
        if tile_id == tl.program_id(0):
            wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)
        for i in range(1, world_size):
            peer = (cur_rank + i) % world_size
            rma.store(
                out_block + offsets, tile, cur_rank, peer, heap_bases, mask=mask, pid_m=pid_m, pid_n=pid_n
            )


@triton.jit
def unit_tile(unit, split_from):
    """``(tile, half)`` of work unit ``unit``: units below ``split_from`` are whole tiles (half -1),
    the rest are halves 0 and 1 of tiles ``split_from, split_from + 1, ...``.

    Example:
        >>> tile, half = unit_tile(unit, split_from)   # half >= 0: columns half * BLOCK_N / 2 on
    """
    past = tl.maximum(unit - split_from, 0)
    tile = tl.where(unit < split_from, unit, split_from + past // 2)
    half = tl.where(unit < split_from, -1, past % 2)
    return tile, half


@triton.jit
def unit_coords(unit, split_from, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n, half)`` of work unit ``unit``: its tile's place (:func:`tile_coords`) and half.

    Example:
        >>> pid_m, pid_n, half = unit_coords(unit, split_from, tl.cdiv(M, 128), tl.cdiv(N, 256), 8)
    """
    tile, half = unit_tile(unit, split_from)
    pid_m, pid_n = tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
    return pid_m, pid_n, half


@triton.jit
def push_unit(
    out_block, pid_m, pid_n, half,
    M, N, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    before,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, COMM_ROWS: tl.constexpr,
):  # fmt: skip
    """:func:`push_tile` for tile ``(pid_m, pid_n)`` whole (``half < 0``) or its half ``half`` only.

    Returns push_tile's trace reservation (``before`` slots ahead of the push's own).

    Example:
        >>> pid_m, pid_n, half = unit_coords(unit, split_from, num_pid_m, num_pid_n, 8)
        >>> reservation = push_unit(block, pid_m, pid_n, half, M, N, N, 1, rank, world, heap_bases, 1,
        ...                         128, 256, 16)
    """
    if half < 0:
        reservation = push_tile(
            out_block, pid_m, pid_n, M, N, stride_cm, stride_cn, cur_rank, world_size, heap_bases, before,
            BLOCK_M, BLOCK_N, COMM_ROWS,
        )  # fmt: skip
    else:
        reservation = push_tile(
            out_block, pid_m, 2 * pid_n + half, M, N, stride_cm, stride_cn, cur_rank, world_size, heap_bases,
            before, BLOCK_M, BLOCK_N // 2, COMM_ROWS,
        )  # fmt: skip
    return reservation


@triton.jit
def claim_tile(flags, tile_id, computed):
    """True for exactly one caller once tile ``tile_id`` is computed (flag ``computed`` -> ``computed + 1``).

    The compare-and-swap is an acquire, and the CTA barrier after it gives every
    thread of the program the tile's data.

    Example:
        >>> if claim_tile(flags, tile_id, 2 * epoch - 1):
        >>>     push_tile(out_block, pid_m, pid_n, ...)
    """
    won = tl.atomic_cas(flags + tile_id, computed, computed + 1, sem="acquire", scope="gpu") == computed
    tl.debug_barrier()
    return won


@triton.jit
def wait_for_unit(flags, unit, computed, heap_bases, pid_m, pid_n, BACKOFF_NS: tl.constexpr = 0):
    """Wait until unit ``unit`` is computed; returns ``(began, ended, seen)`` for :func:`record_unit_wait`.

    ``began`` and ``ended`` are the wait's times (-1 when nothing is recorded) and
    ``seen`` the flag it saw. The wait is recorded after the push it lets through, not
    here: a record written here would claim its trace slot with an atomic whose reply
    the program waits for, holding back every push behind a wait (traced
    ``producer_consumer`` calls at 16384 x 8192 x 8192 were 2-4% slower; docs/tracing.md,
    "Cost"). Its slot is reserved with the push's (:func:`push_unit`'s ``before``).

    Example:
        >>> began, ended, seen = wait_for_unit(flags, unit, 2 * epoch - 1, heap_bases, pid_m, pid_n)
        >>> reservation = push_unit(block, pid_m, pid_n, half, ..., heap_bases, waited(began), ...)
        >>> record_unit_wait(heap_bases, reservation, began, ended, seen, flags, unit, rank, pid_m, pid_n)
    """
    began = tracing.begin(heap_bases)
    seen = rma.wait_until(
        flags + unit, "ge", computed, scope="gpu", heap_bases=tracing.untraced(heap_bases),
        pid_m=pid_m, pid_n=pid_n, backoff_ns=BACKOFF_NS,
    )  # fmt: skip
    return began, tracing.begin(heap_bases), seen


@triton.jit
def _no_wait(computed):
    # What wait_for_unit returns for a unit that was not waited for: nothing to record.
    return tl.full([], -1, tl.int64), tl.full([], -1, tl.int64), computed


@triton.jit
def waited(began):
    """Trace slots a wait timed by :func:`wait_for_unit` needs: 1, or 0 when it is not recorded.

    Example:
        >>> reservation = tracing.reserve(heap_bases, waited(began))
    """
    return (began >= 0).to(tl.int32)


@triton.jit
def record_unit_wait(heap_bases, reservation, began, ended, seen, flags, unit, cur_rank, pid_m, pid_n):
    """Write the wait on this rank's flag that :func:`wait_for_unit` timed into slot 0 of ``reservation``.

    Nothing when ``began`` is -1 (then :func:`waited` reserved no slot for it).

    Example:
        >>> record_unit_wait(heap_bases, reservation, began, ended, seen, flags, unit, rank, pid_m, pid_n)
    """
    tracing.write_reserved(
        heap_bases, reservation, 0, began, tracing.WAIT_UNTIL, cur_rank, flags + unit, None, seen, pid_m,
        pid_n, stop=ended,
    )  # fmt: skip


@triton.jit
def push_claimed_tiles(
    out_block, flags, tickets, computed, pid, gemm_programs, split_from,
    M, N, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, COMM_ROWS: tl.constexpr,
    BACKOFF_NS: tl.constexpr = 0,
):  # fmt: skip
    """Take work units from the ticket counter, in the GEMM's finishing order; push those this program claims.

    Unit ``u`` (a tile or half of one, :func:`unit_tile`) is computed by GEMM program
    ``u % gemm_programs``. This program waits for it only when that program is
    lower-numbered; otherwise it tries to claim the unit and passes it over if
    unfinished (a dedicated pusher sweeps it up later). ``BACKOFF_NS`` is the sleep
    between polls of a flag (see ``iris.wait_until``).

    Example:
        >>> push_claimed_tiles(block, flags, tickets, 2 * epoch - 1, pid, gemm_programs, split, M, N, ...)
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    units = 2 * num_pid_m * num_pid_n - split_from
    # Relaxed: a ticket orders nothing, the flag's acquire does.
    unit = tl.atomic_add(tickets, 1, sem="relaxed", scope="gpu")
    while unit < units:
        pid_m, pid_n, half = unit_coords(unit, split_from, num_pid_m, num_pid_n, GROUP_M)
        began, ended, observed = _no_wait(computed)
        if (pid >= gemm_programs) | (unit % tl.maximum(gemm_programs, 1) < pid):
            began, ended, observed = wait_for_unit(
                flags, unit, computed, heap_bases, pid_m, pid_n, BACKOFF_NS
            )
        if claim_tile(flags, unit, computed):
            reservation = push_unit(
                out_block, pid_m, pid_n, half, M, N, stride_cm, stride_cn, cur_rank, world_size, heap_bases,
                waited(began), BLOCK_M, BLOCK_N, COMM_ROWS,
            )  # fmt: skip
        else:
            reservation = tracing.reserve(heap_bases, waited(began))
        record_unit_wait(heap_bases, reservation, began, ended, observed, flags, unit, cur_rank, pid_m, pid_n)
        unit = tl.atomic_add(tickets, 1, sem="relaxed", scope="gpu")


@triton.jit
def sweep_passed_tiles(
    out_block, flags, computed, first, step, split_from,
    M, N, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, COMM_ROWS: tl.constexpr,
):  # fmt: skip
    """Wait for, claim and push every unit ``first, first + step, ...`` that nobody has claimed yet.

    Flags are read 64 at a time, so a share with nothing left costs one load per 64 units.

    Example:
        >>> sweep_passed_tiles(block, flags, 2 * epoch - 1, pid - gemm_programs, comm, split, M, N, ...)
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    units = 2 * num_pid_m * num_pid_n - split_from
    SWEEP: tl.constexpr = 64
    for chunk in range(first, units, step * SWEEP):
        ids = chunk + tl.arange(0, SWEEP) * step
        seen = tl.load(flags + ids, mask=ids < units, other=computed + 1, volatile=True)
        if tl.min(seen, axis=0) <= computed:
            for unit in range(chunk, tl.minimum(chunk + step * SWEEP, units), step):
                pid_m, pid_n, half = unit_coords(unit, split_from, num_pid_m, num_pid_n, GROUP_M)
                began, ended, observed = wait_for_unit(flags, unit, computed, heap_bases, pid_m, pid_n)
                if claim_tile(flags, unit, computed):
                    reservation = push_unit(
                        out_block, pid_m, pid_n, half, M, N, stride_cm, stride_cn, cur_rank, world_size,
                        heap_bases, waited(began), BLOCK_M, BLOCK_N, COMM_ROWS,
                    )  # fmt: skip
                else:
                    reservation = tracing.reserve(heap_bases, waited(began))
                record_unit_wait(
                    heap_bases, reservation, began, ended, observed, flags, unit, cur_rank, pid_m, pid_n
                )


@triton.jit
def produce_tiles(
    a, b, out_block, flags, computed, first, step, split_from,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    cur_rank, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """Compute work units ``first, first + step, ...`` into the local ``out_block``; flag each ``computed``.

    Units below ``split_from`` are whole tiles, the rest halves (:func:`unit_tile`);
    ``split_from`` must be a multiple of ``step``. Traced, each unit's GEMM scope and
    flag signal are stashed (``iris.device.tracing.stash``) and written at the end.

    Example:
        >>> produce_tiles(a, b, block, flags, 2 * epoch - 1, pid, gemm_programs, split_from, M, N, K, ...)
    """
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    held, count = tracing.stash_new(heap_bases, STASH_RECORDS)
    # Two loops, not one with a branch per unit: each keeps one GEMM body, which
    # Triton pipelines as it does a plain persistent GEMM. ``split_from`` is a
    # multiple of ``step`` (the GEMM programs), so the round robin carries on.
    for unit in range(first, split_from, step):
        pid_m, pid_n = tile_coords(unit, num_pid_m, num_pid_n, GROUP_M)
        held, count = _produce_unit(
            a, b, out_block, flags, unit, computed, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk,
            stride_bn, stride_cm, stride_cn, cur_rank, heap_bases, held, count, BLOCK_M, BLOCK_N, BLOCK_K,
            EVEN_K,
        )  # fmt: skip
    for unit in range(split_from + first, 2 * num_pid_m * num_pid_n - split_from, step):
        pid_m, pid_n, half = unit_coords(unit, split_from, num_pid_m, num_pid_n, GROUP_M)
        held, count = _produce_unit(
            a, b, out_block, flags, unit, computed, pid_m, 2 * pid_n + half, M, N, K, stride_am, stride_ak,
            stride_bk, stride_bn, stride_cm, stride_cn, cur_rank, heap_bases, held, count, BLOCK_M,
            BLOCK_N // 2, BLOCK_K, EVEN_K, pid_n,
        )  # fmt: skip
    tracing.stash_write(heap_bases, held, count)


@triton.jit
def _produce_unit(
    a, b, out_block, flags, unit, computed, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    stride_cm, stride_cn, cur_rank, heap_bases, held, count, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, tile_n=None,
):  # fmt: skip
    # One unit of produce_tiles: the GEMM of block (pid_m, pid_n) (of BLOCK_M x BLOCK_N),
    # stored and flagged; its scope and signal are stashed, named by the tile's column
    # ``tile_n`` (default pid_n: a half names its whole tile, as its flag's waiter does).
    if tile_n is None:
        named_n = pid_n
    else:
        named_n = tile_n
    started = tracing.begin(heap_bases)
    acc = tile_gemm(
        a, b, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K,
    )  # fmt: skip
    computed_at = tracing.begin(heap_bases)
    offsets, mask = tile_offsets(pid_m, pid_n, M, N, stride_cm, stride_cn, BLOCK_M, BLOCK_N)
    tl.store(out_block + offsets, acc.to(out_block.dtype.element_ty), mask=mask)
    signalled = tracing.begin(heap_bases)
    signal_unit(flags, unit, computed, cur_rank, tracing.untraced(heap_bases), pid_m, named_n)
    held, count = tracing.stash_room(heap_bases, held, count, 2)
    held, count = tracing.stash(
        heap_bases, held, count, started, tracing.SCOPE_BASE + SCOPE_GEMM, -1, None, 0, 0, pid_m, pid_n,
        stop=computed_at,
    )  # fmt: skip
    return tracing.stash(
        heap_bases, held, count, signalled, tracing.SIGNAL, cur_rank, flags + unit, None, computed, pid_m,
        named_n, sub=tracing.SIGNAL_SET,
    )  # fmt: skip


@triton.jit
def signal_unit(flags, unit, computed, cur_rank, heap_bases, pid_m, pid_n):
    """Raise unit ``unit``'s flag to ``computed`` once its tile is stored (a release).

    Example:
        >>> signal_unit(flags, unit, 2 * epoch - 1, rank, heap_bases, pid_m, pid_n)
    """
    # Only this GPU reads the flag, so GPU scope is enough for the release.
    rma.signal(flags + unit, computed, cur_rank, cur_rank, heap_bases, "set", "gpu", pid_m=pid_m, pid_n=pid_n)


@triton.jit
def workgroup_specialized_kernel(
    a, b, out_block, flags, tickets, entry, epoch_ptr,
    M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    cur_rank, world_size, heap_bases,
    GEMM_PROGRAMS, SPLIT_FROM,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, COMM_ROWS: tl.constexpr, ROLE: tl.constexpr, BACKOFF_NS: tl.constexpr = 0,
):  # fmt: skip
    """GEMM programs store tiles locally and raise per-tile flags; communication programs push them.

    ``ROLE=BOTH``: programs ``[0, GEMM_PROGRAMS)`` compute, then help push; the others
    only push (they come last because they wait and the computing ones never wait
    for them: a program may only wait for lower-numbered ones, see docs/memory_model.md).
    ``ROLE=PRODUCER`` / ``ROLE=CONSUMER``: every program of the launch has that role
    (the producer-consumer style, two launches on two streams); both get the
    producer's grid size as ``GEMM_PROGRAMS``. Consumers that share SMs with GEMM
    programs sleep ``BACKOFF_NS`` between polls of a tile's flag. Tiles from
    ``SPLIT_FROM`` on are computed and pushed in halves (:func:`unit_tile`;
    :func:`iris.ops.config.last_wave_split` gives the value; the number of tiles
    keeps every tile whole). ``flags`` has one word per work unit.
    ``tickets`` is three int32 words, zero between launches: the next unit to push,
    the programs finished (the last one out resets both) and the producer programs
    started (each adds one on entry; the consumer's last program out takes them
    back), which the host can wait on before launching a consumer that must find
    every producer program already on the SMs.

    Example:
        >>> workgroup_specialized_kernel[(num_sms,)](a, b, block, flags, tickets, entry, epoch, M, N, K,
        ...     *a.stride(), *b.stride(), *block.stride(), rank, world, ctx.get_heap_bases(), num_sms - 16,
        ...     last_wave_split(tiles, num_sms - 16), 128, 256, 64, 8, K % 64 == 0, 32, 0)
    """
    pid = tl.program_id(0)
    epoch = tl.load(epoch_ptr)
    computed = 2 * epoch - 1
    if ROLE == PRODUCER:
        tl.atomic_add(tickets + 2, 1, sem="relaxed", scope="gpu")
        gemm_programs = tl.num_programs(0)
    elif ROLE == CONSUMER:
        gemm_programs = 0
    else:
        gemm_programs = GEMM_PROGRAMS
    # A constexpr test: a consumer launch compiles without the GEMM and keeps few
    # registers, so it can share SMs with the producer (FusedConfig.consumer_warps).
    if ROLE != CONSUMER:
        if pid == 0:
            announce_entry(entry, epoch, cur_rank, world_size, heap_bases)
        if pid < gemm_programs:
            produce_tiles(
                a, b, out_block, flags, computed, pid, gemm_programs, SPLIT_FROM, M, N, K, stride_am,
                stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, cur_rank, heap_bases, BLOCK_M, BLOCK_N,
                BLOCK_K, GROUP_M, EVEN_K,
            )  # fmt: skip
    if ROLE != PRODUCER:
        wait_for_peers(entry, epoch, cur_rank, world_size, heap_bases)
        push_claimed_tiles(
            out_block, flags, tickets, computed, pid, gemm_programs, SPLIT_FROM, M, N, stride_cm, stride_cn,
            cur_rank, world_size, heap_bases, BLOCK_M, BLOCK_N, GROUP_M, COMM_ROWS, BACKOFF_NS,
        )  # fmt: skip
        if pid >= gemm_programs:
            comm_programs = tl.num_programs(0) - gemm_programs
            sweep_passed_tiles(
                out_block, flags, computed, pid - gemm_programs, comm_programs, SPLIT_FROM, M, N, stride_cm,
                stride_cn, cur_rank, world_size, heap_bases, BLOCK_M, BLOCK_N, GROUP_M, COMM_ROWS,
            )  # fmt: skip
        if tl.atomic_add(tickets + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
            tl.store(tickets, 0)
            tl.store(tickets + 1, 0)
            if ROLE == CONSUMER:
                # A producer program without tiles may add its start after this: the
                # count is back at 0 once both launches have ended, either way.
                tl.atomic_add(tickets + 2, -GEMM_PROGRAMS, sem="relaxed", scope="gpu")
