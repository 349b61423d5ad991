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

A gap sensor that sticks (its reading repeats bit for bit while the relative speed says it moves:
the gap_repeat check) leaves the relative speed trusted: the assessor then reads the gap as its
last reading before it stuck moved on by the relative speed's integral since (`GapRun`, followed on
every tick), for at most `stuck_gap_reckon_s`, and only while the relative speed itself still
changes. Without it a lead braking hard behind a frozen gap was met at the fallback's 3 m/s^2.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


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
    # A stuck gap is moved on by the relative speed for this long after it stuck (the fallback stops
    # from 45 m/s at 3 m/s^2 in 15 s; a 0.1 m/s bias of the relative speed is 2 m by then), while the
    # relative speed last changed within `rel_hold_s` (real radars hold it for up to 0.9 s; longer,
    # the whole track is stuck) and never stepped by `new_lead_rel_step` (another lead: the stuck gap
    # is not its gap).
    stuck_gap_reckon_s: float = Field(default=20.0, ge=0.0, description="s; 0: a stuck gap is never reckoned")
    rel_hold_s: float = Field(default=1.0, gt=0.0, description="s")
    new_lead_rel_step: float = Field(default=3.0, gt=0.0, description="m/s between two ticks")


class LeadDoubt(IntEnum):
    """What the per-signal checks leave the threat assessor of a tick's lead readings."""

    NONE = 0  # no check of the lead's readings vetoed
    GAP_STUCK = 1  # only the gap's repeat (and its rate) vetoed: the gap sensor stuck, the relative speed is read
    ALL = 2  # the flag, the gap and the relative speed are all doubted


@dataclass(slots=True)
class GapRun:
    """The gap's current run of bit-identical readings, followed on every tick: its value, the tick
    it began, the relative speed's integral since (m, trapezoids over ticks), the tick the relative
    speed last changed, and the previous tick's ns and relative speed (-1 / NaN: no run)."""

    gap: float = math.nan
    start_ns: int = -1
    moved: float = 0.0
    rel_changed_ns: int = -1
    last_ns: int = -1
    last_rel: float = math.nan
    new_lead: bool = False  # the relative speed stepped as at another lead's: no reckoning this run

    def reset(self) -> None:
        self.gap, self.start_ns, self.moved, self.rel_changed_ns, self.last_ns = math.nan, -1, 0.0, -1, -1
        self.last_rel, self.new_lead = math.nan, False

    def start(self, now_ns: int, gap: float, rel: float) -> None:
        self.gap, self.start_ns, self.moved, self.rel_changed_ns = gap, now_ns, 0.0, now_ns
        self.last_ns, self.last_rel, self.new_lead = now_ns, rel, False


@dataclass(slots=True)
class LeadTrack:
    """A session's recent distinct lead readings: (tick ns, gap, relative speed), oldest first."""

    readings: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=64))
    run: GapRun = field(default_factory=GapRun)

    def clear(self) -> None:
        """Forget the readings `need` keeps (the gap's run is `follow`'s)."""
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
        self._reckon_ns = int(config.stuck_gap_reckon_s * 1e9)
        self._rel_hold_ns = int(config.rel_hold_s * 1e9)

    @property
    def lead_columns(self) -> tuple[int, int, int]:
        """The feature columns `follow` reads: the lead flag, its gap and its relative speed."""
        return self._at[0], self._at[1], self._at[2]

    def follow(self, run: GapRun, now_ns: int, present: float, gap: float, rel: float) -> None:
        """Advance the gap's run by one tick's readings (NaN present: none may be read)."""
        if not (present == 1.0 and math.isfinite(gap) and math.isfinite(rel)):
            run.reset()
        elif run.last_ns < 0 or now_ns - run.last_ns > self._stale_ns or gap != run.gap:
            run.start(now_ns, gap, rel)
        else:
            run.moved += 0.5 * (rel + run.last_rel) * ((now_ns - run.last_ns) * 1e-9)
            if rel != run.last_rel:
                run.rel_changed_ns = now_ns
                run.new_lead = run.new_lead or abs(rel - run.last_rel) >= self.config.new_lead_rel_step
            run.last_ns, run.last_rel = now_ns, rel

    def follow_rows(self, run: GapRun, ticks_ns: np.ndarray, x: np.ndarray, usable: np.ndarray) -> None:
        """`follow` over consecutive ticks (a replay's run of clean ticks; x (ticks, F) raw inputs,
        `usable` False where a row may not be read), leaving the run exactly as tick by tick: only
        the ticks from the last one that starts a run afresh are stepped."""
        if not self.available or len(ticks_ns) == 0:
            return
        p, g, r = (x[:, i].astype(np.float64) for i in self.lead_columns)
        ok = usable & (p == 1.0) & np.isfinite(g) & np.isfinite(r)
        prev_gap = np.concatenate(([run.gap], g[:-1]))
        prev_ns = np.concatenate(([run.last_ns], ticks_ns[:-1])).astype(np.int64)
        fresh = ~ok | (prev_ns < 0) | (ticks_ns - prev_ns > self._stale_ns) | (g != prev_gap)
        fresh[1:] |= ~ok[:-1]  # a tick after an unreadable one starts a run
        starts = np.flatnonzero(fresh)
        first = int(starts[-1]) if starts.size else 0
        if not ok[first]:
            run.reset()
            first += 1
        elif starts.size:
            run.start(int(ticks_ns[first]), float(g[first]), float(r[first]))
            first += 1
        for k in range(first, len(ticks_ns)):
            self.follow(run, int(ticks_ns[k]), float(p[k]), float(g[k]), float(r[k]))

    def _reckoned(self, run: GapRun, now_ns: int, gap: float) -> float:
        """The stuck gap moved on by the relative speed since it stuck; NaN where that is no reading
        to trust: the gap is not this tick's run, the run is too long, another lead came, or the
        relative speed stuck too."""
        if (
            run.last_ns != now_ns
            or gap != run.gap
            or run.new_lead
            or now_ns - run.start_ns > self._reckon_ns
            or run.rel_changed_ns <= run.start_ns
            or now_ns - run.rel_changed_ns > self._rel_hold_ns
        ):
            return math.nan
        return max(run.gap + run.moved, 1e-3)  # reckoned, never the 0 m of a dropped reading

    def need(self, track: LeadTrack, now_ns: int, features: object, gap_stuck: bool = False) -> float:
        """The deceleration (m/s^2, >= 0) a trusted threat asks for at this tick; 0 without one.
        `features`: the tick's raw inputs (None when none may be read, e.g. a frozen sensor);
        `gap_stuck`: the checks doubt the gap alone, as stuck (LeadDoubt.GAP_STUCK)."""
        if not self.available or features is None:
            track.clear()
            return 0.0
        c = self.config
        present, gap, rel, speed = (float(features[i]) for i in self._at)  # type: ignore[index]
        if gap_stuck:
            gap = self._reckoned(track.run, now_ns, gap)
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
        return min(need, c.max_decel) if need >= c.min_decel else 0.0
