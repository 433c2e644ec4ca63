"""Unions, intersections and differences of many interval sets, per key, from one sort.

The analyses ask the same question in several shapes: on each SM (a *key*), how long
were compute scopes, RMA ops or waits running, counting two CTAs that ran at once on
that SM once. :class:`Coverage` cuts every key's timeline at each interval boundary
into *pieces* and records which sets cover each piece; every answer is then a sum of
piece lengths. Per-key totals serve the report's tables (:mod:`iris_trace.analysis`)
and the picture's bins (:mod:`iris_trace.plot`); :meth:`Coverage.length_within` answers
"how much of ``[lo, hi)`` did this key spend in these sets" for many queries at once,
which is how wait attribution tells a releaser that was pushing data from one that ran
nothing traced (:mod:`iris_trace.attribution`).

Example:
    >>> cover = Coverage(keys, starts, ends, member, n_keys)
    >>> cover.union((0,))                              # |set 0| per key
    >>> cover.length_within((0,), query_keys, lo, hi)  # |set 0 ∩ [lo, hi)| per query
"""

from __future__ import annotations

import numpy as np

from .matching import _latest_at_or_before


def order_by_key_then_time(keys: np.ndarray, times: np.ndarray, n_keys: int) -> np.ndarray:
    """Stable sort order by (key, time), for keys in ``[0, n_keys)``.

    Shifting each key's times into its own range lets one argsort do what lexsort does in
    about a fifth of the time; lexsort remains for spans that would overflow int64.

    Example:
        >>> order_by_key_then_time(np.array([1, 0, 1]), np.array([5, 9, 2]), 2)
        array([1, 2, 0])
    """
    if len(times) == 0:
        return np.zeros(0, dtype=np.int64)
    first = int(times.min())
    span = int(times.max()) - first + 1
    if n_keys * span >= 2**62:
        return np.lexsort((times, keys))
    return np.argsort(keys * span + (times - first), kind="stable")


class Coverage:
    """Every key's timeline cut at each interval boundary, with the interval sets covering each piece.

    One sort answers every union, intersection and difference of the sets per key, which is
    what keeps concurrent CTAs on one SM from being counted twice.

    Args:
        keys: int array, each interval's key in ``[0, n_keys)``.
        starts, ends: int64 interval bounds (``ends >= starts``).
        member: bool ``(n, n_sets)``, which sets each interval belongs to (possibly several).
        n_keys: number of keys.

    After construction ``key``, ``start``, ``end`` and ``length`` describe the pieces of positive
    length, ordered by key then time, and ``covered[i, s]`` says whether set ``s`` covers piece ``i``.

    Example:
        >>> cover = Coverage(np.array([0, 0]), np.array([0, 5]), np.array([10, 20]), np.ones((2, 1), bool), 1)
        >>> cover.union((0,))
        array([20])
    """

    def __init__(self, keys, starts, ends, member: np.ndarray, n_keys: int):
        self.n_keys = n_keys
        member = np.asarray(member, dtype=bool)
        times = np.concatenate([starts, ends]).astype(np.int64)
        boundary_keys = np.concatenate([keys, keys]).astype(np.int64)
        steps = np.concatenate([member, member]).astype(np.int32)
        steps[len(starts) :] *= -1
        order = order_by_key_then_time(boundary_keys, times, n_keys)
        times, boundary_keys = times[order], boundary_keys[order]
        # Depth after each boundary; each key's steps sum to zero, so it is 0 between keys.
        depth = np.cumsum(steps[order], axis=0)
        keep = (boundary_keys[1:] == boundary_keys[:-1]) & (times[1:] > times[:-1])
        self.key = boundary_keys[:-1][keep]
        self.start = times[:-1][keep]
        self.end = times[1:][keep]
        self.length = self.end - self.start
        self.covered = depth[:-1][keep] > 0

    def _any(self, sets) -> np.ndarray:
        return self.covered[:, list(sets)].any(axis=1)

    def _length_per_key(self, pieces: np.ndarray) -> np.ndarray:
        total = np.zeros(self.n_keys, dtype=np.int64)
        np.add.at(total, self.key[pieces], self.length[pieces])
        return total

    def union(self, sets) -> np.ndarray:
        """``|U sets|`` per key (int64 ns).

        Example:
            >>> cover.union((0, 1))   # time covered by set 0 or set 1, per key
        """
        return self._length_per_key(self._any(sets))

    def intersection(self, sets_a, sets_b) -> np.ndarray:
        """``|(U sets_a) ∩ (U sets_b)|`` per key.

        Example:
            >>> cover.intersection((0,), (1,))
        """
        return self._length_per_key(self._any(sets_a) & self._any(sets_b))

    def difference(self, sets_a, sets_b) -> np.ndarray:
        """``|(U sets_a) minus (U sets_b)|`` per key.

        Example:
            >>> cover.difference((0,), (1,))
        """
        return self._length_per_key(self._any(sets_a) & ~self._any(sets_b))

    def length_within(self, sets, query_keys, lo, hi) -> np.ndarray:
        """``|(U sets) ∩ [lo, hi)|`` on each query's key (int64 ns; 0 where ``hi <= lo``).

        Args:
            sets: the sets whose union is measured.
            query_keys: int array, each query's key in ``[0, n_keys)``.
            lo, hi: int64 arrays, each query's interval.

        Example:
            >>> cover.length_within((1,), np.array([0]), np.array([100]), np.array([250]))
        """
        query_keys = np.asarray(query_keys, dtype=np.int64)
        lo = np.asarray(lo, dtype=np.int64)
        hi = np.maximum(np.asarray(hi, dtype=np.int64), lo)
        pieces = self._any(sets)
        key, start, length = self.key[pieces], self.start[pieces], self.length[pieces]
        before = np.concatenate([[0], np.cumsum(length)])  # covered time before each piece, all keys
        first_of_key = np.searchsorted(key, query_keys, side="left")

        def covered_until(t):
            # The key's covered time before t: whole pieces before the last one that starts
            # at or before t, and that piece up to t.
            last = _latest_at_or_before([key], start, [query_keys], t)
            safe = np.maximum(last, 0)
            inside = before[safe] + np.clip(t - start[safe], 0, length[safe]) if len(key) else 0
            return np.where(last >= 0, inside, before[first_of_key])

        return (covered_until(hi) - covered_until(lo)).astype(np.int64)
