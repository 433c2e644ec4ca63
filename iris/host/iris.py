"""The host API: ``iris.iris(heap_size)`` gives each rank an :class:`Iris` object.

It owns the symmetric heap, makes tensors on it with torch's conventions, and
hands kernels what they need to reach every peer (``get_heap_bases()`` for the
functional device API, ``get_device_context()`` for :class:`DeviceContext`).
"""

from __future__ import annotations

import os
import weakref

import numpy as np
import torch
import torch.distributed as dist

from iris_trace import flight_file as fmt

from .. import config
from ..backends import make_backend
from ..ccl import CCL
from ..ccl.runtime import Runtime
from ..device import crossnode, layout, wake
from ..device.barrier import device_barrier_kernel
from .copy_engine import CopyEngine
from .distributed.helpers import init_distributed
from .group_slots import GroupSlots
from .hang import Hang
from .log import DEBUG, ERROR, INFO, WARNING, log_with_rank
from .memory import tensors
from .memory.heap import SymmetricHeap
from .prepared import PreparedLaunch
from .tracing import kernel_artifacts
from .tracing.core import Tracing

#: Device-barrier groups that can be live at once (slot 0 is the whole world).
BARRIER_SLOTS = 64


class DeviceName(str):
    """A device as upstream Iris names it (``"cuda:0"``; ``"cpu"`` under emulation).

    A ``str``, so upstream code that formats or compares it keeps working, that also
    has ``torch.device``'s ``type`` and ``index`` and compares equal to the
    ``torch.device`` it names.

    Example:
        >>> ctx.device, ctx.device.index, ctx.device == torch.device("cuda:0")
        ('cuda:0', 0, True)
    """

    __slots__ = ()

    @property
    def type(self) -> str:
        return torch.device(str(self)).type

    @property
    def index(self) -> int | None:
        return torch.device(str(self)).index

    def __eq__(self, other) -> bool:
        if isinstance(other, torch.device):
            return torch.device(str(self)) == other
        return str.__eq__(self, other)

    def __ne__(self, other) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


class Iris:
    """One rank's handle on the symmetric heap and the ranks around it.

    Creating it is collective: every rank must call it with the same ``heap_size``.

    Args:
        heap_size (int): bytes of symmetric heap per rank. Default: 1 GiB.
        allocator_type (str): ``"torch"`` (default) or ``"vmem"``, as upstream Iris: on GPUs,
            ``"vmem"`` makes the heap of CUDA virtual memory, with room after it into which
            :meth:`as_symmetric` maps memory allocated outside the heap; elsewhere both are
            the backend's one heap.

    Example:
        >>> import iris
        >>> ctx = iris.iris(heap_size=1 << 30)
        >>> x = ctx.zeros(1024, dtype=torch.float32)
        >>> print(f"rank {ctx.get_rank()} of {ctx.get_num_ranks()}")
    """

    def __init__(self, heap_size: int = 1 << 30, allocator_type: str = "torch"):
        if allocator_type not in ("torch", "vmem"):
            raise ValueError(f"iris: allocator_type must be 'torch' or 'vmem', got {allocator_type!r}")
        # What the context must give back (heap, mappings, flight file, watchdog) is held
        # apart from it, so that dropping the last reference to the context releases it all
        # (the finalizer), also when this constructor fails half-way; close() does the same
        # after a barrier, at a point every rank agrees on.
        self._resources = _Resources()
        self._finalizer = weakref.finalize(self, self._resources.release)
        self._finalizer.atexit = (
            False  # at exit: iris.host.hang removes the files; the process frees the rest
        )
        try:
            self._build(heap_size, allocator_type)
        except BaseException:
            self._finalizer()
            raise

    def _build(self, heap_size: int, allocator_type: str) -> None:
        self.backend = make_backend(config.BACKEND, cross_node=config.SCALE_OUT, allocator=allocator_type)
        self._comm = init_distributed(self.backend.dist_backend)
        self.cur_rank = self._comm.rank
        kernel_artifacts.set_rank(self.cur_rank)
        self.num_ranks = self._comm.world_size
        #: Ranks per node (``IRIS_RANKS_PER_NODE``, else the launcher's): rank r is on node
        #: ``r // ranks_per_node``; peers of other nodes are reached through NVSHMEM.
        self.ranks_per_node = _ranks_per_node(self.num_ranks)
        self.backend.check_nodes(self.node_of(self.num_ranks - 1) + 1)
        device = self.backend.select_device(self._comm.local_rank, self._comm.local_world_size)
        #: This rank's device as upstream Iris gives it, the string ``"cuda:N"`` (see
        #: :class:`DeviceName`); :meth:`get_device` gives the ``torch.device``.
        self.device = DeviceName(device)
        self.gpu_id = device.index if device.index is not None else 0
        self.heap_size = heap_size
        #: Whether other ranks of this job run on this rank's GPU too (``IRIS_RANKS_PER_GPU``):
        #: right for correctness runs and traces, never for timings.
        self.gpu_shared = self.backend.shares_devices(self._comm.local_world_size)
        # Iris's own state lives in the heap's reserved region, the same on every rank:
        # the device barrier's arrivals (here), the collectives' flags (ccl.Runtime).
        barrier_piece = ((BARRIER_SLOTS, self.num_ranks), torch.int64)
        sm_count = self.backend.multiprocessor_count(device)
        flag_piece = Runtime.flag_piece(self.num_ranks, sm_count)
        # Jobs that span nodes stage blocks of register values there (iris.device.crossnode).
        staging_pieces = crossnode.staging_pieces(sm_count) if config.SCALE_OUT else []
        reserved = SymmetricHeap.footprint([barrier_piece, flag_piece, *staging_pieces])
        self.heap = SymmetricHeap(heap_size, self.backend, self._comm, device, reserved)
        self._resources.heap = self.heap
        self._barrier_arrivals = self.heap.reserve(*barrier_piece)
        self._barrier_slots = GroupSlots(
            BARRIER_SLOTS, self.num_ranks, "device_barrier", "use a different group layout or a host barrier"
        )
        self._barrier_launches: dict[tuple, PreparedLaunch] = {}
        self._wake_launch: PreparedLaunch | None = None
        #: Device-side collectives (``ctx.ccl.all_reduce(out, inp)``); see :mod:`iris.ccl`.
        self.ccl = CCL(self)
        #: Copy-engine puts into peers' heaps (``ctx.copy_engine.put``); see :mod:`iris.host.copy_engine`.
        self.copy_engine = CopyEngine(self)

        # The heap size slot bounds IRIS_DEBUG's pointer checks: in the user's context, exactly the
        # bytes the user may address (a store past them would reach Iris's reserved region);
        # Iris's own kernels take a copy that also covers the reserved region (_iris_context).
        context = [self.cur_rank, self.num_ranks, *self.heap.bases]
        context += [0] * (layout.context_length(self.num_ranks) - len(context))
        context[layout.heap_size_slot(self.num_ranks)] = self.heap.size
        context[layout.ranks_per_node_slot(self.num_ranks)] = self.ranks_per_node
        if staging_pieces:
            area, flags = (self.heap.reserve(*piece) for piece in staging_pieces)
            staging = {layout.STAGING_AREA: area.data_ptr(), layout.STAGING_FLAGS: flags.data_ptr()}
            staging[layout.STAGING_COUNT] = area.shape[0]
            for slot, value in staging.items():
                context[layout.staging_slot(self.num_ranks, slot)] = value
        self._device_context = torch.tensor(context, dtype=torch.int64, device=device)
        self.heap_bases = self._device_context[layout.heap_bases_slots(self.num_ranks)].view(torch.uint64)
        context[layout.heap_size_slot(self.num_ranks)] = self.heap.mapped_size
        self._iris_context = torch.tensor(context, dtype=torch.int64, device=device)
        self._iris_heap_bases = self._iris_context[layout.heap_bases_slots(self.num_ranks)].view(torch.uint64)
        #: Wait timeouts, flight recorder and hang reports; see :class:`iris.host.hang.Hang`.
        self.hang = Hang(self)
        self._resources.hang = self.hang
        self.hang.recorder.name_region(
            "device_barrier slot {0}, arrivals of rank {1}", self._barrier_arrivals, releaser_axis=1
        )
        #: Tracing control (``ctx.tracing.enable()``); see :class:`iris.host.tracing.core.Tracing`.
        self.tracing = Tracing(self)
        self.barrier()

    # ------------------------------------------------------------------ identity
    def get_rank(self) -> int:
        """This process's rank.

        Example:
            >>> ctx.get_rank()
            0
        """
        return self.cur_rank

    def get_num_ranks(self) -> int:
        """Number of ranks (world size).

        Example:
            >>> ctx.get_num_ranks()
            4
        """
        return self.num_ranks

    def node_of(self, rank: int) -> int:
        """The node ``rank`` runs on (``rank // ranks_per_node``; 0 for every rank within one node).

        Example:
            >>> ctx.node_of(ctx.get_rank()) == ctx.node_of(peer)   # reached through mapped memory?
        """
        return rank // self.ranks_per_node

    @property
    def spans_nodes(self) -> bool:
        """Whether the job's ranks are on more than one node (ops to some peers go through NVSHMEM).

        Example:
            >>> ctx.spans_nodes
            False
        """
        return self.ranks_per_node < self.num_ranks

    def get_device(self) -> torch.device:
        """The device this rank's heap lives on (``cuda:N``, or ``cpu`` under emulation).

        Example:
            >>> x = torch.randn(8, device=ctx.get_device())
        """
        return self.heap.device

    def get_device_id(self) -> int:
        """Index of this rank's GPU (0 under emulation).

        Example:
            >>> torch.cuda.set_device(ctx.get_device_id())
        """
        return self.gpu_id

    def get_cu_count(self) -> int:
        """Streaming multiprocessors of this rank's GPU (virtual ones under emulation).

        Example:
            >>> grid = (ctx.get_cu_count(),)
        """
        return self.backend.multiprocessor_count(self.heap.device)

    def get_heap_bases(self) -> torch.Tensor:
        """uint64 tensor of every rank's heap base as mapped here; pass it to device ops.

        Its memory never changes after initialisation, so kernels and CUDA graphs may
        keep it. While tracing is enabled it is an int64 view of the same memory,
        which makes Triton compile the traced variant of kernels it is passed to:
        pass ``ctx.get_heap_bases()`` at each launch rather than keeping an old one.

        Example:
            >>> kernel[grid](buf, n, ctx.get_rank(), ctx.get_heap_bases())
        """
        return self.heap_bases.view(torch.int64) if self.tracing.enabled else self.heap_bases

    def get_device_context(self) -> torch.Tensor:
        """int64 context tensor for :meth:`iris.DeviceContext.initialize`.

        Layout: ``[cur_rank, world_size, heap_base_0..n-1, heap_size, tracing fields]``.
        While tracing is enabled it is a uint64 view (the traced variant, as for
        :meth:`get_heap_bases`).

        Example:
            >>> rank, world_size = ctx.get_rank(), ctx.get_num_ranks()
            >>> kernel[grid](ctx.get_device_context(), buf, rank=rank, world_size=world_size)
        """
        return self._device_context.view(torch.uint64) if self.tracing.enabled else self._device_context

    def _heap_bases_for_iris(self) -> torch.Tensor:
        """:meth:`get_heap_bases` for Iris's own kernels, whose pointers may reach the reserved region.

        The same slots but for the heap size, which covers the whole mapping, so that
        ``IRIS_DEBUG``'s bounds check lets the collectives' flags and the device barrier's
        arrivals through while holding user kernels to the user's bytes.
        """
        return self._iris_heap_bases.view(torch.int64) if self.tracing.enabled else self._iris_heap_bases

    def _device_context_for_iris(self) -> torch.Tensor:
        """:meth:`get_device_context` for Iris's own kernels (see :meth:`_heap_bases_for_iris`)."""
        return self._iris_context.view(torch.uint64) if self.tracing.enabled else self._iris_context

    def _write_context(self, slots: dict[int, int]) -> None:
        """Set context slots (index -> value) in the user's context and in Iris's own copy."""
        indices = torch.tensor(sorted(slots), dtype=torch.int64, device="cpu")
        values = torch.tensor([int(slots[i]) for i in sorted(slots)], dtype=torch.int64, device="cpu")
        for context in (self._device_context, self._iris_context):
            context[indices.to(context.device)] = values.to(context.device)

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lies entirely on this rank's symmetric heap.

        Example:
            >>> ctx.is_symmetric(ctx.zeros(4))
            True
        """
        return self.heap.contains(tensor)

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` as a symmetric-heap tensor that peers can reach.

        A tensor already on the heap is returned as it is. A tensor allocated elsewhere is
        mapped into the heap where the heap can take it in, as upstream Iris's ``vmem``
        allocator does: the result shares the tensor's memory (writes through either are
        seen by both) and lies at the same offset on every rank. That needs a context made
        with ``allocator_type="vmem"`` on GPUs, and memory from CUDA's virtual-memory
        calls, which PyTorch's expandable segments give
        (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, set before CUDA starts);
        anything else raises, saying why: copy instead, ``ctx.empty_like(t).copy_(t)``.
        Collective for an outside tensor: every rank calls it, in the same order.

        Args:
            tensor (torch.Tensor): the tensor to share, contiguous, on this rank's GPU.

        Returns:
            torch.Tensor: ``tensor`` itself, when it lies on this rank's heap; else a view of
            its memory inside the heap, of its shape and dtype.

        Raises:
            RuntimeError: the memory cannot be mapped in (on every rank, naming the rank and why).
            MemoryError: the room kept after the heap (as large as the heap) is used up.

        Example:
            >>> ctx = iris.iris(1 << 30, allocator_type="vmem")
            >>> weights = torch.randn(4096, 4096, device="cuda")   # expandable segments on
            >>> shared = ctx.as_symmetric(weights)
            >>> ctx.as_symmetric(shared) is shared
            True
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"iris: as_symmetric takes a torch.Tensor, got {type(tensor).__name__}")
        if self.heap.contains(tensor):
            return tensor
        flat = self.heap.take_in(self._comm, tensor)
        # IRIS_DEBUG's pointer checks reach the memory taken in (and the reserved region before it).
        self._device_context[layout.heap_size_slot(self.num_ranks)] = self.heap.addressable
        self._iris_context[layout.heap_size_slot(self.num_ranks)] = self.heap.addressable
        return flat.view(tensor.dtype).view(tensor.shape)

    @property
    def ops(self):
        """Fused GEMM + communication ops (:class:`iris.ops.Ops`), created on first use.

        Example:
            >>> ctx.ops.matmul_all_reduce(out, a, b)
        """
        if getattr(self, "_ops", None) is None:
            from ..ops import Ops  # the fused kernels are only compiled when someone asks for them

            self._ops = Ops(self)
        return self._ops

    # ------------------------------------------------------------------ logging
    def debug(self, message: str) -> None:
        """Log ``message`` at debug level, tagged with this rank.

        Example:
            >>> ctx.debug("allocating buffers")   # [Iris] [0/4] allocating buffers
        """
        log_with_rank(DEBUG, message, self.cur_rank, self.num_ranks)

    def info(self, message: str) -> None:
        """Log ``message`` at info level, tagged with this rank.

        Example:
            >>> ctx.info("iteration 0")
        """
        log_with_rank(INFO, message, self.cur_rank, self.num_ranks)

    def warning(self, message: str) -> None:
        """Log ``message`` at warning level, tagged with this rank.

        Example:
            >>> ctx.warning("heap nearly full")
        """
        log_with_rank(WARNING, message, self.cur_rank, self.num_ranks)

    def error(self, message: str) -> None:
        """Log ``message`` at error level, tagged with this rank.

        Example:
            >>> ctx.error("mismatch on element 3")
        """
        log_with_rank(ERROR, message, self.cur_rank, self.num_ranks)

    # ------------------------------------------------------------------ tensors
    # Each factory is defined once, as the module function of iris.host.memory.tensors
    # (upstream's signatures); the method calls it on this rank's heap.
    zeros = tensors.as_method(tensors.zeros, tensors._sizes)
    ones = tensors.as_method(tensors.ones, tensors._sizes)
    full = tensors.as_method(tensors.full)
    empty = tensors.as_method(tensors.empty, tensors._sizes)
    arange = tensors.as_method(tensors.arange, tensors._arange_arguments)
    linspace = tensors.as_method(tensors.linspace)
    rand = tensors.as_method(tensors.rand, tensors._sizes)
    randn = tensors.as_method(tensors.randn, tensors._sizes)
    randint = tensors.as_method(tensors.randint, tensors._randint_arguments)
    uniform = tensors.as_method(tensors.uniform)
    zeros_like = tensors.as_method(tensors.zeros_like)
    ones_like = tensors.as_method(tensors.ones_like)
    full_like = tensors.as_method(tensors.full_like)
    empty_like = tensors.as_method(tensors.empty_like)

    # ------------------------------------------------------------------ synchronisation
    def barrier(self, stream=None, group=None) -> None:
        """Wait for this rank's device work (``stream``, or all of it), then for every rank in ``group``.

        Example:
            >>> kernel[grid](...)
            >>> ctx.barrier()   # every rank's kernel has finished
        """
        recorder = self.hang.recorder
        # Two phases, so that a hang report tells a rank whose kernel never ends (one spinning
        # on a flag in a loop of its own, which the flight recorder does not see) from one
        # that waits for the other ranks.
        recorder.set_phase(fmt.PHASE_DEVICE_SYNC)
        try:
            self.hang.guard(self.backend.synchronize, self.heap.device, stream)
            self.backend.complete_remote_writes()
            recorder.set_phase(fmt.PHASE_BARRIER)
            self._comm.barrier(group)
        finally:
            recorder.set_phase(fmt.PHASE_RUNNING)

    def set_wait_timeout(self, seconds: float) -> None:
        """Make this rank's device waits give up after ``seconds`` (0: never); no recompilation.

        Applies to every ``wait_until`` given ``heap_bases`` (the device barrier, the
        collectives, ``DeviceContext``) in kernels launched afterwards. On expiry the kernel
        stops and the host raises :class:`iris.WaitTimeoutError` naming rank, SM, program,
        op, flag, expected and last seen value, and the rank that likely caused it.
        Default: ``IRIS_WAIT_TIMEOUT``, or 60 s with ``IRIS_DEBUG=1`` or under emulation.

        Example:
            >>> ctx.set_wait_timeout(10)
        """
        self.hang.set_timeout(seconds)

    def get_wait_timeout(self) -> float:
        """The wait timeout of this rank in seconds (0: none).

        Example:
            >>> ctx.get_wait_timeout()
            0.0
        """
        return self.hang.timeout

    def device_barrier(self, group=None) -> None:
        """Barrier executed by a kernel on the current stream: no host sync, CUDA-graph capturable.

        Orders device work across ranks: kernels queued after it on any member rank
        start only once every member's earlier kernels on this stream have finished.

        Example:
            >>> producer[grid](...)
            >>> ctx.device_barrier()
            >>> consumer[grid](...)
        """
        members = self._group_members(group)
        launch = self._barrier_launches.get((members, self.tracing.enabled))
        if launch is None:
            launch = PreparedLaunch(
                device_barrier_kernel,
                (1,),
                (
                    self._barrier_arrivals[self._barrier_slots.slot(members)],
                    self._heap_bases_for_iris(),
                    torch.tensor(members, dtype=torch.int32, device=self.heap.device),
                    self.cur_rank,
                ),
                {"GROUP": len(members), "num_warps": 1},
            )
            self._barrier_launches[(members, self.tracing.enabled)] = launch
        launch()

    def wake_links(self) -> None:
        """Wake the links to this node's peers, so that kernels queued after it do not wait for them.

        NVLink links sleep after a pause in their traffic (50 ms on the H100 machines
        measured; ``nvidia-smi nvlink -gLowPwrInfo``), and the first access over a
        sleeping link waits about 105 us for it to wake: a launch after a pause sees its
        first flags that late. This launches one small kernel on the current stream that
        reads 128 KiB of every same-node peer's heap (a word per 128-byte line, so every
        link carries traffic) and ends once the values are in; it takes about 105 us
        when the links slept, a few us when not. Call it before a call whose trace or
        timing should show the links awake; steady loops never need it. Ranks of other
        nodes are left alone (their traffic crosses no NVLink of this node). Nothing on
        the heap changes, its reads are never traced, and every backend runs the same kernel.

        Example:
            >>> ctx.wake_links()
            >>> kernel[grid](...)  # its first flags come on time
        """
        if self._wake_launch is None:
            mine = self.node_of(self.cur_rank)
            peers = [r for r in range(self.num_ranks) if r != self.cur_rank and self.node_of(r) == mine]
            if not peers:
                return
            heap = self.heap.leading(wake.LINES * wake.LINE_BYTES, torch.int32)
            self._wake_launch = PreparedLaunch(
                wake.wake_links_kernel,
                (len(peers),),
                (
                    heap,
                    heap.numel() * heap.element_size() // wake.LINE_BYTES,
                    torch.tensor(peers, dtype=torch.int32, device=self.heap.device),
                    torch.zeros(len(peers), dtype=torch.int32, device=self.heap.device),
                    self.cur_rank,
                    self._iris_heap_bases,
                ),
                {"LINES": wake.LINES, "num_warps": 4},
            )
        self._wake_launch()

    @property
    def _device_barrier_state(self) -> dict:
        """Upstream's view of the device barriers so far: each group (``None``: every rank,
        else its members) to its arrival flags, the same tensor on every call.

        Example:
            >>> ctx.device_barrier()
            >>> flags = ctx._device_barrier_state[None]
        """
        everyone = tuple(range(self.num_ranks))
        flags = self._barrier_arrivals
        return {
            None if members == everyone else members: flags[self._barrier_slots.slot(members)]
            for members, _traced in self._barrier_launches
        }

    def _group_members(self, group) -> tuple[int, ...]:
        if group is None:
            return tuple(range(self.num_ranks))
        members = tuple(sorted(dist.get_process_group_ranks(group)))
        if self.cur_rank not in members:
            raise ValueError(f"iris: rank {self.cur_rank} is not a member of the group {list(members)}")
        return members

    def broadcast(self, value, src: int = 0):
        """``value`` from rank ``src`` on every rank, like :func:`torch.distributed.broadcast`.

        Tensors and numeric arrays arrive as numpy arrays; other picklable values as themselves.

        Example:
            >>> seed = ctx.broadcast(1234 if ctx.get_rank() == 0 else None, src=0)
        """
        if not 0 <= src < self.num_ranks:
            raise ValueError(f"iris: broadcast src={src} is not a rank of this {self.num_ranks}-rank job")
        payload = _as_array(value) if self.cur_rank == src else None
        return self._comm.broadcast_object(payload if payload is not None else value, src)

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Give back the heap, the peers' mappings, the flight file and the watchdog (collective).

        Every rank waits for the others first, so no peer still writes to this rank's heap.
        Dropping the last reference to the context gives the same back without that
        barrier (when the garbage collector frees it: at once, or at ``gc.collect()``);
        call ``close()`` where every rank should let go at one agreed point. The heap's
        memory itself is returned once no tensor of it is left.

        Example:
            >>> with iris.iris(1 << 24) as ctx:
            ...     ...
        """
        if not self._finalizer.alive:
            return
        self.barrier()
        self._finalizer()

    def __enter__(self) -> Iris:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Resources:
    """What one context gives back when it goes: its hang watch (flight file, watchdog) and its heap.

    Kept apart from :class:`Iris` (which the parts refer to only weakly), so that a
    finalizer holding it does not keep the context alive.
    """

    def __init__(self):
        self.hang: Hang | None = None
        self.heap: SymmetricHeap | None = None

    def release(self) -> None:
        for part in (self.hang, self.heap):
            if part is None:
                continue
            try:
                part.close()
            except Exception as error:  # noqa: BLE001 - give back the rest; say what stayed
                log_with_rank(WARNING, f"iris: releasing {type(part).__name__} failed: {error!r}", -1, -1)
        self.hang = self.heap = None


def _as_array(value):
    """Tensors and numeric sequences as numpy arrays; anything else as ``None``."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return (tensor.float() if tensor.dtype == torch.bfloat16 else tensor).numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        array = np.asarray(value)
        return array if np.issubdtype(array.dtype, np.number) else None
    return None


def _ranks_per_node(world_size: int) -> int:
    per_node = config.ranks_per_node(world_size)
    if (per_node < world_size) != config.SCALE_OUT and not config.CROSS_NODE_ALWAYS:
        told = "IRIS_RANKS_PER_NODE" if "WORLD_SIZE" in os.environ else "WORLD_SIZE and IRIS_RANKS_PER_NODE"
        raise RuntimeError(
            f"iris: this job has {world_size} ranks, {per_node} per node, but iris was imported as part "
            f"of a {'multi' if config.SCALE_OUT else 'single'}-node job (device code is compiled for one "
            f"or the other): set {told} before importing iris, or start through torchrun / "
            "python -m iris.run"
        )
    return per_node


def iris(heap_size: int = 1 << 30, allocator_type: str = "torch") -> Iris:
    """Create this rank's :class:`Iris` (collective: every rank calls it with the same arguments).

    Example:
        >>> import iris
        >>> ctx = iris.iris(1 << 30)
        >>> buf = ctx.zeros(4096, dtype=torch.float32)
    """
    return Iris(heap_size, allocator_type)
