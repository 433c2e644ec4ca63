"""The event format shared by the device recorder, the collector and the exporters.

``EVENT_DTYPE`` is the numpy structured dtype of one decoded event;
:func:`decode_records` turns the raw 8-word device records (layout in
:mod:`iris_trace.schema`) into it without a Python loop per event.
"""

from __future__ import annotations

import numpy as np

# The ids, names and sets live in the schema; some are re-exported here for readers.
from .schema import (  # noqa: F401
    DMA_CU_BASE,
    DMA_PUT,
    EVENT_NAMES,
    EVERY_PEER,
    FIELD_BITS,
    FIELD_MASK,
    IDENT_CU_SHIFT,
    IDENT_CUR_RANK_SHIFT,
    IDENT_EVENT_BITS,
    IDENT_PATH_SHIFT,
    IDENT_SUB_SHIFT,
    IDENT_TARGET_SHIFT,
    LAUNCH_SHIFT,
    NO_RANK,
    RECORD_WORDS,
    RELEASE_EVENTS,
    SCOPE_BASE,
    SITE_SHIFT,
    TAG_MASK,
    VALUED_RELEASES,
    W_ADDRESS,
    W_BYTES,
    W_END,
    W_IDENT,
    W_START,
    W_TILE,
    W_VALUE,
    W_WHERE,
    WAIT_EVENTS,
    WHERE_OP_INDEX_SHIFT,
    event_name,
)

EVENT_DTYPE = np.dtype(
    [
        ("event_id", np.int16),
        ("cur_rank", np.int16),
        ("target_rank", np.int16),
        ("cu_id", np.int16),
        ("xcc_id", np.int16),
        ("path", np.int8),
        ("sub", np.int8),
        ("pid", np.int32),
        ("pid_m", np.int32),
        ("pid_n", np.int32),
        ("op_index", np.int32),
        # The launch's tag and the call site's id (iris_trace.schema; 0 in older files).
        ("launch", np.int32),
        ("site", np.int32),
        ("start_ns", np.int64),
        ("end_ns", np.int64),
        ("address", np.int64),
        ("payload_bytes", np.int64),
        ("value", np.int64),
    ]
)


def upgrade(events: np.ndarray) -> np.ndarray:
    """Events of an older rank file in today's :data:`EVENT_DTYPE` (fields added since read as 0).

    Anything that is not an older form of the event dtype comes back unchanged.

    Example:
        >>> older = EVENT_DTYPE[[name for name in EVENT_DTYPE.names if name != "path"]]
        >>> upgrade(np.zeros(2, older)).dtype == EVENT_DTYPE
        True
    """
    names = events.dtype.names
    if events.dtype == EVENT_DTYPE or names is None or not set(names) < set(EVENT_DTYPE.names):
        return events
    current = np.zeros(events.shape, EVENT_DTYPE)
    for name in names:
        current[name] = events[name]
    return current


def lane_name(cu_id: int, lane: int = 0) -> str:
    """Viewer name of an SM's (or copy-engine lane's) track: ``SM 12 · lane 1``, ``copy engine → rank 2``.

    Example:
        >>> lane_name(12, 1), lane_name(DMA_CU_BASE + 2)
        ('SM 12 · lane 1', 'copy engine → rank 2')
    """
    base = f"copy engine → rank {cu_id - DMA_CU_BASE}" if cu_id >= DMA_CU_BASE else f"SM {cu_id}"
    return base if lane == 0 else f"{base} · lane {lane}"


def decode_records(
    records: np.ndarray, counts: np.ndarray, capacity: int, world_size: int | None = None
) -> np.ndarray:
    """Decode the valid records of every buffer region, sorted by start time.

    A slot that was claimed but never written (its end time 0: a slot reserved for an op
    that never ended, such as a wait that timed out) is not an event. A record for every
    peer (target ``EVERY_PEER``) becomes ``world_size - 1`` events, one to each other
    rank, starting with the next one (``cur_rank + 1``).

    Args:
        records: int64 array of ``regions * capacity * 8`` words.
        counts: events each region claimed (may exceed ``capacity``: those were dropped).
        capacity: slots per region.
        world_size: ranks of the run; needed only when a record is for every peer.

    Raises:
        ValueError: a record is for every peer and ``world_size`` is not given.

    Example:
        >>> events = decode_records(records, counts, capacity, world_size=4)
    """
    counts = np.minimum(np.asarray(counts, dtype=np.int64), capacity)
    words = np.asarray(records, dtype=np.int64).reshape(len(counts), capacity, RECORD_WORDS)
    valid = (np.arange(capacity)[None, :] < counts[:, None]) & (words[:, :, W_END] != 0)
    raw = _every_peer_expanded(words[valid], world_size)
    events = np.empty(len(raw), dtype=EVENT_DTYPE)
    ident, where, tile = raw[:, W_IDENT], raw[:, W_WHERE], raw[:, W_TILE]
    events["event_id"] = ident & ((1 << IDENT_EVENT_BITS) - 1)
    events["cur_rank"] = (ident >> IDENT_CUR_RANK_SHIFT) & 0xFFFF
    target = (ident >> IDENT_TARGET_SHIFT) & 0xFFFF
    events["target_rank"] = np.where(target == NO_RANK, -1, target)
    events["cu_id"] = (ident >> IDENT_CU_SHIFT) & 0xFFFF
    events["path"] = (ident >> IDENT_PATH_SHIFT) & 1
    events["sub"] = (ident >> IDENT_SUB_SHIFT) & 0x7F
    events["xcc_id"] = 0  # Hopper has no XCC: kept for the format (AMD Iris traces have one)
    events["pid"] = where & 0xFFFFFFFF
    events["op_index"] = where >> WHERE_OP_INDEX_SHIFT
    events["pid_m"] = (tile & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
    events["pid_n"] = tile >> 32
    events["start_ns"] = raw[:, W_START]
    events["end_ns"] = raw[:, W_END]
    address, nbytes = raw[:, W_ADDRESS], raw[:, W_BYTES]
    # The address is a signed 40-bit offset (-1: a compute scope has none).
    events["address"] = ((address & FIELD_MASK) ^ (1 << (FIELD_BITS - 1))) - (1 << (FIELD_BITS - 1))
    events["payload_bytes"] = nbytes & FIELD_MASK
    events["launch"] = (address >> LAUNCH_SHIFT) & TAG_MASK
    events["site"] = (nbytes >> SITE_SHIFT) & TAG_MASK
    events["value"] = raw[:, W_VALUE]
    return events[np.argsort(events["start_ns"], kind="stable")]


def _every_peer_expanded(raw: np.ndarray, world_size: int | None) -> np.ndarray:
    # Each record for every peer, repeated once per peer with the peer in its target field.
    target = (raw[:, W_IDENT] >> IDENT_TARGET_SHIFT) & 0xFFFF
    broadcast = target == EVERY_PEER
    if not broadcast.any():
        return raw
    if world_size is None:
        raise ValueError("decode_records: records for every peer need the run's world_size")
    copies = np.where(broadcast, max(int(world_size) - 1, 0), 1)
    expanded = np.repeat(raw, copies, axis=0)
    # 1, 2, ... within each record's copies: the peer is cur_rank + that, modulo the world.
    step = np.arange(len(expanded)) - np.repeat(np.cumsum(copies) - copies, copies) + 1
    cur_rank = (expanded[:, W_IDENT] >> IDENT_CUR_RANK_SHIFT) & 0xFFFF
    peer = (cur_rank + step) % max(int(world_size), 1)
    was_broadcast = np.repeat(broadcast, copies)
    ident = expanded[:, W_IDENT] & ~np.int64(0xFFFF << IDENT_TARGET_SHIFT)
    expanded[:, W_IDENT] = np.where(was_broadcast, ident | (peer << IDENT_TARGET_SHIFT), expanded[:, W_IDENT])
    return expanded
