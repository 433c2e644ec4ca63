"""Clock alignment: per-rank offset and drift of %globaltimer against rank 0.

Input is ping-pong samples ``(t0, t1, t2, t3)`` per peer (``iris.device.clock_sync``),
taken once when tracing is enabled and once when it is collected. Each sample
gives ``offset = ((t1 - t0) + (t2 - t3)) / 2`` (peer minus reference) and a round
trip; the samples with the shortest round trips carry the least queueing noise,
so their median is the offset at that moment. Two moments give a drift.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

#: Fraction of samples (shortest round trips) the offset is taken from.
BEST_FRACTION = 0.25


@dataclass
class ClockEstimate:
    """Offset of one rank's clock from the reference at one moment."""

    at_ns: float  # reference-clock time of the estimate
    offset_ns: float  # rank clock minus reference clock
    spread_ns: float  # median absolute deviation of the offsets used
    rtt_ns: float  # shortest round trip seen


@dataclass
class ClockFit:
    """``reference_time = local_time - (offset_ns + drift * (local_time - at_ns))``."""

    offset_ns: float
    drift: float  # dimensionless: ns of offset change per ns
    at_ns: float
    residual_ns: float  # scatter (median absolute deviation) of the offsets the fit used
    rtt_ns: float  # shortest round trip: asymmetric links could bias the offset by up to half of it
    #: True when this rank reads the reference's own clock (the same GPU, or the host under
    #: emulation): nothing is fitted, the offset and drift are zero by construction.
    shared_clock: bool = False

    def to_reference(self, local_ns: np.ndarray) -> np.ndarray:
        """Map this rank's timestamps onto the reference rank's clock."""
        local = np.asarray(local_ns, dtype=np.float64)
        return local - (self.offset_ns + self.drift * (local - self.offset_ns - self.at_ns))

    def as_dict(self) -> dict:
        return asdict(self)


def estimate(samples: np.ndarray) -> ClockEstimate:
    """One estimate from ``samples`` of shape ``(rounds, 4)`` = (t0, t1, t2, t3)."""
    t0, t1, t2, t3 = (samples[:, i].astype(np.float64) for i in range(4))
    offsets = ((t1 - t0) + (t2 - t3)) / 2
    rtts = (t3 - t0) - (t2 - t1)
    keep = np.argsort(rtts)[: max(1, int(len(rtts) * BEST_FRACTION))]
    chosen = offsets[keep]
    offset = float(np.median(chosen))
    return ClockEstimate(
        at_ns=float(np.median(t0[keep])),
        offset_ns=offset,
        spread_ns=float(np.median(np.abs(chosen - offset))),
        rtt_ns=float(rtts.min()),
    )


def fit(first: ClockEstimate, second: ClockEstimate | None = None) -> ClockFit:
    """Offset and drift from one or two estimates (one: no drift)."""
    drift = 0.0
    if second is not None and second.at_ns != first.at_ns:
        drift = (second.offset_ns - first.offset_ns) / (second.at_ns - first.at_ns)
    estimates = [first] if second is None else [first, second]
    return ClockFit(
        first.offset_ns,
        drift,
        first.at_ns,
        max(e.spread_ns for e in estimates),
        min(e.rtt_ns for e in estimates),
    )


def fit_all(
    sync_at_enable: np.ndarray, sync_at_collect: np.ndarray | None, shared: list[bool] | None = None
) -> list[ClockFit]:
    """One fit per rank from ping-pong arrays of shape ``(world, rounds, 4)`` (rank 0: identity).

    ``shared[r]`` says rank ``r`` reads rank 0's own clock: it gets the identity fit, with
    the measured shortest round trip kept for reference.

    Example:
        >>> fits = fit_all(sync_enable, sync_collect, shared=[True, True])
        >>> fits[1].offset_ns, fits[1].shared_clock
        (0.0, True)
    """
    fits = [ClockFit(0.0, 0.0, 0.0, 0.0, 0.0, shared_clock=True)]
    for rank in range(1, len(sync_at_enable)):
        first = estimate(sync_at_enable[rank])
        if shared is not None and shared[rank]:
            fits.append(ClockFit(0.0, 0.0, 0.0, 0.0, first.rtt_ns, shared_clock=True))
            continue
        second = estimate(sync_at_collect[rank]) if sync_at_collect is not None else None
        fits.append(fit(first, second))
    return fits
