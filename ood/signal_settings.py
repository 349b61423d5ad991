"""The per-signal checks' names and settings: which check is which score, and each one's threshold and
time constants (the rules are in ood.signals; docs/contract.md#checks for what each check judges)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

STUCK, SPEED_ACCEL, GAP_RATE, LEAD_FLICKER, SPEED_REPEAT, GAP_REPEAT, GAP_STEP, REL_ACCEL, REL_UNIT, REL_SIGN = range(
    10
)
CHECKS = (
    "stuck",
    "speed_accel",
    "gap_rate",
    "lead_flicker",
    "speed_repeat",
    "gap_repeat",
    "gap_step",
    "rel_accel",
    "rel_unit",
    "rel_sign",
)
Scores = tuple[float, float, float, float, float, float, float, float, float, float]


@dataclass(frozen=True)
class SignalSettings:
    """The signals' names and each check's threshold and time constants (docs/contract.md#checks).
    Thresholds were set on the shared real data sets, leave one data set out (docs/measurements.md)."""

    speed_feature: str = "ego_speed"  # m/s
    accel_feature: str = "ego_accel"  # m/s^2
    present_feature: str = "lead_present"  # 1 when a lead is measured
    distance_feature: str = "lead_distance"  # m
    rel_speed_feature: str = "lead_rel_speed"  # m/s, lead minus ego
    moving_speed: float = 1.5  # m/s: faster than this, speed and lead readings must change
    stuck_s: float = 1.2  # s of bit-identical readings while moving
    speed_window_s: float = 0.5
    speed_accel_m_s: float = 2.5  # m/s
    gap_jump_m: float = 6.0  # m: an innovation this large with a jump of the relative speed is a new lead
    gap_floor_m: float = 1.0  # m: innovations from this size on are kept for the window
    gap_window_s: float = 1.0
    new_lead_rel_jump: float = 1.0  # m/s
    gap_rate_m: float = 6.5  # m
    flicker_window_s: float = 1.0
    flicker_toggles: float = 1.0  # more toggles than this in the window veto
    speed_repeat_m_s: float = 0.1  # m/s: clean real drives reach 0.074
    gap_repeat_m: float = 0.6  # m: clean real drives reach 0.46 (a 20 Hz radar in a 100 Hz stream)
    gap_step_m: float = 10.0  # m: clean real drives' unexplained steps reach 5.7 (without a new lead)
    hold_s: float = 0.5  # s rel_accel keeps a reading's rate
    rel_accel_m_s2: float = 15.0  # m/s^2: clean real drives reach 9.3
    rel_span_s: float = 0.08  # s: the shortest time rel_accel divides a change by (10 Hz, jitter allowed)
    rel_floor_m_s2: float = 2.0  # m/s^2: rel_accel keeps rates from this size on
    gap_step_max_m: float = 40.0  # m: a larger unexplained step is a new target (the simulator: 64 m)
    gap_unit_factor: float = 1 / 0.3048  # a gap read in feet: a step to this multiple of the track is no new target
    gap_unit_tolerance: float = 0.02  # of the factor: clean real gaps step 0.6% off their track at p99
    step_hold_s: float = 4.0  # s of distrusted readings after which the track starts afresh
    prior_keep_s: float = 4.0  # s a restarted track's predecessor is kept (a reading back on it reverts)
    step_confirm_s: float = 0.3  # s distrusted readings must have lasted for a new lead to carry their offset
    max_gap_s: float = 0.5  # a longer pause between fresh observations starts afresh
    rel_unit_factor: float = 3.6  # a relative speed read in km/h: a step to this multiple is a fault
    rel_unit_tolerance: float = 0.15  # of the step's target (the trend of the last two readings times the factor)
    rel_unit_m_s: float = 0.5  # m/s: a step to the factor this large vetoes (from 0.19 m/s; sensor noise below)
    rel_sign_window_s: float = 2.0  # s over which the gap's change and the relative speed's integral are compared
    rel_sign_m: float = 4.0  # m: clean real drives reach 1.34 (held out), 9.47 (JRC-VC, rows its quality flag doubts)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_feature"):
                if not value:
                    raise ValueError(f"signal checks: {f.name} must name a feature")
            elif not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0.0):
                raise ValueError(f"signal checks: {f.name} must be a finite number > 0, got {value!r}")

    @property
    def thresholds(self) -> Scores:
        return (
            self.stuck_s,
            self.speed_accel_m_s,
            self.gap_rate_m,
            self.flicker_toggles,
            self.speed_repeat_m_s,
            self.gap_repeat_m,
            self.gap_step_m,
            self.rel_accel_m_s2,
            self.rel_unit_m_s,
            self.rel_sign_m,
        )
