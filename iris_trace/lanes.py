"""Lanes: which row of its SM's track each event is drawn on, so slices nest strictly.

Several CTAs can share an SM, and their ops overlap in time; a viewer track only
shows properly nested slices. Inside one program, ops run one after another and
a compute scope contains the ops issued within it, so one program's events
always nest. Programs are therefore the unit: each (rank, SM, program) gets the
first lane of its SM whose previous program has finished, greedily by start
time. The loop runs over programs, never over events.
"""

from __future__ import annotations

import heapq

import numpy as np


def assign_lanes(events: np.ndarray) -> np.ndarray:
    """Lane index (0, 1, ...) of every event within its (rank, SM).

    Example:
        >>> lanes = assign_lanes(trace.events)
        >>> lanes.max() + 1      # lanes the busiest SM needs
    """
    if len(events) == 0:
        return np.zeros(0, dtype=np.int32)
    # One int64 key per program: rank (16 bits) | SM (16 bits) | pid (32 bits).
    key = (
        (events["cur_rank"].astype(np.int64) << 48)
        | (events["cu_id"].astype(np.int64) << 32)
        | (events["pid"].astype(np.int64) & 0xFFFFFFFF)
    )
    program_keys, program_of = np.unique(key, return_inverse=True)
    programs = np.stack([program_keys >> 48, (program_keys >> 32) & 0xFFFF], 1)
    starts = np.full(len(programs), np.iinfo(np.int64).max)
    ends = np.full(len(programs), np.iinfo(np.int64).min)
    np.minimum.at(starts, program_of, events["start_ns"])
    np.maximum.at(ends, program_of, np.maximum(events["end_ns"], events["start_ns"]))

    program_lane = np.zeros(len(programs), dtype=np.int32)
    order = np.lexsort((starts, programs[:, 1], programs[:, 0]))
    # Programs are visited SM by SM; the greedy loop is per program, never per event.
    sm_of = programs[order, :2]
    boundaries = np.flatnonzero(np.any(sm_of[1:] != sm_of[:-1], axis=1)) + 1
    for group in np.split(order, boundaries):
        free: list[tuple[int, int]] = []  # (end time, lane) of the last program on each lane
        lanes_used = 0
        for program in group.tolist():
            if free and free[0][0] <= starts[program]:
                _, lane = heapq.heappop(free)
            else:
                lane, lanes_used = lanes_used, lanes_used + 1
            program_lane[program] = lane
            heapq.heappush(free, (int(ends[program]), lane))
    return program_lane[program_of]
