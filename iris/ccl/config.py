"""Tuning knobs of the collectives and the reduction operators they accept."""

from __future__ import annotations

import enum
from dataclasses import astuple, dataclass

ALL_REDUCE_VARIANTS = ("auto", "one_shot", "two_shot", "ring", "atomic", "spinlock")
#: How data crosses between ranks (``Config.protocol``).
PROTOCOLS = ("auto", "low_latency", "staged", "pushed", "direct")


class ReduceOp(enum.Enum):
    """Reductions the collectives support, named as in :class:`torch.distributed.ReduceOp`.

    Example:
        >>> ctx.ccl.all_reduce(out, inp, op=ReduceOp.MAX)
    """

    SUM = "sum"
    MAX = "max"
    MIN = "min"

    @classmethod
    def parse(cls, op) -> ReduceOp:
        """``op`` as a :class:`ReduceOp`; accepts ours, torch's, or a name like ``"sum"``."""
        if op is None:
            return cls.SUM
        if isinstance(op, cls):
            return op
        name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
        try:
            return cls[name.upper()]
        except KeyError:
            supported = ", ".join(m.name for m in cls)
            raise ValueError(
                f"iris.ccl: reduction {op!r} is not supported (supported: {supported})"
            ) from None


@dataclass
class Config:
    """Launch parameters of the collectives; the defaults suit H100/H200 over NVLink.

    Args:
        block_size (int): elements per tile for the flat collectives; ``None`` picks
            16 KiB worth of the tensor's dtype.
        block_size_m (int): tile rows of ``all_to_all``.
        block_size_n (int): tile columns of ``all_to_all``.
        comm_sms (int): at most this many programs (one per SM) move data; ``None``
            uses every SM. Small tensors use fewer, one per tile.
        num_warps (int): warps per program.
        all_reduce_variant (str): ``"one_shot"`` (every rank reads every input:
            lowest latency), ``"two_shot"`` (reduce-scatter then all-gather: least
            traffic), ``"ring"``, ``"atomic"`` (atomic adds into every output: fp32,
            int32, fp16, bf16), ``"spinlock"`` (adds into every output under a lock
            held at that output's rank: any dtype and reduction), or ``"auto"``
            (one-shot up to ``one_shot_max_bytes``, two-shot above).
        one_shot_max_bytes (int): the ``"auto"`` switch point; ``None`` scales
            with the group size (see :func:`iris.ccl.all_reduce.pick_variant`).
        protocol (str): how calls move data. ``"low_latency"`` sends data and
            flag in one 8-byte store (:mod:`iris.ccl.low_latency`); ``"staged"``
            copies into a staging buffer and synchronises once
            (:mod:`iris.ccl.staged`); ``"pushed"`` (two-shot ``all_reduce`` and
            ``reduce_scatter``) moves every tile by remote stores into its owner's
            receive slots, with no ready or done handshake (:mod:`iris.ccl.pushed`);
            ``"direct"`` runs the kernels with ready and done handshakes on the
            tensors themselves. ``"auto"`` takes the first that applies:
            low-latency up to ``low_latency_max_bytes`` per member, staged up to the
            staging capacity, pushed (all_reduce at any size, reduce_scatter up to
            :data:`iris.ccl.runtime.REDUCE_SCATTER_PUSHED_AUTO_BYTES`), then direct.
            All but direct need the whole-world group; forcing one that cannot run
            raises :class:`~iris.ccl.CollectiveError`.
        low_latency_max_bytes (int): the ``"auto"`` limit of the low-latency
            protocol, in payload bytes each member sends to one member; ``None``
            uses :data:`iris.ccl.runtime.LOW_LATENCY_AUTO_BYTES`.
        all_reduce_distribution (int): how the full-shape ``reduce_scatter`` shares its
            tiles out: ``0`` strided, ``1`` contiguous runs (upstream's meaning).
        reduce_scatter_variant (str): accepted for Iris compatibility (``"two_shot"``).
        all_gather_variant (str): accepted for Iris compatibility (``"persistent"`` or
            ``"partitioned"``); ``protocol`` chooses how all_gather runs here.
        swizzle_size (int): tile rows taken together when the full-shape
            ``reduce_scatter`` numbers its tiles (:mod:`iris.ccl.tile_reduce_scatter`).
        num_stages, num_xcds, chunk_size, use_gluon, all_reduce_num_rings,
        all_reduce_ring_slice_n, threads_per_warp, waves_per_eu: upstream Iris's
            launch settings, accepted, checked as upstream checks them and read back;
            they do not change how the collectives run here (one Triton implementation,
            NVIDIA warps of 32 threads, no chiplets).

    Fields may be set after construction, as upstream's tests do; each change is
    checked like the constructor's arguments (a bad value raises and is not kept).

    Example:
        >>> from iris.ccl import Config
        >>> ctx.ccl.all_reduce(out, inp, config=Config(all_reduce_variant="ring", comm_sms=32))
    """

    block_size: int | None = None
    block_size_m: int = 64
    block_size_n: int = 64
    comm_sms: int | None = None
    num_warps: int = 8
    all_reduce_variant: str = "auto"
    one_shot_max_bytes: int | None = None
    protocol: str = "auto"
    low_latency_max_bytes: int | None = None
    all_reduce_distribution: int = 1
    reduce_scatter_variant: str = "two_shot"
    all_gather_variant: str = "persistent"
    swizzle_size: int = 4
    num_stages: int = 1
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    threads_per_warp: int = 32
    waves_per_eu: int = 0

    def __post_init__(self):
        self._validate()
        object.__setattr__(self, "_checked", True)

    def __setattr__(self, name, value):
        if not getattr(self, "_checked", False):
            object.__setattr__(self, name, value)
            return
        old = getattr(self, name)
        object.__setattr__(self, name, value)
        try:
            self._validate()
        except ValueError:
            object.__setattr__(self, name, old)
            raise

    def key(self) -> tuple:
        """The field values, for caches: a later change to the object makes a new key."""
        return astuple(self)

    def _validate(self) -> None:
        for name in ("block_size_m", "block_size_n", "num_warps"):
            _check_power_of_two(name, getattr(self, name))
        if self.block_size is not None:
            _check_power_of_two("block_size", self.block_size)
        if self.comm_sms is not None and self.comm_sms < 1:
            raise ValueError(f"iris.ccl.Config: comm_sms must be at least 1, got {self.comm_sms}")
        if self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(
                f"iris.ccl.Config: all_reduce_variant must be one of {', '.join(ALL_REDUCE_VARIANTS)}, "
                f"got {self.all_reduce_variant!r}"
            )
        if self.protocol not in PROTOCOLS:
            raise ValueError(
                f"iris.ccl.Config: protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}"
            )
        if self.low_latency_max_bytes is not None and self.low_latency_max_bytes < 0:
            raise ValueError(
                f"iris.ccl.Config: low_latency_max_bytes must be at least 0, got {self.low_latency_max_bytes}"
            )
        if self.all_gather_variant not in ("persistent", "partitioned"):
            raise ValueError(
                "iris.ccl.Config: all_gather_variant must be 'persistent' or 'partitioned', "
                f"got {self.all_gather_variant!r}"
            )
        for name in ("swizzle_size", "num_stages", "all_reduce_num_rings", "threads_per_warp"):
            _check_positive(name, getattr(self, name))
        for name in ("num_xcds", "chunk_size", "all_reduce_ring_slice_n"):
            if getattr(self, name) is not None:
                _check_positive(name, getattr(self, name))
        if not isinstance(self.waves_per_eu, int) or self.waves_per_eu < 0:
            raise ValueError(f"iris.ccl.Config: waves_per_eu must be at least 0, got {self.waves_per_eu!r}")
        if self.all_reduce_distribution not in (0, 1):
            raise ValueError(
                "iris.ccl.Config: all_reduce_distribution must be 0 or 1, "
                f"got {self.all_reduce_distribution!r}"
            )
        slice_n = self.all_reduce_ring_slice_n
        if slice_n is not None and self.block_size_n % slice_n:
            raise ValueError(
                f"iris.ccl.Config: block_size_n ({self.block_size_n}) must be divisible by "
                f"all_reduce_ring_slice_n ({slice_n})"
            )
        if self.reduce_scatter_variant not in ("two_shot", "auto"):
            raise ValueError(
                "iris.ccl.Config: reduce_scatter_variant must be 'two_shot', "
                f"got {self.reduce_scatter_variant!r}"
            )

    def block_for(self, element_size: int) -> int:
        """Elements per tile for a dtype of ``element_size`` bytes."""
        return self.block_size or max(16384 // element_size, 256)


def _check_positive(name: str, value) -> None:
    if not isinstance(value, int) or value < 1:
        raise ValueError(f"iris.ccl.Config: {name} must be a positive integer, got {value!r}")


def _check_power_of_two(name: str, value) -> None:
    if not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"iris.ccl.Config: {name} must be a positive power of two, got {value!r}")
