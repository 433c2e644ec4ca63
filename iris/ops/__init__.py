"""Fused GEMM + communication, reached as ``ctx.ops`` (names as in Iris's ``iris.ops``).

* ``matmul_all_gather(out, A, B, dim=0)``: ``A (M, K)``, ``B (K, N)``; ``out (world*M, N)``
  holds every rank's ``A @ B``, stacked by rank
* ``matmul_all_gather(out, A, B, dim=1)``: the same with ``out (M, world*N)``, blocks side
  by side (GEMM + all-scatter: ``B`` is sharded by columns)
* ``all_gather_matmul(out, A, B)``: ``A (M, K)`` is a row shard; ``out (world*M, N) =
  all_gather(A) @ B``
* ``matmul_all_reduce(out, A, B)``: ``out (M, N)`` = the sum over ranks of ``A @ B``
* ``matmul_reduce_scatter(out, A, B)``: ``A (world*M, K)``; ``out (M, N)`` = row block
  ``rank`` of the sum over ranks of ``A @ B``

Shapes, strides and dtypes come from the tensors; gathers and scatters follow
``torch.distributed`` (``all_gather_into_tensor``, ``reduce_scatter_tensor``: row
blocks in rank order). Outputs written by other ranks (``matmul_all_gather``,
``matmul_all_reduce``) must be on the symmetric heap and allocated in the same order
on every rank. Every op is collective. With ``async_op=False`` (default) a device
barrier follows, so work queued afterwards on any rank sees the whole result; with
``async_op=True`` call ``ctx.device_barrier()`` (or ``ctx.barrier()``) before reading
the output or calling the op again.

Each op either runs a fused Triton kernel or its unfused fallback (cuBLAS through
``torch.matmul``, then ``ctx.ccl`` or ``torch.distributed``); ``config.variant``
picks, and ``"auto"`` uses :func:`iris.ops.config.choose_variant`.

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> a = ctx.randn(4096, 1024, dtype=torch.bfloat16)
    >>> b = ctx.randn(1024, 8192, dtype=torch.bfloat16)
    >>> out = ctx.empty(4096, 8192, dtype=torch.bfloat16)
    >>> ctx.ops.matmul_all_reduce(out, a, b)
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
import triton

from .. import config as _iris_config
from .all_scatter import (
    BOTH,
    CONSUMER,
    PRODUCER,
    all_scatter_kernel,
    fused_sequential_kernel,
    workgroup_specialized_kernel,
)
from .config import FusedConfig, choose_variant, default_config
from .gather import all_gather_matmul_kernel
from .gemm import SCOPE_GEMM, matmul_kernel
from .reduce import gemm_reduce_kernel

__all__ = ["FusedConfig", "Ops", "choose_variant", "default_config"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Ops:
    """Fused GEMM + collective ops of one :class:`iris.Iris` context (``ctx.ops``).

    Workspaces (flags, partial and gather buffers) live on the symmetric heap; each is
    allocated on first use and again only when a larger one is needed (the heap never
    frees, so run the largest shape first to allocate once). Every rank must issue the
    same ops with the same shapes in the same order.

    Example:
        >>> out = ctx.empty(world * 1024, 4096, dtype=torch.bfloat16)
        >>> ctx.ops.matmul_all_gather(out, a, b)   # a (1024, K), b (K, 4096) on every rank
    """

    def __init__(self, ctx):
        self._ctx = ctx
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._epoch = None
        self._side_stream = None
        ctx.tracing.name_scope(int(SCOPE_GEMM), "gemm tile")

    # ------------------------------------------------------------------ public ops
    def matmul_all_gather(self, out, A, B, dim: int = 0, async_op: bool = False, config=None):
        """``out = all_gather(A @ B)`` along ``dim``: 0 stacks rows (``all_gather_into_tensor``),
        1 places each rank's block at columns ``rank * N`` (GEMM + all-scatter).

        ``config.variant`` may name any of the four overlap styles (docs/fused.md);
        ``"fused"`` is ``workgroup_specialized``.

        Example:
            >>> out = ctx.empty(M, world * N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_all_gather(out, a, b_shard, dim=1)
        """
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        M, K, N = _gemm_dims("matmul_all_gather", A, B)
        if dim not in (0, 1):
            raise ValueError(f"iris.ops.matmul_all_gather: dim must be 0 or 1, got {dim}")
        expected = (world * M, N) if dim == 0 else (M, world * N)
        _check_out("matmul_all_gather", out, expected, A, ctx, symmetric=True)
        block = out.narrow(dim, rank * (M if dim == 0 else N), M if dim == 0 else N)
        cfg, variant = self._plan(config, M, N, K)
        if variant == "fused":
            variant = "workgroup_specialized"
        num_sms = ctx.get_cu_count()
        heap_bases = ctx.get_heap_bases()
        even_k = K % cfg.block_k == 0
        tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
        ws = SimpleNamespace(
            flags=self._flags("tile", tiles), entry=self._flags("entry", world), epoch=self._bump()
        )
        gemm = dict(
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m, EVEN_K=even_k,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
        if variant in ("unfused", "bulk_synchronous"):
            if variant == "unfused":
                _matmul_into(A, B, block)
            else:
                matmul_kernel[(min(num_sms, tiles),)](
                    A, B, block, M, N, K, *A.stride(), *B.stride(), *block.stride(), heap_bases, **gemm
                )
            all_scatter_kernel[(num_sms,)](
                block, ws.entry, ws.epoch, M, N, *block.stride(), rank, world, heap_bases,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, COMM_ROWS=cfg.comm_rows, num_warps=cfg.num_warps,
            )  # fmt: skip
        elif variant == "fused_sequential":
            fused_sequential_kernel[(min(num_sms, tiles),)](
                A, B, block, ws.entry, ws.epoch, M, N, K, *A.stride(), *B.stride(), *block.stride(),
                rank, world, heap_bases, **gemm,
            )  # fmt: skip
        else:
            comm = min(cfg.comm_sms, num_sms - 1)
            args = (
                A, B, block, ws.flags, ws.entry, ws.epoch, M, N, K, *A.stride(), *B.stride(), *block.stride(),
                rank, world, heap_bases,
            )  # fmt: skip
            if variant == "workgroup_specialized":
                workgroup_specialized_kernel[(num_sms,)](
                    *args, num_sms - comm, ROLE=BOTH, COMM_ROWS=cfg.comm_rows, **gemm
                )
            else:
                self._producer_consumer(args, num_sms - comm, comm, dict(COMM_ROWS=cfg.comm_rows, **gemm))
        if not async_op:
            ctx.device_barrier()
        return out

    def all_gather_matmul(self, out, A, B, async_op: bool = False, config=None):
        """``out = all_gather(A) @ B``: ``A (M, K)`` is this rank's row shard, ``out`` is ``(world*M, N)``.

        Fused: some programs push this rank's shard to every peer while the others
        multiply, own rows first, then each peer's rows as they land.

        Example:
            >>> out = ctx.empty(world * M, N, dtype=torch.bfloat16)
            >>> ctx.ops.all_gather_matmul(out, x_shard, w)
        """
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        M, K, N = _gemm_dims("all_gather_matmul", A, B)
        _check_out("all_gather_matmul", out, (world * M, N), A, ctx, symmetric=False)
        cfg, variant = self._plan(config, world * M, N, K)
        if variant not in ("fused", "unfused"):
            raise ValueError(
                f"iris.ops.all_gather_matmul: variant must be auto, fused or unfused, got {variant!r}"
            )
        gathered = self._buffer("gathered", (world * M, K), A.dtype)
        if variant == "unfused":
            if world > 1:
                _all_gather(ctx, gathered, A.contiguous())
            else:
                gathered.copy_(A)
            _matmul_into(gathered, B, out)
        else:
            a_shard = A if A.stride() == gathered.stride() else A.contiguous()
            chunks = triton.cdiv(M, cfg.block_m)
            ws = SimpleNamespace(flags=self._flags("chunk", world * chunks), epoch=self._bump())
            num_sms = ctx.get_cu_count()
            comm = min(cfg.comm_sms, num_sms - 1) if world > 1 else 0
            all_gather_matmul_kernel[(num_sms,)](
                a_shard, gathered, B, out, ws.flags, ws.epoch, M, N, K, *a_shard.stride(), *B.stride(),
                *out.stride(), rank, world, ctx.get_heap_bases(), comm,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                EVEN_K=K % cfg.block_k == 0, COMM_K=cfg.block_k, num_warps=cfg.num_warps,
                num_stages=cfg.num_stages,
            )  # fmt: skip
        if not async_op:
            ctx.device_barrier()
        return out

    def matmul_all_reduce(self, out, A, B, async_op: bool = False, config=None):
        """``out = sum over ranks of A @ B`` (row-parallel linear layer): ``A (M, K)``, ``out (M, N)``.

        Fused: partial tiles are reduced by an owner rank each (two-shot) while the GEMM
        goes on; the owner sums every rank's partial in fp32 and stores the result everywhere.

        Example:
            >>> out = ctx.empty(M, N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_all_reduce(out, x, w_shard)
        """
        M, K, N = _gemm_dims("matmul_all_reduce", A, B)
        _check_out("matmul_all_reduce", out, (M, N), A, self._ctx, symmetric=True)
        return self._gemm_reduce("matmul_all_reduce", out, A, B, M, N, K, False, async_op, config)

    def matmul_reduce_scatter(self, out, A, B, async_op: bool = False, config=None):
        """``out`` = row block ``rank`` of ``sum over ranks of A @ B``: ``A (world*M, K)``, ``out (M, N)``.

        Fused: rank ``r`` reduces row block ``r`` tile by tile as the ranks' partial tiles finish.

        Example:
            >>> out = ctx.empty(M // world, N, dtype=torch.bfloat16)
            >>> ctx.ops.matmul_reduce_scatter(out, x, w_shard)
        """
        world = self._ctx.get_num_ranks()
        total_rows, K, N = _gemm_dims("matmul_reduce_scatter", A, B)
        if total_rows % world:
            raise ValueError(
                f"iris.ops.matmul_reduce_scatter: A has {total_rows} rows, not a multiple of {world} ranks"
            )
        M = total_rows // world
        _check_out("matmul_reduce_scatter", out, (M, N), A, self._ctx, symmetric=False)
        return self._gemm_reduce("matmul_reduce_scatter", out, A, B, M, N, K, True, async_op, config)

    # ------------------------------------------------------------------ internals
    def _plan(self, config, rows, cols, k):
        ctx = self._ctx
        backend, world, num_sms = _iris_config.BACKEND, ctx.get_num_ranks(), ctx.get_cu_count()
        cfg = config if config is not None else default_config(backend, rows, cols, k, world, num_sms)
        return cfg, choose_variant(cfg, backend, rows, cols, k, world, num_sms)

    def _buffer(self, name, shape, dtype):
        numel = shape[0] * shape[1]
        buf = self._buffers.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = self._buffers[(name, dtype)] = self._ctx.empty(numel, dtype=dtype)
        return buf[:numel].view(shape)

    def _flags(self, name, count):
        # Every protocol leaves its flags either at 0 or below the next epoch, so one
        # array per protocol serves every shape; a fresh (zeroed) one only when it grows.
        flags = self._buffers.get((name, torch.int32))
        if flags is None or flags.numel() < count:
            flags = self._buffers[(name, torch.int32)] = self._ctx.zeros(max(count, 64), dtype=torch.int32)
            # Peers signal into these flags: none may do so before every rank's zeros
            # have landed, or a faster rank's signal is wiped and both sides wait forever.
            self._ctx.barrier()
        return flags

    def _bump(self):
        # One epoch for every epoch-valued flag. The increment is queued on the stream
        # before the kernel (so CUDA graph replays bump it too) and every rank makes
        # the same calls, so the ranks' epochs agree.
        if self._epoch is None:
            self._epoch = self._ctx.zeros(1, dtype=torch.int32)
        self._epoch.add_(1)
        return self._epoch

    def _gemm_reduce(self, name, out, A, B, M, N, K, scatter, async_op, config):
        ctx = self._ctx
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        total_rows = world * M if scatter else M
        cfg, variant = self._plan(config, total_rows, N, K)
        if variant not in ("fused", "unfused"):
            raise ValueError(f"iris.ops.{name}: variant must be auto, fused or unfused, got {variant!r}")
        partial = self._buffer("partial", (total_rows, N), out.dtype)
        if variant == "unfused" or world == 1:
            _matmul_into(A, B, partial)
            if world == 1:
                out.copy_(partial)
            elif scatter:
                _reduce_scatter(ctx, out, partial)
            else:
                _all_reduce(ctx, out, partial)
        else:
            tiles = triton.cdiv(M, cfg.block_m) * triton.cdiv(N, cfg.block_n)
            counters = self._flags("reduce", tiles)
            num_sms = ctx.get_cu_count()
            comm = min(cfg.comm_sms, num_sms - 1)
            gemm_reduce_kernel[(num_sms,)](
                A, B, partial, out, counters, M, N, K, *A.stride(), *B.stride(), *partial.stride(),
                *out.stride(), rank, world, ctx.get_heap_bases(), num_sms - comm,
                BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
                EVEN_K=K % cfg.block_k == 0, COMM_ROWS=cfg.comm_rows, SCATTER=scatter,
                num_warps=cfg.num_warps, num_stages=cfg.num_stages,
            )  # fmt: skip
        if not async_op:
            ctx.device_barrier()
        return out

    def _producer_consumer(self, args, gemm_programs, comm_programs, common):
        ctx = self._ctx
        if _iris_config.BACKEND != "cuda":
            # The interpreter runs launches one after another: producer first, then its consumer.
            workgroup_specialized_kernel[(gemm_programs,)](*args, 0, ROLE=PRODUCER, **common)
            workgroup_specialized_kernel[(comm_programs,)](*args, 0, ROLE=CONSUMER, **common)
            return
        if self._side_stream is None:
            self._side_stream = torch.cuda.Stream(device=ctx.get_device())
        main, side = torch.cuda.current_stream(), self._side_stream
        side.wait_stream(main)  # the consumer must not see flags or data of work queued before
        workgroup_specialized_kernel[(gemm_programs,)](*args, 0, ROLE=PRODUCER, **common)
        with torch.cuda.stream(side):
            workgroup_specialized_kernel[(comm_programs,)](*args, 0, ROLE=CONSUMER, **common)
        main.wait_stream(side)


def _gemm_dims(name, A, B):
    if A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"iris.ops.{name}: A and B must be 2-D, got {tuple(A.shape)} and {tuple(B.shape)}")
    if A.shape[1] != B.shape[0]:
        raise ValueError(
            f"iris.ops.{name}: A is {tuple(A.shape)} but B is {tuple(B.shape)} (inner dims differ)"
        )
    if A.dtype != B.dtype or A.dtype not in _DTYPES:
        raise TypeError(
            f"iris.ops.{name}: A and B must share a dtype among {_DTYPES}, got {A.dtype}, {B.dtype}"
        )
    return A.shape[0], A.shape[1], B.shape[1]


def _check_out(name, out, shape, A, ctx, symmetric: bool):
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"iris.ops.{name}: out must be {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype not in _DTYPES:
        raise TypeError(f"iris.ops.{name}: out dtype {out.dtype} is not one of {_DTYPES}")
    if symmetric and not ctx.is_symmetric(out):
        raise ValueError(
            f"iris.ops.{name}: out is written by other ranks, so it must be on the symmetric heap"
        )
    if A.device != out.device:
        raise ValueError(f"iris.ops.{name}: A is on {A.device} but out is on {out.device}")


def _matmul_into(A, B, out):
    if out.is_contiguous() or out.stride(1) == 1:
        torch.matmul(A, B, out=out)
    else:
        out.copy_(A @ B)


def _ccl(ctx):
    # ctx.ccl (device collectives on the heap) when this build has it, else torch.distributed.
    return getattr(ctx, "ccl", None)


def _all_gather(ctx, out, inp):
    ccl = _ccl(ctx)
    if ccl is not None and ctx.is_symmetric(inp):
        ccl.all_gather(out, inp)
    else:
        dist.all_gather_into_tensor(out, inp)


def _all_reduce(ctx, out, inp):
    ccl = _ccl(ctx)
    if ccl is not None:
        ccl.all_reduce(out, inp)
    else:
        out.copy_(inp)
        dist.all_reduce(out)


def _reduce_scatter(ctx, out, inp):
    ccl = _ccl(ctx)
    if ccl is not None:
        ccl.reduce_scatter(out, inp)
    else:
        dist.reduce_scatter_tensor(out, inp)
