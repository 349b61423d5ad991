"""The rate of change of each feature since the previous fresh observation, per session slot.

A noisy sensor still reports plausible values one at a time; what gives it away is how fast they move
from one observation to the next (a 3 m/s speed change in 5 ms). A gate's change limits
(``FeatureRange.change_low/high``) check these rates, in the feature's unit per second: the change is
divided by the time between the two observations' timestamps (sensor time), so one limit holds at
any observation rate (a 10 Hz sensor's changes are 20 times those of a 200 Hz one, and so is its
interval).

Rules, the same for a live tick (``step``) and a replay (``scan``):
- only a fresh observation makes a new rate; a tick that reuses an observation reports the rate it
  made (a 100 Hz sensor on 200 Hz ticks is not standing still);
- the rate is measured from the last *finite* fresh observation (finite: as the caller says, e.g.
  every feature the session measures is finite), ``(now - before) / ((t_now - t_before) * 1e-9)`` in
  float64 of the float32 values, with the interval in integer nanoseconds made a float64 and then
  scaled, in this order in every copy;
- it is NaN (unknown: no limit can be broken) for a non-finite observation, whose NaN the gate vetoes
  anyway, for a slot's first finite observation, which has nothing to compare with, and when the
  interval is not positive; a feature NaN in either observation (one the session does not measure)
  has a NaN rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

NS = 1e-9  # seconds per nanosecond: the interval is (t_now - t_before) * NS


class ChangeTracker:
    """Per slot, as Python floats (a tick has few rows; a numpy call costs more than the arithmetic):
    the last finite fresh observation (None before the first), its timestamp and the last rate."""

    def __init__(self, n_slots: int, dim: int) -> None:
        self.dim = dim
        self._unknown = [math.nan] * dim
        self._last: list[list[float] | None] = [None] * n_slots
        self._last_t: list[int] = [0] * n_slots
        self._change: list[list[float]] = [self._unknown] * n_slots

    def step(
        self,
        x: np.ndarray,
        slots: Sequence[int],
        fresh: Sequence[bool],
        finite: Sequence[bool],
        times: Sequence[int],
    ) -> list[list[float]]:
        """x (rows, dim) float32 raw features of the rows ticking now, ``times`` their observations'
        timestamps (int ns); their rates of change (unit/s), one list of floats per row (the scorer takes
        them as they are; ``np.array`` makes the (rows, dim) array). The lists are the tracker's own: read
        them, do not change them."""
        last, last_t, change, unknown, out = self._last, self._last_t, self._change, self._unknown, []
        for slot, now, is_fresh, ok, t in zip(slots, x.tolist(), fresh, finite, times):
            if is_fresh:
                if not ok:
                    change[slot] = unknown
                else:
                    before = last[slot]
                    dt = (t - last_t[slot]) * NS
                    if before is None or not dt > 0.0:
                        change[slot] = unknown
                    else:
                        change[slot] = [(a - b) / dt for a, b in zip(now, before)]
                    last[slot] = now
                    last_t[slot] = t
            out.append(change[slot])
        return out

    def scan(self, x: np.ndarray, finite: np.ndarray, slot: int, times: np.ndarray | Sequence[int]) -> np.ndarray:
        """``step`` for consecutive fresh observations of one slot (a replay: each row is fresh once):
        x (n, dim), finite (n,), times (n,) int ns. Returns the rate per row (n, dim) float64 and leaves
        the slot as row-by-row steps would."""
        x64 = np.asarray(x, np.float32).astype(np.float64)
        finite = np.asarray(finite, bool)
        ts = np.asarray(times, np.int64)
        n = len(x64)
        if n == 0:
            return np.zeros((0, self.dim))
        if ts.shape != (n,):
            raise ValueError(f"{n} observations need {n} timestamps, got shape {ts.shape}")
        idx = np.where(finite, np.arange(n), -1)
        prev_idx = np.concatenate([[-1], np.maximum.accumulate(idx)[:-1]])  # last finite row before each
        before = self._last[slot]
        start = np.full(self.dim, np.nan) if before is None else np.array(before, np.float64)
        has_prev = prev_idx >= 0
        at = np.maximum(prev_idx, 0)
        prev = np.where(has_prev[:, None], x64[at], start[None, :])
        prev_t = np.where(has_prev, ts[at], self._last_t[slot])
        dt = (ts - prev_t).astype(np.float64) * NS
        known = finite & (dt > 0.0) & (has_prev | (before is not None))
        with np.errstate(divide="ignore", invalid="ignore"):
            change = np.where(known[:, None], (x64 - prev) / np.where(known, dt, 1.0)[:, None], np.nan)
        finite_rows = np.flatnonzero(finite)
        if finite_rows.size:
            self._last[slot] = x64[finite_rows[-1]].tolist()
            self._last_t[slot] = int(ts[finite_rows[-1]])
        self._change[slot] = change[-1].tolist()
        return change

    @property
    def state(self) -> tuple[list[list[float] | None], list[int], np.ndarray]:
        """(last finite observation or None, its timestamp, last rate) per slot (copies, for tests)."""
        return [None if v is None else list(v) for v in self._last], list(self._last_t), np.array(self._change)

    def reset(self, slot: int) -> None:
        self._last[slot] = None
        self._last_t[slot] = 0
        self._change[slot] = self._unknown
