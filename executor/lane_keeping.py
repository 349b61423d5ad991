"""The lane keeper the safe side steers with outside NOMINAL: its settings and its steering laws.

The laws are pure: given the speed the lateral rules use, the steering applied at the tick before
and the lane (read, or dead-reckoned by executor/lane_estimate.py), they give this tick's command.
The safe-state machine (executor/safety.py) decides when they apply and from which readings:

- **Stanley-like keeping**: the road's curvature ahead as feed-forward, the heading and offset
  errors as bounded feedback; below `min_speed` the wheel stays where it was.
- **Rate**: every command moves at most `max_steer_rate` from the one applied at the tick before;
  the recovery's return to the model may move at the rate `max_lateral_jerk` allows where faster.
- **Lateral bound**: the hold's and the fallback's steering keeps the lateral acceleration below
  `max_lateral_accel` at the current speed.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field


class LaneKeepingConfig(BaseModel):
    """The fallback's lane keeper (Stanley-like); features are named in the model's schema."""

    model_config = ConfigDict(extra="forbid")
    offset_feature: str = "lane_offset"  # m, + = left of the lane centre
    heading_feature: str = "heading_error"  # rad, + = pointing left of the road
    curvature_feature: str = "road_curvature"  # 1/m, + = turning left
    speed_feature: str = "ego_speed"
    wheelbase_m: float = Field(default=2.7, gt=0.0)
    gain: float = Field(default=1.0, ge=0.0, description="offset gain of the Stanley law")
    max_correction_rad: float = Field(default=0.05, ge=0.0, description="bound on the feedback part")
    # The hold's and the fallback's steering is bounded so that the lateral acceleration stays
    # below this at the current speed (dead-reckoned from the last trusted one while the reading is
    # doubted): a steer held from 25 m/s is violent at 55 m/s (0.034 rad there is ~37 m/s^2). The
    # recovery's blend is not: it returns to the trusted model, which a tight curve may need.
    max_lateral_accel: float = Field(default=3.0, gt=0.0, description="m/s^2")
    # At rest a correction moves nothing, and the readings' noise (0.03 m of offset is 0.03 rad at
    # 1 m/s) turned the wheel back and forth by up to 0.04 rad every tick of a standstill hold.
    min_speed: float = Field(default=1.0, ge=0.0, description="m/s: below it the keeper holds the wheel")
    # The keeper's command moves at most this fast from the one applied at the tick before: into a
    # hold from the model's command, back to it in recovery, and against readings whose noise at a
    # few m/s (0.03 m of offset at 2 m/s is 0.015 rad) turned the wheel by up to 0.04 rad every tick.
    max_steer_rate: float = Field(default=0.2, gt=0.0, description="rad/s of road-wheel angle")
    # The recovery's return to the model may turn faster where the lateral jerk allows (UN R79's
    # 5 m/s^3 for a steering function): 0.2 rad/s is 67 m/s^3 at 30 m/s but 1.9 at 5 m/s, where
    # an urban turn's 0.3 rad would take 1.5 s to come back.
    max_lateral_jerk: float = Field(default=5.0, ge=0.0, description="m/s^3, the recovery's return")
    # While the lane is not visible (nothing readable, or not finite) the keeper steers by a
    # dead-reckoned estimate of it (executor/lane_estimate.py): a clothoid fitted to the trusted
    # readings of the last `trend_window_s` (its offset and heading to those of the last
    # `pose_window_s`), the curvature's trend extrapolated over `preview_m` (a camera lane model's
    # range) and bounded by `max_curvature_rate` (a road's tightest clothoid).
    trend_window_s: float = Field(default=1.0, gt=0.0, description="s of trusted readings the trend is fitted to")
    pose_window_s: float = Field(default=0.2, gt=0.0, description="s of trusted readings the pose is fitted to")
    preview_m: float = Field(default=60.0, ge=0.0, description="m over which the curvature trend is extrapolated")
    max_curvature_rate: float = Field(default=1e-4, ge=0.0, description="1/m per m")


class LaneKeeper:
    """The laws of a `LaneKeepingConfig` at a tick period."""

    __slots__ = ("config", "_period_s")

    def __init__(self, config: LaneKeepingConfig, period_s: float) -> None:
        self.config = config
        self._period_s = period_s

    def turn_towards(self, before: float, target: float, rate: float | None = None) -> float:
        """`target`, at most `rate` (`max_steer_rate`) away from `before`, the steering applied at
        the tick before."""
        step = (self.config.max_steer_rate if rate is None else rate) * self._period_s
        return min(max(target, before - step), before + step)

    def keep(self, speed: float, before: float, curvature: float, offset: float, heading: float) -> float:
        """The road's curvature ahead as feed-forward, the heading and offset errors as bounded
        feedback, reached at `max_steer_rate`; below `min_speed` the wheel stays where it was."""
        c = self.config
        if speed < c.min_speed:
            return before
        correction = -heading - math.atan(c.gain * offset / max(speed, 1.0))
        bound = c.max_correction_rad
        return self.turn_towards(before, self.steer_for(curvature) + min(max(correction, -bound), bound))

    def steer_for(self, curvature: float) -> float:
        """The road-wheel angle that drives `curvature` (1/m), kinematically."""
        return math.atan(self.config.wheelbase_m * curvature)

    def return_rate(self, speed: float) -> float:
        """rad/s the recovery's return to the model may turn at `speed`: the keeper's rate, or the
        lateral jerk's where faster (slow)."""
        c = self.config
        return max(c.max_steer_rate, c.max_lateral_jerk * c.wheelbase_m / max(speed, 1.0) ** 2)

    def lateral_limit(self, speed: float) -> float:
        """The largest road-wheel angle within `max_lateral_accel` at `speed` (> 0 m/s)."""
        return math.atan(self.config.wheelbase_m * self.config.max_lateral_accel / (speed * speed))
