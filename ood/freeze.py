"""Frozen-input detection: a stuck sensor repeats itself exactly.

A single frozen vector looks perfectly typical to a Mahalanobis score; what gives it away is time:
real sensor noise never repeats every component bit for bit. This counts, per session slot, how many
consecutive *fresh* observations were identical to the one before and alarms at `repeats`.
Only fresh observations count, because a tick that reuses the same observation (a 100 Hz sensor on
200 Hz ticks) is not a repeat of the sensor.
"""

from __future__ import annotations

import numpy as np


class FreezeDetector:
    def __init__(self, n_slots: int, dim: int, repeats: int = 2) -> None:
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        self.repeats = repeats
        self._last = np.full((n_slots, dim), np.nan, np.float32)
        self._count = np.zeros(n_slots, np.int64)

    def update(self, x: np.ndarray, slots: np.ndarray, fresh: np.ndarray) -> np.ndarray:
        """x (batch, dim) raw features of the rows ticking now; returns the alarm per row.

        Delay: the `repeats`-th identical fresh observation after onset alarms, i.e. `repeats` ticks
        after the first frozen sample at the observation rate.
        """
        last = self._last[slots]
        same = np.all(x == last, axis=1) & fresh  # NaN never equals: non-finite rows are the gate's job
        count = np.where(same, self._count[slots] + 1, np.where(fresh, 0, self._count[slots]))
        self._count[slots] = count
        self._last[slots[fresh]] = x[fresh]
        return count >= self.repeats

    def scan(self, x: np.ndarray, slot: int, fresh: np.ndarray) -> np.ndarray:
        """``update`` of one slot over many consecutive ticks (replay), vectorised: x (ticks, dim),
        fresh (ticks,). Returns the alarm per tick; leaves the slot as tick-by-tick updates would."""
        fresh = np.asarray(fresh, dtype=bool)
        at = np.flatnonzero(fresh)
        if at.size == 0:
            return np.full(len(x), self._count[slot] >= self.repeats)
        xf = x[at]
        same = np.all(xf == np.vstack([self._last[slot][None], xf[:-1]]), axis=1)
        # count at the j-th fresh tick: fresh ticks since the last one that differed, or, before
        # any difference, the slot's old count plus the run so far
        j = np.arange(at.size)
        last_reset = np.maximum.accumulate(np.where(same, -1, j))
        count_f = np.where(last_reset >= 0, j - last_reset, self._count[slot] + j + 1)
        # a tick that reuses an observation keeps the count of the last fresh tick before it
        latest = np.searchsorted(at, np.arange(len(x)), side="right") - 1
        count = np.where(latest >= 0, count_f[np.maximum(latest, 0)], self._count[slot])
        self._count[slot] = count_f[-1]
        self._last[slot] = xf[-1]
        return count >= self.repeats

    def reset(self, slot: int) -> None:
        self._last[slot] = np.nan
        self._count[slot] = 0
