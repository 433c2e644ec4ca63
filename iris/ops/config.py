"""A fused op's configuration: tile sizes, communication programs, register split, GEMM geometry.

:class:`FusedConfig` takes this package's field names and upstream Iris's; what ``auto``
picks for a shape is :mod:`iris.ops.selection`.

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
