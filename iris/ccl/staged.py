"""Small collectives in one synchronisation: stage the input, arrive, pull from the peers.

A collective that pushes into peers' outputs needs two handshakes: *ready*
(the peer is in the call, its output may be overwritten) and *done* (every
store has landed). For small tensors those round trips are most of the time. A
staged collective instead copies its input into one of two staging halves on
its own heap (``Runtime.staging_buffer``), arrives, waits for every member's arrival,
then *reads* what it needs from the members' staging halves into its own output:

* ``all_reduce``: element ``i`` of every member's staging, combined;
* ``all_gather``: every member's staging, placed at ``member * n``;
* ``reduce_scatter``: block ``my_index`` of every member's staging, combined;
* ``broadcast``: ``src``'s staging (every member still arrives, see below).

Nothing is stored remotely, so there is no done phase. Call ``c`` uses half
``c % 2``: a member rewrites a half at call ``c + 2`` only after every member
arrived at call ``c + 1``, which each does after finishing its reads of call
``c``. That argument needs every member to arrive at every call, ``src`` of a
broadcast included. Only the whole-world group stages (all ranks then make the
same staged calls, so their call counters agree).

Program ``p`` stages exactly the tiles that program ``p`` of every member reads,
so each program only waits for the arrivals of its own row.
"""

import triton
import triton.language as tl

from ..device import rma
from . import device as ccl
from .device import RANK_ARGS

#: What a staged call computes (``staged_kernel``'s ``MODE``).
MODES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


@triton.jit(do_not_specialize=RANK_ARGS)
def staged_kernel(
    out, inp,
    n,
    src_index,
    group, my_index, cur_rank,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
    staging, calls, half,
    MODE: tl.constexpr,
):  # fmt: skip
    """One staged collective over ``n`` output elements per member (see the module doc).

    ``inp`` holds ``GROUP * n`` elements for ``reduce_scatter``, ``n`` otherwise;
    ``src_index`` is the broadcasting member's index (unused by the other modes).

    Launched by :func:`staged_launch`.
    """
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    call = tl.load(calls, volatile=True)
    # Halves are whole multiples of 256 bytes: keep the accesses 16-byte vectors.
    stage = staging + tl.multiple_of((call % 2) * half, 16)
    tiles = tl.cdiv(n, BLOCK)
    # Work unit u reads tile u // MEMBERS of member u % MEMBERS: an all-gather spreads
    # the members over programs (their remote reads then overlap); the others read
    # every member inside one unit. Program p stages what program p of every member reads.
    if MODE == "all_gather":
        MEMBERS: tl.constexpr = GROUP
    else:
        MEMBERS: tl.constexpr = 1
    for u in range(pid, tiles * MEMBERS, programs):
        stages = (u % MEMBERS) == my_index % MEMBERS
        if MODE == "broadcast":
            stages = my_index == src_index
        if stages:
            offsets = (u // MEMBERS) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            for b in tl.static_range(GROUP if MODE == "reduce_scatter" else 1):
                at = b * n + offsets
                tl.store(stage + at, tl.load(inp + at, mask=mask), mask=mask)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    read_units = tiles * MEMBERS
    if MODE == "broadcast":
        if my_index == src_index:
            read_units = 0
    for u in range(pid, read_units, programs):
        offsets = (u // MEMBERS) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        if MODE == "all_reduce":
            total = ccl.reduce_tile(stage + offsets, cur_rank, ranks, my_index, GROUP, heap_bases, mask, OP)
            tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
        elif MODE == "reduce_scatter":
            mine = my_index * n + offsets
            total = ccl.reduce_tile(stage + mine, cur_rank, ranks, my_index, GROUP, heap_bases, mask, OP)
            tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
        elif MODE == "all_gather":
            member = u % MEMBERS
            values = rma.load(stage + offsets, cur_rank, tl.load(ranks + member), heap_bases, mask=mask)
            tl.store(out + member * n + offsets, values, mask=mask)
        else:
            tl.static_assert(MODE == "broadcast", "MODE must be one of iris.ccl.staged.MODES")
            peer = tl.load(ranks + src_index)
            values = rma.load(stage + offsets, cur_rank, peer, heap_bases, mask=mask)
            tl.store(out + offsets, values, mask=mask)
    finish_call(calls, call)


@triton.jit
def finish_call(calls, call):
    """Count this program out of call ``call``; the last one hands the next call the other half.

    ``calls`` is ``Runtime.protocol_calls``: ``[call, programs finished with it]``,
    shared by the staged and low-latency protocols.

    Example:
        >>> call = tl.load(calls, volatile=True)
        >>> ...  # stage, synchronise, read half call % 2
        >>> finish_call(calls, call)
    """
    if tl.atomic_add(calls + 1, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        tl.store(calls + 1, 0)
        tl.store(calls, call + 1)


def staged_launch(runtime, state, mode: str, out, inp, n: int, config, op=None, src_index: int = 0):
    """``(kernel, grid, args, num_warps)`` of a staged ``mode`` call, for ``Runtime.prepare``.

    Example:
        >>> staged_launch(runtime, state, "all_gather", out, inp, inp.numel(), config)
    """
    staging = runtime.staging_buffer()
    block = config.block_for(inp.element_size())
    units = triton.cdiv(n, block) * (state.size if mode == "all_gather" else 1)
    grid = (runtime.programs(units, config),)
    typed = staging.view(inp.dtype)
    reduction = op.value if op is not None else "sum"
    args = (
        out, inp, n, src_index, *runtime.group_args(state), block, reduction,
        typed, runtime.protocol_calls, typed.numel() // 2, mode,
    )  # fmt: skip
    return staged_kernel, grid, args, config.num_warps
