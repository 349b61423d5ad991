"""Frozen-input detection: a stuck sensor repeats itself exactly, a car at rest may too.

A single frozen vector looks perfectly typical to a Mahalanobis score; what gives it away is time:
real sensor noise never repeats every component bit for bit. This counts, per session slot, how many
consecutive *fresh* observations were identical to the one before and alarms at `repeats`.
Only fresh observations count, because a tick that reuses the same observation (a 100 Hz sensor on
200 Hz ticks) is not a repeat of the sensor.

Two things repeat legitimately and are not counted:
- a car at rest (``FreezeSettings``): a real speed sensor reads exactly 0 at standstill, the
  acceleration 0 and the gap to a stopped lead stays the same, so whole observations repeat (5.3% of
  a real 10 Hz drive's). A repeat whose speed feature reads at most ``rest_speed`` in magnitude resets
  the count instead, but only when the car came to rest: a reading that jumps to rest straight from
  above ``moving_speed`` (walking pace) is a sensor that died, not a car that stopped (no car loses
  1.5 m/s between two samples of a 10 Hz sensor), and its repeats count. The price: a sensor that
  sticks while the car stands still is not caught here (it is indistinguishable from standing still
  until the car moves, and its speed reading moves with it only if the sensor is alive);
- features the session does not measure (its sensor profile, ``set_present``): they are NaN, which
  never equals itself, so only the present features are compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

_FLOAT32 = np.dtype(np.float32)
# m/s: a speed reading that jumps from above this straight to rest is a lost sensor, not a stop.
WALKING_PACE = 1.5


@dataclass(frozen=True)
class FreezeSettings:
    """How the freeze check tells a car at rest from a stuck sensor; stated, not fitted."""

    speed_feature: str = "ego_speed"  # m/s
    rest_speed: float = 0.1  # m/s; a repeat at |speed| <= this is a car at rest, not a freeze

    def __post_init__(self) -> None:
        if not self.speed_feature:
            raise ValueError("freeze check needs the name of its speed feature")
        if not (math.isfinite(self.rest_speed) and self.rest_speed >= 0.0):
            raise ValueError(f"freeze check: rest_speed must be a finite number >= 0, got {self.rest_speed!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"speed_feature": self.speed_feature, "rest_speed": float(self.rest_speed)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> FreezeSettings:
        unknown = sorted(set(d) - {"speed_feature", "rest_speed"})
        if unknown:
            raise ValueError(f"freeze settings: unknown fields {unknown}")
        return FreezeSettings(str(d["speed_feature"]), float(d["rest_speed"]))

    def rest(self, feature_names: Sequence[str]) -> tuple[int, float]:
        """(speed feature position, rest speed) for ``FreezeDetector``; ValueError when it is missing."""
        names = list(feature_names)
        if self.speed_feature not in names:
            raise ValueError(f"freeze check reads the feature {self.speed_feature!r}, which the inputs do not have")
        return names.index(self.speed_feature), float(self.rest_speed)


def common_settings(settings: Sequence[FreezeSettings | None]) -> FreezeSettings | None:
    """The one freeze setting several gates state (None if none does); ValueError if they differ."""
    stated = {s for s in settings if s is not None}
    if len(stated) > 1:
        raise ValueError(f"the gates state different freeze settings: {sorted(map(repr, stated))}")
    return stated.pop() if stated else None


class FreezeDetector:
    """Per slot, as arrays over every slot (a tick's rows are gathered and scattered with one numpy call
    each, whatever their number): the last fresh observation (float32), the repeat count, the features
    it compares and where its speed is (-1: no rest rule)."""

    def __init__(
        self,
        n_slots: int,
        dim: int,
        repeats: int = 2,
        rest: tuple[int, float] | None = None,
        moving_speed: float = WALKING_PACE,
    ) -> None:
        """``rest``: (speed feature position, rest speed) of ``FreezeSettings.rest``; None: every repeat
        counts. ``moving_speed``: a run at rest entered straight from a speed above this counts."""
        if repeats < 1:
            raise ValueError(f"repeats must be >= 1, got {repeats}")
        if rest is not None and not (0 <= rest[0] < dim and rest[1] >= 0.0):
            raise ValueError(f"rest rule {rest} for {dim} features")
        self.repeats = repeats
        self.dim = dim
        self.rest = rest
        self._rest_speed = -1.0 if rest is None else float(rest[1])
        self._last = np.full((n_slots, dim), np.nan, np.float32)
        self._count = np.zeros(n_slots, np.int64)
        self._ignored = np.zeros((n_slots, dim), bool)  # features the slot's session does not measure
        self._masked = False  # any slot ignores some
        self._rest_at = np.full(n_slots, -1 if rest is None else rest[0], np.intp)
        self.moving_speed = float(moving_speed)
        # per slot: the run of readings now repeating began straight from a speed above moving_speed
        self._from_moving = np.zeros(n_slots, bool)

    def set_present(self, slot: int, present: npt.NDArray[np.bool_] | None) -> None:
        """The features the slot's session measures (None: all); only they are compared, and the rest
        rule applies only when the speed feature is one of them."""
        self._ignored[slot] = False if present is None else ~np.asarray(present, bool)
        self._masked = bool(self._ignored.any())
        speed = -1 if self.rest is None else self.rest[0]
        self._rest_at[slot] = speed if speed >= 0 and not self._ignored[slot, speed] else -1

    def update(self, x: np.ndarray, slots: np.ndarray | Sequence[int], fresh: np.ndarray) -> np.ndarray:
        """x (batch, dim) raw features of the rows ticking now; returns the alarm per row.

        Delay: the `repeats`-th identical fresh observation after onset alarms, i.e. `repeats` ticks
        after the first frozen sample at the observation rate.
        """
        return np.array(self.step(x, slots, fresh), dtype=bool)

    def step(self, x: np.ndarray, slots: np.ndarray | Sequence[int], fresh: np.ndarray | Sequence[bool]) -> list[bool]:
        """``update`` as a list (each slot at most once per call).

        Components compare with float32 ``==``: NaN never equals, so non-finite rows are the gate's
        job, not a freeze; the speeds compare in float64, as ``scan`` does."""
        at = np.asarray(slots, np.intp)
        is_fresh = np.asarray(fresh, bool)
        count = self._count
        if is_fresh.all():  # every row a new observation (a sensor at the tick rate): no masking
            self._judge(at, np.asarray(x, np.float32))
        elif is_fresh.any():  # a reused observation is not a repeat of the sensor
            self._judge(at[is_fresh], np.asarray(x, np.float32)[is_fresh])
        alarm: list[bool] = (count[at] >= self.repeats).tolist()
        return alarm

    def _judge(self, at: npt.NDArray[np.intp], now: npt.NDArray[np.float32]) -> None:
        """Count the fresh observations `now` of slots `at` against each slot's last one."""
        before = self._last[at]
        same = now == before
        if self._masked:
            same |= self._ignored[at]
        same = same.all(axis=1)
        if self.rest is not None:
            r = self._rest_at[at]
            rest, rows, speed = r >= 0, np.arange(len(at)), np.maximum(r, 0)
            # a new reading: did it come straight from moving? (NaN: no)
            new = ~same & rest
            self._from_moving[at[new]] = np.abs(before[rows, speed][new].astype(np.float64)) > self.moving_speed
            at_rest = np.abs(now[rows, speed].astype(np.float64)) <= self._rest_speed
            same &= ~(rest & at_rest & ~self._from_moving[at])  # a car at rest is no frozen sensor
        self._count[at] = np.where(same, self._count[at] + 1, 0)
        self._last[at] = now

    @property
    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """(last fresh observation, repeat count) per slot (copies, for tests and debugging)."""
        return self._last.copy(), self._count.copy()

    def counts(self, slots: np.ndarray | Sequence[int]) -> list[int]:
        """The repeat count of these slots now (after a step: the count each row was judged on)."""
        counts: list[int] = self._count[np.asarray(slots, np.intp)].tolist()
        return counts

    def scan(self, x: np.ndarray, slot: int, fresh: np.ndarray) -> np.ndarray:
        """``update`` of one slot over many consecutive ticks (replay), vectorised: x (ticks, dim),
        fresh (ticks,). Returns the alarm per tick; leaves the slot as tick-by-tick updates would."""
        return self.scan_counts(x, slot, fresh) >= self.repeats

    def scan_counts(self, x: np.ndarray, slot: int, fresh: np.ndarray) -> np.ndarray:
        """``scan``'s repeat count per tick (the alarm is count >= repeats)."""
        fresh = np.asarray(fresh, dtype=bool)
        at = np.flatnonzero(fresh)
        if at.size == 0:
            return np.full(len(x), int(self._count[slot]))
        xf = x[at]
        before = np.vstack([self._last[slot][None], xf[:-1]])
        same = np.all((xf == before) | self._ignored[slot], axis=1)
        r = int(self._rest_at[slot])
        if r >= 0:  # in float64, as `step` compares (a float32 compare rounds the limit)
            # whether the run each fresh tick belongs to began straight from moving: set at each new
            # reading from the reading before it, carried through the repeats after it
            j_new = np.flatnonzero(~same)
            began = np.abs(np.asarray(before[j_new, r], np.float64)) > self.moving_speed
            k = np.searchsorted(j_new, np.arange(len(xf)), side="right") - 1
            from_moving = np.where(k >= 0, began[np.maximum(k, 0)] if len(j_new) else False, self._from_moving[slot])
            same &= ~((np.abs(np.asarray(xf[:, r], np.float64)) <= self._rest_speed) & ~from_moving)
            self._from_moving[slot] = bool(from_moving[-1])
        # count at the j-th fresh tick: fresh ticks since the last one that differed, or, before
        # any difference, the slot's old count plus the run so far
        j = np.arange(at.size)
        last_reset = np.maximum.accumulate(np.where(same, -1, j))
        old = int(self._count[slot])
        count_f = np.where(last_reset >= 0, j - last_reset, old + j + 1)
        # a tick that reuses an observation keeps the count of the last fresh tick before it
        latest = np.searchsorted(at, np.arange(len(x)), side="right") - 1
        count = np.where(latest >= 0, count_f[np.maximum(latest, 0)], old)
        self._count[slot] = count_f[-1]
        self._last[slot] = xf[-1]
        return count

    def reset(self, slot: int) -> None:
        self._last[slot] = np.nan
        self._count[slot] = 0
        self._from_moving[slot] = False
        self.set_present(slot, None)
