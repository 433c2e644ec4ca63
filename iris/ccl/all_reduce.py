"""All-reduce in five algorithms, one kernel each, and the rule that picks between them.

* ``one_shot``: every rank reads every member's input and reduces all of it.
  One round of remote reads: the lowest latency, ``group_size`` times the traffic.
  In the whole-world group small calls instead send their input to every member
  with the low-latency protocol (:mod:`iris.ccl.low_latency`: one one-way trip),
  and calls up to the staging capacity run staged (:mod:`iris.ccl.staged`: one
  synchronisation instead of two); the input may then live anywhere
  (``Config.protocol``).
* ``two_shot``: tile ``t`` belongs to member ``t % group_size``, which reads the
  tile from every input, reduces it and pushes the result into every output
  (a reduce-scatter and an all-gather fused into one pass): the least traffic.
* ``ring``: the classic ``2 (group_size - 1)`` neighbour steps, pulling partial
  sums from the previous rank's output; per-tile step counters replace barriers.
* ``atomic``: every rank zeroes its output, then atomically adds its input into
  every member's output (fp32, int32, fp16 and bf16).
* ``spinlock``: every rank starts its output from its own input, then adds its input
  into every peer's output with plain loads and stores, holding a lock at that peer
  (upstream Iris's variant: any dtype and reduction, no atomics on the data). Program
  ``p`` of every member works on the same tiles, so one lock per program at each
  member serialises exactly the adders that touch the same tiles.

Inputs are read remotely by ``one_shot`` and ``two_shot`` (so they must be on
the heap); outputs are written remotely by ``two_shot``, ``atomic`` and ``spinlock``
and read remotely by ``ring`` and ``spinlock``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..device import rma
from ..errors import WorkspaceTooSmallError
from ..host.prepared import PreparedLaunch, tensor_key
from . import device as ccl
from .config import ReduceOp
from .device import RANK_ARGS
from .low_latency import payload_bytes
from .protocols import protocol_launch
from .pushed import tile_bytes
from .runtime import (
    REDUCIBLE_DTYPES,
    check_out_and_inp,
    describe_tensor,
    nbytes,
)


@triton.jit(do_not_specialize=RANK_ARGS)
def one_shot_kernel(
    out, inp, n, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr
):
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    for tile in range(pid, tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        total = ccl.reduce_tile(inp + offsets, cur_rank, ranks, my_index, GROUP, heap_bases, mask, OP)
        tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


@triton.jit(do_not_specialize=RANK_ARGS)
def two_shot_kernel(
    out, inp, n, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr
):
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    owned = (tl.cdiv(n, BLOCK) - my_index + GROUP - 1) // GROUP
    for k in range(pid, owned, tl.num_programs(0)):
        offsets = (k * GROUP + my_index) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        total = ccl.reduce_tile(inp + offsets, cur_rank, ranks, my_index, GROUP, heap_bases, mask, OP)
        ccl.push_tile(
            out + offsets, total.to(out.dtype.element_ty), cur_rank, ranks, my_index, GROUP, heap_bases, mask
        )
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


@triton.jit(do_not_specialize=RANK_ARGS)
def ring_kernel(
    out, inp, n, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr
):
    # Chunk c of every output is reduced around the ring and ends complete on member
    # c - 1; it then travels on around the ring. Step s (0 .. 2 GROUP - 2) of member
    # j touches chunk (j - s) mod GROUP, reading what the previous member wrote at
    # step s - 1, so each step waits only for the previous member's step counter.
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    steps = ccl.flag_row(flags, ccl.STEPS, pid, max_programs, world_size)
    base = tl.load(steps + cur_rank, volatile=True)
    tl.debug_barrier()  # all warps hold ``base`` before the first step overwrites it
    prev = tl.load(ranks + (my_index + GROUP - 1) % GROUP)
    nxt = tl.load(ranks + (my_index + 1) % GROUP)
    chunk_tiles = tl.cdiv(tl.cdiv(n, GROUP), BLOCK)
    for s in tl.static_range(2 * GROUP - 1):
        if s > 0:
            rma.wait_until(steps + prev, "ge", base + s, heap_bases=heap_bases)
        chunk = (my_index + GROUP - (s % GROUP)) % GROUP
        for k in range(pid, chunk_tiles, programs):
            offsets = (chunk * chunk_tiles + k) * BLOCK + tl.arange(0, BLOCK)
            mask = offsets < n
            if s == 0:
                tl.store(out + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
            elif s < GROUP:
                partial = rma.load(out + offsets, cur_rank, prev, heap_bases, mask=mask)
                mine = tl.load(inp + offsets, mask=mask)
                total = ccl.combine(ccl.accumulator(partial), ccl.accumulator(mine), OP)
                tl.store(out + offsets, total.to(out.dtype.element_ty), mask=mask)
            else:
                tl.store(
                    out + offsets, rma.load(out + offsets, cur_rank, prev, heap_bases, mask=mask), mask=mask
                )
        tl.store(steps + cur_rank, base + s + 1)
        if GROUP > 1:
            rma.signal(steps + cur_rank, 1, cur_rank, nxt, heap_bases, op="add")
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


@triton.jit(do_not_specialize=RANK_ARGS)
def atomic_kernel(
    out, inp, n, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr
):
    flags, ranks, world_size, max_programs, heap_bases = group
    tl.static_assert(OP == "sum", "the atomic all-reduce only sums")
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = tl.cdiv(n, BLOCK)
    # Program p of every member adds into the same tiles, so zeroing them here before
    # announcing readiness is enough; no grid-wide barrier is needed.
    for tile in range(pid, tiles, programs):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        tl.store(out + offsets, tl.zeros([BLOCK], out.dtype.element_ty), mask=offsets < n)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    for tile in range(pid, tiles, programs):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        values = tl.load(inp + offsets, mask=mask)
        for i in tl.static_range(GROUP):
            peer = tl.load(ranks + (my_index + i) % GROUP)
            rma.atomic_add(out + offsets, values, cur_rank, peer, heap_bases, mask=mask, sem="relaxed")
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


@triton.jit(do_not_specialize=RANK_ARGS)
def spinlock_kernel(
    out, inp, n, group, my_index, cur_rank, GROUP: tl.constexpr, BLOCK: tl.constexpr, OP: tl.constexpr
):
    flags, ranks, world_size, max_programs, heap_bases = group
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles = tl.cdiv(n, BLOCK)
    # Each output starts as its own input; peers may add into it only after that,
    # which the ready row of program p (the only program touching these tiles) says.
    for tile in range(pid, tiles, programs):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(out + offsets, tl.load(inp + offsets, mask=mask), mask=mask)
    ccl.handshake(flags, ccl.READY, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)
    lock = ccl.flag_row(flags, ccl.LOCKS, pid, max_programs, world_size)
    for tile in range(pid, tiles, programs):
        offsets = tile * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        mine = ccl.accumulator(tl.load(inp + offsets, mask=mask))
        for i in tl.static_range(1, GROUP):
            peer = tl.load(ranks + (my_index + i) % GROUP)
            ccl.acquire_lock(lock, cur_rank, peer, heap_bases, "iris.ccl.all_reduce")
            # Past this SM's L1: the previous holder wrote from another SM (or GPU).
            current = rma.load(out + offsets, cur_rank, peer, heap_bases, mask=mask, cache_modifier=".cg")
            total = ccl.combine(ccl.accumulator(current), mine, OP)
            rma.store(out + offsets, total.to(out.dtype.element_ty), cur_rank, peer, heap_bases, mask=mask)
            ccl.release_lock(lock, cur_rank, peer, heap_bases)
    ccl.handshake(flags, ccl.DONE, pid, max_programs, world_size, cur_rank, ranks, GROUP, heap_bases)


#: Element types with an atomic add on both backends (half precision rounds at every add, in
#: whatever order the members' adds land, so its results are not bit-identical between runs).
ATOMIC_DTYPES = (torch.float32, torch.int32, torch.float16, torch.bfloat16)
KERNELS = {
    "one_shot": one_shot_kernel,
    "two_shot": two_shot_kernel,
    "ring": ring_kernel,
    "atomic": atomic_kernel,
    "spinlock": spinlock_kernel,
}
#: Where each variant needs the tensors to be: (inp on the heap, out on the heap).
ON_HEAP = {
    "one_shot": (True, False),
    "two_shot": (True, True),
    "ring": (False, True),
    "atomic": (False, True),
    "spinlock": (False, True),
}


def pick_variant(config, nbytes: int, group_size: int) -> str:
    """The algorithm ``config.all_reduce_variant == "auto"`` resolves to.

    One-shot moves ``group_size - 1`` times the data of two-shot but saves a round
    of stores; it wins while latency dominates, which lasts longer in small groups.

    Example:
        >>> pick_variant(Config(), 64 << 10, 4)
        'one_shot'
    """
    if config.all_reduce_variant != "auto":
        return config.all_reduce_variant
    if config.protocol == "pushed":
        return "two_shot"  # the only variant with a pushed kernel
    limit = config.one_shot_max_bytes
    if limit is None:
        limit = (1 << 20) if group_size <= 4 else (256 << 10)
    return "one_shot" if nbytes <= limit else "two_shot"


@dataclass(frozen=True)
class AllReduceWorkspace:
    """What :func:`all_reduce_preamble` settled for a pair of tensors: the variant and launch.

    Pass it back as ``workspace=``. The buffers are the context's own, but a
    workspace records the tiles upstream Iris's lock (``spinlock``) or flag
    (``ring``) array would hold, and a call that reuses it for more tiles is refused
    as upstream refuses it (:func:`check_workspace`).

    Args:
        variant: the algorithm that runs.
        key: the prepared launch.
        shape, dtype: the input's.
        tiles: tiles of ``Config.block_size_m x block_size_n`` upstream's array would
            hold (0 for the variants where upstream keeps none).
    """

    variant: str
    key: tuple
    shape: tuple = ()
    dtype: torch.dtype | None = None
    tiles: int = 0


#: Upstream's per-tile array of each variant that keeps one, by upstream's name for it.
_TILE_ARRAYS = {"spinlock": "Lock", "ring": "Flags"}


def _upstream_tiles(inp, config) -> int:
    # Upstream tiles an (M, N) input in block_size_m x block_size_n; other shapes as (rows, rest).
    rows = inp.shape[0] if inp.dim() >= 2 else 1
    cols = inp.numel() // max(rows, 1)
    return triton.cdiv(rows, config.block_size_m) * triton.cdiv(cols, config.block_size_n)


def check_workspace(runtime, workspace, inp, group, config) -> None:
    """Refuse ``workspace`` as upstream Iris does: prepared for the variant, shape and
    dtype this call runs, but for fewer tiles than ``config``'s tiles make.

    Raises:
        TypeError: ``workspace`` is not an :class:`AllReduceWorkspace`.
        WorkspaceTooSmallError: too few tiles.

    Example:
        >>> ws = ctx.ccl.all_reduce_preamble(out, inp, config=Config(all_reduce_variant="ring"))
        >>> check_workspace(runtime, ws, inp, None, Config(all_reduce_variant="ring", block_size_m=32))
        Traceback (most recent call last):
        WorkspaceTooSmallError: Flags array too small: ...
    """
    if not isinstance(workspace, AllReduceWorkspace):
        raise TypeError(
            "iris.ccl.all_reduce: workspace must be what all_reduce_preamble returned, "
            f"got {type(workspace).__name__}"
        )
    variant = pick_variant(config, nbytes(inp), runtime.group(group).size)
    same_call = (workspace.variant, workspace.shape, workspace.dtype) == (
        variant,
        tuple(inp.shape),
        inp.dtype,
    )
    if same_call and variant in _TILE_ARRAYS:
        need = _upstream_tiles(inp, config)
        if 0 < workspace.tiles < need:
            raise WorkspaceTooSmallError(_TILE_ARRAYS[variant], workspace.tiles, need)


def all_reduce_preamble(runtime, out, inp, op=None, group=None, config=None) -> AllReduceWorkspace:
    """Check the arguments on every member, pick the variant, compile (see ``CCL.all_reduce_preamble``)."""
    op = ReduceOp.parse(op)
    state = runtime.group(group)
    variant = pick_variant(config, nbytes(inp), state.size)
    key = runtime.key("all_reduce", state, config, variant, op, tensor_key(out), tensor_key(inp))

    def prepare(errors: list[str]):
        ctx = runtime.ctx
        inp_on_heap, out_on_heap = ON_HEAP[variant]
        protocol = "direct"
        if variant == "one_shot":
            protocol = runtime.protocol(
                errors, state, config, nbytes(inp), payload_bytes(nbytes(inp), out, inp)
            )
        elif variant == "two_shot" and config.protocol in ("auto", "pushed"):
            protocol = runtime.protocol(
                errors, state, config, None, pushed_bytes=tile_bytes(config, inp), auto_pushes=True
            )
        elif config.protocol not in ("auto", "direct"):
            runs = "two_shot" if config.protocol == "pushed" else "one_shot"
            errors.append(f"protocol={config.protocol!r} runs only the {runs} variant, not {variant}")
        # Only the direct kernels read peers' inputs; pushed ones still store into outputs.
        inp_on_heap &= protocol == "direct"
        pair = dict(out_on_heap=out_on_heap, inp_on_heap=inp_on_heap, same_shape=True)
        if check_out_and_inp(errors, ctx, out, inp, REDUCIBLE_DTYPES, **pair):
            if variant == "atomic" and op is not ReduceOp.SUM:
                errors.append(f"the atomic variant only sums, not {op.name}")
            if variant == "atomic" and inp.dtype not in ATOMIC_DTYPES:
                added = "fp32, int32, fp16 or bf16"
                errors.append(f"the atomic variant adds {added}, not {inp.dtype}: pick another variant")
            if variant == "atomic" and inp.element_size() < 4 and ctx.spans_nodes:
                errors.append(
                    f"the atomic variant cannot add {inp.dtype} across nodes (NVSHMEM has no 16-bit atomics)"
                )
        signature = (
            describe_tensor(out, ctx, out_on_heap),
            describe_tensor(inp, ctx, protocol == "direct"),
            variant,
            op,
            config,
            protocol,
        )
        runtime.agree(state, signature, errors, "all_reduce")
        block = config.block_for(inp.element_size())
        launch = protocol_launch(protocol, runtime, state, "all_reduce", out, inp, inp.numel(), config, op)
        if launch is not None:
            return launch
        tiles = triton.cdiv(inp.numel(), block)
        if variant in ("two_shot", "ring"):
            tiles = triton.cdiv(tiles, state.size)
        grid = (runtime.programs(tiles, config),)
        args = (out, inp, inp.numel(), *runtime.group_args(state), block, op.value)
        return KERNELS[variant], grid, args, config.num_warps

    runtime.prepare(key, prepare)
    tiles = _upstream_tiles(inp, config) if variant in _TILE_ARRAYS else 0
    return AllReduceWorkspace(variant, key, tuple(inp.shape), inp.dtype, tiles)


def all_reduce(runtime, out, inp, op=None, group=None, config=None) -> PreparedLaunch:
    """Reduce every member's ``inp`` into ``out`` on every member; see :meth:`iris.ccl.CCL.all_reduce`."""
    return runtime.launch(all_reduce_preamble(runtime, out, inp, op, group, config).key)
