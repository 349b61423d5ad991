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
    """Per slot: the last fresh observation (float32, as Python floats), the repeat count, the features
    it compares (None: all) and where its speed is (-1: no rest rule), kept as Python numbers because a
    tick has few rows and a numpy call costs more than the check."""

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
        self._last: list[list[float]] = [[math.nan] * dim for _ in range(n_slots)]
        self._count = [0] * n_slots
        self._keep: list[list[int] | None] = [None] * n_slots
        self._rest_at = [-1 if rest is None else rest[0]] * n_slots
        self.moving_speed = float(moving_speed)
        # per slot: the run of readings now repeating began straight from a speed above moving_speed
        self._from_moving = [False] * n_slots

    def set_present(self, slot: int, present: npt.NDArray[np.bool_] | None) -> None:
        """The features the slot's session measures (None: all); only they are compared, and the rest
        rule applies only when the speed feature is one of them."""
        keep = None if present is None or bool(np.all(present)) else np.flatnonzero(present).tolist()
        self._keep[slot] = keep
        speed = -1 if self.rest is None else self.rest[0]
        self._rest_at[slot] = speed if keep is None or speed in keep else -1

    def update(self, x: np.ndarray, slots: np.ndarray | Sequence[int], fresh: np.ndarray) -> np.ndarray:
        """x (batch, dim) raw features of the rows ticking now; returns the alarm per row.

        Delay: the `repeats`-th identical fresh observation after onset alarms, i.e. `repeats` ticks
        after the first frozen sample at the observation rate.
        """
        return np.array(
            self.step(x, np.asarray(slots, dtype=np.intp).tolist(), np.asarray(fresh, dtype=bool).tolist()), dtype=bool
        )

    def step(self, x: np.ndarray, slots: Sequence[int], fresh: Sequence[bool]) -> list[bool]:
        """``update`` with the slots and fresh flags as Python sequences; returns a list.

        Comparing two rows' ``tolist()`` compares every component with float ``==``, as numpy's
        ``==`` does: NaN never equals, so non-finite rows are the gate's job, not a freeze."""
        rows = x.tolist()
        kept = rows if x.dtype is _FLOAT32 else np.asarray(x, dtype=np.float32).tolist()
        last, count, repeats = self._last, self._count, self.repeats
        keep, rest_at, rest_speed = self._keep, self._rest_at, self._rest_speed
        from_moving, moving_speed = self._from_moving, self.moving_speed
        alarm = []
        for slot, now, k, is_fresh in zip(slots, rows, kept, fresh):
            if is_fresh:  # a reused observation is not a repeat of the sensor
                before, cols, r = last[slot], keep[slot], rest_at[slot]
                same = now == before if cols is None else [now[i] for i in cols] == [before[i] for i in cols]
                if not same and r >= 0:  # a new reading: did it come straight from moving? (NaN: no)
                    from_moving[slot] = abs(before[r]) > moving_speed
                elif same and r >= 0 and abs(now[r]) <= rest_speed and not from_moving[slot]:  # a car at rest
                    same = False
                count[slot] = count[slot] + 1 if same else 0
                last[slot] = k
            alarm.append(count[slot] >= repeats)
        return alarm

    @property
    def state(self) -> tuple[np.ndarray, np.ndarray]:
        """(last fresh observation, repeat count) per slot (copies, for tests and debugging)."""
        return np.array(self._last, dtype=np.float32), np.array(self._count)

    def counts(self, slots: Sequence[int]) -> list[int]:
        """The repeat count of these slots now (after a step: the count each row was judged on)."""
        count = self._count
        return [count[slot] for slot in slots]

    def scan(self, x: np.ndarray, slot: int, fresh: np.ndarray) -> np.ndarray:
        """``update`` of one slot over many consecutive ticks (replay), vectorised: x (ticks, dim),
        fresh (ticks,). Returns the alarm per tick; leaves the slot as tick-by-tick updates would."""
        return self.scan_counts(x, slot, fresh) >= self.repeats

    def scan_counts(self, x: np.ndarray, slot: int, fresh: np.ndarray) -> np.ndarray:
        """``scan``'s repeat count per tick (the alarm is count >= repeats)."""
        fresh = np.asarray(fresh, dtype=bool)
        at = np.flatnonzero(fresh)
        if at.size == 0:
            return np.full(len(x), self._count[slot])
        xf = x[at]
        before = np.vstack([np.array(self._last[slot], dtype=np.float32)[None], xf[:-1]])
        cols = self._keep[slot]
        same = np.all(xf == before, axis=1) if cols is None else np.all(xf[:, cols] == before[:, cols], axis=1)
        r = self._rest_at[slot]
        if r >= 0:  # in float64, as the Python floats compare (a float32 compare rounds the limit)
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
        count_f = np.where(last_reset >= 0, j - last_reset, self._count[slot] + j + 1)
        # a tick that reuses an observation keeps the count of the last fresh tick before it
        latest = np.searchsorted(at, np.arange(len(x)), side="right") - 1
        count = np.where(latest >= 0, count_f[np.maximum(latest, 0)], self._count[slot])
        self._count[slot] = int(count_f[-1])
        self._last[slot] = np.asarray(xf[-1], dtype=np.float32).tolist()
        return count

    def reset(self, slot: int) -> None:
        self._last[slot] = [math.nan] * self.dim
        self._count[slot] = 0
        self._from_moving[slot] = False
        self.set_present(slot, None)
