"""The event format shared by the device recorder, the collector and the exporters.

``EVENT_DTYPE`` is the numpy structured dtype of one decoded event;
:func:`decode_records` turns the raw 8-word device records (layout in
``iris.device.tracing``) into it without a Python loop per event.
"""

from __future__ import annotations

import numpy as np

#: event_id -> op name. Ids from SCOPE_BASE up are user compute scopes.
EVENT_NAMES = {
    1: "load",
    2: "store",
    3: "get",
    4: "put",
    5: "copy",
    6: "atomic_add",
    7: "atomic_sub",
    8: "atomic_xchg",
    9: "atomic_xor",
    10: "atomic_and",
    11: "atomic_or",
    12: "atomic_min",
    13: "atomic_max",
    14: "atomic_cas",
    15: "signal",
    16: "wait_until",
    20: "dma_put",
}
SCOPE_BASE = 64
#: ``dma_put`` events (copy-engine puts, ``iris.copy_engine``) sit on lane ``DMA_CU_BASE +
#: destination rank`` instead of an SM: the copy engines are not SMs.
DMA_PUT = 20
DMA_CU_BASE = 0x7F00
#: Ops that wait for another rank (their time is stall time).
WAIT_EVENTS = frozenset({16})
#: Ops that can release a waiter on the target rank (flow sources).
RELEASE_EVENTS = frozenset({2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
NO_RANK = 0xFFFF

EVENT_DTYPE = np.dtype(
    [
        ("event_id", np.int16),
        ("cur_rank", np.int16),
        ("target_rank", np.int16),
        ("cu_id", np.int16),
        ("xcc_id", np.int16),
        ("pid", np.int32),
        ("pid_m", np.int32),
        ("pid_n", np.int32),
        ("op_index", np.int32),
        ("start_ns", np.int64),
        ("end_ns", np.int64),
        ("address", np.int64),
        ("payload_bytes", np.int64),
        ("value", np.int64),
    ]
)

RECORD_WORDS = 8


def event_name(event_id: int, scope_names: dict[int, str] | None = None) -> str:
    """Human name of an event id (user scopes use ``scope_names`` or ``scope<N>``)."""
    if event_id >= SCOPE_BASE:
        scope = event_id - SCOPE_BASE
        return (scope_names or {}).get(scope, f"scope{scope}")
    return EVENT_NAMES.get(event_id, f"event{event_id}")


def lane_name(cu_id: int, lane: int = 0) -> str:
    """Viewer name of an SM's (or copy-engine lane's) track: ``SM 12 · lane 1``, ``copy engine → rank 2``.

    Example:
        >>> lane_name(12, 1), lane_name(DMA_CU_BASE + 2)
        ('SM 12 · lane 1', 'copy engine → rank 2')
    """
    base = f"copy engine → rank {cu_id - DMA_CU_BASE}" if cu_id >= DMA_CU_BASE else f"SM {cu_id}"
    return base if lane == 0 else f"{base} · lane {lane}"


def decode_records(records: np.ndarray, counts: np.ndarray, capacity: int) -> np.ndarray:
    """Decode the valid records of every SM region, sorted by start time.

    Args:
        records: int64 array of ``regions * capacity * 8`` words.
        counts: events each region claimed (may exceed ``capacity``: those were dropped).
        capacity: slots per region.
    """
    counts = np.minimum(np.asarray(counts, dtype=np.int64), capacity)
    words = np.asarray(records, dtype=np.int64).reshape(len(counts), capacity, RECORD_WORDS)
    valid = np.arange(capacity)[None, :] < counts[:, None]
    raw = words[valid]
    events = np.empty(len(raw), dtype=EVENT_DTYPE)
    ident, where, tile = raw[:, 4], raw[:, 5], raw[:, 6]
    events["event_id"] = ident & 0xFF
    events["cur_rank"] = (ident >> 8) & 0xFFFF
    target = (ident >> 24) & 0xFFFF
    events["target_rank"] = np.where(target == NO_RANK, -1, target)
    events["cu_id"] = (ident >> 40) & 0xFFFF
    events["xcc_id"] = (ident >> 56) & 0xFF
    events["pid"] = where & 0xFFFFFFFF
    events["op_index"] = where >> 32
    events["pid_m"] = (tile & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    events["pid_n"] = tile >> 32
    events["start_ns"] = raw[:, 0]
    events["end_ns"] = raw[:, 1]
    events["address"] = raw[:, 2]
    events["payload_bytes"] = raw[:, 3]
    events["value"] = raw[:, 7]
    return events[np.argsort(events["start_ns"], kind="stable")]
