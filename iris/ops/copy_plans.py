"""Plans of the copy-engine variants (``FusedConfig(variant="copy_engine")``).

A workgroup-specialised kernel gives some SMs to communication, and the GEMM then
needs more waves of tiles than cuBLAS on the whole GPU. Here cuBLAS keeps every SM
and the GPU's copy engines move the blocks between heaps (:mod:`iris.host.copy_engine`),
pipelined so that a block travels while the next one is computed:

* ``matmul_all_gather``: the local block is computed in row chunks; each finished
  chunk is put into every peer's ``out`` while the next chunk is computed. Only the
  last chunk's copies are not hidden; with ``FusedConfig(sm_tail=True)`` every SM,
  free once the GEMM ends, pushes that chunk with stores instead
  (the bulk-synchronous style's :func:`iris.ops.all_scatter.all_scatter_kernel`).
* ``all_gather_matmul``: this rank's shard is put into every peer's gather buffer
  while cuBLAS multiplies the local rows; each peer's rows are multiplied once
  that peer announces its puts landed.
* ``matmul_reduce_scatter``: the partial block each peer owns is computed first
  and put into that peer's landing slot while the next is computed; the owner sums
  the landed partials (fp32, slot order) into ``out``.

Every plan starts with the entry handshake of :mod:`iris.ops.copy_kernels` and
ends by joining the copy lanes into the current stream, so CUDA graphs capture it
whole. Each plan is recorded as one (:class:`iris.host.prepared.CapturedPlan`) after its
first call: queued step by step from Python, a 1024-row chunk's cuBLAS call and
copy took about as long on the host as the GPU took to run them (2 x H200), so the
GPU waited for the host. The copies are DMA transfers, not kernel stores; with tracing on,
:mod:`iris.host.copy_engine` records each as a ``dma_put`` event on its copy lane.
"""

from __future__ import annotations

import torch
import triton

from ..host.prepared import CapturedPlan, PreparedLaunch
from .copy_kernels import announce_landed_kernel, enter_call_kernel, sum_landed_kernel, wait_landed_kernel

#: ``copy_chunks=0`` puts one chunk per this many rows (between 2 and 8 chunks).
ROWS_PER_CHUNK = 1024
#: Chunks longer than this many rows are a multiple of it (cuBLAS's widest tiles have 256 rows).
CHUNK_ALIGN = 256
#: Tile of :func:`sum_landed_kernel`.
SUM_BLOCK = 64


def matmul_into(A, B, out) -> None:
    """``out = A @ B`` by cuBLAS, writing straight into ``out`` when its rows are unit-stride.

    Example:
        >>> matmul_into(a, b, out[:, 0:n])
    """
    if out.is_contiguous() or out.stride(1) == 1:
        torch.matmul(A, B, out=out)
    else:
        out.copy_(A @ B)


def chunk_bounds(rows: int, chunks: int, tail_rows: int = 0) -> list[tuple[int, int]]:
    """``(start, stop)`` of each row chunk of a ``rows``-row block.

    ``chunks`` equal chunks (0: one per ``ROWS_PER_CHUNK`` rows, between 2 and 8;
    above ``CHUNK_ALIGN`` rows each, a multiple of it). A ``tail_rows`` tail shorter
    than those chunks is cut from the end first and the rest chunked the same way:
    nothing hides the last chunk's exchange, so a short last chunk shortens the wait.

    Example:
        >>> chunk_bounds(4096, 0, tail_rows=512)
        [(0, 1024), (1024, 2048), (2048, 3072), (3072, 3584), (3584, 4096)]
    """
    if chunks == 0:
        chunks = min(8, max(2, rows // ROWS_PER_CHUNK))

    def split(length: int) -> list[tuple[int, int]]:
        step = max(1, -(-length // chunks))
        if step > CHUNK_ALIGN:  # whole rows of cuBLAS tiles in every chunk
            step = -(-step // CHUNK_ALIGN) * CHUNK_ALIGN
        return [(start, min(start + step, length)) for start in range(0, length, step)]

    bounds = split(rows)
    if len(bounds) > 1 and 0 < tail_rows < bounds[0][1]:
        body = rows - tail_rows
        bounds = [*split(body), (body, rows)]
    return bounds


class _Handshake:
    """The launches every copy-engine plan shares: epoch bump, entry, landed signals and waits."""

    def __init__(self, ops):
        ctx = ops._ctx
        self.ctx, self.engine = ctx, ctx.copy_engine
        self.rank, self.world = ctx.get_rank(), ctx.get_num_ranks()
        bases = ctx._heap_bases_for_iris()
        self.epoch = ops._epoch_counter()
        self.entry, self.landed = ops._flags("entry", self.world), ops._flags("landed", self.world)
        self.peers = [(self.rank + i) % self.world for i in range(1, self.world)]
        self._enter = PreparedLaunch(
            enter_call_kernel, (1,), (self.entry, self.epoch, self.rank, self.world, bases)
        )
        self._announce = {
            peer: PreparedLaunch(
                announce_landed_kernel, (1,), (self.landed, self.epoch, self.rank, peer, bases)
            )
            for peer in self.peers
        }
        self._wait = {
            peer: PreparedLaunch(
                wait_landed_kernel,
                (1,),
                (self.landed, self.epoch, -1 if peer is None else peer, self.rank, self.world, bases),
                {"EVERY_PEER": peer is None},
            )
            for peer in [*self.peers, None]
        }

    def start(self) -> list:
        """The first steps of a call: a new epoch, then wait until every peer entered it."""
        return [lambda: self.epoch.add_(1), self._enter]

    def put(self, dst, src, peers, announce: bool = False):
        """A step: after the work queued so far, put ``src`` into ``dst`` on each of ``peers``."""
        engine = self.engine
        sends = [(peer, engine.prepare_put(dst, src, peer), self._announce[peer] if announce else None)
                 for peer in peers]  # fmt: skip

        def step():
            engine.fork()
            for peer, send, landed in sends:
                send()
                if landed is not None:
                    engine.then(peer, landed)

        return step

    def replayed(self, steps: list) -> list:
        """The plan to keep: ``steps`` recorded as one graph after their first run
        (:class:`iris.host.prepared.CapturedPlan`: a chunk's host steps take about as long as its
        GEMM). Traced plans too: their kernels find the trace buffers through the context
        tensor's slots at run time, so a replay records into whatever buffers are current."""
        return [CapturedPlan(steps, self.ctx.backend)]

    def wait(self, peer=None):
        """A step: wait until ``peer`` (None: every peer) announced that its puts landed here."""
        return self._wait[peer]


def _check_rows_unit_stride(name: str, tensor: torch.Tensor, what: str) -> None:
    if tensor.dim() != 2 or tensor.stride(1) != 1:
        raise ValueError(
            f"iris.ops.{name}: variant='copy_engine' copies whole rows, so {what} needs unit column "
            f"stride; got strides {tensor.stride()}"
        )


def matmul_all_gather_plan(ops, out, A, B, block, cfg, async_op: bool) -> list:
    """Steps of ``matmul_all_gather`` (either ``dim``): ``block`` is this rank's view in ``out``.

    ``cfg`` gives the chunks (``copy_chunks``, ``copy_tail_rows``) and how the last
    one travels (``sm_tail``; its pushes use the config's tiles).

    Example:
        >>> steps = matmul_all_gather_plan(ctx.ops, out, a, b, out[:, r * n:(r + 1) * n], cfg, False)
    """
    _check_rows_unit_stride("matmul_all_gather", out, "out")
    shake = _Handshake(ops)
    steps = shake.start()
    bounds = chunk_bounds(block.shape[0], cfg.copy_chunks, cfg.copy_tail_rows)
    for start, stop in bounds:
        a_rows, c_rows = A[start:stop], block[start:stop]
        steps.append(lambda a=a_rows, c=c_rows: matmul_into(a, B, c))
        if cfg.sm_tail and stop == bounds[-1][1]:
            # Every SM is free once the GEMM ends; the entry handshake has passed, so the
            # push kernel's own wait for it returns at once.
            steps.append(ops._all_scatter_launch(c_rows, cfg))
        else:
            steps.append(shake.put(c_rows, c_rows, shake.peers))
    steps.append(shake.engine.join)
    # Peers put into this rank's out: only a barrier says that they are done.
    if not async_op:
        steps.append(shake.ctx.device_barrier)
    return shake.replayed(steps)


def all_gather_matmul_plan(ops, out, A, B) -> list:
    """Steps of ``all_gather_matmul``: ``out = all_gather(A) @ B``; ends like a collective.

    Example:
        >>> steps = all_gather_matmul_plan(ctx.ops, out, a_shard, b)
    """
    shake = _Handshake(ops)
    rank, M = shake.rank, A.shape[0]
    gathered = ops._buffer("gathered_copies", (shake.world * M, A.shape[1]), A.dtype)
    steps = shake.start()
    shard = A
    if A.stride(1) != 1:
        shard = torch.empty_like(A, memory_format=torch.contiguous_format)
        steps.append(lambda: shard.copy_(A))
    steps.append(shake.put(gathered[rank * M : (rank + 1) * M], shard, shake.peers, announce=True))
    steps.append(lambda: matmul_into(shard, B, out[rank * M : (rank + 1) * M]))
    for peer in shake.peers:
        rows = slice(peer * M, (peer + 1) * M)
        steps.append(shake.wait(peer))
        steps.append(lambda rows=rows: matmul_into(gathered[rows], B, out[rows]))
    steps.append(shake.engine.join)
    return shake.replayed(steps)


def matmul_reduce_scatter_plan(ops, out, A, B, partial) -> list:
    """Steps of ``matmul_reduce_scatter``: ``A (world*M, K)``, partial products into ``partial``
    (``(world*M, N)``, any device memory); ends like a collective.

    Example:
        >>> steps = matmul_reduce_scatter_plan(ctx.ops, out, a, b, partial)
    """
    shake = _Handshake(ops)
    rank, world = shake.rank, shake.world
    M, N = out.shape
    landing = ops._buffer("landing", (world * M, N), out.dtype)
    mine = landing[rank * M : (rank + 1) * M]
    steps = shake.start()
    for peer in shake.peers:
        rows = slice(peer * M, (peer + 1) * M)
        steps.append(lambda rows=rows: matmul_into(A[rows], B, partial[rows]))
        steps.append(shake.put(mine, partial[rows], [peer], announce=True))
    steps.append(lambda: matmul_into(A[rank * M : (rank + 1) * M], B, mine))
    steps.append(shake.wait())
    grid = (triton.cdiv(M, SUM_BLOCK), triton.cdiv(N, SUM_BLOCK))
    steps.append(
        PreparedLaunch(
            sum_landed_kernel,
            grid,
            (out, landing, M, N, *out.stride(), world),
            dict(BLOCK_M=SUM_BLOCK, BLOCK_N=SUM_BLOCK),
        )
    )
    steps.append(shake.engine.join)
    return shake.replayed(steps)
