"""Lanes: which row of its SM's track each event is drawn on, so slices nest strictly.

Several CTAs can share an SM, and their ops overlap in time; a viewer track only
shows properly nested slices. Inside one program, ops run one after another and
a compute scope contains the ops issued within it, so one program's events
always nest. Programs are therefore the unit: each (rank, SM, program) gets the
first lane of its SM whose previous program has finished, greedily by start
time. The loop runs over programs, never over events, and only on SMs where
programs overlap at all: everywhere else every program is on lane 0.
"""

from __future__ import annotations

import heapq

import numpy as np


def stable_order(*keys: np.ndarray) -> np.ndarray:
    """What ``np.lexsort(keys[::-1])`` returns: the stable order by the first key, then the next...

    Integer keys are shifted to start at 0 and packed side by side into int64 words with the
    row index in the lowest bits, so each word sorts with one plain value sort (much faster
    than lexsort's stable argsort per key, and stable because the index breaks ties). Keys
    that do not fit one word together are sorted least significant word first, each pass
    stable, as in an LSD radix sort; a key wider than a word falls back to a stable argsort.

    Example:
        >>> stable_order(np.array([1, 0, 1]), np.array([5, 7, 2])).tolist()
        [1, 2, 0]
    """
    n = len(keys[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    index_bits = max(1, (n - 1).bit_length())
    # Group the keys into words of at most 63 - index_bits bits, most significant word first.
    words: list[list[tuple[np.ndarray, int, int]]] = [[]]
    used = 0
    for key in keys:
        low, high = int(key.min()), int(key.max())
        bits = (high - low).bit_length()
        if bits > 63:
            return np.lexsort(keys[::-1])  # spans more than int64: only lexsort can compare it
        if words[-1] and used + bits > 63 - index_bits:
            words.append([])
            used = 0
        words[-1].append((key, low, bits))
        used += bits
    order = None
    for word in reversed(words):
        packed = np.zeros(n, dtype=np.int64)
        for key, low, bits in word:
            packed <<= bits
            if key.dtype.kind == "u":
                packed |= (key.astype(np.uint64) - np.uint64(low)).astype(np.int64)
            else:
                packed |= key.astype(np.int64, copy=False) - low
        if order is not None:
            packed = packed[order]
        if sum(bits for _, _, bits in word) + index_bits <= 63:
            packed <<= index_bits
            packed |= np.arange(n)
            packed.sort()
            step = packed & ((1 << index_bits) - 1)
        else:
            step = np.argsort(packed, kind="stable")
        order = step if order is None else order[step]
    return order


#: Events handled at a time by the passes over all events: about 1 MiB of records, which stay
#: in the CPU cache while each field is read (reading a field of the whole array walks every
#: record, once per field), and the temporaries stay small.
_SLICE = 1 << 14


def assign_lanes(events: np.ndarray) -> np.ndarray:
    """Lane index (0, 1, ...) of every event within its (rank, SM).

    Example:
        >>> lanes = assign_lanes(trace.events)
        >>> lanes.max() + 1      # lanes the busiest SM needs
    """
    n = len(events)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    rank, cu_id, pid, end, in_order = _read_fields(events)
    if rank.min() < 0 or cu_id.min() < 0:
        return _assign_lanes_by_key(events)
    # Programs are the runs of equal (rank, SM, pid) once the events are sorted by it.
    words = _program_words(rank, cu_id, pid)
    if words is None:
        order = stable_order(rank, cu_id, pid)
        keys = [rank[order], cu_id[order], pid[order]]
        del rank, cu_id, pid
    else:
        del rank, cu_id, pid  # all in the words now
        words, index_bits, program_fields = words
        words.sort()  # by key, then index: a stable sort
        order = words & ((1 << index_bits) - 1)
        words >>= index_bits
        keys = [words]
    new_program = np.ones(n, dtype=bool)
    np.not_equal(keys[0][1:], keys[0][:-1], out=new_program[1:])
    for key in keys[1:]:
        new_program[1:] |= key[1:] != key[:-1]
    first = np.flatnonzero(new_program)
    program_rank, program_sm = (
        (keys[0][first], keys[1][first]) if words is None else program_fields(keys[0][first])
    )
    del keys, words
    starts, ends = _program_spans(events, order, first, end, in_order)
    del end
    program_lane = _program_lanes(program_rank.astype(np.int64), program_sm.astype(np.int64), starts, ends)
    if not program_lane.any():
        return np.zeros(n, dtype=np.int32)
    lanes = np.empty(n, dtype=np.int32)
    done = 0  # programs before the slice
    for lo in range(0, n, _SLICE):
        program = np.cumsum(new_program[lo : lo + _SLICE]) + (done - 1)
        lanes[order[lo : lo + _SLICE]] = program_lane[program]
        done = int(program[-1]) + 1
    return lanes


def _read_fields(events: np.ndarray):
    """What the lanes need of every event, read a slice at a time into compact arrays.

    Returns ``(rank, cu_id, pid, end, in_order)``: the pid's 32 bits as uint32 (as the program
    key has them), the end no earlier than the start, and whether starts never decrease.
    """
    n = len(events)
    rank = np.empty(n, dtype=events.dtype["cur_rank"])
    cu_id = np.empty(n, dtype=events.dtype["cu_id"])
    pid = np.empty(n, dtype=np.uint32)
    end = np.empty(n, dtype=np.int64)
    in_order, previous = True, None
    for lo in range(0, n, _SLICE):
        part = events[lo : lo + _SLICE]
        rows = slice(lo, lo + len(part))
        rank[rows], cu_id[rows], pid[rows] = part["cur_rank"], part["cu_id"], part["pid"]
        start = part["start_ns"]
        np.maximum(part["end_ns"], start, out=end[rows])
        if in_order:
            in_order = bool(np.all(start[1:] >= start[:-1])) and (previous is None or start[0] >= previous)
            previous = start[-1]
    return rank, cu_id, pid, end, in_order


def _program_words(rank, cu_id, pid):
    """(rank, SM, pid, index) of every event packed into one int64, if they fit 63 bits.

    Returns ``(words, index_bits, program_fields)``, ``program_fields`` turning a word shifted
    right by ``index_bits`` back into ``(rank, SM)``; or None.
    """
    n = len(pid)
    index_bits = max(1, (n - 1).bit_length())
    columns = (rank, cu_id, pid)
    lows = [int(column.min()) for column in columns]
    bits = [(int(column.max()) - low).bit_length() for column, low in zip(columns, lows)]
    if sum(bits) + index_bits > 63:
        return None
    words = np.empty(n, dtype=np.int64)
    for lo in range(0, n, _SLICE):
        part = np.subtract(rank[lo : lo + _SLICE], lows[0], dtype=np.int64)
        for column, low, width in zip(columns[1:], lows[1:], bits[1:]):
            part <<= width
            part |= np.subtract(column[lo : lo + _SLICE], low, dtype=np.int64)
        part <<= index_bits
        part |= np.arange(lo, lo + len(part))
        words[lo : lo + len(part)] = part

    def program_fields(keys):
        return (keys >> (bits[1] + bits[2])) + lows[0], ((keys >> bits[2]) & ((1 << bits[1]) - 1)) + lows[1]

    return words, index_bits, program_fields


def _program_spans(events, order, first, end, in_order: bool):
    """Earliest start and latest ``end`` of every program.

    ``order`` lists the events program by program, each program's events in input order;
    ``first`` is where each program begins in it; ``in_order``: the starts never decrease.
    """
    if in_order:
        starts = events["start_ns"][order[first]]  # the earliest event of a program comes first in it
    else:
        starts = np.minimum.reduceat(events["start_ns"][order], first)
    # Latest end per program, a slice of the order at a time; a program may straddle slices.
    ends = np.full(len(first), np.iinfo(np.int64).min)
    for lo in range(0, len(order), _SLICE):
        values = end[order[lo : lo + _SLICE]]
        a, b = np.searchsorted(first, (lo, lo + len(values)))
        programs = np.arange(a, b)
        heads = first[a:b] - lo
        if len(heads) == 0 or heads[0] != 0:  # the slice starts inside program a - 1
            programs, heads = np.r_[a - 1, programs], np.r_[0, heads]
        ends[programs] = np.maximum(ends[programs], np.maximum.reduceat(values, heads))
    return starts, ends


def _assign_lanes_by_key(events: np.ndarray) -> np.ndarray:
    """:func:`assign_lanes` for negative ranks or SM ids, with the packed key that defines programs."""
    # One int64 key per program: rank (16 bits) | SM (16 bits) | pid (32 bits).
    key = (
        (events["cur_rank"].astype(np.int64) << 48)
        | (events["cu_id"].astype(np.int64) << 32)
        | (events["pid"].astype(np.int64) & 0xFFFFFFFF)
    )
    program_keys, program_of = np.unique(key, return_inverse=True)
    starts = np.full(len(program_keys), np.iinfo(np.int64).max)
    ends = np.full(len(program_keys), np.iinfo(np.int64).min)
    np.minimum.at(starts, program_of, events["start_ns"])
    np.maximum.at(ends, program_of, np.maximum(events["end_ns"], events["start_ns"]))
    program_lane = _program_lanes(program_keys >> 48, (program_keys >> 32) & 0xFFFF, starts, ends)
    return program_lane[program_of.reshape(-1)]


def _program_lanes(ranks, sms, starts, ends) -> np.ndarray:
    """Greedy lane of every program, given in (rank, SM, pid) order: visited by start time per SM."""
    program_lane = np.zeros(len(starts), dtype=np.int32)
    order = stable_order(ranks, sms, starts)
    sm_rank, sm_id = ranks[order], sms[order]
    new_sm = np.ones(len(order), dtype=bool)
    new_sm[1:] = (sm_rank[1:] != sm_rank[:-1]) | (sm_id[1:] != sm_id[:-1])
    boundaries = np.flatnonzero(new_sm)
    overlapping = _overlapping_sms(np.cumsum(new_sm) - 1, starts[order], ends[order])
    # Only an SM where some program starts before an earlier one ends needs a second lane;
    # on the others every program reuses lane 0, so the greedy loop visits overlapping SMs only.
    for sm in overlapping.tolist():
        stop = boundaries[sm + 1] if sm + 1 < len(boundaries) else len(order)
        free: list[tuple[int, int]] = []  # (end time, lane) of the last program on each lane
        lanes_used = 0
        for program in order[boundaries[sm] : stop].tolist():
            if free and free[0][0] <= starts[program]:
                _, lane = heapq.heappop(free)
            else:
                lane, lanes_used = lanes_used, lanes_used + 1
            program_lane[program] = lane
            heapq.heappush(free, (int(ends[program]), lane))
    return program_lane


def _overlapping_sms(sm: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """SMs (ids ``sm``, non-decreasing) where a program starts before an earlier one on it ends.

    Programs come in start order within each SM. Each SM's times are lifted into a range of
    their own, so one running maximum over all programs never carries an end across SMs.
    """
    low = int(starts.min())
    span = int(ends.max()) - low + 1
    if (int(sm[-1]) + 1) * span >= 2**62:
        return np.unique(sm)  # too wide to lift: let the greedy loop look at every SM
    offset = sm * span - low
    latest_end = np.maximum.accumulate(ends + offset)
    overlap = starts[1:] + offset[1:] < latest_end[:-1]
    return np.unique(sm[1:][overlap])
