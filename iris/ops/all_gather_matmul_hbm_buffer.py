"""Upstream Iris's HBM-staged all-gather + GEMM: ``out = concat_K(every rank's A_sharded) @ B``.

The shapes are upstream's ``all_gather_matmul``'s (:mod:`iris.ops.pull_gather`):
rank ``r`` holds ``A_r (M x K_local)``, columns ``[r * K_local, (r + 1) * K_local)`` of
``A``; every rank holds ``B (K x N)`` and computes all of ``out (M x N)``. Where the
pulled kernel reads the peers' slices inside each output tile's dot product, this one
splits its programs into two kinds:

* **fetchers** copy ``BLOCK_M x BLOCK_K`` blocks of every rank's shard (the peers'
  read from their heaps with :func:`iris.load`) into a local ``M x K`` staging buffer
  in HBM, and raise one local flag per ``k_per_flag`` consecutive K blocks of an
  ``M`` tile (:func:`iris.signal`);
* **GEMM programs** compute one output tile each, waiting (:func:`iris.wait_until`,
  traced and under the wait timeout) for each K group's flag before reading that group
  from the staging buffer.

Each remote block is thus read once per rank, not once per output column tile, at
the cost of a round trip through HBM. The grid is laid out in ``num_fetch_stages``
stages, each ``[fetchers][GEMM programs]`` for its share of the ``M`` tiles (the first
stage with ``first_stage_fetch_sms`` fetchers), so a GEMM program only waits on
fetchers with lower program ids: those the GPU starts first, and that the interpreter
runs first. Fetchers walk a band of ``group_size_m`` M tiles K group by K group, so the
band's GEMM programs can start on their first group early.

The tuning table (:data:`_CHAMPION_CONFIGS`) and heuristics (:func:`_auto_config`) are
upstream's, measured on MI300X; kept so that a program's ``config=None`` chooses as it
does upstream (docs/upstream.md). ``trace=True`` records, per program, its start and
end time, its time spent waiting and its SM in ``workspace.trace_data`` (upstream's
fields; ``xcd`` holds the SM); ``ctx.tracing`` traces this op like any other.

Example:
    >>> ws = iris.ops.all_gather_matmul_hbm_buffer_preamble(ctx, a_shard, b)
    >>> iris.ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard, b, workspace=ws)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..device import rma, tracing
from ..device import utils as device_utils
from ._plans import check_bias, check_out, gemm_dims
from .config import FusedConfig
from .gemm import SCOPE_GEMM, tile_coords, tile_gemm
from .workspace import FusedWorkspace

#: Upstream's tuned launches on MI300X by ``(M, N, K)``: tiles ``bm x bn x bk``, band ``gm``,
#: K blocks per flag ``kpf``, fetchers per later stage ``fs``, stages ``nfs``, and
#: fetchers of the first stage ``fsf``.
_CHAMPION_CONFIGS = {
    (262144, 8192, 8192): dict(bm=256, bn=256, bk=64, gm=24, kpf=64, fs=52, nfs=128, fsf=304),
    (131072, 16384, 16384): dict(bm=256, bn=256, bk=64, gm=24, kpf=32, fs=4, nfs=64, fsf=52),
    (147456, 28672, 4096): dict(bm=256, bn=256, bk=64, gm=24, kpf=16, fs=59, nfs=36, fsf=52),
    (229376, 28672, 4096): dict(bm=256, bn=256, bk=64, gm=24, kpf=16, fs=4, nfs=56, fsf=52),
    (327680, 28672, 4096): dict(bm=256, bn=256, bk=64, gm=24, kpf=16, fs=4, nfs=32, fsf=52),
    (8192, 8192, 262144): dict(bm=128, bn=256, bk=64, gm=8, kpf=32, fs=4, nfs=8, fsf=52),
    (16384, 16384, 131072): dict(bm=128, bn=256, bk=64, gm=16, kpf=16, fs=16, nfs=8, fsf=52),
}

#: Launch settings when neither ``config=None`` (the table) nor the call chooses them, upstream's:
#: ``(k_per_flag, num_fetch_sms, num_fetch_stages, first_stage_fetch_sms)``.
_DEFAULTS = (8, 32, 1, 256)
#: ``staged_a_layout``: which of the staging buffer's dimensions is contiguous.
LAYOUTS = ("k_contiguous", "m_contiguous")


def _largest_dividing(k_per_flag: int, k_blocks: int) -> int:
    # Halve until it divides the K blocks (upstream's rule); 1 always does.
    while k_blocks % k_per_flag and k_per_flag > 1:
        k_per_flag //= 2
    return k_per_flag


def _auto_config(M: int, N: int, K: int, world_size: int = 8):
    """Upstream's choice of launch for ``(M, N, K)``: a tuned entry, else its heuristics.

    Returns ``(FusedConfig, k_per_flag, num_fetch_sms, num_fetch_stages,
    first_stage_fetch_sms)``. Tiles are 64 deep and 256 wide; 256 rows once ``M`` is a
    multiple of 256 of at least 8192, else 128; ``k_per_flag`` as large as divides the K
    blocks; more fetchers, stages and a wider band as the M tiles grow.

    Example:
        >>> config, k_per_flag, fetchers, stages, first = _auto_config(1024, 256, 1024, 8)
        >>> config.block_m, k_per_flag
        (128, 4)
    """
    del world_size  # upstream's signature; its choices depend on the shape alone
    tuned = _CHAMPION_CONFIGS.get((M, N, K))
    if tuned is not None:
        config = FusedConfig(
            block_m=tuned["bm"], block_n=tuned["bn"], block_k=tuned["bk"], group_m=tuned["gm"]
        )
        k_per_flag = _largest_dividing(tuned["kpf"], K // tuned["bk"])
        return config, k_per_flag, tuned["fs"], tuned["nfs"], tuned["fsf"]
    k_blocks = K // 64
    block_m = 256 if M % 256 == 0 and M >= 8192 else 128
    m_tiles = M // block_m
    k_per_flag = 64 if k_blocks >= 512 else 16 if k_blocks >= 128 else 8 if k_blocks >= 64 else 4
    fetchers = 4 if m_tiles <= 8 else 16 if m_tiles <= 32 else 32 if m_tiles <= 128 else 52
    stages = 4 if m_tiles >= 512 else 2 if m_tiles >= 64 else 1
    band = 24 if m_tiles >= 64 else 8 if m_tiles >= 16 else 1
    config = FusedConfig(block_m=block_m, block_n=256, block_k=64, group_m=band)
    return config, _largest_dividing(k_per_flag, k_blocks), fetchers, stages, 64


@triton.jit
def _fetch(a_shard, staged, flags, m_tile, k_group, stride_am, stride_ak, stride_sm, stride_sk,
           cur_rank, heap_bases, K_LOCAL_BLOCKS: tl.constexpr, K_PER_FLAG: tl.constexpr,
           GROUPS_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
    # One flag's worth: K_PER_FLAG blocks of M tile ``m_tile``, each from the rank that holds it.
    rm = (m_tile * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
    rk = tl.arange(0, BLOCK_K)[None, :]
    for k_off in range(K_PER_FLAG):
        k_block = k_group * K_PER_FLAG + k_off
        source = k_block // K_LOCAL_BLOCKS
        local_k = (k_block % K_LOCAL_BLOCKS) * BLOCK_K + rk
        block = rma.load(a_shard + rm * stride_am + local_k * stride_ak, cur_rank, source, heap_bases,
                         pid_m=m_tile, pid_n=k_block)  # fmt: skip
        tl.store(staged + rm * stride_sm + (k_block * BLOCK_K + rk) * stride_sk, block)
    rma.signal(flags + m_tile * GROUPS_K + k_group, 1, cur_rank, cur_rank, heap_bases, scope="gpu",
               pid_m=m_tile, pid_n=k_group)  # fmt: skip


@triton.jit
def hbm_buffer_kernel(
    a_shard, b, out, bias, staged, flags, timings,
    M, N, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_sm, stride_sk, stride_bias,
    cur_rank, heap_bases,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    M_TILES: tl.constexpr, N_TILES: tl.constexpr, K_BLOCKS: tl.constexpr, K_LOCAL_BLOCKS: tl.constexpr,
    K_PER_FLAG: tl.constexpr, FETCHERS: tl.constexpr, FIRST_FETCHERS: tl.constexpr, STAGES: tl.constexpr,
    HAS_BIAS: tl.constexpr, TIMINGS: tl.constexpr,
):  # fmt: skip
    """A fetcher or a GEMM program, by program id (module docstring).

    ``flags`` holds ``M_TILES x K_BLOCKS / K_PER_FLAG`` zeros at launch; with ``TIMINGS``,
    ``timings (grid, 4)`` int64 gets each program's start, end, waiting (ns) and SM.

    Example:
        >>> hbm_buffer_kernel[(grid,)](a, b, out, out, staged, flags, flags, M, N, *a.stride(),
        ...     *b.stride(), *out.stride(), *staged.stride(), 0, rank, heap_bases,
        ...     128, 256, 64, 8, M // 128, N // 256, K // 64, K_local // 64, 4, 32, 256, 1, False, False)
    """
    GROUPS_K: tl.constexpr = K_BLOCKS // K_PER_FLAG
    M_PER_STAGE: tl.constexpr = (M_TILES + STAGES - 1) // STAGES
    GEMMS_PER_STAGE: tl.constexpr = M_PER_STAGE * N_TILES
    FIRST_STAGE: tl.constexpr = FIRST_FETCHERS + GEMMS_PER_STAGE
    pid = tl.program_id(0)
    if TIMINGS:  # the timer is read only when asked: each read is an instruction that stays
        started = device_utils.read_realtime()
        waited = started * 0
    zero = pid * 0  # both branches below give tensors of one type
    if pid < FIRST_STAGE:
        stage = zero
        local = pid
        fetchers = zero + FIRST_FETCHERS
    else:
        stage = 1 + (pid - FIRST_STAGE) // (FETCHERS + GEMMS_PER_STAGE)
        local = (pid - FIRST_STAGE) % (FETCHERS + GEMMS_PER_STAGE)
        fetchers = zero + FETCHERS
    first_m = stage * M_PER_STAGE
    stage_m_tiles = tl.minimum(M_PER_STAGE, M_TILES - first_m)
    if local < fetchers:
        # Bands of GROUP_M tiles (the last one may be short), K group by K group within a band.
        for g in range(local, stage_m_tiles * GROUPS_K, fetchers):
            band = g // (GROUP_M * GROUPS_K)
            band_tiles = tl.minimum(GROUP_M, stage_m_tiles - band * GROUP_M)
            within = g - band * GROUP_M * GROUPS_K
            m_tile = first_m + band * GROUP_M + within % band_tiles
            _fetch(
                a_shard, staged, flags, m_tile, within // band_tiles, stride_am, stride_ak, stride_sm,
                stride_sk, cur_rank, heap_bases, K_LOCAL_BLOCKS, K_PER_FLAG, GROUPS_K, BLOCK_M, BLOCK_K,
            )  # fmt: skip
    elif local - fetchers < stage_m_tiles * N_TILES:
        pid_m, pid_n = tile_coords(local - fetchers, stage_m_tiles, N_TILES, GROUP_M)
        pid_m += first_m
        begun = tracing.trace_begin(heap_bases)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_group in range(GROUPS_K):
            if TIMINGS:
                before = device_utils.read_realtime()
            rma.wait_until(flags + pid_m * GROUPS_K + k_group, "ge", 1, scope="gpu", heap_bases=heap_bases,
                           pid_m=pid_m, pid_n=pid_n, op="iris.ops.all_gather_matmul_hbm_buffer")  # fmt: skip
            if TIMINGS:
                waited += device_utils.read_realtime() - before
            k_first = k_group * K_PER_FLAG * BLOCK_K
            acc = tile_gemm(
                staged + k_first * stride_sk, b + k_first * stride_bk, pid_m, pid_n, M, N,
                K_PER_FLAG * BLOCK_K, stride_sm, stride_sk, stride_bk, stride_bn,
                BLOCK_M, BLOCK_N, BLOCK_K, True, acc,
            )  # fmt: skip
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        if HAS_BIAS:
            acc += tl.load(bias + rm * stride_bias, mask=rm < M, other=0.0).to(tl.float32)[:, None]
        tracing.trace_end(heap_bases, begun, SCOPE_GEMM, pid_m, pid_n)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rm[:, None] < M) & (rn[None, :] < N)
        tl.store(
            out + rm[:, None] * stride_cm + rn[None, :] * stride_cn, acc.to(out.dtype.element_ty), mask=mask
        )
    if TIMINGS:
        row = timings + pid * 4
        tl.store(row, started)
        tl.store(row + 1, device_utils.read_realtime())
        tl.store(row + 2, waited)
        tl.store(row + 3, device_utils.get_cu_id().to(tl.int64))


# ------------------------------------------------------------------ upstream Iris's module functions
def _settings(M, N, K, world, config, k_per_flag=None, fetchers=None, stages=None, first=None):
    # (config, k_per_flag, fetchers per later stage, stages, first stage's fetchers): what the
    # call gives, then, with no config, _auto_config's choice, then upstream's defaults.
    chosen = (k_per_flag, fetchers, stages, first)
    if config is None:
        config, *auto = _auto_config(M, N, K, world)
        chosen = tuple(auto_value if value is None else value for value, auto_value in zip(chosen, auto))
    return config, *(default if value is None else value for value, default in zip(chosen, _DEFAULTS))


def _check(ctx, A_sharded, B, config: FusedConfig, k_per_flag: int, staged_a_layout: str):
    # Upstream's asserts, as errors that say what to change.
    name = "all_gather_matmul_hbm_buffer"
    world = ctx.get_num_ranks()
    M, K_local, N = gemm_dims(name, A_sharded, B, shards=world)
    if staged_a_layout not in LAYOUTS:
        raise ValueError(
            f"iris.ops.{name}: staged_a_layout must be one of {LAYOUTS}, got {staged_a_layout!r}"
        )
    if M % config.block_m or K_local % config.block_k:
        raise ValueError(
            f"iris.ops.{name}: M={M} must be a multiple of block_size_m={config.block_m} and "
            f"K_local={K_local} of block_size_k={config.block_k}"
        )
    k_blocks = world * K_local // config.block_k
    if k_per_flag <= 0 or k_blocks % k_per_flag:
        raise ValueError(
            f"iris.ops.{name}: k_per_flag={k_per_flag} must divide the {k_blocks} K blocks "
            f"(K={world * K_local} / block_size_k={config.block_k})"
        )
    if not ctx.is_symmetric(A_sharded):
        raise ValueError(f"iris.ops.{name}: A_sharded is read by the other ranks, so it must be on the heap")
    return M, K_local, N


def all_gather_matmul_hbm_buffer_preamble(
    ctx, A_sharded, B, config: FusedConfig | None = None, k_per_flag: int | None = None,
    staged_a_layout: str = "k_contiguous",
) -> FusedWorkspace:  # fmt: skip
    """A workspace with the staging buffer (``aux_buffer``, ``M x K``) and flags (``locks``).

    Both are views of the context's own heap buffers, reused by later calls (as
    ``ctx.ops`` reuses its workspaces), so a call that prepares again costs no heap.

    Args:
        ctx: the :class:`iris.Iris` context.
        A_sharded, B: as for :func:`all_gather_matmul_hbm_buffer`.
        config: tiles; ``None``: :func:`_auto_config`'s, which also sets ``k_per_flag``.
        k_per_flag: K blocks per flag (default 8 where ``config`` is given).
        staged_a_layout: ``"k_contiguous"`` (row-major ``M x K``) or ``"m_contiguous"``.

    Example:
        >>> ws = iris.ops.all_gather_matmul_hbm_buffer_preamble(ctx, a_shard, b, k_per_flag=4)
        >>> ws.aux_buffer.shape
        torch.Size([1024, 8192])
    """
    world = ctx.get_num_ranks()
    config, k_per_flag, *_ = _settings(A_sharded.shape[0], B.shape[1], B.shape[0], world, config, k_per_flag)
    M, K_local, N = _check(ctx, A_sharded, B, config, k_per_flag, staged_a_layout)
    K = world * K_local
    workspace = FusedWorkspace()
    workspace.describe("all_gather_matmul_hbm_buffer", A_sharded, B, world, f"hbm_buffer_{staged_a_layout}")
    # The context's own heap buffers, grown when a call needs more (the heap never frees):
    # calls that pass no workspace, or a new one each time, do not use up the heap.
    if staged_a_layout == "m_contiguous":
        workspace.aux_buffer = ctx.ops._buffer("hbm_staged_m_contiguous", (K, M), A_sharded.dtype).T
    else:
        workspace.aux_buffer = ctx.ops._buffer("hbm_staged_k_contiguous", (M, K), A_sharded.dtype)
    flags = (M // config.block_m) * (K // config.block_k // k_per_flag)
    workspace.locks = ctx.ops._flags("hbm_staged", flags)[:flags]
    ctx.barrier()
    return workspace


def all_gather_matmul_hbm_buffer(
    ctx, output_tensor, A_sharded, B, bias=None, async_op: bool = False, config: FusedConfig | None = None,
    workspace: FusedWorkspace | None = None, num_fetch_sms: int | None = None, k_per_flag: int | None = None,
    fetch_block_m: int | None = None, fetch_block_k: int | None = None, staged_a_layout: str = "k_contiguous",
    num_warps: int | None = 8, num_stages: int | None = 2, num_fetch_stages: int | None = None,
    first_stage_fetch_sms: int | None = None, trace: bool = False,
) -> FusedWorkspace:  # fmt: skip
    """``output_tensor = concat_K(every rank's A_sharded) @ B (+ bias[:, None])``; returns the workspace.

    Args:
        ctx: the :class:`iris.Iris` context.
        output_tensor: ``(M, N)``.
        A_sharded: ``(M, K_local)``, this rank's columns of ``A``, on the heap.
        B: ``(world_size * K_local, N)``.
        bias: ``M`` entries, added to the fp32 accumulator.
        async_op: skip the closing device barrier (peers may still read ``A_sharded``).
        config: tiles and band; ``None``: :func:`_auto_config`'s, with its launch settings.
        workspace: from :func:`all_gather_matmul_hbm_buffer_preamble` (made when ``None``);
            one made for another shape or layout is made again.
        num_fetch_sms, num_fetch_stages, first_stage_fetch_sms: fetchers per later stage,
            stages, fetchers of the first stage (defaults 32, 1, 256 where ``config`` is given).
        k_per_flag: K blocks per flag; must divide ``K / block_size_k``.
        fetch_block_m, fetch_block_k: taken as upstream takes them, unused (fetchers copy
            the GEMM's tiles).
        staged_a_layout: ``"k_contiguous"`` or ``"m_contiguous"``.
        num_warps, num_stages: the kernel's launch options.
        trace: fill ``workspace.trace_data`` with each program's timings (module docstring).

    Example:
        >>> out = ctx.empty(M, N, dtype=torch.float16)
        >>> ws = iris.ops.all_gather_matmul_hbm_buffer(ctx, out, a_shard, b, k_per_flag=4)
    """
    world = ctx.get_num_ranks()
    M, N, K = A_sharded.shape[0], B.shape[1], B.shape[0]
    config, k_per_flag, fetchers, stages, first = _settings(
        M, N, K, world, config, k_per_flag, num_fetch_sms, num_fetch_stages, first_stage_fetch_sms
    )
    M, K_local, N = _check(ctx, A_sharded, B, config, k_per_flag, staged_a_layout)
    name = "all_gather_matmul_hbm_buffer"
    check_out(name, output_tensor, (M, N), A_sharded, ctx, symmetric=False)
    for setting, value in (("num_fetch_sms", fetchers), ("num_fetch_stages", stages),
                           ("first_stage_fetch_sms", first), ("fetch_block_m", fetch_block_m),
                           ("fetch_block_k", fetch_block_k)):  # fmt: skip
        if value is not None and value <= 0:
            raise ValueError(f"iris.ops.{name}: {setting} must be positive, got {value}")
    if bias is not None:
        check_bias(name, bias, M, A_sharded)
    variant = f"hbm_buffer_{staged_a_layout}"
    m_tiles, groups_k = M // config.block_m, world * K_local // config.block_k // k_per_flag
    if (
        workspace is None
        or not workspace.matches(name, (M, N, K), A_sharded.dtype, world, variant)
        or workspace.locks is None
        or workspace.locks.numel() != m_tiles * groups_k
    ):
        workspace = all_gather_matmul_hbm_buffer_preamble(
            ctx, A_sharded, B, config, k_per_flag, staged_a_layout
        )
    n_tiles = triton.cdiv(N, config.block_n)
    gemms_per_stage = triton.cdiv(m_tiles, stages) * n_tiles
    grid = first + gemms_per_stage + (fetchers + gemms_per_stage) * (stages - 1)
    timings = (
        torch.zeros((grid, 4), dtype=torch.int64, device=output_tensor.device) if trace else workspace.locks
    )
    workspace.locks.zero_()
    ctx.device_barrier()  # every rank's shard is in place before anyone reads it
    options = {} if num_warps is None else {"num_warps": num_warps}
    options.update({} if num_stages is None else {"num_stages": num_stages})
    hbm_buffer_kernel[(grid,)](
        A_sharded, B, output_tensor, bias if bias is not None else output_tensor, workspace.aux_buffer,
        workspace.locks, timings, M, N, *A_sharded.stride(), *B.stride(), *output_tensor.stride(),
        *workspace.aux_buffer.stride(), bias.stride(0) if bias is not None else 0, ctx.get_rank(),
        ctx._heap_bases_for_iris(), config.block_m, config.block_n, config.block_k, config.group_m, m_tiles,
        n_tiles, world * K_local // config.block_k, K_local // config.block_k, k_per_flag, fetchers, first,
        stages, bias is not None, trace, **options,
    )  # fmt: skip
    if not async_op:
        ctx.device_barrier()  # peers read this rank's shard until they finish
    workspace.trace_data = None
    if trace:
        columns = timings.cpu()
        workspace.trace_data = dict(
            start=columns[:, 0], end=columns[:, 1], wait=columns[:, 2], xcd=columns[:, 3].to(torch.int32),
            grid_size=grid, num_fetch_sms=fetchers, num_fetch_stages=stages, num_m_tiles=m_tiles,
            num_tiles_n=n_tiles, first_stage_fetch_sms=first, first_stage_size=first + gemms_per_stage,
            rest_stage_size=fetchers + gemms_per_stage, gemm_tiles_per_stage=gemms_per_stage,
            total_fetch_wgs=first + fetchers * (stages - 1),
        )  # fmt: skip
    return workspace
