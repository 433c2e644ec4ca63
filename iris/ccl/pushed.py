"""Large reductions by pushes only: partial tiles go to their owner, which reduces them locally.

The direct two-shot all-reduce and reduce-scatter *pull*: the owner of a tile
loads it from every member over NVLink, and two handshakes (ready before, done
after) guard the tensors that peers read or write. Here every transfer is a
remote *store* into a receive slot, and the handshakes go away:

1. **scatter**: each member stores its copy of tile ``(c, j)`` into member
   ``j``'s receive slot, then raises one *arrived* flag per member;
2. **reduce**: member ``j`` waits for every member's arrival, reduces its own
   copy with the received ones (fp32 for floats), and
3. ``all_reduce`` only: stores the result into every member's output.

Program ``p`` of every member handles the same columns ``c = p, p + programs, ...``
in *rounds* of up to ``ROUND`` columns (:data:`iris.ccl.runtime.PUSH_ROUND_TILES`,
as many as the slots hold). Each round costs a system fence and an arrival wait,
which stall the program: on 4 x H200 with one column per round, about 12 us per
round on top of the transfer (estimated from the all_reduce and reduce_scatter
times, which move 96 and 48 KiB per round and program), so a round must move much
data. The round
count only grows across calls (kept in this rank's own arrived slot,
``arrived[p][cur_rank]`), so the flags need no reset and CUDA graphs replay the
kernel. Round ``q`` uses half ``q % 2`` of the program's slots. A sender rewrites
a half at round ``q + 2`` only after its own round ``q + 1``, which waited for
every member's round ``q + 1`` arrival, which each member raised only after
reducing round ``q`: two halves are enough, with no acknowledgement.

Inputs are only read by their own rank, so nothing guards them at the end. A
member's arrival in this call also tells that it entered the call, so the results
of step 3 never land in an output its rank still reads. Only ``all_reduce`` keeps
one handshake: each program's *landed* flag, raised on every member after its last
results, so no rank returns before its output is complete.

The receive slots are shared by every pushed call and the round counts must agree
between ranks, so, like the staged protocol, only the whole-world group pushes.

What it buys: no handshakes, and stores only (remote stores outrun remote loads over
NVLink). Measured on 4 x H200 (sweep `tune_pushed_h200x4`),
all_reduce pushed beats the direct two-shot at every size (256 MiB: 1158 against
1277 us, NCCL 1183), reduce_scatter up to 16 MiB and ties above
(``runtime.REDUCE_SCATTER_PUSHED_AUTO_BYTES`).
"""

import triton
import triton.language as tl

from ..device import rma
from . import device as ccl
from .device import RANK_ARGS

#: What a pushed call computes (``pushed_kernel``'s ``MODE`).
MODES = ("all_reduce", "reduce_scatter")
#: What a wait that runs out of time reports as its op.
WAIT_OP: tl.constexpr = tl.constexpr("iris.ccl.pushed")


@triton.jit
def _tile(column, j, n, lanes, MODE: tl.constexpr, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    # Offsets and mask of member j's tile of ``column``. all_reduce: tile
    # column * GROUP + j of the flat tensor (``n`` elements); reduce_scatter: tile
    # ``column`` of block ``j`` (``n`` elements per block).
    if MODE == "all_reduce":
        at = (column * GROUP + j) * BLOCK + lanes
        mask = at < n
    else:
        at = j * n + column * BLOCK + lanes
        mask = column * BLOCK + lanes < n
    return at, mask


@triton.jit
def _raise_on_members(row, value, cur_rank, ranks, my_index, GROUP: tl.constexpr, heap_bases):
    # ``row[cur_rank] = value`` on every other member, after everything this program
    # wrote: one system fence for all members, then relaxed sets (as ``barrier.arrive`).
    rma.fence()
    for i in tl.static_range(1, GROUP):
        peer = tl.load(ranks + (my_index + i) % GROUP)
        rma.signal(row + cur_rank, value, cur_rank, peer, heap_bases, sem="relaxed")


@triton.jit(do_not_specialize=RANK_ARGS)
def pushed_kernel(
    out, inp,
    n,
    group, my_index, cur_rank,
    GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr,
    slots,
    MODE: tl.constexpr, ROUND: tl.constexpr,
):  # fmt: skip
    """One pushed ``all_reduce`` (``n`` elements) or ``reduce_scatter`` (``n`` output elements per member).

    ``slots`` holds ``[max_programs, 2, ROUND, GROUP - 1, BLOCK]`` elements on every
    member: a half per round, a slot per column of the round and sender.

    Launched by :func:`pushed_launch`.
    """
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    arrived = ccl.flag_row(flags, ccl.ARRIVED, pid, max_programs, world_size)
    # Peers raise their own slot of this row, never ours: it keeps our round count.
    base = tl.load(arrived + cur_rank, volatile=True)
    if MODE == "all_reduce":
        columns = tl.cdiv(tl.cdiv(n, BLOCK), GROUP)
    else:
        tl.static_assert(MODE == "reduce_scatter", "MODE must be one of iris.ccl.pushed.MODES")
        columns = tl.cdiv(n, BLOCK)
    lanes = tl.arange(0, BLOCK)
    SENDERS: tl.constexpr = GROUP - 1
    program_slots = slots + pid * (2 * ROUND * SENDERS * BLOCK)
    rounds = 0
    # Columns past the end are masked off by ``_tile`: a round may be partial.
    for first in range(pid, columns, programs * ROUND):
        half = program_slots + (base + rounds) % 2 * (ROUND * SENDERS * BLOCK)
        # 1. scatter: member j's tiles of the round go into our slots on member j,
        #    at our place among j's senders.
        for r in tl.static_range(ROUND):
            for i in tl.static_range(1, GROUP):
                j = (my_index + i) % GROUP
                at, mask = _tile(first + r * programs, j, n, lanes, MODE, GROUP, BLOCK)
                values = tl.load(inp + at, mask=mask)
                peer = tl.load(ranks + j)
                slot = half + (r * SENDERS + GROUP - 1 - i) * BLOCK
                rma.store(slot + lanes, values, cur_rank, peer, heap_bases, mask=mask)
        _raise_on_members(arrived, base + rounds + 1, cur_rank, ranks, my_index, GROUP, heap_bases)
        for i in tl.static_range(1, GROUP):
            peer = tl.load(ranks + (my_index + i) % GROUP)
            rma.wait_until(arrived + peer, "ge", base + rounds + 1, heap_bases=heap_bases, op=WAIT_OP)
        # 2. reduce our own tiles of the round with what every member sent.
        for r in tl.static_range(ROUND):
            column = first + r * programs
            own, mask = _tile(column, my_index, n, lanes, MODE, GROUP, BLOCK)
            total = ccl.accumulator(tl.load(inp + own, mask=mask))
            for i in tl.static_range(1, GROUP):
                sent = tl.load(half + (r * SENDERS + i - 1) * BLOCK + lanes, mask=mask)
                total = ccl.combine(total, ccl.accumulator(sent), OP)
            # 3. the result: into every member's output (all_reduce) or our own.
            result = total.to(out.dtype.element_ty)
            if MODE == "all_reduce":
                ccl.push_tile(out + own, result, cur_rank, ranks, my_index, GROUP, heap_bases, mask)
            else:
                tl.store(out + column * BLOCK + lanes, result, mask=mask)
        rounds += 1
    tl.debug_barrier()  # every warp has read ``base`` before it moves on
    tl.store(arrived + cur_rank, base + rounds)
    if MODE == "all_reduce":
        if rounds > 0:
            # Every member's results for our columns of this call have landed here once
            # its landed flag reaches our round count.
            landed = ccl.flag_row(flags, ccl.LANDED, pid, max_programs, world_size)
            _raise_on_members(landed, base + rounds, cur_rank, ranks, my_index, GROUP, heap_bases)
            for i in tl.static_range(1, GROUP):
                peer = tl.load(ranks + (my_index + i) % GROUP)
                rma.wait_until(landed + peer, "ge", base + rounds, heap_bases=heap_bases, op=WAIT_OP)


def tile_bytes(config, inp) -> int:
    """Bytes of one tile of a pushed call on ``inp`` (a receive slot holds one or more).

    Example:
        >>> runtime.protocol(errors, state, config, None, pushed_bytes=tile_bytes(config, inp))
    """
    return config.block_for(inp.element_size()) * inp.element_size()


def pushed_launch(runtime, state, mode: str, out, inp, n: int, config, op=None):
    """``(kernel, grid, args, num_warps)`` of a pushed ``mode`` call, for ``Runtime.prepare``.

    ``n`` is ``inp.numel()`` for ``all_reduce`` and ``out.numel()`` for ``reduce_scatter``.

    Example:
        >>> pushed_launch(runtime, state, "reduce_scatter", out, inp, out.numel(), config)
    """
    block = config.block_for(inp.element_size())
    tiles = triton.cdiv(n, block)
    columns = triton.cdiv(tiles, state.size) if mode == "all_reduce" else tiles
    grid = (runtime.programs(columns, config),)
    slots = runtime.push_slots().view(inp.dtype)
    reduction = op.value if op is not None else "sum"
    round_tiles = runtime.push_round_tiles(tile_bytes(config, inp))
    args = (out, inp, n, *runtime.group_args(state), block, reduction, slots, mode, round_tiles)
    return pushed_kernel, grid, args, config.num_warps
