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
in *rounds*; its round count only grows across calls (kept in this rank's own
arrived slot, ``arrived[p][cur_rank]``), so the flags need no reset and CUDA
graphs replay the kernel. Round ``q`` uses half ``q % 2`` of the program's
slots. A sender rewrites a half at round ``q + 2`` only after its own round
``q + 1``, which waited for every member's round ``q + 1`` arrival, which each
member raised only after reducing round ``q``: two halves are enough, with no
acknowledgement.

Inputs are only read by their own rank, so nothing guards them at the end. A
member's arrival in this call also tells that it entered the call, so the results
of step 3 never land in an output its rank still reads. Only ``all_reduce`` keeps
one handshake: each program's *landed* flag, raised on every member after its last
results, so no rank returns before its output is complete.

The receive slots are shared by every pushed call and the round counts must agree
between ranks, so, like the staged protocol, only the whole-world group pushes.

What it buys is the handshakes, not bandwidth: measured on 4 x H200 it wins up to
16 MiB and loses from 64 MiB, where each round's fence and arrival wait, which stall
the program, add up (``runtime.PUSHED_AUTO_BYTES``).
"""

import triton
import triton.language as tl

from ..device import intrinsics as hw
from ..device import rma
from . import device as ccl
from .device import RANK_ARGS

#: What a pushed call computes (``pushed_kernel``'s ``MODE``).
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
    # wrote: one system fence for all members, then relaxed sets (as ``barrier.arrive``).
    hw.fence_system()
    for i in tl.static_range(1, GROUP):
        peer = tl.load(ranks + (my_index + i) % GROUP)
        rma.signal(row + cur_rank, value, cur_rank, peer, heap_bases, sem="relaxed")


@triton.jit(do_not_specialize=RANK_ARGS)
def pushed_kernel(
    out,
    inp,
    n,
    flags,
    ranks,
    my_index,
    cur_rank,
    world_size,
    max_programs,
    heap_bases,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    OP: tl.constexpr,
    slots,
    MODE: tl.constexpr,
):
    """One pushed ``all_reduce`` (``n`` elements) or ``reduce_scatter`` (``n`` output elements per member).

    ``slots`` holds ``[max_programs, 2, GROUP, BLOCK]`` elements on every member.

    Example:
        >>> kernel, grid, args, num_warps = pushed_launch(runtime, state, "all_reduce", out, inp,
        ...                                               inp.numel(), config)
        >>> kernel[grid](*args, num_warps=num_warps)
    """
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
    program_slots = slots + pid * (2 * GROUP * BLOCK)
    rounds = 0
    for column in range(pid, columns, programs):
        half = program_slots + (base + rounds) % 2 * (GROUP * BLOCK)
        # 1. scatter: member j's tile of this column goes into our slot on member j.
        for i in tl.static_range(1, GROUP):
            j = (my_index + i) % GROUP
            at, mask = _tile(column, j, n, lanes, MODE, GROUP, BLOCK)
            values = tl.load(inp + at, mask=mask)
            peer = tl.load(ranks + j)
            rma.store(half + my_index * BLOCK + lanes, values, cur_rank, peer, heap_bases, mask=mask)
        _raise_on_members(arrived, base + rounds + 1, cur_rank, ranks, my_index, GROUP, heap_bases)
        # 2. reduce our own tile of the column with what every member sent.
        own, mask = _tile(column, my_index, n, lanes, MODE, GROUP, BLOCK)
        total = ccl._accumulator(tl.load(inp + own, mask=mask))
        for i in tl.static_range(1, GROUP):
            peer = tl.load(ranks + (my_index + i) % GROUP)
            rma.wait_until(arrived + peer, "ge", base + rounds + 1, heap_bases=heap_bases, op=WAIT_OP)
            sent = tl.load(half + ((my_index + i) % GROUP) * BLOCK + lanes, mask=mask)
            total = ccl.combine(total, ccl._accumulator(sent), OP)
        # 3. the result: into every member's output (all_reduce) or our own.
        if MODE == "all_reduce":
            ccl.push_tile(
                out + own, total.to(out.dtype.element_ty), cur_rank, ranks, my_index, GROUP, heap_bases, mask
            )
        else:
            tl.store(out + column * BLOCK + lanes, total.to(out.dtype.element_ty), mask=mask)
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
    """Bytes of one tile, and so of one receive slot, of a pushed call on ``inp``.

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
    args = (out, inp, n, *runtime.group_args(state), block, reduction, slots, mode)
    return pushed_kernel, grid, args, config.num_warps
