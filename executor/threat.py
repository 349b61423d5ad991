"""The one thing allowed to brake harder than the safe profile while the model is not trusted.

A rule-based, AEB-style assessor: from the lead vehicle's gap and relative speed alone (no model,
nothing learnt), the deceleration the ego needs to stop closing on the lead before the gap falls
to `standstill_gap_m`:

    closing = -lead_rel_speed ;  need = closing^2 / (2 * (lead_distance - standstill_gap_m))

It only counts lead readings that pass their own checks, because it runs exactly when the checks
distrust the tick: no per-signal check of the lead's readings vetoes them (the caller says so:
executor/checks.py LEAD_CHECKS), the lead is reported present, every value is finite and physically
plausible (gap within the sensor's range and not exactly 0, the value a dropped reading takes; a lead
that is not driving backwards), and the readings agree with
each other over time (the gap shrinks as fast as the relative speed says: a speed sensor in km/h or
a glitched gap does not). A lead seen for less than `confirm_s` is not yet trusted: a cut-in is
braked for one confirmation window later, a one-sample glitch never.

One of the gap and the relative speed stuck while the other stays healthy, or the relative speed
against the gap's trend (executor/stuck_lead.py): the assessor reads the healthy one and what it
says of the doubted one.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from dualloop.executor.stuck_lead import LeadDoubt, LeadRuns, StuckReadings


class LeadFeatures(BaseModel):
    """The features a rule on the lead reads, named in the model card's schema."""

    model_config = ConfigDict(extra="forbid")
    present_feature: str = "lead_present"  # 1 when a lead is measured
    distance_feature: str = "lead_distance"  # m, bumper to bumper
    rel_speed_feature: str = "lead_rel_speed"  # m/s, lead speed minus ego speed
    speed_feature: str = "ego_speed"  # m/s


class ThreatConfig(LeadFeatures):
    """The assessor's features (LeadFeatures) and its physical limits."""

    standstill_gap_m: float = Field(default=2.0, ge=0.0, description="gap the braking aims to keep")
    max_range_m: float = Field(default=200.0, gt=0.0, description="a farther gap is not a measurement")
    max_decel: float = Field(default=8.0, gt=0.0, description="m/s^2, the most it ever asks for")
    # A need below this is left to the safe profile (not worth exceeding the jerk limit for).
    min_decel: float = Field(default=1.0, ge=0.0, description="m/s^2")
    confirm_s: float = Field(default=0.15, ge=0.0, description="how long a lead must be seen before it is trusted")
    # The gap's rate over the confirmation window must match the mean relative speed this well.
    rate_tolerance: float = Field(default=1.5, gt=0.0, description="m/s")
    rate_tolerance_fraction: float = Field(default=0.25, ge=0.0, description="of |relative speed|")
    # A track whose newest reading is older than this starts afresh (the sensor's slowest period, with margin).
    max_reading_gap_s: float = Field(default=0.5, gt=0.0)
    # One of the gap and the relative speed stuck (executor/stuck_lead.py): a stuck gap is moved on by
    # the relative speed for this long after it stuck (the fallback stops from 45 m/s at 3 m/s^2 in
    # 15 s; a 0.1 m/s bias of the relative speed is 2 m by then), unless the relative speed steps by
    # `new_lead_rel_step` (another lead: the stuck gap is not its gap); a stuck relative speed is the
    # gap's rate over `rate_window_s`; a reading repeating for longer than `stuck_after_s` is stuck
    # itself (real radars hold one for up to 0.9 s).
    stuck_stand_in: bool = Field(default=True, description="false: one stuck reading doubts the whole lead")
    stuck_gap_reckon_s: float = Field(default=20.0, ge=0.0, description="s; 0: a stuck gap is never reckoned")
    new_lead_rel_step: float = Field(default=3.0, gt=0.0, description="m/s between two ticks")
    rate_window_s: float = Field(default=0.5, gt=0.0, description="s")
    stuck_after_s: float = Field(default=1.0, gt=0.0, description="s")
    # The relative speed doubted alone (CHECK_REL_SIGN, CHECK_REL_UNIT, CHECK_REL_ACCEL): read as the
    # gap's rate over `rate_window_s` instead.
    rel_stand_in: bool = Field(default=True, description="false: a relative speed doubted alone doubts the whole lead")
    # A relative speed against the gap's trend (CHECK_REL_SIGN) is found only once the gap has moved
    # 4 m against it, seconds into a closing the model did not see, and read from the gap's rate it
    # says nothing of how hard the lead brakes: the ego then brakes to stop behind a lead braking this
    # hard (a hard stop; the simulator's braking leads reach 7), at its dead-reckoned speed. Not for
    # the other checks of the relative speed, which find their faults at once: there the term braked
    # for leads that were no threat (demo-safety's unit_mismatch_kmh, docs/measurements-archive.md).
    doubted_lead_decel: float = Field(default=6.0, gt=0.0, description="m/s^2")


@dataclass(slots=True)
class LeadTrack:
    """A session's recent distinct lead readings: (tick ns, gap, relative speed), oldest first."""

    readings: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=64))
    runs: LeadRuns = field(default_factory=LeadRuns)

    def clear(self) -> None:
        """Forget the readings `need` keeps (the runs are `follow`'s)."""
        self.readings.clear()


class ThreatAssessor:
    def __init__(self, config: ThreatConfig, feature_names: list[str]) -> None:
        self.config = config
        names = (config.present_feature, config.distance_feature, config.rel_speed_feature, config.speed_feature)
        # Without its four features in the schema there is no assessor (and so no braking beyond the profile).
        self.available = all(n in feature_names for n in names)
        self._at = tuple(feature_names.index(n) for n in names) if self.available else (0, 0, 0, 0)
        self._confirm_ns = int(config.confirm_s * 1e9)
        self._stale_ns = int(config.max_reading_gap_s * 1e9)
        self.stuck = StuckReadings(
            config.max_reading_gap_s,
            config.stuck_gap_reckon_s,
            config.stuck_after_s,
            config.new_lead_rel_step,
            config.rate_window_s,
        )

    @property
    def follows_runs(self) -> bool:
        """Whether the runs of repeated lead readings are followed (only a stand-in reads them)."""
        return self.available and (self.config.stuck_stand_in or self.config.rel_stand_in)

    @property
    def lead_columns(self) -> tuple[int, int, int]:
        """The feature columns the runs follow: the lead flag, its gap and its relative speed."""
        return self._at[0], self._at[1], self._at[2]

    def need(
        self,
        track: LeadTrack,
        now_ns: int,
        features: object,
        doubt: int = LeadDoubt.NONE,
        own_speed: float | None = None,
    ) -> float:
        """The deceleration (m/s^2, >= 0) a trusted threat asks for at this tick; 0 without one.
        `features`: the tick's raw inputs (None when none may be read, e.g. a frozen sensor);
        `doubt`: what the checks doubt of the lead's readings (ONE_STUCK, REL_DOUBTED, REL_AGAINST_TREND:
        one of gap and relative speed, stood in for; the caller passes None features for ALL); `own_speed`: the ego's
        speed where its reading may not be read (dead-reckoned from the last trusted one; None: none)."""
        if not self.available or features is None:
            track.clear()
            return 0.0
        c = self.config
        present, gap, rel, speed = (float(features[i]) for i in self._at)  # type: ignore[index]
        if doubt in (LeadDoubt.ONE_STUCK, LeadDoubt.REL_DOUBTED, LeadDoubt.REL_AGAINST_TREND):
            allowed = c.stuck_stand_in if doubt == LeadDoubt.ONE_STUCK else c.rel_stand_in
            kind = LeadDoubt(doubt)
            gap, rel = self.stuck.stand_in(track.runs, now_ns, gap, rel, kind) if allowed else (math.nan, math.nan)
        plausible = (
            present == 1.0
            and math.isfinite(gap)
            and math.isfinite(rel)
            and math.isfinite(speed)
            and 0.0 < gap <= c.max_range_m  # exactly 0 m with the flag set: a dropped reading, no lead that near
            and speed + rel >= -1.0  # the lead is not driving backwards
        )
        if not plausible:
            track.clear()
            return 0.0
        readings = track.readings
        if readings and now_ns - readings[-1][0] > self._stale_ns:  # readings from before the model drove
            readings.clear()
        if not readings or readings[-1][1:] != (gap, rel):  # a held observation is no new evidence
            readings.append((now_ns, gap, rel))
        while len(readings) > 2 and now_ns - readings[1][0] >= self._confirm_ns:
            readings.popleft()  # keep one reading at least confirm_s old
        t0, gap0, _ = readings[0]
        span_s = (now_ns - t0) / 1e9
        if len(readings) < 2 or now_ns - t0 < self._confirm_ns:
            return 0.0
        mean_rel = sum(r[2] for r in readings) / len(readings)
        rate = (readings[-1][1] - gap0) / span_s if span_s > 0 else 0.0
        if abs(rate - mean_rel) > c.rate_tolerance + c.rate_tolerance_fraction * abs(mean_rel):
            return 0.0  # the gap and the relative speed disagree: one of them is wrong
        closing = -rel
        if closing <= 0.0:
            return 0.0
        room = gap - c.standstill_gap_m
        need = c.max_decel if room <= 0.0 else closing * closing / (2.0 * room)
        if doubt == LeadDoubt.REL_AGAINST_TREND and own_speed is not None and room > 0.0:
            # stop behind where the lead would stop braking at `doubted_lead_decel`
            lead_speed = max(own_speed + rel, 0.0)
            stop_room = room + lead_speed * lead_speed / (2.0 * c.doubted_lead_decel)
            need = max(need, own_speed * own_speed / (2.0 * stop_room))
        return min(need, c.max_decel) if need >= c.min_decel else 0.0
