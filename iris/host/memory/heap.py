"""The symmetric heap: one equally sized block per rank, every block mapped everywhere.

Allocation is a bump allocator over the local block. Because every rank makes
the same allocations in the same order, an object lives at the same offset in
every rank's heap, so a device kernel reaches a peer's copy by swapping the
heap base (see ``iris.device.rma``).

Iris's own always-present state (the device barrier's arrival counters, the
collectives' flags) lives in a *reserved* region past the user's ``heap_size``
bytes, carved at start-up in the same order on every rank: a small heap stays
entirely the user's, and the reserved bytes are counted and reported apart
(``SymmetricHeap.reserved``).
"""

from __future__ import annotations

import math
import uuid

import torch

from ...backends import Backend
from ..distributed.helpers import Communicator

#: Every allocation starts on this boundary (bytes): wide vector loads stay legal.
ALIGNMENT = 256
#: Heap bases must be this aligned; device-side translation relies on it (rma.HEAP_BASE_ALIGNMENT).
BASE_ALIGNMENT = 4096


def _aligned(offset: int) -> int:
    """``offset`` rounded up to the next ALIGNMENT boundary."""
    return -(-offset // ALIGNMENT) * ALIGNMENT


def _nbytes(shape, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _start_address(tensor: torch.Tensor) -> int:
    # data_ptr() is 0 for empty tensors; the storage still knows where the view starts.
    return tensor.untyped_storage().data_ptr() + tensor.storage_offset() * tensor.element_size()


def _span_bytes(tensor: torch.Tensor) -> int:
    """Bytes between a tensor's first and one-past-last element, strides included."""
    if tensor.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return (last + 1) * tensor.element_size()


class SymmetricHeap:
    """This rank's heap plus the mapped addresses of every peer's heap.

    Created collectively: every rank must construct it with the same ``heap_size``.

    Example:
        >>> heap = SymmetricHeap(1 << 20, backend, comm, device)
        >>> x = heap.allocate((256,), torch.float32)
        >>> heap.offset_of(x)
        0
    """

    def __init__(
        self,
        heap_size: int,
        backend: Backend,
        comm: Communicator,
        device: torch.device,
        reserved_bytes: int = 0,
    ):
        # Gather before validating, so a bad value on one rank fails every rank
        # with the same message instead of leaving the others waiting.
        asked = comm.all_gather_object((heap_size, backend.allocator))
        sizes = [size for size, _ in asked]
        for rank, size in enumerate(sizes):
            if isinstance(size, bool) or not isinstance(size, int):
                raise TypeError(
                    f"iris: heap_size must be an int number of bytes, got {size!r} on rank {rank}"
                )
            if size <= 0:
                raise ValueError(f"iris: heap_size must be positive, got {size} on rank {rank}")
        if len(set(sizes)) != 1:
            per_rank = ", ".join(f"rank {r}: {s}" for r, s in enumerate(sizes))
            raise ValueError(f"iris: heap_size must be the same on every rank ({per_rank})")
        if len({kind for _, kind in asked}) != 1:  # the heaps are shared in different ways
            per_rank = ", ".join(f"rank {r}: {kind!r}" for r, (_, kind) in enumerate(asked))
            raise ValueError(f"iris: allocator_type must be the same on every rank ({per_rank})")

        self.size = heap_size
        #: Bytes past ``size`` kept for Iris's own state (:meth:`reserve`).
        self.reserved = _aligned(reserved_bytes)
        #: Bytes mapped per rank: the user's heap, padded to ``ALIGNMENT``, then the reserved region.
        self.mapped_size = self._reserved_start() + self.reserved
        # Before anything is made: a heap the backend cannot back fails every rank in one
        # line (the first rank's reason), not with a raw OSError or a bus error later.
        problems = comm.all_gather_object(backend.heap_problem(self.mapped_size, device))
        problem = next(((rank, text) for rank, text in enumerate(problems) if text), None)
        if problem is not None:
            raise MemoryError(f"iris: rank {problem[0]}: {problem[1]}")
        self.device = device
        self.rank = comm.rank
        self._backend = backend
        session = comm.broadcast_object(uuid.uuid4().hex[:12] if comm.rank == 0 else None, src=0)
        self._peer_token_of: dict[int, object] = {}  # peer rank -> its mapping (map_peer's token)
        self._allocation = None
        #: Bytes of address space past the mapped heap for memory taken in by :meth:`take_in`.
        self.window = backend.import_window(self.mapped_size)
        self._next_import = 0
        # The tensors taken in, each with its bytes in the window: while the heap lives their
        # memory must not go back to their allocator, which would hand it out again under the
        # peers' reach; and taking the same memory in again reuses its place.
        self._taken_in: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._closed = True  # until every peer is mapped: close() then gives back what was made
        try:
            self._allocation = backend.allocate(self.mapped_size, device, tag=f"{session}-rank{comm.rank}")
            handles = backend.share_handles(comm, self._allocation)
            bases = []
            for peer, handle in enumerate(handles):
                if peer == comm.rank:
                    bases.append(self._allocation.tensor.data_ptr())
                    continue
                address, token = backend.map_peer(handle, self.mapped_size, device)
                bases.append(address)
                self._peer_token_of[peer] = token
            comm.barrier()
            backend.after_all_mapped(self._allocation)
        except BaseException:
            self._release()
            raise

        misaligned = [hex(b) for b in bases if b % BASE_ALIGNMENT]
        if misaligned:
            self._release()
            raise RuntimeError(f"iris: heap bases {misaligned} are not {BASE_ALIGNMENT}-byte aligned")
        #: Address of every rank's heap as mapped in this process, in rank order.
        self.bases: list[int] = bases
        self._storage = self._allocation.tensor
        self._next_offset = 0
        self._next_reserved = self._reserved_start()
        self._closed = False

    def _reserved_start(self) -> int:
        return _aligned(self.size)

    @property
    def base(self) -> int:
        """Address of this rank's own heap."""
        return self.bases[self.rank]

    @property
    def used(self) -> int:
        """Bytes handed out so far, alignment padding included."""
        return self._next_offset

    @property
    def free(self) -> int:
        """Bytes still available."""
        return self.size - self._next_offset

    @property
    def aligned_heap_size(self) -> int:
        """Bytes of physical memory behind this rank's heap (upstream's allocator name): the heap,
        with Iris's reserved region, rounded up to the backend's allocation granularity.

        Example:
            >>> ctx.heap.allocator.aligned_heap_size % iris.hip.get_allocation_granularity() == 0
            True
        """
        return self._backend.padded_size(self.mapped_size, self.device)

    @property
    def allocator(self) -> SymmetricHeap:
        """Upstream Iris's path to the heap's bump allocator (``ctx.heap.allocator.heap_offset``):
        the heap itself here.

        Example:
            >>> mark = ctx.heap.allocator.heap_offset
        """
        return self

    @property
    def heap_offset(self) -> int:
        """Where the next allocation starts (upstream's name for :attr:`used`). Set it back to an
        earlier value to hand out that memory again, as upstream's benchmarks do between calls:
        tensors allocated after that point then share memory with the new ones.

        Raises:
            ValueError: set to anything but an int in ``[0, size]``.

        Example:
            >>> mark = ctx.heap.heap_offset
            >>> scratch = ctx.zeros(1024)
            >>> ctx.heap.heap_offset = mark   # scratch's memory is handed out again
        """
        return self._next_offset

    @heap_offset.setter
    def heap_offset(self, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= self.size:
            raise ValueError(f"iris: heap_offset must be an int in [0, {self.size}], got {offset!r}")
        self._next_offset = offset

    def accepts_device(self, requested: torch.device, heap_device: torch.device | None = None) -> bool:
        """Whether a user's ``device=`` names this heap's device (``heap_device``), by the backend's rule.

        Example:
            >>> heap.accepts_device(torch.device("cuda"))
            True
        """
        return self._backend.accepts_device(requested, self.device if heap_device is None else heap_device)

    def get_base_address(self) -> int:
        """Upstream Iris's allocator name for :attr:`base` (``ctx.heap.allocator.get_base_address()``).

        Example:
            >>> ctx.heap.allocator.get_base_address() == ctx.heap.base
            True
        """
        return self.base

    def owns_tensor(self, tensor: torch.Tensor) -> bool:
        """Upstream Iris's allocator name for :meth:`contains` (``ctx.heap.allocator.owns_tensor``).

        Example:
            >>> ctx.heap.allocator.owns_tensor(ctx.zeros(4)), ctx.heap.allocator.owns_tensor(torch.zeros(4))
            (True, False)
        """
        return self.contains(tensor)

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        """Upstream Iris's name for :meth:`contains`.

        Example:
            >>> heap.is_symmetric(heap.allocate(4, torch.int32))
            True
        """
        return self.contains(tensor)

    def allocate(self, shape: int | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A contiguous, uninitialised tensor of ``shape`` and ``dtype`` inside the heap.

        ``shape`` may be an element count, as upstream Iris's ``allocate(num_elements, dtype)``
        takes it: the tensor is then one-dimensional.

        Example:
            >>> flat = heap.allocate(1024, torch.float32)        # upstream's form
            >>> tile = heap.allocate((32, 32), torch.float32)
        """
        if isinstance(shape, int):
            shape = (shape,)
        if self._closed:
            raise RuntimeError("iris: the symmetric heap was closed")
        nbytes = _nbytes(shape, dtype)
        offset = _aligned(self._next_offset)
        if offset + nbytes > self.size:
            raise MemoryError(
                f"iris: cannot allocate {nbytes} bytes ({tuple(shape)}, {dtype}) on the symmetric heap: "
                f"{max(self.size - offset, 0)} of {self.size} bytes free"
            )
        self._next_offset = offset + nbytes
        return self._view(offset, nbytes, shape, dtype)

    def reserve(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A zeroed tensor in the reserved region (Iris's own state; same order on every rank).

        Example:
            >>> arrivals = heap.reserve((64, world_size), torch.int64)
        """
        nbytes = _nbytes(shape, dtype)
        offset = _aligned(self._next_reserved)
        if offset + nbytes > self.mapped_size:
            raise RuntimeError(
                f"iris: the reserved region ({self.reserved} bytes) has no room for {nbytes} more bytes"
            )
        self._next_reserved = offset + nbytes
        return self._view(offset, nbytes, shape, dtype).zero_()

    def bytes_needed(self, pieces) -> int:
        """Heap bytes that :meth:`allocate` calls of ``(shape, dtype)`` pieces, in order, would take now.

        Alignment padding included, so ``bytes_needed(pieces) <= free`` says whether they fit.

        Example:
            >>> heap.bytes_needed([((1024,), torch.int64)]) <= heap.free
            True
        """
        return _aligned(self._next_offset) - self._next_offset + self.footprint(pieces)

    @staticmethod
    def footprint(pieces) -> int:
        """Bytes that ``(shape, dtype)`` pieces take when placed one after another, each aligned.

        What the reserved region must hold for :meth:`reserve` calls of those pieces.

        Example:
            >>> SymmetricHeap.footprint([((64, 4), torch.int64), ((10,), torch.int32)])
            2088
        """
        end = 0
        for shape, dtype in pieces:
            end = _aligned(end) + _nbytes(shape, dtype)
        return end

    def leading(self, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        """The first ``nbytes`` of this rank's mapped heap (at most all of it) as a flat tensor.

        For Iris's own kernels that address the heap itself rather than a tensor on it
        (the same offsets reach every peer's copy).

        Example:
            >>> heap.leading(4096, torch.int32).numel()
            1024
        """
        nbytes = min(nbytes, self.mapped_size)
        return self._view(0, nbytes, (nbytes // dtype.itemsize,), dtype)

    def _view(self, offset: int, nbytes: int, shape, dtype: torch.dtype) -> torch.Tensor:
        return self._storage[offset : offset + nbytes].view(dtype).view(shape)

    def contains(self, tensor: torch.Tensor) -> bool:
        """Whether every element of ``tensor`` lies in this rank's heap (reserved region included)."""
        if not isinstance(tensor, torch.Tensor) or tensor.device != self._storage.device:
            return False
        start = _start_address(tensor)
        end = self.base + self.mapped_size + self._next_import
        return self.base <= start and start + _span_bytes(tensor) <= end

    @property
    def addressable(self) -> int:
        """Bytes from the heap base that tensors of the heap may occupy: the mapped heap and
        what :meth:`take_in` has mapped after it."""
        return self.mapped_size + self._next_import

    def take_in(self, comm: Communicator, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor``'s own memory mapped into the heap, as a flat ``uint8`` tensor (collective).

        Every rank calls it with its tensor, in the same order; each rank's memory lands at
        one offset past the heap, the same on every rank, where peers reach it by the usual
        translation. Upstream Iris's ``vmem`` allocator does this for ``as_symmetric``. The heap
        keeps ``tensor`` alive until it closes, so its allocator cannot hand the memory out again
        while peers reach it. Memory taken in before (the same tensor, or a view inside it) is
        not mapped again where every rank finds its tensor at one offset of the window.

        Raises:
            RuntimeError: a rank's memory cannot be taken in (the message names the rank and why).
            MemoryError: the window past the heap has no room left.

        Example:
            >>> shared = heap.take_in(comm, weights).view(weights.dtype).view(weights.shape)
        """
        if self._closed:
            raise RuntimeError("iris: the symmetric heap was closed")
        outside = self._backend.outside_memory(tensor)
        problem = outside if isinstance(outside, str) else ""
        if problem and not self.window:  # no heap of this kind takes anything in: no need to ask the others
            raise RuntimeError(f"iris: as_symmetric: {problem}")
        mapped = None if problem else self._mapped_before(tensor)
        offset = -1 if mapped is None else mapped.data_ptr() - self.base
        mine = (problem, 0, 1, offset) if problem else (problem, outside.span, outside.alignment, offset)
        gathered = comm.all_gather_object(mine)
        bad = next(((rank, text) for rank, (text, _, _, _) in enumerate(gathered) if text), None)
        if bad is not None:
            raise RuntimeError(f"iris: as_symmetric on rank {bad[0]}: {bad[1]}")
        if offset >= 0 and all(theirs == offset for *_, theirs in gathered):
            return mapped  # every rank's memory lies in the window already, at one offset
        spans = [span for _, span, _, _ in gathered]
        alignment = max(align for _, _, align, _ in gathered)
        start = -(-(self.mapped_size + self._next_import) // alignment) * alignment
        left = self.mapped_size + self.window - start
        if max(spans) > left:
            raise MemoryError(
                f"iris: as_symmetric needs {max(spans)} bytes past the heap and {max(left, 0)} of the "
                f"{self.window} kept for outside memory are left"
            )
        # Taken before the mapping: a failure half way must not leave the range to be mapped twice.
        self._next_import = start + max(spans) - self.mapped_size
        taken = self._backend.take_in(comm, self._allocation, self._peer_token_of, outside, start, spans)
        self._taken_in.append((tensor, taken))
        return taken

    def _mapped_before(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """``tensor``'s bytes in the window, where an earlier :meth:`take_in` mapped memory holding them."""
        first, nbytes = _start_address(tensor), _span_bytes(tensor)
        for original, taken in self._taken_in:
            start = _start_address(original)
            inside = start <= first and first + nbytes <= start + taken.numel()
            if inside and original.device == tensor.device:
                return taken[first - start : first - start + nbytes]
        return None

    def offset_of(self, tensor: torch.Tensor) -> int:
        """Byte offset of ``tensor``'s first element from the heap base."""
        if not self.contains(tensor):
            raise ValueError("iris: tensor is not on this rank's symmetric heap")
        return _start_address(tensor) - self.base

    def close(self) -> None:
        """Unmap the peers' heaps and let go of this rank's (not collective).

        The memory is returned once no tensor of the heap is left (on GPUs too): a tensor
        kept past ``close()`` stays valid as local memory, but peers no longer reach it.
        """
        if self._closed:
            return
        self._closed = True
        self._release()
        self._storage = None

    def _release(self) -> None:
        self._taken_in = []
        tokens, self._peer_token_of = self._peer_token_of.values(), {}
        for token in tokens:
            self._backend.unmap_peer(token)
        allocation, self._allocation = self._allocation, None
        if allocation is not None:
            self._backend.free(allocation)
