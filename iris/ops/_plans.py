"""What the fused ops' plans share: recorded plans, heap buffers and flags, checks.

Each op of ``ctx.ops`` lives in a module of its name (``matmul_all_gather``,
``all_gather_matmul``, ``matmul_all_reduce``, ``matmul_reduce_scatter``) that checks a
call, picks its variant and builds its *plan*: the list of steps (prepared kernel
launches, torch calls, barriers) one call runs. :class:`Planner`, the base of
:class:`iris.ops.Ops`, keeps what those modules share for one context: the plans
recorded per call (a repeated call replays its plan), the workspaces on the heap
(allocated on first use, again only when a larger one is needed), the flags and the
epoch counter the fused protocols signal with, and the launches of the all-scatter and
producer-consumer styles that two ops use.
"""

from __future__ import annotations

import functools
import weakref

import torch

from ..host.prepared import LaunchCache, PreparedLaunch, tensor_key
from .all_scatter import CONSUMER, PRODUCER, all_scatter_kernel, workgroup_specialized_kernel
from .config import COPY_ENGINE, FusedConfig, split_sm_registers
from .gemm import SCOPE_GEMM
from .selection import choose_variant, default_config
from .workspace import FusedWorkspace

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: Recorded plans kept per context (oldest dropped first).
MAX_PLANS = 64


class Planner:
    """The state the fused ops' plans share for one context (the base of :class:`iris.ops.Ops`)."""

    def __init__(self, ctx):
        # A proxy: the context's parts must not keep it alive (see Iris.close).
        self._ctx = weakref.proxy(ctx)
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._plans = LaunchCache(MAX_PLANS)
        self._epoch = None
        self._side_stream = None
        ctx.tracing.name_scope(int(SCOPE_GEMM), "gemm tile")

    def default_config(self, rows: int, cols: int, k: int, op: str | None = None) -> FusedConfig:
        """The configuration an op picks for a ``rows x cols`` per-rank output of depth ``k`` here.

        :func:`iris.ops.selection.default_config` with this context's world size, SM
        count and backend; ``op`` names the ``ctx.ops`` method.

        Example:
            >>> cfg = ctx.ops.default_config(8192, 2048, 8192).replace(variant="fused_sequential")
            >>> ctx.ops.matmul_all_gather(out, a, b, dim=1, config=cfg)
        """
        ctx = self._ctx
        return default_config(
            rows, cols, k, ctx.get_num_ranks(), ctx.get_cu_count(), op, interpreted=ctx.backend.interpreted
        )

    def choose_variant(self, config: FusedConfig, rows: int, cols: int, k: int, op: str | None = None) -> str:
        """The variant ``config`` runs as here (:func:`iris.ops.selection.choose_variant` for this context).

        Example:
            >>> ctx.ops.choose_variant(FusedConfig(), 1024, 1024, 4096)
            'unfused'
        """
        ctx = self._ctx
        return choose_variant(
            config,
            rows,
            cols,
            k,
            ctx.get_num_ranks(),
            ctx.get_cu_count(),
            op,
            interpreted=ctx.backend.interpreted,
            spans_nodes=ctx.spans_nodes,
            memory_bandwidth=self._memory_bandwidth,
        )

    @functools.cached_property
    def _memory_bandwidth(self) -> float:
        return self._ctx.backend.memory_bandwidth(self._ctx.heap.device)

    def _call_key(self, out, A, B, async_op, config, bias=None) -> tuple:
        tensors = tuple(tensor_key(t) for t in (out, A, B))
        biased = None if bias is None else tensor_key(bias)
        return (*tensors, biased, bool(async_op), config, self._ctx.tracing.enabled)

    def _run(self, key, build):
        for step in self._plans.get_or_build(key, build):
            step()

    def _config_and_variant(self, config, rows, cols, k, op=None):
        cfg = config if config is not None else self.default_config(rows, cols, k, op)
        variant = self.choose_variant(cfg, rows, cols, k, op)
        if variant == COPY_ENGINE and self._ctx.spans_nodes:
            raise ValueError(
                f"iris.ops.{op}: the copy_engine variant reaches only the GPUs of this node, and this "
                "job spans nodes: pick fused or unfused (or auto)"
            )
        return cfg, variant

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

    def _all_scatter_launch(self, block, cfg) -> PreparedLaunch:
        # The bulk-synchronous push: every SM stores this rank's finished ``block`` (its
        # view of a symmetric output) into every peer's copy, after the call's entry
        # handshake (the flags and epoch every all-scatter plan of this object shares).
        ctx = self._ctx
        world = ctx.get_num_ranks()
        return PreparedLaunch(
            all_scatter_kernel,
            (ctx.get_cu_count(),),
            (block, self._flags("entry", world), self._epoch_counter(), *block.shape, *block.stride(),
             ctx.get_rank(), world, ctx._heap_bases_for_iris()),
            dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, COMM_ROWS=cfg.comm_rows, num_warps=cfg.num_warps),
        )  # fmt: skip

    def _epoch_counter(self):
        # One epoch for every epoch-valued flag, bumped by the first step of each call's
        # plan: queued on the stream before the kernel (so CUDA graph replays bump it
        # too), and every rank makes the same calls, so the ranks' epochs agree.
        if self._epoch is None:
            self._epoch = self._ctx.zeros(1, dtype=torch.int32)
        return self._epoch

    def _producer_consumer(self, args, tickets, cfg, num_sms, gemm_programs, common):
        sharing = cfg.consumer_warps > 0
        # Sharing SMs, every SM computes and one small consumer sits beside each GEMM program.
        comm_programs = num_sms if sharing else num_sms - gemm_programs

        def launch(role, programs, **options):
            options = dict(common, ROLE=role, **options)
            return PreparedLaunch(workgroup_specialized_kernel, (programs,), args, options)

        backend = self._ctx.backend
        if sharing and not backend.interpreted:
            producer, consumer = _sm_sharing_launches(cfg, launch, gemm_programs, comm_programs)
        else:  # under emulation a sharing consumer differs only in its sleeps (no-ops there)
            producer = launch(PRODUCER, gemm_programs)
            consumer = launch(CONSUMER, comm_programs, BACKOFF_NS=SHARING_BACKOFF_NS if sharing else 0)
        if self._side_stream is None:
            self._side_stream = backend.side_stream(self._ctx.get_device())
        # Consumers that reached the SMs first could keep GEMM programs off them while
        # waiting for their tiles: when sharing, they are launched once all have started.
        started = (tickets[2:3], gemm_programs) if sharing else None

        def run():
            backend.run_beside(self._side_stream, producer, consumer, started)

        return [run]


def _sm_sharing_launches(cfg, launch, gemm_programs, comm_programs):
    """The producer and consumer launches of SM-sharing producer-consumer (:func:`split_sm_registers`)."""
    sharing = dict(num_warps=cfg.consumer_warps, num_stages=1, BACKOFF_NS=SHARING_BACKOFF_NS)

    def producer(cap):
        return launch(PRODUCER, gemm_programs, maxnreg=cap)

    def consumer(cap):
        return launch(CONSUMER, comm_programs, maxnreg=cap, **sharing)

    def compiled(make):
        def registers_and_spills(cap):
            kernel = make(cap).compile()
            return kernel.n_regs, kernel.n_spills

        return registers_and_spills

    producer_cap, consumer_cap = split_sm_registers(
        compiled(producer), compiled(consumer), cfg.num_warps, cfg.consumer_warps
    )
    return producer(producer_cap), consumer(consumer_cap)


#: Sleep between a sharing consumer's polls of a tile flag, so the GEMM warps on its SM
#: keep issuing (4 x H200, 4096 x 8192 x 8192: 0.283 ms in the run with it, 0.292 in
#: the run before, polling busily).
SHARING_BACKOFF_NS = 500


def gemm_dims(name, A, B, shards: int = 1):
    # (rows of A, columns of A, columns of B); B has ``shards`` times A's columns as rows
    # (more than 1 where A is one rank's column shard).
    if A.dim() != 2 or B.dim() != 2:
        raise ValueError(f"iris.ops.{name}: A and B must be 2-D, got {tuple(A.shape)} and {tuple(B.shape)}")
    if A.shape[1] * shards != B.shape[0]:
        raise ValueError(
            f"iris.ops.{name}: A is {tuple(A.shape)} but B is {tuple(B.shape)} (inner dims differ)"
        )
    if A.dtype != B.dtype or A.dtype not in DTYPES:
        raise TypeError(
            f"iris.ops.{name}: A and B must share a dtype among {DTYPES}, got {A.dtype}, {B.dtype}"
        )
    return A.shape[0], A.shape[1], B.shape[1]


def check_out(name, out, shape, A, ctx, symmetric: bool):
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"iris.ops.{name}: out must be {tuple(shape)}, got {tuple(out.shape)}")
    if out.dtype not in DTYPES:
        raise TypeError(f"iris.ops.{name}: out dtype {out.dtype} is not one of {DTYPES}")
    if symmetric and not ctx.is_symmetric(out):
        raise ValueError(
            f"iris.ops.{name}: out is written by other ranks, so it must be on the symmetric heap"
        )
    if A.device != out.device:
        raise ValueError(f"iris.ops.{name}: A is on {A.device} but out is on {out.device}")


def gathers_columns(A, B, world: int) -> bool:
    # Upstream Iris's all_gather_matmul: A (M, K / world), B (K, N). Never ambiguous
    # with this package's row gather (A (M, K), B (K, N)) once there are two ranks.
    return world > 1 and A.dim() == 2 and B.dim() == 2 and A.shape[1] * world == B.shape[0]


def scatters_tiles(out, A, B, world: int) -> bool:
    # Upstream Iris's matmul_reduce_scatter: out has the full (M, N) shape; this
    # package's row scatter has out (M / world, N).
    if world == 1 or A.dim() != 2 or B.dim() != 2 or out.dim() != 2:
        return False
    return tuple(out.shape) == (A.shape[0], B.shape[1])


def check_bias(name, bias, rows: int, A):
    if bias.dim() != 1 or bias.shape[0] != rows:
        raise ValueError(
            f"iris.ops.{name}: bias must have {rows} entries (one per row), got {tuple(bias.shape)}"
        )
    if bias.device != A.device:
        raise ValueError(f"iris.ops.{name}: bias is on {bias.device} but A is on {A.device}")


def row_bias_steps(name, out, bias) -> list:
    if bias is None:
        return []
    check_bias(name, bias, out.shape[0], out)
    return [lambda: out.add_(bias[:, None])]


def refuse_bias(name, bias):
    if bias is not None:
        raise ValueError(
            f"iris.ops.{name}: bias is not supported (upstream Iris accepts it here and ignores it); "
            "add it to out after the call"
        )


def fill_workspace(workspace, operation: str, A, B, ctx, variant="", lock_tiles=None, reuse=False):
    # Upstream Iris's ops return and take a FusedWorkspace; here buffers are the
    # context's own, so a workspace passed in records the call and the tiles
    # upstream's locks would hold, refusing a reuse where those would be too few
    # (upstream's matmul_all_reduce reuses a matching workspace; matmul_reduce_scatter
    # prepares it again, checking the old locks first).
    if workspace is None:
        return
    if not isinstance(workspace, FusedWorkspace):
        raise TypeError(
            f"iris.ops.{operation}: workspace must be an iris.ops.FusedWorkspace, got {type(workspace)}"
        )
    world = ctx.get_num_ranks()
    if reuse:
        workspace.reuse(operation, A, B, world, variant, lock_tiles)
    else:
        workspace.prepare(operation, A, B, world, variant, lock_tiles, check=lock_tiles is not None)


def checked_workspace(shmem, config, workspace) -> FusedWorkspace:
    # Upstream validates the config against the world size; the op fills the workspace in.
    if config is not None:
        config.validate(world_size=shmem.get_num_ranks())
    return workspace if workspace is not None else FusedWorkspace()


def prepared_workspace(shmem, operation, A, B, config, workspace, variant="", lock_tiles=None, check=False):
    # A preamble: nothing runs, so it describes the call itself (and the tiles
    # upstream's locks would hold).
    workspace = checked_workspace(shmem, config, workspace)
    workspace.prepare(operation, A, B, shmem.get_num_ranks(), variant, lock_tiles, check)
    return workspace
