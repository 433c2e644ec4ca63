"""Copies into peers' heaps by the GPU's copy engines, beside the kernels of the current stream.

A copy engine moves memory over NVLink without taking an SM, so a GEMM keeps every
SM while the finished part of its output travels. ``ctx.copy_engine`` queues each
copy on a lane of its own per destination rank: copies to different peers run at
once, and each lane keeps its copies and launches (:meth:`CopyEngine.then`) in
order. :meth:`CopyEngine.fork` and :meth:`CopyEngine.join` tie the lanes to the
current stream, so a CUDA graph captures the whole pattern.

Under emulation the lanes copy at once on the CPU (the interpreter runs every launch
to its end), so the same code runs in CI.

While tracing is enabled, each put is bracketed on its lane by two one-thread
kernels (:mod:`iris.device.dma_trace`) and appears in the trace as a ``dma_put``
event on the track "copy engine → rank N" of the sending rank.

Example:
    >>> ce = ctx.copy_engine
    >>> torch.matmul(a, b, out=block)        # on the current stream
    >>> ce.fork()                            # copies start once the matmul is done
    >>> for peer in range(world):
    ...     if peer != rank:
    ...         ce.put(block, block, peer)   # into peer's copy of the symmetric ``block``
    >>> ce.join()                            # later work waits for the copies
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch

from ..device.dma_trace import dma_record_kernel, dma_start_kernel
from .prepared import PreparedLaunch


class CopyEngine:
    """Copy-engine puts into any rank's heap (``ctx.copy_engine``); see the module doc.

    Example:
        >>> ctx.copy_engine.fork()
        >>> ctx.copy_engine.put(dst, src, to_rank=1)
        >>> ctx.copy_engine.join()
    """

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        self._lanes = ctx.backend.copy_lanes(ctx.get_device(), ctx.num_ranks)
        self._stamps: torch.Tensor | None = None  # per lane: when its traced put started
        self._trace_launches: dict[tuple, tuple[PreparedLaunch, PreparedLaunch]] = {}

    def fork(self) -> None:
        """Puts and launches queued from now on start after the work queued so far on the current stream.

        Example:
            >>> ctx.copy_engine.fork()
        """
        self._lanes.fork()

    def put(self, dst: torch.Tensor, src: torch.Tensor, to_rank: int) -> None:
        """Queue a copy of ``src`` (this rank's memory) into rank ``to_rank``'s ``dst``.

        ``dst`` is this rank's view of a symmetric tensor: the copy lands at the same
        heap offset on ``to_rank``. Both are 1-D contiguous or 2-D with unit column
        stride (row blocks and column blocks of matrices), with equal shapes and
        dtypes. It runs on ``to_rank``'s lane, after the latest :meth:`fork`.

        Example:
            >>> ctx.copy_engine.put(out[rows], out[rows], to_rank=peer)
        """
        self.prepare_put(dst, src, to_rank)()

    def prepare_put(self, dst: torch.Tensor, src: torch.Tensor, to_rank: int) -> Callable[[], None]:
        """Check a :meth:`put` once; returns a callable that queues it with no further checks.

        For loops and recorded plans that repeat the same put: addresses, pitches and
        (while tracing is on now) the tracing launches are settled here.

        Example:
            >>> send = ctx.copy_engine.prepare_put(out[rows], out[rows], to_rank=peer)
            >>> ctx.copy_engine.fork(); send(); ctx.copy_engine.join()
        """
        ctx = self._ctx
        if not 0 <= to_rank < ctx.num_ranks:
            raise ValueError(f"ctx.copy_engine.put: to_rank {to_rank} is not in [0, {ctx.num_ranks})")
        if ctx.node_of(to_rank) != ctx.node_of(ctx.cur_rank):
            raise ValueError(
                f"ctx.copy_engine.put: rank {to_rank} is on another node; copy engines reach only the "
                "GPUs of this node (use iris.put in a kernel)"
            )
        if not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
            raise TypeError("ctx.copy_engine.put: dst and src must be torch.Tensors")
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(
                f"ctx.copy_engine.put: dst is {_dtype_name(dst)} {tuple(dst.shape)} but src is "
                f"{_dtype_name(src)} {tuple(src.shape)}"
            )
        if not ctx.is_symmetric(dst):
            raise ValueError("ctx.copy_engine.put: dst must be on the symmetric heap (peers hold it)")
        if src.device != ctx.get_device():
            raise ValueError(
                f"ctx.copy_engine.put: src is on {src.device}, this rank's device is {ctx.get_device()}"
            )
        if dst.numel() == 0:
            return _nothing
        rows, dst_pitch, width = _rows(dst, "dst")
        _, src_pitch, _ = _rows(src, "src")
        offset = ctx.heap.offset_of(dst)
        copy = (to_rank, ctx.heap.bases[to_rank] + offset, dst_pitch, src.data_ptr(), src_pitch, width, rows)
        lanes, traced = self._lanes, self._traced(to_rank, offset, dst.numel() * dst.element_size())
        if traced is None:
            return lambda: lanes.copy_2d(*copy)

        def traced_put():
            lanes.run(to_rank, traced[0])
            lanes.copy_2d(*copy)
            lanes.run(to_rank, traced[1])

        return traced_put

    def _traced(self, to_rank: int, offset: int, nbytes: int):
        # (start, record) launches that bracket a put while tracing is on; None otherwise.
        ctx = self._ctx
        if not ctx.tracing.enabled:
            return None
        key = (to_rank, offset, nbytes)
        launches = self._trace_launches.get(key)
        if launches is None:
            if self._stamps is None:
                self._stamps = torch.zeros(ctx.num_ranks, dtype=torch.int64, device=ctx.get_device())
            stamps, bases = self._stamps, ctx._heap_bases_for_iris()
            launches = self._trace_launches[key] = (
                PreparedLaunch(dma_start_kernel, (1,), (stamps, to_rank), {"num_warps": 1}),
                PreparedLaunch(
                    dma_record_kernel,
                    (1,),
                    (bases, stamps, to_rank, to_rank, offset, nbytes),
                    {"num_warps": 1},
                ),
            )
        return launches

    def then(self, to_rank: int, launch: Callable[[], None]) -> None:
        """Run ``launch`` (kernel launches) on ``to_rank``'s lane, after the puts queued there.

        Example:
            >>> ctx.copy_engine.then(peer, lambda: signal_kernel[(1,)](flag, 1, rank, peer, bases))
        """
        self._lanes.run(to_rank, launch)

    def join(self) -> None:
        """Work queued on the current stream from now on waits for every put and launch queued so far.

        Example:
            >>> ctx.copy_engine.join()
        """
        self._lanes.join()


def _nothing() -> None:
    pass


def _dtype_name(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def _rows(tensor: torch.Tensor, name: str) -> tuple[int, int, int]:
    """(rows, pitch in bytes, row width in bytes) of a 1-D contiguous or 2-D unit-column-stride tensor."""
    size = tensor.element_size()
    if tensor.dim() == 1 and tensor.stride(0) == 1:
        return 1, tensor.numel() * size, tensor.numel() * size
    if tensor.dim() == 2 and (tensor.stride(1) == 1 or tensor.shape[1] == 1):
        pitch = max(tensor.stride(0), tensor.shape[1]) if tensor.shape[0] > 1 else tensor.shape[1]
        return tensor.shape[0], pitch * size, tensor.shape[1] * size
    raise ValueError(
        f"ctx.copy_engine.put: {name} must be 1-D contiguous or 2-D with unit column stride, "
        f"got shape {tuple(tensor.shape)} and strides {tensor.stride()}"
    )
