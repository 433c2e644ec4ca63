"""Per-group state slots that every member picks identically without talking to the others."""

from __future__ import annotations

import zlib

import numpy as np


class GroupSlots:
    """Maps a group (its sorted member ranks) to one of ``num_slots`` slots.

    Slot 0 is the whole world; other groups hash to slots ``1 .. num_slots - 1``.
    Two groups that share a member may not share a slot (their counters would mix),
    which is reported as an error rather than left to deadlock.

    Example:
        >>> slots = GroupSlots(64, world_size=4, what="collective")
        >>> slots.slot((0, 1, 2, 3)), slots.slot((0, 2))
        (0, 23)
    """

    def __init__(
        self, num_slots: int, world_size: int, what: str, advice: str = "use a different group layout"
    ):
        self.num_slots = num_slots
        self.what = what
        self.advice = advice
        self._slots: dict[tuple[int, ...], int] = {tuple(range(world_size)): 0}

    def slot(self, members: tuple[int, ...]) -> int:
        if members in self._slots:
            return self._slots[members]
        # A function of the member set alone, so every member agrees.
        slot = 1 + zlib.crc32(np.asarray(members, dtype=np.int64).tobytes()) % (self.num_slots - 1)
        for other, taken in self._slots.items():
            if taken == slot and set(other) & set(members):
                raise RuntimeError(
                    f"iris: {self.what} groups {list(other)} and {list(members)} share slot {slot}; "
                    f"{self.advice}"
                )
        self._slots[members] = slot
        return slot
