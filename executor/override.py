"""Someone else driving a held vehicle: the end of a standstill hold without a release.

Once the minimal-risk manoeuvre has stopped the vehicle, only a release or someone else driving it
(a driver's override, the vehicle of a shadow-mode session) ends the hold. One speed reading is no
evidence of that: a speed sensor biased by +2 m/s read "moving" at rest, nothing vetoed it once its
step had passed, and the held car drove off by itself. So a pull-away counts only when the measured
acceleration, integrated from the last trusted reading at rest, explains the measured speed on every
tick on the way: within `tolerance` plus `tolerance_fraction` of the speed gained. A tick that
disagrees, or whose inputs are doubted or unreadable, voids the pull-away until the speed is read at
rest again. Without an acceleration feature in the schema only a release ends the hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dualloop.executor.snapshot import FeatureRow


@dataclass(slots=True)
class PullAway:
    """A held vehicle's speed since its last trusted reading at rest."""

    rest_speed: float  # m/s: that reading
    integral: float = 0.0  # m/s: the measured acceleration integrated since
    consistent: bool = True  # every tick since agreed with the speed


class OverrideTest:
    def __init__(
        self,
        speed_at: int | None,
        accel_at: int | None,
        rest_speed: float,
        override_speed: float,
        tolerance: float,
        tolerance_fraction: float,
        period_s: float,
    ) -> None:
        self._speed_at, self._accel_at = speed_at, accel_at
        self._rest, self._override = rest_speed, override_speed
        self._tolerance, self._fraction = tolerance, tolerance_fraction
        self._period_s = period_s

    def step(
        self, pull_away: PullAway | None, features: FeatureRow | None, doubted: bool
    ) -> tuple[PullAway | None, bool]:
        """One tick of a held vehicle: (the pull-away to remember, whether someone else is driving it)."""
        if features is None or doubted or self._speed_at is None or self._accel_at is None:
            return None, False
        speed, accel = float(features[self._speed_at]), float(features[self._accel_at])
        if not (math.isfinite(speed) and math.isfinite(accel)):
            return None, False
        if abs(speed) <= self._rest:
            return PullAway(speed), False
        if pull_away is None:  # it left rest unseen: nothing to check the speed against
            return None, False
        pull_away.integral += accel * self._period_s
        gained = speed - pull_away.rest_speed
        agrees = abs(gained - pull_away.integral) <= self._tolerance + self._fraction * abs(gained)
        pull_away.consistent = pull_away.consistent and agrees
        return pull_away, pull_away.consistent and abs(speed) > self._override
