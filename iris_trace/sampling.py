"""Totals of a sampled trace: what every program did, estimated from the programs that recorded.

With ``ctx.tracing.enable(sample=1 / k)`` a program records when its linear id is a
multiple of ``k`` (``iris.device.tracing.enabled``): program 0 of every launch, then one
program in ``k``. Program 0 stands for itself (a one-program kernel, such as the device
barrier, is recorded whole), and each other recorded program for the ``k`` programs of
its block. For every rank and quantity (events of each category, bytes moved, time inside
ops of each category) the estimate is ``sum over program 0 + k * sum over the others``,
and its bound is two standard errors of that sum under sampling without replacement:
``2 * N * s * sqrt((1 - 1/k) / n)``, with ``n`` the recorded programs other than 0, ``N =
k * n`` the programs they stand for and ``s`` the spread of their values. A program is a
``(rank, program id)`` over all launches of the trace (a record does not carry its
launch). The last block of a launch may hold fewer than ``k`` programs, so an estimate
can run high by up to ``k - 1`` programs' worth.

Example:
    >>> rows = estimate_totals(trace.events, trace.world_size, trace.sample_period)
    >>> rows[0]
    {'rank': 0, 'quantity': 'comm_events', 'recorded': 310, 'estimate': 2466.0, 'bound': 41.2}
"""

from __future__ import annotations

import numpy as np

from .matching import COMM, COMPUTE, WAIT, categories

#: The quantities estimated per rank, in report order.
QUANTITIES = (
    "compute_events",
    "comm_events",
    "wait_events",
    "bytes_moved",
    "compute_op_ns",
    "comm_op_ns",
    "wait_op_ns",
)


def estimate_totals(events: np.ndarray, world_size: int, period: int) -> list[dict]:
    """Per rank and quantity: what was recorded, the estimated total over every program, its bound.

    ``*_op_ns`` are sums of event lengths (not the report's unions over an SM): time
    spent inside ops, counted once per op. ``period`` 1 (nothing sampled) gives the
    recorded values with bound 0.

    Example:
        >>> estimate_totals(trace.events, 2, 8)[1]["estimate"]
    """
    ranks = events["cur_rank"].astype(np.int64)
    programs = events["pid"].astype(np.int64)
    category = categories(events["event_id"])
    lengths = np.maximum(events["end_ns"].astype(np.int64) - events["start_ns"].astype(np.int64), 0)
    values = {
        "compute_events": (category == COMPUTE).astype(np.float64),
        "comm_events": (category == COMM).astype(np.float64),
        "wait_events": (category == WAIT).astype(np.float64),
        "bytes_moved": np.where(category == COMM, events["payload_bytes"], 0).astype(np.float64),
        "compute_op_ns": np.where(category == COMPUTE, lengths, 0).astype(np.float64),
        "comm_op_ns": np.where(category == COMM, lengths, 0).astype(np.float64),
        "wait_op_ns": np.where(category == WAIT, lengths, 0).astype(np.float64),
    }
    rows = []
    for rank in range(world_size):
        mine = ranks == rank
        first = mine & (programs == 0)
        others = mine & (programs != 0)
        ids, unit = np.unique(programs[others], return_inverse=True)
        n = len(ids)
        for quantity in QUANTITIES:
            value = values[quantity]
            per_program = np.bincount(unit, weights=value[others], minlength=n) if n else np.zeros(0)
            recorded = float(value[first].sum() + per_program.sum())
            estimate = float(value[first].sum() + period * per_program.sum())
            bound = 0.0
            if period > 1 and n > 1:
                spread = float(np.std(per_program, ddof=1))
                bound = 2 * period * n * spread * float(np.sqrt((1 - 1 / period) / n))
            rows.append(
                {
                    "rank": rank,
                    "quantity": quantity,
                    "recorded": recorded,
                    "estimate": estimate,
                    "bound": bound,
                }
            )
    return rows
