"""The standstill hold: a vehicle at rest behind a stopped lead stays at rest.

A rule, no model: while the ego stands (its speed below `rest_speed`) behind a lead that stands too
(lead speed = ego_speed + lead_rel_speed below `lead_stopped_speed`) closer than `max_gap_m`, no
positive acceleration reaches the actuators. A model whose commands hover around 0 at rest would
otherwise creep towards the car in front; ACC stop-and-go systems hold there and move off only when
the lead does. It releases by itself as soon as the lead moves off or the gap grows beyond
`max_gap_m`, so stop-and-go traffic still starts.

Only trusted readings count: every value finite, the lead reported present, the gap within
[0, max_gap_m), and the tick's inputs not doubted by the checks (the caller decides that, as for the
threat assessor). It is memoryless apart from the jerk limit, which the safe-state machine applies
(executor/safety.py): a positive command steps down to 0 at the limit, and after a release the
model's command is ramped back in at the limit from the held one.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field

from dualloop.executor.snapshot import FeatureRow
from dualloop.executor.threat import LeadFeatures


class StandstillConfig(LeadFeatures):
    """The hold's features (LeadFeatures, as the threat assessor's) and its physical limits."""

    # Wheel-speed sensors read 0 at rest; 0.2 m/s leaves room for speeds derived from positions
    # (NGSIM-like logs) while a vehicle that moves at a walking pace is not "at rest".
    rest_speed: float = Field(default=0.2, gt=0.0, description="m/s: below it the ego is at rest")
    # The lead counts as moved off above this: at a 1-2 m/s^2 launch it is 0.25-0.5 s after it starts.
    lead_stopped_speed: float = Field(default=0.5, gt=0.0, description="m/s: below it the lead stands")
    # Farther than this, closing up on a stopped lead is the model's to decide.
    max_gap_m: float = Field(default=8.0, gt=0.0, description="m: the hold applies closer than this")


class StandstillHold:
    def __init__(self, config: StandstillConfig, feature_names: list[str]) -> None:
        self.config = config
        names = (config.present_feature, config.distance_feature, config.rel_speed_feature, config.speed_feature)
        # Without its four features in the schema there is no hold.
        self.available = all(n in feature_names for n in names)
        self._at = tuple(feature_names.index(n) for n in names) if self.available else (0, 0, 0, 0)
        self._rest_speed = np.float64(config.rest_speed)

    def engaged(self, features: FeatureRow | None) -> bool:
        """Whether one tick's raw inputs (None: none may be read) show the ego at rest behind a
        stopped lead within the gap. The caller checks that the checks do not doubt the inputs."""
        if not self.available or features is None:
            return False
        c = self.config
        present, gap, rel, speed = (float(features[i]) for i in self._at)
        lead_speed = speed + rel
        return (
            present == 1.0
            and math.isfinite(lead_speed)  # NaN or Inf in either: no hold (the comparisons below say so too)
            and abs(speed) < c.rest_speed
            and lead_speed < c.lead_stopped_speed
            and 0.0 <= gap < c.max_gap_m
        )

    def engaged_rows(self, features: np.ndarray) -> np.ndarray:
        """`engaged` for each row of (rows, features), vectorised, with the same float64 arithmetic."""
        n = len(features)
        if not self.available:
            return np.zeros(n, bool)
        c = self.config
        # a float64 scalar compares a float32 column in float64, as `engaged` does (NaN: False, no warning)
        rows: np.ndarray = np.abs(features[:, self._at[3]]) < self._rest_speed
        if not rows.any():  # a live tick's usual case: nobody at rest, one column read
            return rows
        present, gap, rel, speed = features[:, list(self._at)].astype(np.float64).T
        with np.errstate(invalid="ignore", over="ignore"):  # inf + -inf
            lead_speed = speed + rel
            rows &= (
                (present == 1.0)
                & np.isfinite(lead_speed)
                & (lead_speed < c.lead_stopped_speed)
                & (gap >= 0.0)
                & (gap < c.max_gap_m)
            )
        return rows
