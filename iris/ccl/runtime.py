"""What every collective shares on the host: group state, argument checks and fast launches.

A collective call is keyed by everything that shapes its launch (tensors'
addresses, shapes, strides and dtypes, the group, the config, whether tracing is
compiled in). The first call with a key checks the arguments on every member and
compiles; later calls with the same key go straight to the compiled kernel, so a
small collective costs a few microseconds of host time. A call that repeats the
previous call of the same collective with the very same tensor objects (unchanged
address, shape and strides) and options skips even the key (:meth:`Runtime.call`):
the common case of a training or decode loop.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..host.distributed.helpers import extract_group_info as group_info
from ..host.group_slots import GroupSlots
from ..host.prepared import LaunchCache, PreparedLaunch
from ..host.tracing import kernel_artifacts
from .device import PHASES

#: Groups whose collectives can be in use at once (slot 0 is the whole world).
GROUP_SLOTS = 16

#: Prepared launches kept (oldest dropped first); each holds its tensors.
MAX_LAUNCHES = 256
#: Most bytes a staged collective stages (see ``iris.ccl.staged`); capped at heap_size / 64.
STAGING_BYTES = 1 << 20
#: Most payload bytes a low-latency call sends each member (``iris.ccl.low_latency`);
#: capped so that the receive slots take at most heap_size / 32.
LOW_LATENCY_BYTES = 256 << 10
#: Bytes of one receive slot of a pushed call (``iris.ccl.pushed`): the tiles one member
#: sends another in one round; capped so that the slots take at most heap_size / 16.
PUSH_SLOT_BYTES = 64 << 10
#: At most this many tiles per round and member in a pushed call.
PUSH_ROUND_TILES = 4
#: ``Config.protocol="auto"`` pushes reduce_scatter calls past the staging capacity up to
#: this many input bytes per member, and two-shot all_reduce calls of any size. Measured on
#: 4 x H200 (eager, sweep `tune_pushed_h200x4`): reduce_scatter 4 MiB
#: 25 us pushed against 33 direct (NCCL 46), 16 MiB 54 against 64 (NCCL 61); from 64 MiB
#: the two are within 1% (256 MiB: 640 against 633 us). all_reduce pushed wins at every
#: size: 16 MiB 91 against 102 us, 256 MiB 1158 against 1277 (NCCL 1183).
REDUCE_SCATTER_PUSHED_AUTO_BYTES = 16 << 20
#: ``Config.protocol="auto"`` uses the low-latency protocol up to this many bytes per member.
LOW_LATENCY_AUTO_BYTES = 256 << 10

#: Element types the data-moving collectives accept; reductions accept the first four.
REDUCIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int32)
COPYABLE_DTYPES = REDUCIBLE_DTYPES + (torch.float64, torch.int64, torch.int16, torch.int8, torch.uint8)


class CollectiveError(ValueError):
    """Arguments that would make a collective wrong or hang, reported on every member."""


@dataclass
class Group:
    """One group's members and flag rows, as the kernels see them."""

    members: tuple[int, ...]
    ranks: torch.Tensor  # int32 member ranks, on the device
    my_index: int
    flags: torch.Tensor  # int32 [PHASES, max_programs, world_size] on the heap
    process_group: object

    @property
    def size(self) -> int:
        return len(self.members)


class Runtime:
    """The collectives' shared state on one rank (created with the :class:`~iris.Iris` object)."""

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self.ctx = weakref.proxy(ctx)
        self.max_programs = ctx.get_cu_count()
        # In the heap's reserved region, carved at start-up on every rank: subgroups that
        # only some ranks use cannot make the heap asymmetric, and the user's heap_size
        # bytes stay the user's.
        self.flags = ctx.heap.reserve(*self.flag_piece(ctx.num_ranks, self.max_programs))
        self._slots = GroupSlots(GROUP_SLOTS, ctx.num_ranks, "collective")
        self._groups: dict[object, Group] = {}
        self._launches = LaunchCache(MAX_LAUNCHES)
        #: Per collective: the last call's tensors (object, address, shape, strides), options, launch.
        self._recent: dict[str, tuple] = {}
        self._staging: torch.Tensor | None = None
        self._low_latency: torch.Tensor | None = None
        self._push_slots: torch.Tensor | None = None
        #: Calls of the staged and low-latency protocols so far, and programs done with the
        #: current one: both protocols take turns on their halves by this one count.
        self.protocol_calls = torch.zeros(2, dtype=torch.int32, device=ctx.get_device())

    @staticmethod
    def flag_piece(world_size: int, max_programs: int) -> tuple[tuple[int, ...], torch.dtype]:
        """``(shape, dtype)`` of the flag rows of every group slot (reserved on the heap at start-up).

        Example:
            >>> Runtime.flag_piece(4, 132)
            ((16, 6, 132, 4), torch.int32)
        """
        return (GROUP_SLOTS, PHASES, max_programs, world_size), torch.int32

    def protocol(
        self,
        errors: list[str],
        state: Group,
        config,
        staged_bytes,
        low_latency_bytes=None,
        pushed_bytes=None,
        auto_pushes=False,
    ) -> str:
        """The protocol a call runs (``Config.protocol`): ``"low_latency"``, ``"staged"``,
        ``"pushed"`` or ``"direct"``.

        ``staged_bytes`` is what a member would stage, or None for a collective
        without a staged kernel; ``low_latency_bytes`` what it sends one member
        under the low-latency protocol, or None where that protocol does not apply
        (a broadcast, or blocks that are not whole aligned 4-byte words);
        ``pushed_bytes`` the bytes of one tile of a pushed call, or None for a call
        without a pushed kernel, and ``auto_pushes`` whether ``"auto"`` pushes it
        where it can (where pushing wins: see
        :data:`REDUCE_SCATTER_PUSHED_AUTO_BYTES`). A forced protocol that
        cannot run appends to ``errors``. Callers put the choice in the signature the
        members compare: it hangs on tensor alignment, which may differ between ranks.

        Example:
            >>> runtime.protocol(errors, state, Config(), inp.numel() * inp.element_size())
            'staged'
        """
        whole_world = state.process_group is None
        low_latency = (
            whole_world
            and low_latency_bytes is not None
            and low_latency_bytes <= self._low_latency_capacity()
        )
        staged = whole_world and staged_bytes is not None and staged_bytes <= self._staging_capacity()
        pushed = whole_world and pushed_bytes is not None and pushed_bytes <= self._push_slot_bytes()
        if config.protocol == "auto":
            limit = config.low_latency_max_bytes
            limit = LOW_LATENCY_AUTO_BYTES if limit is None else limit
            if low_latency and low_latency_bytes <= limit:
                return "low_latency"
            if staged:
                return "staged"
            if pushed and auto_pushes:
                return "pushed"
            return "direct"
        possible = {"low_latency": low_latency, "staged": staged, "pushed": pushed, "direct": True}
        if not possible[config.protocol]:
            if not whole_world:
                why = "it runs only in the whole-world group (group=None)"
            elif config.protocol == "pushed" and pushed_bytes is None:
                why = "only all_reduce (two_shot) and reduce_scatter have a pushed kernel"
            elif config.protocol == "pushed":
                why = (
                    f"its slots hold tiles of at most {self._push_slot_bytes()} bytes (this call's: "
                    f"{pushed_bytes}); they take at most 1/16 of the heap: use a larger heap or a "
                    "smaller Config.block_size"
                )
            elif config.protocol == "staged" and staged_bytes is None:
                why = "this collective has no staged kernel"
            elif config.protocol == "staged":
                why = f"it stages at most {self._staging_capacity()} bytes (this call: {staged_bytes})"
            elif low_latency_bytes is None:
                why = "it needs blocks of whole, 4-byte-aligned words (and broadcast has no such kernel)"
            else:
                why = (
                    f"it sends at most {self._low_latency_capacity()} bytes to each member "
                    f"(this call: {low_latency_bytes})"
                )
            errors.append(f"protocol={config.protocol!r} cannot run this call: {why}")
        return config.protocol

    def _staging_capacity(self) -> int:
        return min(STAGING_BYTES, self.ctx.heap_size // 64) // 256 * 256

    def _push_slot_count(self) -> int:
        # Two halves per program and sender: a member receives from every other member.
        return 2 * self.max_programs * max(self.ctx.num_ranks - 1, 1)

    def _push_slot_bytes(self) -> int:
        # All slots together take at most 1/16 of the heap.
        return min(PUSH_SLOT_BYTES, self.ctx.heap_size // (16 * self._push_slot_count())) // 256 * 256

    def push_round_tiles(self, tile_bytes: int) -> int:
        """Tiles of ``tile_bytes`` that a pushed call moves per round and member (0: none fit).

        Example:
            >>> runtime.push_round_tiles(16 << 10)  # 1 GiB heap, 132 SMs, 4 ranks
            4
        """
        return min(PUSH_ROUND_TILES, self._push_slot_bytes() // tile_bytes)

    def push_slots(self) -> torch.Tensor:
        """The receive slots of :mod:`iris.ccl.pushed` (bytes), allocated on first use.

        Call it only after the members agreed on a pushed call, so that every rank
        allocates at the same point. The contents need no zeroing: flags guard them.
        """
        if self._push_slots is None:
            total = self._push_slot_count() * self._push_slot_bytes()
            self._push_slots = self.ctx.empty(total, dtype=torch.uint8)
        return self._push_slots

    def _low_latency_capacity(self) -> int:
        # Two halves of a slot per rank, each word sent as two: at most 1/32 of the heap.
        return min(LOW_LATENCY_BYTES, self.ctx.heap_size // (128 * self.ctx.num_ranks)) // 64 * 64

    def staging_buffer(self) -> torch.Tensor:
        """The two staging halves of :mod:`iris.ccl.staged` (bytes), allocated on first use.

        Call it only after the members agreed on a staged call: every rank then
        allocates at the same point, keeping the heap symmetric.
        """
        if self._staging is None:
            self._staging = self.ctx.zeros(2 * self._staging_capacity(), dtype=torch.uint8)
        return self._staging

    def low_latency_slots(self) -> torch.Tensor:
        """The receive slots of :mod:`iris.ccl.low_latency`: int64 ``[2, world_size, words]``.

        Allocated and zeroed on first use, after the members agreed on a
        low-latency call; the barrier keeps a fast member's first words from being
        zeroed by a slow member.
        """
        if self._low_latency is None:
            words = self._low_latency_capacity() // 4
            self._low_latency = self.ctx.zeros(2, self.ctx.num_ranks, words, dtype=torch.int64)
            self.ctx.barrier()
        return self._low_latency

    def group(self, process_group) -> Group:
        """The :class:`Group` for a torch process group (``None`: every rank)."""
        state = self._groups.get(process_group)
        if state is None:
            members = self.ctx._group_members(process_group)
            state = Group(
                members=members,
                ranks=torch.tensor(members, dtype=torch.int32, device=self.ctx.get_device()),
                my_index=members.index(self.ctx.cur_rank),
                flags=self.flags[self._slots.slot(members)],
                process_group=process_group,
            )
            self._groups[process_group] = state
        return state

    def group_args(self, state: Group) -> tuple:
        """The arguments every collective kernel takes after its own: ``group, my_index, cur_rank, GROUP``.

        ``group`` packs what every member passes alike (flags, the members' ranks, the world
        size, programs per call, heap bases); the member's index and rank stay apart, as
        :data:`iris.ccl.device.RANK_ARGS` keeps them unspecialised (Triton specialises the
        elements of a tuple whatever ``do_not_specialize`` says), so every rank runs the same
        compiled kernel.

        Example:
            >>> args = (out, inp, inp.numel(), *runtime.group_args(state), block)
        """
        ctx = self.ctx
        group = (state.flags, state.ranks, ctx.num_ranks, self.max_programs, ctx._heap_bases_for_iris())
        return group, state.my_index, ctx.cur_rank, state.size

    def key(self, name: str, state: Group, config, *parts) -> tuple:
        """The launch-cache key of a call (tracing on or off compiles different kernels)."""
        return (name, state.members, config.key(), self.ctx.tracing.enabled, *parts)

    def runs_gluon(self, config) -> bool:
        """Whether a direct-protocol launch takes its Gluon kernel (:mod:`iris.ccl.gluon`): where
        ``config.use_gluon`` asks for it and the backend compiles kernels (the interpreter runs no Gluon).

        Example:
            >>> runtime.runs_gluon(Config(use_gluon=True))   # on GPUs
            True
        """
        return config.use_gluon and not self.ctx.backend.interpreted

    def programs(self, tiles: int, config) -> int:
        """How many programs a launch over ``tiles`` tiles uses."""
        cap = min(config.comm_sms or self.max_programs, self.max_programs)
        return max(1, min(tiles, cap))

    def prepare(self, key: tuple, prepare: Callable[[list[str]], tuple]) -> None:
        """Make the launch for ``key`` ready; ``prepare`` runs only the first time.

        ``prepare(errors)`` checks the arguments, appending each problem to ``errors``, which
        :meth:`agree` raises on every member alike, and returns ``(kernel, grid, args, num_warps)``.

        Example:
            >>> runtime.prepare(key, lambda errors: (kernel, (programs,), args, 8))
        """

        def build() -> PreparedLaunch:
            kernel, grid, args, num_warps = prepare([])
            return PreparedLaunch(kernel, grid, args, {"num_warps": num_warps})

        self._launches.get_or_build(key, build)

    def prepare_and_launch(self, key: tuple, prepare: Callable[[list[str]], tuple]) -> PreparedLaunch:
        """:meth:`prepare` then :meth:`launch`: what a collective's host entry ends with.

        Example:
            >>> return runtime.prepare_and_launch(key, prepare)
        """
        self.prepare(key, prepare)
        return self.launch(key)

    def launch(self, key: tuple) -> PreparedLaunch:
        """Launch the prepared collective ``key`` on the current stream; returns that launch."""
        launch = self._launches[key]
        launch()
        return launch

    def call(self, name: str, run: Callable[[], PreparedLaunch], tensors: tuple, options: tuple) -> None:
        """Run collective ``name`` (``run`` checks, prepares and launches it, returning the launch),
        or replay its previous call.

        The previous call's launch is replayed when ``tensors`` are the same objects
        with the same address, shape and strides, and ``options`` (op, group, config,
        ...) and the tracing state are the same: nothing that shapes the launch can
        then differ, so the key need not be built.

        Example:
            >>> run = lambda: all_reduce(runtime, out, inp)
            >>> runtime.call("all_reduce", run, (out, inp), (op, group, config))
        """
        options = (*options, self.ctx.tracing.enabled)
        recent = self._recent.get(name)
        if recent is not None and recent[1] == options:
            described, _, launch = recent
            # A plain loop, not all(...): this is the whole host cost of a replayed call.
            for tensor, (same, address, shape, strides) in zip(tensors, described):
                if tensor is not same or tensor.data_ptr() != address or tensor.shape != shape:
                    break
                if tensor.stride() != strides:
                    break
            else:
                launch()
                return
        with kernel_artifacts.filed_under(name):  # IRIS_KERNEL_ARTIFACTS_DIR: by collective
            launch = run()
        described = tuple((t, t.data_ptr(), t.shape, t.stride()) for t in tensors)
        self._recent[name] = (described, options, launch)

    def agree(self, group: Group, signature: tuple, errors: list[str], what: str) -> None:
        """Raise :class:`CollectiveError` on every member if any member found an error or differs.

        ``signature`` is what must be identical on every member (shapes, dtypes,
        heap offsets, config); ``errors`` this rank's own findings.
        """
        if group.size == 1 and not errors:
            return
        mine = (self.ctx.cur_rank, signature, errors)
        if group.process_group is None:
            everyone = self.ctx._comm.all_gather_object(mine)
        else:
            everyone = [None] * group.size
            dist.all_gather_object(everyone, mine, group=group.process_group)
        problems = [f"rank {rank}: {error}" for rank, _, rank_errors in everyone for error in rank_errors]
        reference_rank, reference = everyone[0][0], everyone[0][1]
        for rank, other, _ in everyone[1:]:
            if other != reference:
                problems.append(f"rank {rank} called it with {other}, rank {reference_rank} with {reference}")
        if problems:
            raise CollectiveError(f"iris.ccl.{what}: " + "; ".join(problems))


def nbytes(tensor) -> int:
    """Bytes of ``tensor``'s elements (0 for a non-tensor: the argument checks report it)."""
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


def describe_tensor(tensor: torch.Tensor, ctx, placed: bool = True) -> tuple:
    """What must match across ranks about ``tensor`: shape, dtype and, if peers reach it
    (``placed`), its heap offset (or None)."""
    if not placed:
        return (tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""))
    offset = ctx.heap.offset_of(tensor) if ctx.is_symmetric(tensor) else None
    return (tuple(tensor.shape), str(tensor.dtype).replace("torch.", ""), offset)


def check_tensor(errors: list[str], ctx, tensor, name: str, dtypes, on_heap: bool) -> bool:
    """Append what is wrong with ``tensor`` to ``errors``; True when it is usable."""
    if not isinstance(tensor, torch.Tensor):
        errors.append(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        return False
    before = len(errors)
    if tensor.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        errors.append(f"{name} has dtype {str(tensor.dtype).replace('torch.', '')}; supported: {names}")
    if not tensor.is_contiguous():
        errors.append(f"{name} must be contiguous")
    if on_heap and not ctx.is_symmetric(tensor):
        errors.append(
            f"{name} is not on the symmetric heap (allocate it with ctx.empty/zeros/...: peers must reach it)"
        )
    elif tensor.device != ctx.get_device():
        errors.append(f"{name} is on {tensor.device}, this rank's device is {ctx.get_device()}")
    return len(errors) == before


def check_out_and_inp(
    errors: list[str], ctx, out, inp, dtypes, *, out_on_heap: bool, inp_on_heap: bool, same_shape=False
) -> bool:
    """Append what is wrong with a collective's ``out`` and ``inp`` to ``errors``.

    Each must be usable (:func:`check_tensor`), the two of one dtype (and, with
    ``same_shape``, one shape) and apart in memory. True when both are tensors of one
    dtype (and shape), so that the caller's checks of their sizes can run.

    Example:
        >>> errors = []
        >>> if check_out_and_inp(errors, ctx, out, inp, COPYABLE_DTYPES, out_on_heap=True, inp_on_heap=False):
        ...     check_sizes(errors, out, inp)
    """
    usable = check_tensor(errors, ctx, out, "out", dtypes, on_heap=out_on_heap)
    usable &= check_tensor(errors, ctx, inp, "inp", dtypes, on_heap=inp_on_heap)
    if not usable:
        return False
    check_disjoint(errors, out, inp, "out and inp")
    if same_shape and (out.dtype, out.shape) != (inp.dtype, inp.shape):
        errors.append(f"out is {out.dtype} {tuple(out.shape)} but inp is {inp.dtype} {tuple(inp.shape)}")
        return False
    if out.dtype != inp.dtype:
        errors.append(f"out is {out.dtype} but inp is {inp.dtype}")
        return False
    return True


def check_parts(errors: list[str], whole, whole_name: str, part, part_name: str, parts: int) -> None:
    """Append an error unless ``whole`` holds ``parts`` times the elements of ``part``.

    Example:
        >>> check_parts(errors, out, "out", inp, "inp", group_size)  # all_gather
    """
    if whole.numel() != parts * part.numel():
        errors.append(
            f"{whole_name} has {whole.numel()} elements; a group of {parts} needs "
            f"{parts} x {part_name}.numel() = {parts * part.numel()}"
        )


def check_disjoint(errors: list[str], a: torch.Tensor, b: torch.Tensor, names: str) -> None:
    """Append an error when ``a`` and ``b`` share memory."""
    a_start, b_start = a.data_ptr(), b.data_ptr()
    a_end = a_start + a.numel() * a.element_size()
    b_end = b_start + b.numel() * b.element_size()
    if a_start < b_end and b_start < a_end:
        errors.append(f"{names} overlap; this collective needs separate input and output")


def extract_group_info(group, ctx) -> tuple[int, int, int, int, int]:
    """Upstream's ``iris.ccl.utils.extract_group_info`: ``iris.host.distributed.helpers``'s, for ``ctx``.

    Example:
        >>> rank_in_group, rank, size, start, stride = extract_group_info(group, ctx)
    """
    return group_info(group, ctx.get_rank(), ctx.get_num_ranks())
