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

from collections.abc import Sequence

import numpy as np

NS = 1e-9  # seconds per nanosecond: the interval is (t_now - t_before) * NS


class ChangeTracker:
    """Per slot, as arrays over every slot (a tick's rows are gathered and scattered with one numpy call
    each, whatever their number): the last finite fresh observation (``_has_last`` False before the
    first), its timestamp and the last rate."""

    def __init__(self, n_slots: int, dim: int) -> None:
        self.dim = dim
        self._last = np.full((n_slots, dim), np.nan)
        self._has_last = np.zeros(n_slots, bool)
        self._last_t = np.zeros(n_slots, np.int64)
        self._change = np.full((n_slots, dim), np.nan)

    def step(
        self,
        x: np.ndarray,
        slots: np.ndarray | Sequence[int],
        fresh: np.ndarray | Sequence[bool],
        finite: Sequence[bool],
        times: Sequence[int],
    ) -> np.ndarray:
        """x (rows, dim) float32 raw features of the rows ticking now (each slot at most once),
        ``times`` their observations' timestamps (int ns); their rates of change (unit/s), (rows, dim)
        float64, a new array."""
        at = np.asarray(slots, np.intp)
        is_fresh = np.asarray(fresh, bool)
        if is_fresh.any():
            updated = is_fresh & np.asarray(finite, bool)
            t = np.asarray(times, np.int64)
            x64 = x.astype(np.float64)
            dt = (t - self._last_t[at]).astype(np.float64) * NS
            known = updated & self._has_last[at] & (dt > 0.0)
            with np.errstate(invalid="ignore", over="ignore"):
                rate = (x64 - self._last[at]) / np.where(known, dt, 1.0)[:, None]
            rate[~known] = np.nan
            self._change[at[is_fresh]] = rate[is_fresh]
            to = at[updated]
            self._last[to] = x64[updated]
            self._last_t[to] = t[updated]
            self._has_last[to] = True
        return self._change[at]

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
        had_last = bool(self._has_last[slot])
        start = self._last[slot]  # NaN before the slot's first finite observation
        has_prev = prev_idx >= 0
        at = np.maximum(prev_idx, 0)
        prev = np.where(has_prev[:, None], x64[at], start[None, :])
        prev_t = np.where(has_prev, ts[at], self._last_t[slot])
        dt = (ts - prev_t).astype(np.float64) * NS
        known = finite & (dt > 0.0) & (has_prev | had_last)
        with np.errstate(divide="ignore", invalid="ignore"):
            change = np.where(known[:, None], (x64 - prev) / np.where(known, dt, 1.0)[:, None], np.nan)
        finite_rows = np.flatnonzero(finite)
        if finite_rows.size:
            self._last[slot] = x64[finite_rows[-1]]
            self._last_t[slot] = ts[finite_rows[-1]]
            self._has_last[slot] = True
        self._change[slot] = change[-1]
        return change

    @property
    def state(self) -> tuple[list[list[float] | None], list[int], np.ndarray]:
        """(last finite observation or None, its timestamp, last rate) per slot (copies, for tests)."""
        last = [row.tolist() if has else None for row, has in zip(self._last, self._has_last)]
        return last, self._last_t.tolist(), self._change.copy()

    def reset(self, slot: int) -> None:
        self._last[slot] = np.nan
        self._has_last[slot] = False
        self._last_t[slot] = 0
        self._change[slot] = np.nan
