"""Where the lane is while the fallback cannot see it: the last trusted lane reading carried forward
by the vehicle's own motion (dead reckoning), on a road whose curvature keeps the trend it had.

A blind stop from motorway speed covers about 100 m. Steering it on the last curvature alone is
open loop: the heading and offset errors it starts with are never taken back, and a curve that
tightens on the way leaves the road (a 0.00045 1/m change over the stop drifts ~1.6 m). Lane
models of production cameras describe the lane ahead as a clothoid (offset, heading, curvature,
curvature rate) for this reason; this is that model, fitted to the trusted readings of the last
`trend_window_s` (the pose to those of the last `pose_window_s`), with the curvature's trend
extrapolated over `preview_m` and held beyond it.
The pose is integrated with a kinematic bicycle from the steering the safe side applied.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# One trusted lane reading: (road curvature 1/m, speed m/s, lane offset m, heading error rad).
LaneReading = tuple[float, float, float, float]


class LaneHistory:
    """The trusted readings a session keeps for the estimate: the newest `length`, oldest first. Held
    as one flat float64 array, which the garbage collector does not walk: a deque of 200 reading
    tuples per session is visited item by item by every full collection (at 512 sessions most of a
    ~9 ms pause)."""

    __slots__ = ("length", "_flat")

    def __init__(self, length: int) -> None:
        self.length = max(length, 1)
        self._flat = array("d")  # every reading appended since the last trim, four values each

    def append(self, reading: LaneReading) -> None:
        flat = self._flat
        flat.extend(reading)
        if len(flat) >= 8 * self.length:  # twice what is kept: drop the older half at once
            del flat[: len(flat) - 4 * self.length]

    def __len__(self) -> int:
        return min(len(self._flat) // 4, self.length)

    def clear(self) -> None:
        del self._flat[:]

    def __eq__(self, other: object) -> bool:
        """The same length and readings (as two deques compare)."""
        return isinstance(other, LaneHistory) and self.length == other.length and self.readings() == other.readings()

    def readings(self) -> list[LaneReading]:
        """The readings kept, oldest first, as the floats appended."""
        kept = self._flat[len(self._flat) - 4 * len(self) :]
        return list(zip(kept[0::4], kept[1::4], kept[2::4], kept[3::4]))


def curvature_trend(history: Sequence[LaneReading], period_s: float) -> tuple[float, float]:
    """(curvature now, its rate per metre travelled): a least-squares line of curvature against the
    distance covered over the history, at the newest reading (its fitted value, not its noise). A
    rate within three standard errors of 0 is 0 and the curvature their mean: a few metres of noisy
    readings (after a recovery, at a session's start) read as a trend would be extrapolated 60 m."""
    if not history:
        return 0.0, 0.0
    readings = np.array(history, np.float64)
    curvature, speed = readings[:, 0], readings[:, 1]
    mean = float(curvature.mean())
    if len(readings) < 3:
        return mean, 0.0
    s = np.concatenate(([0.0], np.cumsum(np.abs(speed[1:]) * period_s)))
    ds = s - s.mean()
    spread = float(ds @ ds)
    if spread < 1.0:  # less than ~1 m of travel: no trend to read
        return mean, 0.0
    rate = float(ds @ (curvature - mean)) / spread
    residual = curvature - mean - rate * ds
    standard_error = math.sqrt(float(residual @ residual) / (len(readings) - 2) / spread)
    if abs(rate) < 3.0 * standard_error:
        return mean, 0.0
    return mean + rate * float(ds[-1]), rate


def _newest_of_line(values: np.ndarray) -> tuple[float, float]:
    """Each column's least-squares line over its rows (one per tick), at the newest row."""
    n = len(values)
    if n < 3:
        return float(values[-1, 0]), float(values[-1, 1])
    t = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
    slope = t @ (values - values.mean(axis=0)) / (t @ t)
    newest = values.mean(axis=0) + slope * t[-1]
    return float(newest[0]), float(newest[1])


@dataclass(slots=True)
class LaneEstimate:
    """The lane pose relative to the vehicle, integrated tick by tick from the last trusted reading."""

    offset: float  # m, + = left of the lane centre
    heading: float  # rad, + = pointing left of the road
    curvature: float  # 1/m at the last trusted reading
    curvature_rate: float  # 1/m per m travelled
    travelled: float = 0.0  # m since the last trusted reading

    @classmethod
    def from_history(
        cls,
        history: LaneHistory,
        period_s: float,
        max_rate: float,
        pose_readings: int,
        suspect: int = 0,
    ) -> LaneEstimate | None:
        """From the readings but the `suspect` newest (at least one is used): the curvature's trend
        over all of them, the offset and heading over the newest `pose_readings` (one reading's noise
        in heading, held over a 100 m stop, is a lane offset of its own)."""
        if not history:
            return None
        readings = history.readings()[: max(len(history) - suspect, 1)]
        curvature, rate = curvature_trend(readings, period_s)
        pose = np.array(readings[-max(pose_readings, 1) :], np.float64)[:, 2:]
        offset, heading = _newest_of_line(pose)
        return cls(offset, heading, curvature, min(max(rate, -max_rate), max_rate))

    def road_curvature(self, preview_m: float) -> float:
        """The curvature expected where the vehicle is now: the trend up to `preview_m`, then held."""
        return self.curvature + self.curvature_rate * min(self.travelled, preview_m)

    def advance(self, speed: float, steer: float, period_s: float, wheelbase_m: float, preview_m: float) -> None:
        """One tick at `speed` with `steer` applied: the heading error turns by the yaw rate less
        the road's, the offset moves by the heading error."""
        ds = max(speed, 0.0) * period_s
        yaw = math.tan(steer) / wheelbase_m
        self.heading += (yaw - self.road_curvature(preview_m)) * ds
        self.offset += math.sin(self.heading) * ds
        self.travelled += ds
