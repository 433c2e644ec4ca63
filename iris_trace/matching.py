"""Which event released each wait, and the small helpers every analysis shares.

*Category* of an event, by ``event_id``: *compute* is a user scope (``event_id >=
SCOPE_BASE``); *wait* is an op in ``WAIT_EVENTS``; *communication* is every other op.

*Releaser* of a wait: among the release events (``RELEASE_EVENTS``, issued on any rank,
this one included) with ``target_rank`` equal to the waiter's ``cur_rank``, ``address``
equal to the waiter's ``address`` and ``start_ns <= `` the waiter's ``end_ns``, the one
with the latest ``start_ns``; if any of them is a signal or an atomic whose ``value``
equals the waiter's ``value``, the latest of those instead. Equal ``start_ns`` go to the
event later in the input array. None when nothing matches.

Example:
    >>> from iris_trace.matching import match_releasers
    >>> releaser = match_releasers(trace.events)
"""

from __future__ import annotations

import numpy as np

from .lanes import stable_order
from .schema import RELEASE_EVENTS, SCOPE_BASE, VALUED_RELEASES, WAIT_EVENTS

COMPUTE, COMM, WAIT = 0, 1, 2


def categories(event_ids: np.ndarray) -> np.ndarray:
    """``COMPUTE``, ``COMM`` or ``WAIT`` for every event id.

    Example:
        >>> categories(np.array([4, 16, 64]))
        array([1, 2, 0], dtype=int8)
    """
    event_ids = np.asarray(event_ids)
    category = np.full(event_ids.shape, COMM, dtype=np.int8)
    category[np.isin(event_ids, list(WAIT_EVENTS))] = WAIT
    category[event_ids >= SCOPE_BASE] = COMPUTE
    return category


def _latest_at_or_before(cand_keys, cand_times, query_keys, query_times) -> np.ndarray:
    """For each query, the candidate with equal keys and the latest time <= the query's time.

    Returns indices into the candidates, -1 where none. Candidates and queries are sorted
    together by (keys, time, candidates first), stably, so the answer is the last candidate at
    or before each query's position, provided its keys are the query's; of equal candidates
    the later one in the input comes last. The keys are packed into int64 words with the row
    index in the lowest bits: one value sort when keys, time and index fit 63 bits, else two
    (time, then keys), else :func:`stable_order` on the separate keys.
    """
    n_cand, n_query = len(cand_times), len(query_times)
    found = np.full(n_query, -1, dtype=np.int64)
    if n_cand == 0 or n_query == 0:
        return found
    n = n_cand + n_query
    sides = ([*cand_keys, cand_times], [*query_keys, query_times])
    lows = [min(int(c.min()), int(q.min())) for c, q in zip(*sides)]
    bits = [(max(int(c.max()), int(q.max())) - low).bit_length() for c, q, low in zip(*sides, lows)]
    key_bits, time_bits = sum(bits[:-1]), bits[-1]
    index_bits = max(1, (n - 1).bit_length())
    one_word = key_bits + time_bits + 1 + index_bits <= 63
    if not one_word and (key_bits + index_bits > 63 or time_bits + 1 + index_bits > 63):
        keys = [np.concatenate([c, q]).astype(np.int64) for c, q in zip(cand_keys, query_keys)]
        times = np.concatenate([cand_times, query_times]).astype(np.int64)
        is_query = np.concatenate([np.zeros(n_cand, np.int8), np.ones(n_query, np.int8)])
        order = stable_order(*keys, times, is_query)
        group = None
    else:
        order, group = _packed_order(sides, lows, bits, one_word, index_bits)
    # Each query's answer: the last candidate before it in this order, if it has the query's keys.
    at_query = order >= n_cand
    last = np.arange(n)
    last[at_query] = -1
    np.maximum.accumulate(last, out=last)
    query_pos = np.flatnonzero(at_query)
    del at_query
    cand_pos = last[query_pos]
    del last
    same = cand_pos >= 0
    np.maximum(cand_pos, 0, out=cand_pos)
    cand = order[cand_pos]
    query_index = order[query_pos] - n_cand
    if group is not None:
        same &= group[cand_pos] == group[query_pos]
    else:
        for key in keys:
            same &= key[cand] == key[n_cand + query_index]
    found[query_index] = np.where(same, cand, -1)
    return found


def _packed_order(sides, lows, bits, one_word: bool, index_bits: int):
    """The sort of :func:`_latest_at_or_before` on packed words: (order, keys packed per row in order).

    ``sides``: the candidates' then the queries' columns, keys then time.
    """
    n = sum(len(side[-1]) for side in sides)
    time_bits = bits[-1]
    group = np.empty(n, dtype=np.int64)  # the packed keys (and, in one word, the time)
    later = group if one_word else np.empty(n, dtype=np.int64)  # the time and is-query bit
    start = 0
    for is_query, columns in enumerate(sides):
        for lo in range(0, len(columns[-1]), _READ_ROWS):
            hi = min(lo + _READ_ROWS, len(columns[-1]))
            key = np.zeros(hi - lo, dtype=np.int64)
            for column, low, width in zip(columns[:-1], lows, bits):
                key <<= width
                key |= np.subtract(column[lo:hi], low, dtype=np.int64)
            time = np.subtract(columns[-1][lo:hi], lows[-1], dtype=np.int64)
            time <<= 1
            time |= is_query
            if one_word:
                key <<= time_bits + 1
                key |= time
                group[start + lo : start + hi] = key
            else:
                group[start + lo : start + hi], later[start + lo : start + hi] = key, time
        start += len(columns[-1])
    # The lowest bits carry the row index: a value sort is then stable and gives the order.
    mask = (1 << index_bits) - 1
    if one_word:
        group <<= index_bits
        group |= np.arange(n)
        group.sort()
        order = group & mask
        group >>= index_bits + 1 + time_bits
        return order, group
    later <<= index_bits
    later |= np.arange(n)
    later.sort()
    later &= mask  # the order by time alone
    group = group[later]
    group <<= index_bits
    group |= np.arange(n)
    group.sort()
    order = later[group & mask]
    group >>= index_bits
    return order, group


def sm_keys(events: np.ndarray) -> np.ndarray:
    """One int64 per event naming its ``(cur_rank, cu_id)``: ``cur_rank << 16 | cu_id``.

    Example:
        >>> sm_keys(trace.events)[0] >> 16    # the first event's rank
    """
    return (events["cur_rank"].astype(np.int64) << 16) | (events["cu_id"].astype(np.int64) & 0xFFFF)


def sm_index(events: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The SMs with events and which of them each event ran on.

    Returns ``(rows, index)``: ``rows`` an int64 ``(n_sms, 2)`` array of ``(cur_rank, cu_id)``
    sorted by rank then SM, and ``index`` the row of every event.

    Example:
        >>> rows, index = sm_index(trace.events)
        >>> rows[index[0]]          # (rank, SM) of the first event
    """
    # One int64 per SM: np.unique on a 1-D array is far faster than with axis=0.
    unique, index = np.unique(sm_keys(events), return_inverse=True)
    rows = np.stack([unique >> 16, (unique & 0xFFFF).astype(np.uint16).view(np.int16)], axis=1)
    return rows.astype(np.int64), index.reshape(-1).astype(np.int64)


_WAIT, _RELEASE, _VALUED_RELEASE = 1, 2, 3
#: Events read at a time by match_releasers' passes: whole records (``take``, several times
#: faster than one field at a time), about 1 MiB of them, which stay in the CPU cache while
#: their fields are copied out; the temporaries stay small next to the trace.
_READ_ROWS = 1 << 14


def _release_kinds(event_ids: np.ndarray) -> np.ndarray:
    """0, ``_WAIT``, ``_RELEASE`` or ``_VALUED_RELEASE`` for every event id (int8).

    16-bit ids (the event dtype's) read a 64 Ki-entry table, one gather instead of three isin.
    An id has one kind: wait and release ids are disjoint, valued releases are releases.
    """
    event_ids = np.asarray(event_ids)
    groups = ((WAIT_EVENTS, _WAIT), (RELEASE_EVENTS, _RELEASE), (VALUED_RELEASES, _VALUED_RELEASE))
    kinds = np.zeros(event_ids.shape, dtype=np.int8)
    if event_ids.dtype.kind in "iu" and event_ids.dtype.itemsize == 2:
        table = np.zeros(1 << 16, dtype=np.int8)
        for ids, kind in groups:
            table[[i & 0xFFFF for i in ids]] = kind
        for lo in range(0, len(event_ids), _READ_ROWS):
            np.take(table, event_ids[lo : lo + _READ_ROWS].view(np.uint16), out=kinds[lo : lo + _READ_ROWS])
        return kinds
    for ids, kind in groups:
        kinds[np.isin(event_ids, list(ids))] = kind
    return kinds


def match_releasers(events: np.ndarray) -> np.ndarray:
    """Index of the event that released each wait (module docstring), -1 for others and unmatched.

    Vectorised (two sorts), so exporters can draw a flow arrow per wait on large traces; the
    events are read a slice at a time, so beyond the result it needs about 40 bytes per event.

    Example:
        >>> releaser = match_releasers(trace.events)
        >>> waits = np.nonzero(releaser >= 0)[0]
        >>> arrows = zip(releaser[waits], waits)      # (source event, waiting event)
    """
    events = np.asarray(events)
    if len(events) == 0:
        return np.full(0, -1, dtype=np.int64)
    kind = _release_kinds(events["event_id"])
    waits = np.flatnonzero(kind == _WAIT)
    releases = np.flatnonzero(kind >= _RELEASE)
    valued = releases[kind[releases] == _VALUED_RELEASE]
    del kind
    if len(waits) == 0 or len(releases) == 0:
        return np.full(len(events), -1, dtype=np.int64)
    query = _read_columns(
        events, waits, ("cur_rank", "address", "value"), lambda r: np.maximum(r["end_ns"], r["start_ns"])
    )
    cand = _read_columns(events, releases, ("target_rank", "address"), lambda r: r["start_ns"])
    found = _latest_at_or_before(cand[:2], cand[2], query[:2], query[3])
    any_release = np.where(found >= 0, releases[np.maximum(found, 0)], -1)
    del cand
    same_value = np.full(len(waits), -1, dtype=np.int64)
    if len(valued):
        cand = _read_columns(events, valued, ("target_rank", "address", "value"), lambda r: r["start_ns"])
        found = _latest_at_or_before(cand[:3], cand[3], query[:3], query[3])
        same_value = np.where(found >= 0, valued[np.maximum(found, 0)], -1)
    result = np.full(len(events), -1, dtype=np.int64)
    result[waits] = np.where(same_value >= 0, same_value, any_release)
    return result


def _read_columns(events, index, fields, time) -> list[np.ndarray]:
    """``fields`` of the events at ``index``, then ``time(records)``, as contiguous arrays.

    Whole records are read a slice at a time: one pass, several times faster than reading
    field by field, with temporaries bounded by the slice.
    """
    columns = [np.empty(len(index), dtype=events.dtype[f]) for f in fields] + [np.empty(len(index), np.int64)]
    for lo in range(0, len(index), _READ_ROWS):
        records = events.take(index[lo : lo + _READ_ROWS])
        for column, name in zip(columns, fields):
            column[lo : lo + len(records)] = records[name]
        columns[-1][lo : lo + len(records)] = time(records)
    return columns
