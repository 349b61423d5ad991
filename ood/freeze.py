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

    def reset(self, slot: int) -> None:
        self._last[slot] = np.nan
        self._count[slot] = 0
