"""How ``variant="auto"`` picks a fused op's style and its configuration: the rules, as data.

:func:`choose_variant` applies the rules of docs/design.md ("How `auto` picks", rules 1
to 12, first match wins) and :func:`default_config` gives the tiles and communication
programs. Every threshold is a constant below, named in that table beside the rule that
reads it; the measurements behind each are there, and the records in
``benchmarks/results/``. Change a threshold only with a run of ``benchmarks/fused_ops.py``
that moves it, and the table with it.

Example:
    >>> choose_variant(FusedConfig(), 1024, 1024, 4096, world_size=4, num_sms=132)
    'unfused'
"""

from __future__ import annotations

from .config import COPY_ENGINE, COPY_ENGINE_OPS, FusedConfig, tile_count

# ---------------------------------------------------------------------- the thresholds (docs/design.md)
#: Rule 2: fuse only from this per-rank reduction depth (shallower GEMMs are bandwidth-bound).
MIN_K = 1024
#: Rule 9: fuse only from this many 128 x 128 output tiles per SM (below, fusing adds a wave).
MIN_TILES_PER_SM = 1.0
#: Rule 9, ``all_gather_matmul``: its own tiles-per-SM floor.
GATHER_MIN_TILES_PER_SM = 8.0
#: Rule 9a: ``all_gather_matmul`` on 3+ ranks fuses only where gathering A takes this share
#: of the GEMM's time (:func:`gather_share`) or more.
GATHER_MIN_SHARE = 0.55
#: FLOPs of a bf16 GEMM per byte of a GPU's remote stores (cuBLAS's rate over NVLink's
#: store rate, ../shared/HARDWARE.md): only ratios of times are taken from it.
GEMM_FLOPS_PER_LINK_BYTE = 1900
#: Rules 3 and 4: the copy engines from this many per-rank output elements.
COPY_ENGINE_MIN_ELEMENTS = 1 << 22
#: Rule 3, ``matmul_reduce_scatter`` on 3+ ranks: ... and this many per peer ...
COPY_ENGINE_MIN_ELEMENTS_PER_PEER = 1 << 22
#: Rule 3a: ... unless the GPU's memory reaches this many bytes per second (``Backend.memory_bandwidth``).
FAST_MEMORY_BYTES_PER_S = 4.0e12
#: Rule 3a: below the per-peer size, fused only up to this per-rank K (else unfused).
REDUCE_SCATTER_FUSED_MAX_K = 1024
#: Rules 10 and 11: GEMM + all-scatter with at most this many peers pushes from the program
#: that computed each tile (``fused_sequential``).
SEQUENTIAL_SCATTER_MAX_PEERS = 1
#: Rule 10: ... from this many tiles per SM (below, unfused).
ONE_PEER_SCATTER_MIN_TILES_PER_SM = 2.0
#: Rule 8: GEMM + all-scatter with more peers runs ``producer_consumer`` from this many tiles per SM.
PRODUCER_CONSUMER_MIN_TILES_PER_SM = 8.0
#: Rule 7: ... and ``fused_sequential`` under this many (one wave).
SEQUENTIAL_SCATTER_MAX_TILES_PER_SM = 1.0
#: Rule 8a: where the pushes take at most this share of the GEMM's time
#: (:func:`scatter_link_share`), :data:`FEW_PUSHERS` SMs push and the GEMM gets 4 stages.
FEW_PUSHERS_MAX_LINK_SHARE = 1.0
FEW_PUSHERS = 16
#: Rule 6: ``matmul_all_reduce`` on two ranks fuses only from this per-rank K ...
ONE_PEER_REDUCE_MIN_K = 4096
#: ... and this many tiles per SM.
ONE_PEER_REDUCE_MIN_TILES_PER_SM = 4.0


# ---------------------------------------------------------------------- the rules
def gather_share(cols: int, world_size: int) -> float:
    """Time to gather A over the time of the GEMM that uses it, for ``all_gather_matmul`` in bf16.

    Each rank receives ``(world_size - 1) / world_size`` of A (``rows x k``, 2 bytes an
    element) and multiplies all of it by its ``k x cols`` block: the ratio of the two
    times depends on ``cols`` alone (:data:`GEMM_FLOPS_PER_LINK_BYTE`).

    Example:
        >>> round(gather_share(2048, 4), 2)   # N = 8192 on four ranks
        0.7
    """
    return (world_size - 1) / world_size * GEMM_FLOPS_PER_LINK_BYTE / cols


def sharing_saves_a_wave(tiles: int, num_sms: int, comm_sms: int) -> bool:
    """Whether a GEMM of ``tiles`` tiles should keep every SM and share them with small consumers.

    Only when giving ``comm_sms`` SMs to communication would add a wave to a GEMM of
    at most two: that wave is a third of the GEMM or more. Measured on 4 x H200
    (sweep `tune_fused_shared_h200x4`): with 256 tiles (2 waves
    on 132 SMs, 3 on 108) sharing took 0.283-0.292 ms against 0.303-0.316 for
    consumers on SMs of their own; with 448 and 1024 tiles 2-warp consumers lost
    25-35% (they push only about 200 GB/s, an estimate), and 4-warp ones, with the
    registers :func:`split_sm_registers` leaves them, still 6-11%
    (sweep `tune_fused_push_last_h200x4`).

    Example:
        >>> sharing_saves_a_wave(256, 132, 24)
        True
    """
    waves = -(-tiles // num_sms)
    return waves <= 2 and waves < -(-tiles // (num_sms - comm_sms))


def scatter_link_share(k: int, world_size: int) -> float:
    """Time a GEMM + all-scatter's pushes take over the GEMM's own, at cuBLAS's rate and the links'.

    Each output element costs ``2 k`` FLOPs and leaves as 2 bytes to each of
    ``world_size - 1`` peers, so the ratio is ``(world_size - 1) * GEMM_FLOPS_PER_LINK_BYTE / k``
    whatever the tile: under 1 the pushes fit behind the GEMM.

    Example:
        >>> round(scatter_link_share(8192, 4), 2)   # K = 8192 on four ranks
        0.7
    """
    return (world_size - 1) * GEMM_FLOPS_PER_LINK_BYTE / k


def _few_pushers(op: str | None, k: int, world_size: int) -> bool:
    # GEMM + all-scatter with several peers whose pushes fit behind the GEMM (FEW_PUSHERS_MAX_LINK_SHARE).
    return (
        op == "matmul_all_gather"
        and world_size - 1 > SEQUENTIAL_SCATTER_MAX_PEERS
        and scatter_link_share(k, world_size) <= FEW_PUSHERS_MAX_LINK_SHARE
    )


def _one_peer_variant(op: str, elements: int, k: int, tiles_per_sm: float, spans_nodes: bool) -> str | None:
    # choose_variant's rules for two ranks (None: the general rules decide).
    if op in COPY_ENGINE_OPS:
        if elements >= COPY_ENGINE_MIN_ELEMENTS and not spans_nodes:
            return COPY_ENGINE
        return "unfused" if op == "matmul_reduce_scatter" else None
    deep = k >= ONE_PEER_REDUCE_MIN_K and tiles_per_sm >= ONE_PEER_REDUCE_MIN_TILES_PER_SM
    return "fused" if deep else "unfused"


def default_config(
    rows: int,
    cols: int,
    k: int,
    world_size: int,
    num_sms: int,
    op: str | None = None,
    *,
    interpreted: bool = False,
) -> FusedConfig:
    """Defaults for a ``rows x cols`` per-rank output with reduction depth ``k``.

    ``ctx.ops.default_config(rows, cols, k, op)`` fills in the rest from the context.
    ``interpreted`` (the emulation backend): tiny tiles, as the interpreter runs each
    program in Python. On GPUs: 128 x 256 x 64 tiles when there are at least two waves
    of them, else 128 x 128 (fewer idle SMs in the last wave). For ``op="matmul_all_gather"``,
    consumers that share the SMs (``consumer_warps=2``, ``comm_rows=16`) where
    :func:`sharing_saves_a_wave` (measured: 16-row steps slow the other ops' kernels), and
    :data:`FEW_PUSHERS` pushers with 4 stages where the pushes fit behind the GEMM
    (:data:`FEW_PUSHERS_MAX_LINK_SHARE`).

    Example:
        >>> default_config(8192, 2048, 8192, 4, 132).block_n
        256
    """
    if interpreted:
        return FusedConfig(
            block_m=32, block_n=32, block_k=32, group_m=2, num_warps=4, num_stages=1, comm_sms=2, comm_rows=16
        )
    comm_sms = 16 if world_size <= 2 else 24
    wide_tiles = tile_count(rows, cols, 128, 256)
    if wide_tiles >= 2 * (num_sms - comm_sms):
        if op == "matmul_all_gather" and sharing_saves_a_wave(wide_tiles, num_sms, comm_sms):
            return FusedConfig(block_n=256, num_stages=3, comm_sms=comm_sms, consumer_warps=2, comm_rows=16)
        if _few_pushers(op, k, world_size):
            return FusedConfig(block_n=256, num_stages=4, comm_sms=FEW_PUSHERS)
        return FusedConfig(block_n=256, num_stages=3, comm_sms=comm_sms)
    return FusedConfig(block_n=128, num_stages=4, comm_sms=comm_sms)


def choose_variant(
    config: FusedConfig,
    rows: int,
    cols: int,
    k: int,
    world_size: int,
    num_sms: int,
    op: str | None = None,
    *,
    interpreted: bool = False,
    spans_nodes: bool = False,
    memory_bandwidth: float = 0.0,
):
    """The style ``auto`` runs: ``"fused"``, ``"unfused"``, ``"copy_engine"`` or a GEMM + all-scatter style.

    Returns the explicit variant in ``config`` unless it is ``auto``.
    ``ctx.ops.choose_variant(config, rows, cols, k, op)`` fills in the rest from the
    context. ``auto`` when ``interpreted`` (the emulation backend) always fuses (so the
    fused kernels are what CI checks).
    On GPUs it fuses when there is communication to hide (more than one rank) and
    enough work to hide it behind (see :data:`MIN_TILES_PER_SM`, :data:`MIN_K`;
    ``all_gather_matmul`: :data:`GATHER_MIN_TILES_PER_SM` and :data:`GATHER_MIN_SHARE`);
    ``matmul_reduce_scatter`` uses the copy engines from :data:`COPY_ENGINE_MIN_ELEMENTS`
    (with three or more ranks from :data:`COPY_ENGINE_MIN_ELEMENTS_PER_PEER` per peer
    unless ``memory_bandwidth``, the GPU's peak bytes per second, reaches
    :data:`FAST_MEMORY_BYTES_PER_S`; below that it runs unfused deeper than
    :data:`REDUCE_SCATTER_FUSED_MAX_K`), except in jobs that span nodes
    (``spans_nodes`): copy engines reach only this node's GPUs.
    With one peer, ``matmul_all_gather`` and ``all_gather_matmul`` use them too (below
    that size ``matmul_reduce_scatter`` runs unfused, and GEMM + all-scatter runs
    ``fused_sequential``, or unfused below :data:`ONE_PEER_SCATTER_MIN_TILES_PER_SM`),
    and ``matmul_all_reduce`` fuses only deep GEMMs (:data:`ONE_PEER_REDUCE_MIN_K`).
    With more peers GEMM + all-scatter runs ``fused_sequential`` in one wave
    (:data:`SEQUENTIAL_SCATTER_MAX_TILES_PER_SM`), ``producer_consumer`` from
    :data:`PRODUCER_CONSUMER_MIN_TILES_PER_SM`, and the workgroup-specialised kernel
    (``"fused"`) in between; where the pushes fit behind the GEMM
    (:data:`FEW_PUSHERS_MAX_LINK_SHARE`) the last two get fewer pushers from :func:`default_config`.
    ``rows`` and ``cols`` are the per-rank GEMM's output (``op`` names the ``ctx.ops`` method).
    The rules and the measurements behind them: docs/design.md, "How `auto` picks".

    Example:
        >>> choose_variant(FusedConfig(), 1024, 1024, 4096, 4, 132)
        'unfused'
    """
    if config.variant != "auto":
        return config.variant
    if interpreted:
        return "fused"
    if world_size == 1 or k < MIN_K:
        return "unfused"
    if op == "matmul_reduce_scatter" and rows * cols >= COPY_ENGINE_MIN_ELEMENTS and not spans_nodes:
        per_peer = rows * cols // world_size
        if (
            world_size == 2
            or per_peer >= COPY_ENGINE_MIN_ELEMENTS_PER_PEER
            or memory_bandwidth >= FAST_MEMORY_BYTES_PER_S
        ):
            return COPY_ENGINE
        if k > REDUCE_SCATTER_FUSED_MAX_K:
            return "unfused"
    tiles_per_sm = tile_count(rows, cols, 128, 128) / num_sms
    if world_size == 2 and op in (*COPY_ENGINE_OPS, "matmul_all_reduce"):
        one_peer = _one_peer_variant(op, rows * cols, k, tiles_per_sm, spans_nodes)
        if one_peer is not None:
            return one_peer
    if op == "matmul_all_gather" and world_size - 1 > SEQUENTIAL_SCATTER_MAX_PEERS:
        if tiles_per_sm < SEQUENTIAL_SCATTER_MAX_TILES_PER_SM:
            return "fused_sequential"
        if tiles_per_sm >= PRODUCER_CONSUMER_MIN_TILES_PER_SM:
            return "producer_consumer"
    per_sm = GATHER_MIN_TILES_PER_SM if op == "all_gather_matmul" else MIN_TILES_PER_SM
    if tiles_per_sm < per_sm:
        return "unfused"
    if op == "all_gather_matmul" and gather_share(cols, world_size) < GATHER_MIN_SHARE:
        return "unfused"
    if op == "matmul_all_gather" and world_size - 1 <= SEQUENTIAL_SCATTER_MAX_PEERS:
        if tiles_per_sm < ONE_PEER_SCATTER_MIN_TILES_PER_SM:
            return "unfused"
        return "fused_sequential"
    return "fused"
