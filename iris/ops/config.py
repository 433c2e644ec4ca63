"""Tile sizes, communication programs and the fused-or-not rule of ``ctx.ops``.

Example:
    >>> from iris.ops import FusedConfig
    >>> ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(block_n=128, comm_sms=16))
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass

#: Styles of GEMM + all-scatter (``matmul_all_gather`); "fused" means workgroup_specialized
#: (producer_consumer when the config's consumers share the SMs).
SCATTER_VARIANTS = (
    "bulk_synchronous",
    "fused_sequential",
    "workgroup_specialized",
    "producer_consumer",
)
#: cuBLAS on every SM while the copy engines move finished blocks (``matmul_all_gather``,
#: ``all_gather_matmul``, ``matmul_reduce_scatter``; see :mod:`iris.ops.copy_plans`).
COPY_ENGINE = "copy_engine"
VARIANTS = ("auto", "fused", "unfused", COPY_ENGINE, *SCATTER_VARIANTS)

#: ``auto`` fuses on GPUs only when the output has at least this many 128 x 128 tiles
#: per SM: below that the GEMM cannot give SMs to communication without adding a wave,
#: and cuBLAS plus a collective wins. Tune from benchmarks/fused_ops.py.
MIN_TILES_PER_SM = 1.0
#: ... and at least this much reduction depth (shallower GEMMs are bandwidth-bound).
MIN_K = 1024
#: ``all_gather_matmul`` fuses from this many 128 x 128 output tiles per SM: measured on
#: 4 x H200, fused won at 15 and 27 tiles per SM (M = 16384) and lost by 2-4% to cuBLAS
#: after ``ctx.ccl.all_gather`` at 7 and fewer (M <= 4096).
GATHER_MIN_TILES_PER_SM = 8.0
#: ... and, with three or more ranks, only where gathering A takes at least this share of
#: the GEMM's time (:func:`gather_share`): fusing pays where it hides a large transfer. In
#: six 4 x H100 and 4 x H200 runs at M = 16384 (15.5 and 27 tiles per SM), fused beat
#: unfused by 0.5-4% at a share of 0.70 (N = 8192, K = 8192) every time; at 0.40
#: (N = 14336, K = 4096) unfused was the best style or within 1.3% of it every time, and
#: fused up to 3.4% behind (docs/fused.md, rule 9a).
GATHER_MIN_SHARE = 0.55
#: FLOPs of a bf16 GEMM per byte of a GPU's remote stores: cuBLAS at about 700 TFLOP/s
#: (690-790 in benchmarks/fused_ops.py on H100s and H200s) over the 366 GB/s a GPU's stores
#: reach over NVLink (../shared/HARDWARE.md). Only ratios of times are taken from it.
GEMM_FLOPS_PER_LINK_BYTE = 1900
#: ``matmul_reduce_scatter`` (any number of ranks), and with one peer (two ranks) also
#: ``matmul_all_gather`` and ``all_gather_matmul``, use the copy engines from this many
#: per-rank output elements: cuBLAS keeps every SM while the copy engines move the
#: finished blocks. Measured with the copy-engine plans replayed as CUDA graphs, at the
#: six shapes of benchmarks/fused_ops.py (the smallest 2^22 elements per rank on two
#: GPUs, 2^23 on four): on 2 x H200 the copy engines were the fastest style of each of
#: the three ops at every shape or within 1% of it; on 4 x H200 the fastest
#: ``matmul_reduce_scatter`` at every shape (1.06-1.57x against 1.00-1.24x fused), while
#: for the two gathers three peers' transfers queue on the copy engines one after
#: another and the SM styles won (docs/fused.md). Before the replay they lost at
#: 2^22-2^26 elements: that was the host's time to queue the steps.
COPY_ENGINE_MIN_ELEMENTS = 1 << 22
#: With three or more ranks, ``matmul_reduce_scatter`` uses the copy engines only where
#: each peer's block (per-rank output elements / ranks) is at least this big, unless the
#: GPU's memory is as fast as :data:`FAST_MEMORY_BYTES_PER_S`: the copies to different
#: peers run one after another, each paying its start. At 2^21 and 3.7 * 2^20 elements
#: per peer (M = 1024 on four GPUs) they were the slowest style on 4 x H100 in five runs,
#: 0.94-1.00x against 1.01-1.03x unfused and 1.08-1.10x fused
#: (benchmarks/results/fused_ops_h100x4.json and its sweeps).
COPY_ENGINE_MIN_ELEMENTS_PER_PEER = 1 << 22
#: ... while on 4 x H200 they were the fastest style at both shapes in all five runs, by
#: 2-6% and 1-2% (1.05-1.08x and 1.11-1.13x; benchmarks/results/fused_ops_h200x4.json and
#: its sweeps: with the SM styles there, `auto` was 6% behind once). The two cards
#: share the architecture, the SMs and the links and differ in memory: 4.8 TB/s of HBM3e
#: against 3.35 TB/s of HBM3 (``Backend.memory_bandwidth`). From this peak rate the
#: copy engines take small blocks too; where between the two cards the rate starts to
#: pay is not measured.
FAST_MEMORY_BYTES_PER_S = 4.0e12
#: ... and below that size it fuses only a shallow GEMM (per-rank K at most this), where
#: the exchange is a large share of the call. Four GPUs, M = 1024: at K = 1024 fused beat
#: cuBLAS plus ``ctx.ccl.reduce_scatter`` by 7-9% on both cards; at K = 2048 the latter won
#: by about 4% in three runs (two cards) and lost by 1% in a fourth.
REDUCE_SCATTER_FUSED_MAX_K = 1024
#: ``matmul_all_gather`` (GEMM + all-scatter) for at most this many peers does not give SMs
#: to communication (``workgroup_specialized`): with one peer a tile's push is short next
#: to its GEMM, and every SM computing wins. Where the copy engines do not take it
#: (:data:`COPY_ENGINE_MIN_ELEMENTS`, or a job that spans nodes), it pushes each tile
#: from the program that computed it (``fused_sequential`). Measured on 2 x H200 at the
#: six shapes of benchmarks/fused_ops.py in three runs: fused_sequential beat
#: workgroup_specialized at every shape, by 5-24%. On 4 x H200 (three peers)
#: workgroup_specialized wins by 10-35% at M >= 4096.
SEQUENTIAL_SCATTER_MAX_PEERS = 1
#: ... and with one peer it fuses from this many 128 x 128 output tiles per SM; below, in
#: under two waves, the last wave's pushes have no GEMM left to hide behind, and cuBLAS
#: plus the all-scatter kernel won: at 1.9 tiles per SM (M = 1024, K = 8192) unfused beat
#: fused_sequential by 4-7% in three 2-GPU runs, while at 3.4 tiles per SM (K = 4096)
#: fused_sequential won by 2-4% (benchmarks/results/fused_ops_h200x2.json, docs/fused.md).
ONE_PEER_SCATTER_MIN_TILES_PER_SM = 2.0
#: GEMM + all-scatter with more peers runs the GEMM and the pushers as two kernels
#: (``producer_consumer`) from this many 128 x 128 tiles per SM: at 15.5 tiles per SM
#: (4 x H200, 16384 x 8192 x 8192) it beat the one-kernel workgroup-specialised style by
#: 8-9% in two runs, at 27 they tied, and at 3.9 and 6.8 the one kernel was as fast or up
#: to 2% faster (benchmarks/results/fused_ops_h200x4.json).
PRODUCER_CONSUMER_MIN_TILES_PER_SM = 8.0
#: ... and under :data:`MIN_TILES_PER_SM` (the GEMM fits one wave on every SM) it pushes
#: each tile from the program that computed it (``fused_sequential`): giving SMs to
#: pushers would add a second wave. At 0.97 tiles per SM (4 x H200, 1024 x 8192 x 8192)
#: fused_sequential beat cuBLAS plus the all-scatter kernel by 7-9% in two runs.
SEQUENTIAL_SCATTER_MAX_TILES_PER_SM = 1.0
#: GEMM + all-scatter with more peers gives its pushers :data:`FEW_PUSHERS` SMs (and the
#: GEMM 4 pipeline stages) where the pushes take at most this share of the GEMM's time
#: (:func:`scatter_link_share`): they keep up with fewer SMs, and the others compute. Four
#: ranks, per-rank K = 8192 (a share of 0.70), M = 8192-32768 on 4 x H200: 3-10% faster than
#: 24 pushers and 3 stages in every call, as the workgroup-specialised kernel (7.75 tiles per
#: SM) and as ``producer_consumer`` (from :data:`PRODUCER_CONSUMER_MIN_TILES_PER_SM`); the
#: workgroup-specialised kernel gained 2.5-9% on 4 x H100 too. At K = 4096 (1.39) it was
#: 1-6% slower, so there the pushers keep 24 SMs (sweep `fused_ops_h200x4_few_pushers_*`,
#: ..._ws_pushers_stages.json; docs/fused.md, rule 8a).
FEW_PUSHERS_MAX_LINK_SHARE = 1.0
FEW_PUSHERS = 16
#: With one peer, ``matmul_all_reduce`` fuses only a deep GEMM (per-rank K at least
#: :data:`ONE_PEER_REDUCE_MIN_K`, and this many 128 x 128 tiles per SM); otherwise cuBLAS
#: plus ``ctx.ccl.all_reduce`` won, by 0-9% in the same run (fused won by 11% at K = 4096
#: with 15 and more tiles per SM). On 4 x H200 fused won at every shape, K = 1024 and 2048.
ONE_PEER_REDUCE_MIN_K = 4096
ONE_PEER_REDUCE_MIN_TILES_PER_SM = 4.0
#: The ops with a copy-engine variant (``variant="copy_engine"`).
COPY_ENGINE_OPS = ("matmul_all_gather", "matmul_reduce_scatter", "all_gather_matmul")


#: Upstream Iris's ``FusedConfig`` names of this config's fields (either name works).
UPSTREAM_ALIASES = {
    "block_size_m": "block_m",
    "block_size_n": "block_n",
    "block_size_k": "block_k",
    "group_size_m": "group_m",
}
#: Upstream Iris's ``FusedConfig`` fields that have no effect here, with upstream's
#: defaults: grid sizing (``num_sms`) is this package's own, the chiplet and cache
#: settings are AMD's, fp32 inputs multiply in TF32 (upstream's default), and the
#: reduction protocol of ``matmul_all_reduce`` is this package's (docs/upstream.md).
#: They are accepted, validated as upstream validates them, and read back.
UPSTREAM_ONLY = {
    "num_sms": None,
    "num_xcds": 1,
    "chunk_size": 1,
    "cache_modifier_a": ".ca",
    "cache_modifier_b": ".ca",
    "allow_tf32": True,
    "all_reduce_variant": "two_shot",
    "all_reduce_num_rings": 1,
}
#: Upstream's ``all_reduce_variant`` values.
UPSTREAM_ALL_REDUCE_VARIANTS = ("atomic", "ring", "one_shot", "two_shot", "spinlock")


def _upstream_keywords(kwargs: dict, settings: tuple = ()) -> dict:
    # Upstream's names -> this config's: aliases renamed, upstream-only settings kept
    # (sorted, hashable) in the ``upstream`` field.
    kwargs = dict(kwargs)
    for theirs, ours in UPSTREAM_ALIASES.items():
        if theirs in kwargs:
            if ours in kwargs:
                raise TypeError(f"iris.ops.FusedConfig: {theirs} and {ours} name the same field; pass one")
            kwargs[ours] = kwargs.pop(theirs)
    extra = {name: kwargs.pop(name) for name in UPSTREAM_ONLY if name in kwargs}
    if extra:
        kwargs["upstream"] = tuple(sorted({**dict(kwargs.get("upstream", settings)), **extra}.items()))
    return kwargs


@dataclass(frozen=True)
class FusedConfig:
    """How a fused op runs; every field has a per-shape default (:func:`default_config`).

    Upstream Iris's field names work too (``FusedConfig(block_size_m=64)``, and
    ``cfg.block_size_m`` reads ``block_m`); its fields with no effect here
    (:data:`UPSTREAM_ONLY`) are accepted, checked and read back.

    Args:
        block_m, block_n, block_k: GEMM tile (bf16/fp16 in, fp32 accumulate).
        group_m: row band of the tile order (L2 reuse).
        num_warps, num_stages: Triton launch settings of the fused kernel.
        comm_sms: programs (one per SM) that communicate in workgroup-specialised kernels.
        comm_rows: rows per copy step of a communication program (bounds its registers).
        consumer_warps: the ``producer_consumer`` style's consumer. 0: it takes ``comm_sms``
            SMs of its own and the GEMM the rest. 1, 2 or 4: the GEMM takes every SM
            and, once all its programs have started, one consumer program of this
            many warps runs beside each, so both fit on one SM: the GEMM gives up
            registers it can spare without spilling, else the consumer is capped
            (:func:`split_sm_registers`; with too few left it runs uncapped, on SMs
            the GEMM has left).
        split_last_wave: GEMM + all-scatter (``matmul_all_gather``'s workgroup-specialised
            and producer-consumer styles) computes its last wave of tiles in halves of
            ``block_n / 2`` columns (:func:`last_wave_split`), so less is left to push
            once the GEMM ends.
        copy_chunks: row chunks of the copy-engine ``matmul_all_gather`` (0: one per
            1024 rows, 2 to 8): chunk ``c`` travels while chunk ``c + 1`` is computed.
        copy_tail_rows: rows of the copy-engine ``matmul_all_gather``'s last chunk, cut
            from the end of the block when shorter than the other chunks (0: none): nothing
            is left to hide that chunk's exchange behind, so it is kept short.
        sm_tail: the copy-engine ``matmul_all_gather`` pushes its last chunk by SM stores
            instead of the copy engines (once the GEMM ends every SM is free to push).
        variant: ``"auto"`` (by :func:`choose_variant`), ``"fused"`` (for ``matmul_all_gather``
            workgroup-specialised, or producer-consumer when ``consumer_warps`` is set), ``"unfused"``
            (cuBLAS + a collective), ``"copy_engine"`` (cuBLAS + copy-engine puts,
            pipelined), or for ``matmul_all_gather`` one of ``bulk_synchronous``,
            ``fused_sequential``, ``workgroup_specialized``, ``producer_consumer``.

    Example:
        >>> cfg = FusedConfig(block_m=128, block_n=128, comm_sms=24, variant="fused")
    """

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    comm_sms: int = 16
    comm_rows: int = 32
    consumer_warps: int = 0
    split_last_wave: bool = False
    copy_chunks: int = 0
    copy_tail_rows: int = 512
    sm_tail: bool = True
    variant: str = "auto"
    #: upstream Iris's settings without effect here, as sorted ``(name, value)`` pairs.
    upstream: tuple = ()

    def __post_init__(self):
        if self.variant not in VARIANTS:
            raise ValueError(f"iris.ops: variant must be one of {VARIANTS}, got {self.variant!r}")
        for name in ("block_m", "block_n", "block_k", "comm_rows"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"iris.ops: {name} must be a power of two >= 16, got {value}")
        if self.comm_rows > self.block_m:
            raise ValueError(
                f"iris.ops: comm_rows ({self.comm_rows}) must not exceed block_m ({self.block_m})"
            )
        if self.copy_chunks < 0:
            raise ValueError(f"iris.ops: copy_chunks must be >= 0 (0: automatic), got {self.copy_chunks}")
        if self.copy_tail_rows < 0:
            raise ValueError(f"iris.ops: copy_tail_rows must be >= 0 (0: none), got {self.copy_tail_rows}")
        if self.consumer_warps not in (0, 1, 2, 4):
            raise ValueError(f"iris.ops: consumer_warps must be 0, 1, 2 or 4, got {self.consumer_warps}")
        if self.comm_sms < 1:
            raise ValueError(f"iris.ops: comm_sms must be at least 1, got {self.comm_sms}")
        unknown = sorted(set(dict(self.upstream)) - set(UPSTREAM_ONLY))
        if unknown:
            raise ValueError(f"iris.ops: unknown upstream settings {unknown}; known: {sorted(UPSTREAM_ONLY)}")
        self.validate()

    def __getattr__(self, name):
        # Only reached for names that are not fields: upstream's settings read back.
        if name in UPSTREAM_ONLY:
            return dict(self.__dict__.get("upstream", ())).get(name, UPSTREAM_ONLY[name])
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    block_size_m = property(lambda self: self.block_m, doc="Upstream Iris's name of ``block_m``.")
    block_size_n = property(lambda self: self.block_n, doc="Upstream Iris's name of ``block_n``.")
    block_size_k = property(lambda self: self.block_k, doc="Upstream Iris's name of ``block_k``.")
    group_size_m = property(lambda self: self.group_m, doc="Upstream Iris's name of ``group_m``.")

    def validate(self, world_size: int | None = None) -> None:
        """Check upstream Iris's settings as upstream's ``FusedConfig.validate`` does.

        The fields of this package are checked when the config is made; this adds
        upstream's rules (positive counts, a known ``all_reduce_variant``, and for
        ``"ring"`` a ``block_n`` that ``world_size`` divides).

        Raises:
            ValueError: a setting upstream would refuse.

        Example:
            >>> FusedConfig(block_size_m=64, all_reduce_variant="ring").validate(world_size=4)
        """
        for name in ("num_xcds", "chunk_size", "all_reduce_num_rings"):
            if getattr(self, name) <= 0:
                raise ValueError(f"iris.ops: {name} must be positive, got {getattr(self, name)}")
        if self.num_sms is not None and self.num_sms <= 0:
            raise ValueError(f"iris.ops: num_sms must be positive, got {self.num_sms}")
        if self.all_reduce_variant not in UPSTREAM_ALL_REDUCE_VARIANTS:
            raise ValueError(
                f"iris.ops: all_reduce_variant must be one of {UPSTREAM_ALL_REDUCE_VARIANTS}, "
                f"got {self.all_reduce_variant!r}"
            )
        if self.all_reduce_variant == "ring" and world_size is not None and self.block_n % world_size:
            raise ValueError(
                f"iris.ops: for the ring variant, block_n ({self.block_n}) must be divisible by "
                f"world_size ({world_size})"
            )

    def replace(self, **changes) -> FusedConfig:
        """A copy with ``changes`` applied (this package's or upstream's names).

        Example:
            >>> cfg.replace(variant="unfused")
        """
        return dataclasses.replace(self, **_upstream_keywords(changes, self.upstream))


def upstream_setting(config: FusedConfig | None, name: str):
    """Upstream Iris's setting ``name`` of ``config``, or upstream's default when ``config`` is None.

    Example:
        >>> upstream_setting(None, "all_reduce_variant")
        'two_shot'
    """
    return UPSTREAM_ONLY[name] if config is None else getattr(config, name)


_fields_init = FusedConfig.__init__


def _init_with_upstream_names(self, *args, **kwargs):
    _fields_init(self, *args, **_upstream_keywords(kwargs))


_init_with_upstream_names.__doc__ = _fields_init.__doc__
_init_with_upstream_names.__signature__ = inspect.signature(_fields_init)
FusedConfig.__init__ = _init_with_upstream_names


#: Registers of one SM (sm_80 to sm_90).
SM_REGISTERS = 65536
#: Fewer registers per thread than this and a program would mostly spill.
MIN_SHARING_REGISTERS = 32


def registers_beside(registers: int, warps: int, other_warps: int) -> int:
    """The register cap per thread (``maxnreg`) of a program sharing an SM with another.

    The other program has ``warps`` warps of ``registers`` per thread (what ptxas gave
    its kernel); one of ``other_warps`` warps gets what is left of the SM's registers,
    in steps of 8, at most 248. 0 when less than :data:`MIN_SHARING_REGISTERS` per
    thread would be left. Both ways round: a consumer beside a compiled GEMM program,
    or a GEMM program beside a compiled consumer.

    Example:
        >>> registers_beside(224, 8, 4)  # a 4-warp consumer beside the 128 x 256 x 64 GEMM on sm_90
        64
        >>> registers_beside(168, 2, 8)  # the GEMM beside a 2-warp consumer of 168 registers
        208
    """
    left = SM_REGISTERS - registers * warps * 32
    cap = min(248, left // (other_warps * 32) // 8 * 8)
    return cap if cap >= MIN_SHARING_REGISTERS else 0


def split_sm_registers(producer, consumer, producer_warps: int, consumer_warps: int) -> tuple:
    """``maxnreg`` of a GEMM program and of the consumer beside it, so that both fit on one SM.

    ``producer`` and ``consumer`` compile their kernel with a register cap (``None`:
    uncapped) and return ``(registers, spilled)``, as ptxas reports them. The GEMM
    gives up registers it can spare (capped, it spills no more than uncapped), so the
    consumer keeps its own; otherwise the consumer gets what the GEMM leaves
    (:func:`registers_beside`), or ``None`` with too few left: it then runs
    uncapped, on SMs the GEMM has left.

    Example:
        >>> split_sm_registers(lambda cap: (cap or 220, 0), lambda cap: (168, 2), 8, 2)
        (208, None)
    """
    wanted, _ = consumer(None)
    used, spilled = producer(None)
    room = registers_beside(wanted, consumer_warps, producer_warps)
    if used <= room:
        return None, None
    if room and producer(room)[1] <= spilled:
        return room, None
    return None, registers_beside(used, producer_warps, consumer_warps) or None


def tile_count(rows: int, cols: int, block_m: int, block_n: int) -> int:
    """Tiles of ``block_m x block_n`` covering a ``rows x cols`` output, partial ones included.

    Example:
        >>> tile_count(1000, 512, 128, 256)
        16
    """
    return -(-rows // block_m) * -(-cols // block_n)


def last_wave_split(tiles: int, programs: int) -> int:
    """The first tile of the last wave of ``tiles`` on ``programs`` GEMM programs.

    The GEMM + all-scatter kernels compute the tiles from there on in halves: a wave
    of whole tiles finishes all at once and leaves all its data to push after the
    GEMM, while halves finish in two steps, and the first step's data travels while
    the second is computed. With one wave or less it is 0 (every tile in halves).

    Example:
        >>> last_wave_split(256, 132)   # tiles 132..255 in halves: 132 + 248 work units
        132
    """
    return (-(-tiles // programs) - 1) * programs


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


#: What a 128 x 128 tile (4 warps) costs beyond half a 128 x 256 one, in K-steps of
#: BLOCK_K: its epilogue and pipeline fill, which the flattened 128 x 256 loop of
#: :func:`flatten_tile_loop` hides. Fitted on one H200 (``benchmarks/gemm.py``,
#: sweep `gemm_flatten_h200`): the narrow tile's time per FLOP over the wide
#: one's was 1.02-1.05 at 128 K-steps, 1.06 at 64, 1.10-1.12 at 32, 1.22-1.23 at 16.
NARROW_TILE_EXTRA_STEPS = 3.5


def gemm_config(rows: int, cols: int, k: int, num_sms: int) -> FusedConfig:
    """Tiles for a plain ``rows x cols x k`` GEMM (:func:`iris.ops.gemm.matmul_kernel`) on ``num_sms`` SMs.

    128 x 256 tiles (8 warps, 3 stages, flattened loop) unless 128 x 128 ones (4 warps,
    4 stages) finish sooner: a wave of wide tiles takes as long as two of narrow ones,
    and each narrow tile costs ``NARROW_TILE_EXTRA_STEPS`` more K-steps, so narrow tiles
    win where they fill the last wave much better (few tiles, or a wave saved).

    Example:
        >>> gemm_config(1024, 2048, 8192, 132).block_n   # 64 wide tiles would idle half the SMs
        128
    """
    wide = FusedConfig(block_n=256, num_stages=3)
    narrow = FusedConfig(block_n=128, num_warps=4, num_stages=4)

    def waves(config: FusedConfig) -> int:
        return -(-tile_count(rows, cols, config.block_m, config.block_n) // num_sms)

    steps = max(1, -(-k // narrow.block_k))
    narrow_cost = waves(narrow) * (1 + NARROW_TILE_EXTRA_STEPS / steps)
    return narrow if narrow_cost < 2 * waves(wide) else wide


def gemm_launch_options(config: FusedConfig, k: int | None = None) -> dict:
    """The tile GEMM's launch options from ``config`: block sizes, grouping, warps, stages.

    With the reduction depth ``k`` also ``EVEN_K`` (no masked last K step), which the
    pointer-load kernels take and the tensor-descriptor kernel does not.

    Example:
        >>> gemm_launch_options(FusedConfig(), 4096)["EVEN_K"]
        True
    """
    options = dict(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        GROUP_M=config.group_m,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    if k is not None:
        options["EVEN_K"] = k % config.block_k == 0
    return options


#: Shared memory one program may use on Hopper (H100, H200): 227 KiB.
HOPPER_SHARED_BYTES = 232448
#: Shared memory the tensor-descriptor GEMM takes beyond its stages and output tile
#: (barriers; 1048 bytes compiled for sm_90 at 128 x 256 x 64), rounded up.
DESCRIPTOR_GEMM_OVERHEAD_BYTES = 2048


def descriptor_stages(
    config: FusedConfig, element_bytes: int, shared_bytes: int = HOPPER_SHARED_BYTES
) -> int:
    """``config.num_stages``, or fewer where the tensor-descriptor GEMM would not fit in shared memory.

    :func:`iris.ops.gemm.matmul_tma_kernel` stores its output tile through shared
    memory beside its input stages, which the pointer-load kernels do not: at
    128 x 256 x 64 in bf16 each stage takes 48 KiB and the tile 64 KiB, so 3 stages
    fit Hopper's 227 KiB and 4 (which :func:`default_config` gives the
    workgroup-specialised GEMM + all-scatter) do not.

    Example:
        >>> descriptor_stages(FusedConfig(block_n=256, num_stages=4), 2)
        3
    """
    per_stage = (config.block_m + config.block_n) * config.block_k * element_bytes
    room = shared_bytes - config.block_m * config.block_n * element_bytes - DESCRIPTOR_GEMM_OVERHEAD_BYTES
    return max(1, min(config.num_stages, room // per_stage))


def flatten_tile_loop(config: FusedConfig) -> bool:
    """Whether :func:`iris.ops.gemm.matmul_kernel` runs with ``FLATTEN`` (one pipelined tile and K loop).

    For 128 x 256 tiles it hid the epilogue (up to 11% faster at K = 1024 on one H200);
    for 128 x 128 tiles at 4 warps it was slower at every measured shape.

    Example:
        >>> flatten_tile_loop(gemm_config(4096, 8192, 2048, 132))
        True
    """
    return config.block_m * config.block_n >= 128 * 256


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
    The rules and the measurements behind them: docs/fused.md.

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
