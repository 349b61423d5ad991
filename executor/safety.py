"""The safe-state machine: what the executor applies when a tick cannot be trusted.

    NOMINAL --distrust--> VETO_HOLD --hold_timeout--> FALLBACK_ACTIVE --standstill--> (stopped)
       ^                     |  clean                    |  clean                        | release
       |                     v                           v                               v
       +--blend-- RECOVERING <---------------------------+<------------------------------+
                     | distrust: back to where it came from (the hold timer keeps running)

What reaches the actuators (docs/contract.md#safety):
- **Distrust follows the inputs.** A tick whose inputs the checks doubt (invalid input, or a veto by
  any check but the actuation check) applies nothing the model computed from them, braking included.
  Reasons that do not doubt the inputs (a late observation, low margin, an actuation shortfall, a
  stale plan) may keep the model's braking, down to `max_vetoed_brake`.
- **Only a trusted threat brakes harder than the safe side** (executor/threat.py: a rule-based
  assessor on lead readings that pass their own checks; THREAT_BRAKING says so). It alone may
  exceed the jerk limit.
- **Every other command the safe side applies moves from the command actually applied at the tick
  before by at most `jerk_limit`** (0 before a session's first tick): into the hold, into and out
  of the fallback, and recovery, which blends the model's command in at the limit (its steering
  at `max_steer_rate`) and returns to NOMINAL only once both meet.
- VETO_HOLD aims at the last action that passed every check. On a gate veto it rolls back
  `rollback_ticks`: the gate's sequential filter confirms a fault a few ticks after it began, and
  the actions of those ticks were computed from suspect input.
- **Outside NOMINAL the steering keeps a lane, never a held angle**: the hold keeps the trusted
  action's acceleration and steers, as the fallback does, with a lane keeper that does not involve
  the model (executor/lane_keeping.py; a held angle is open loop: held from the middle of a lane
  change it leaves the road).
  The keeper reads the lane while it is readable; while it is not, it steers by the lane
  dead-reckoned from the last trusted readings (executor/lane_estimate.py). Its command moves at
  most `max_steer_rate` from the one applied before, and holds below `min_speed`.
- FALLBACK_ACTIVE is the minimal-risk manoeuvre (UN R157 5.5): decelerate in lane at
  `fallback_decel` (<= 3 m/s^2) while the lane is visible, `blind_decel` (<= 4 m/s^2) while it is
  not, steering with the lane keeper. Its snapshots carry FALLBACK
  from the first tick, which is the hazard-light request. Once the vehicle stands still (measured,
  or dead-reckoned from the last trusted speed when the speed is distrusted) it stays stopped
  (STANDSTILL_HOLD) until an explicit release (Observation.release_standstill), or until trusted
  inputs show someone else driving it (a driver's override, a shadow-mode vehicle: the measured
  acceleration explains the speed all the way from rest, executor/override.py): never by itself.
- RECOVERING keeps the safe side in charge until the inputs have been clean for `recovery_dwell`,
  then blends (Simplex: switch back only after a clean dwell).
- A late observation (STALE_OBSERVATION alone) is not distrust of what the sensors said: it holds,
  and the first tick with a fresh observation blends back without a dwell. Past `hold_timeout` the
  sensor is gone and the fallback takes over as for any hold.
- A low-margin abstention (LOW_MARGIN, in NOMINAL) holds the last trusted acceleration, keeping the
  model's braking, with the model's steering (the margin is between acceleration bands); past
  `max_abstain_ms` the fallback takes over.
- **At rest behind a stopped lead nothing positive is applied** (executor/standstill.py: a rule on
  trusted lead readings, in every state; STOPPED_LEAD_HOLD says so). A positive command steps down to
  0 at the jerk limit; once the lead moves off or the gap grows, the model's command is ramped back
  in at the limit from the held one.
- The applied action is named by the band its acceleration falls in (executor/action_labels.py)
  when the model's actions are those bands, so its name never contradicts its command.
Times are tick times, so LOCKSTEP runs reproduce every transition exactly.

`decide` is the reference, one session at a time. `decide_batch` is the live tick's: every session
of a batch at once, equal to `decide` row by row (tests/executor/test_safety_batch.py checks it on
random sequences). Almost every row of a live tick is *steady*: NOMINAL with no reason, so it applies
the model's proposal and remembers it; those rows take one pass with their inputs read as columns,
and only the rows with a reason or a state to leave, or at rest behind a stopped lead (one vectorised
test of the batch's lead columns), go through `decide`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from dualloop.executor.action_labels import ACTIONS, BRAKE_BELOW, BRAKE_HARD_BELOW, KEEP_AT_MOST, action_of_accel
from dualloop.executor.lane_estimate import LaneEstimate, LaneHistory
from dualloop.executor.lane_keeping import LaneKeeper, LaneKeepingConfig
from dualloop.executor.override import OverrideTest, PullAway
from dualloop.executor.snapshot import AppliedAction, FeatureRow, Reason, SafetyState
from dualloop.executor.standstill import StandstillConfig, StandstillHold
from dualloop.executor.stuck_lead import LeadDoubt
from dualloop.executor.threat import LeadTrack, ThreatAssessor, ThreatConfig

# UN R157 5.5: a minimal-risk manoeuvre aims at no more than 4 m/s^2; 3 while the lane is trusted.
R157_LANE_VISIBLE_DECEL = 3.0
R157_BLIND_DECEL = 4.0


class SafetyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hold_timeout_ms: float = Field(default=300.0, ge=0.0)
    recovery_dwell_ms: float = Field(default=500.0, ge=0.0)
    fallback_decel: float = Field(default=3.0, gt=0.0, description="m/s^2, minimal-risk braking, lane visible")
    # While the lane is not visible (inputs frozen or non-finite) the keeper steers by a lane
    # dead-reckoned from the last trusted readings: stop sooner than with the lane, within R157's 4 m/s^2.
    blind_decel: float = Field(default=4.0, gt=0.0, description="m/s^2, minimal-risk braking, lane not visible")
    # Decelerations above R157's aims (3 / 4 m/s^2) must say why: a stated, reviewed exception.
    decel_exception: str = Field(default="", description="why fallback_decel > 3 or blind_decel > 4")
    # Every command the safe side applies moves at most this fast from the one applied before
    # (trusted-threat braking aside). `fallback_jerk` is its name from before it covered every transition.
    jerk_limit: float = Field(
        default=2.5, gt=0.0, validation_alias=AliasChoices("jerk_limit", "fallback_jerk"), description="m/s^3"
    )
    # LOW_MARGIN abstentions hold the last action's acceleration tick by tick (with the model's
    # steering); this many in a row escalate to the fallback so an undecided model cannot keep an
    # old command forever.
    max_abstain_ms: float = Field(default=1000.0, ge=0.0)
    accel_control: str = "accel"  # which control is longitudinal acceleration
    steer_control: str = "steer"
    speed_feature: str = "ego_speed"  # m/s: the standstill test and its dead reckoning
    standstill_speed: float = Field(default=0.1, ge=0.0, description="m/s: at or below, the vehicle stands still")
    # A held vehicle measured (on trusted inputs) moving faster than this is being driven by someone
    # else, a driver's override or the vehicle of a shadow-mode session: that ends the hold as a
    # release does, when the measured acceleration explains the speed all the way from rest
    # (executor/override.py). The controller's own command never moves it (the hold brakes).
    override_speed: float = Field(default=1.5, gt=0.0, description="m/s")
    accel_feature: str = "ego_accel"  # m/s^2, measured: what a pull-away's speed must agree with
    override_tolerance: float = Field(default=0.5, gt=0.0, description="m/s")
    override_tolerance_fraction: float = Field(default=0.25, ge=0.0, description="of the speed gained")
    # While the model is held for a reason that does not doubt its inputs (late observation, low
    # margin, actuation shortfall, stale plan), its braking is kept down to this. 0 disables.
    max_vetoed_brake: float = Field(default=6.0, ge=0.0, description="m/s^2")
    # How far back the hold reaches: at least the gate filter's worst confirmation delay (n - 1
    # for k-of-n 3/5).
    rollback_ticks: int = Field(default=4, ge=0)
    # None: the fallback holds the last trusted steering instead of keeping the lane.
    lane_keeping: LaneKeepingConfig | None = LaneKeepingConfig()
    # None: nothing brakes harder than the safe side while the model is not trusted.
    threat: ThreatConfig | None = ThreatConfig()
    # The hold at rest behind a stopped lead (not the fallback's standstill). None: no such hold.
    standstill: StandstillConfig | None = StandstillConfig()

    @model_validator(mode="after")
    def _within_r157(self) -> SafetyConfig:
        over = [
            f"{name}={value} m/s^2 (R157 aims at <= {aim})"
            for name, value, aim in (
                ("fallback_decel", self.fallback_decel, R157_LANE_VISIBLE_DECEL),
                ("blind_decel", self.blind_decel, R157_BLIND_DECEL),
            )
            if value > aim
        ]
        if over and not self.decel_exception.strip():
            raise ValueError(f"{', '.join(over)}: state why in decel_exception, or lower it")
        return self

    @property
    def fallback_jerk(self) -> float:
        return self.jerk_limit


DISTRUST = frozenset(
    {Reason.OOD_VETO, Reason.INVALID_INPUT, Reason.MODEL_ERROR, Reason.STALE_OBSERVATION, Reason.STALE_PLAN}
)
# Reasons that doubt the inputs' content; lateness alone (STALE_OBSERVATION) does not.
CONTENT_DISTRUST = DISTRUST - {Reason.STALE_OBSERVATION}


def inputs_doubted(reasons: list[Reason] | tuple[Reason, ...], actuation_only: bool = False) -> bool:
    """Whether a tick's checks doubt what its inputs say: invalid input, or a veto by any check
    but the actuation check (`actuation_only`: the actuation check alone vetoed)."""
    return Reason.INVALID_INPUT in reasons or (Reason.OOD_VETO in reasons and not actuation_only)


_NO_LEAD = (math.nan, math.nan, math.nan)  # a tick whose inputs may not be read


class _SteadyColumns(NamedTuple):
    lanes: list[list[float]] | None
    own_speeds: list[float] | None
    at_rest: list[bool] | None
    leads: list[list[float]] | None


@dataclass(slots=True)
class SafetyMemory:
    """Per-session state of the machine."""

    state: SafetyState = SafetyState.NOMINAL
    hold_since_ns: int = 0
    clean_since_ns: int = 0
    came_from: SafetyState = SafetyState.VETO_HOLD  # where RECOVERING falls back to
    abstain_since_ns: int | None = None
    last_safe: AppliedAction | None = None  # the action the hold aims at
    fallback: AppliedAction | None = None  # the fallback's last command (its steering, without lane keeping)
    recent: list[AppliedAction] = field(default_factory=list)  # NOMINAL actions, newest last
    trusted_curvature: float = 0.0
    trusted_speed: float = 0.0
    rolled_back: bool = False  # the last hold reached back past suspect ticks
    late_hold: bool = False  # the VETO_HOLD is for a late observation only (no dwell to leave it)
    last_accel: float | None = None  # the acceleration command applied at the previous tick
    speed_estimate: float | None = None  # m/s: measured while trusted, dead-reckoned while not
    stopped: bool = False  # the minimal-risk manoeuvre reached standstill: stay until released
    released: bool = False  # a standstill hold was released: no new one until the model drives again
    lead: LeadTrack = field(default_factory=LeadTrack)
    lead_hold: bool = False  # the stopped-lead hold lowered the previous command: ramp back in from it
    pull_away: PullAway | None = None  # a held vehicle moving off (executor/override.py)
    lane_history: LaneHistory | None = None  # trusted lane readings since the last recovery
    lane_estimate: LaneEstimate | None = None  # the lane, dead-reckoned since the last trusted tick
    steer_applied: float | None = None  # the steering applied at the last tick the safe side decided


class SafetyMachine:
    def __init__(
        self,
        config: SafetyConfig,
        control_names: list[str],
        period_ns: int,
        safe_action: AppliedAction,
        feature_names: list[str] | None = None,
        action_names: list[str] | None = None,
    ) -> None:
        self.config = config
        lk, names = config.lane_keeping, feature_names or []
        needed = (lk.offset_feature, lk.heading_feature, lk.curvature_feature, lk.speed_feature) if lk else ()
        # Lane keeping needs its four features in the model's schema; otherwise hold the steering.
        self._lane = tuple(names.index(n) for n in needed) if lk and all(n in names for n in needed) else None
        self._speed = names.index(config.speed_feature) if config.speed_feature in names else None
        self._accel = control_names.index(config.accel_control) if config.accel_control in control_names else None
        self._steer = control_names.index(config.steer_control) if config.steer_control in control_names else None
        self._hold_ns = int(config.hold_timeout_ms * 1e6)
        self._dwell_ns = int(config.recovery_dwell_ms * 1e6)
        self._abstain_ns = int(config.max_abstain_ms * 1e6)
        self._period_s = period_ns / 1e9
        self._history_len = round(max(lk.trend_window_s, lk.pose_window_s) / self._period_s) if lk else 0
        self._pose_len = round(lk.pose_window_s / self._period_s) if lk else 0
        self._keeper = LaneKeeper(lk, self._period_s) if lk else None
        self._jerk_step = config.jerk_limit * self._period_s
        self.threat = ThreatAssessor(config.threat, names) if config.threat is not None else None
        self._override = OverrideTest(
            self._speed,
            names.index(config.accel_feature) if config.accel_feature in names else None,
            config.standstill_speed,
            config.override_speed,
            config.override_tolerance,
            config.override_tolerance_fraction,
            self._period_s,
        )
        hold = StandstillHold(config.standstill, names) if config.standstill is not None else None
        self.standstill = hold if hold is not None and hold.available and self._accel is not None else None
        # Name applied actions by their acceleration's band only where the model's actions are the bands.
        self._banded = self._accel is not None and action_names is not None and tuple(action_names) == ACTIONS
        self.safe_action = self._named(safe_action)

    @property
    def hold_timeout_ns(self) -> int:
        return self._hold_ns

    @property
    def recovery_dwell_ns(self) -> int:
        return self._dwell_ns

    @property
    def max_abstain_ns(self) -> int:
        return self._abstain_ns

    @property
    def jerk_step(self) -> float:
        """The largest change of the acceleration command per tick outside trusted-threat braking."""
        return self._jerk_step

    def decide(
        self,
        mem: SafetyMemory,
        now_ns: int,
        reasons: list[Reason],
        proposal: AppliedAction | None,
        features: FeatureRow | None = None,
        actuation_only: bool = False,
        release: bool = False,
        lead_doubt: int = LeadDoubt.NONE,
    ) -> tuple[AppliedAction, SafetyState]:
        """Advance one tick; `reasons` may gain FALLBACK / SAFE_DEFAULT / THREAT_BRAKING /
        STANDSTILL_HOLD / STOPPED_LEAD_HOLD. Returns (applied, state).

        `features` are this tick's raw inputs (None where they must not be read: a frozen sensor),
        read by the lane keeper, the threat assessor and the standstill test. `actuation_only`: the
        tick's OOD_VETO is the actuation check's alone (it doubts the vehicle, not the inputs).
        `release`: the client releases a standstill hold at this tick. `lead_doubt`: what the checks of the
        lead's readings left the threat assessor (a LeadDoubt; executor/checks.py LEAD_CHECKS)."""
        self._features = features
        self._lead_doubt = lead_doubt
        self._follow_lead(mem, now_ns, features)
        doubted = self._doubted = inputs_doubted(reasons, actuation_only)
        if mem.stopped:
            mem.pull_away, driven = self._override.step(mem.pull_away, features, doubted)
            if release or driven:
                mem.stopped, mem.released, mem.pull_away = False, True, None
        last = mem.last_accel
        self._steer_before, self._suspect_readings = self._advance_lane_estimate(mem), 0
        target, state, blending = self._decide(mem, now_ns, reasons, proposal, features)
        if state is SafetyState.NOMINAL and not blending and not reasons:
            applied, state = self._applied_nominal(mem, proposal)  # type: ignore[arg-type]
        else:
            if state is not SafetyState.NOMINAL and not blending:  # the blend's target is trusted
                target = self._bound_steer(mem, target)
            applied, state = self._safe_side(mem, now_ns, reasons, proposal, target, state, blending, doubted)
            if self._steer is not None:
                mem.steer_applied = float(applied.controls[self._steer])
        if self.standstill is not None:
            at_rest = not doubted and self.standstill.engaged(features)
            if at_rest or mem.lead_hold:
                applied = self._hold_at_rest(mem, last, reasons, applied, state, at_rest)
        return applied, state

    def _advance_lane_estimate(self, mem: SafetyMemory) -> float:
        """Carry the dead-reckoned lane to this tick; returns the steering applied at the tick
        before: the safe side's after a tick outside NOMINAL or an abstention, else the last trusted
        command's."""
        if self._steer is None:
            before = 0.0
        elif (
            mem.state is not SafetyState.NOMINAL or mem.abstain_since_ns is not None
        ) and mem.steer_applied is not None:
            before = mem.steer_applied  # the safe side's, or an abstention's
        else:
            before = float((self.safe_action if mem.last_safe is None else mem.last_safe).controls[self._steer])
        estimate = mem.lane_estimate
        lk = self.config.lane_keeping
        if estimate is not None and lk is not None:
            estimate.advance(self._speed_now(mem), before, self._period_s, lk.wheelbase_m, lk.preview_m)
        return before

    def _lane_estimate(self, mem: SafetyMemory) -> LaneEstimate | None:
        """The dead-reckoned lane at this tick, started from the newest trusted reading (taken to be
        the tick before's) on the first tick outside NOMINAL; None without lane keeping or readings."""
        lk = self.config.lane_keeping
        if mem.lane_estimate is None and lk is not None and self._steer is not None and mem.lane_history:
            suspect = min(self._suspect_readings, len(mem.lane_history) - 1)
            mem.lane_estimate = LaneEstimate.from_history(
                mem.lane_history, self._period_s, lk.max_curvature_rate, self._pose_len, suspect
            )
            if mem.lane_estimate is not None:
                for _ in range(suspect + 1):  # from the reading used to this tick
                    mem.lane_estimate.advance(
                        self._speed_now(mem), self._steer_before, self._period_s, lk.wheelbase_m, lk.preview_m
                    )
        return mem.lane_estimate

    def _hold_at_rest(
        self,
        mem: SafetyMemory,
        last: float | None,
        reasons: list[Reason],
        applied: AppliedAction,
        state: SafetyState,
        at_rest: bool,
    ) -> AppliedAction:
        """The stopped-lead hold (executor/standstill.py) on the command the machine chose: at rest,
        at most 0, stepped down at the jerk limit from a positive `last` (the command applied at the
        tick before); after a release, at most a jerk step above `last` until the model's command is
        met. A lowered command is what the hold of a later veto aims at."""
        assert self._accel is not None
        prev = 0.0 if last is None else last
        if at_rest:
            ceiling = self._step_towards(prev, 0.0) if prev > 0.0 else 0.0
        else:
            ceiling = self._step_towards(prev, prev + self._jerk_step)
        a = float(applied.controls[self._accel])
        mem.lead_hold = a > ceiling
        if not mem.lead_hold:
            return applied
        held = self._named(applied.with_control(self._accel, ceiling))
        trusted = mem.last_safe  # a NOMINAL tick's proposal: remember the command applied instead
        if state is SafetyState.NOMINAL and trusted is not None and trusted.controls is applied.controls:
            mem.last_safe = held
            if mem.recent and mem.recent[-1].controls is applied.controls:
                mem.recent[-1] = held
        mem.last_accel = ceiling
        reasons.append(Reason.STOPPED_LEAD_HOLD)
        return held

    def _applied_nominal(self, mem: SafetyMemory, proposal: AppliedAction) -> tuple[AppliedAction, SafetyState]:
        """The model's proposal as it is (a trusted NOMINAL tick), named by its band."""
        if self._accel is not None:
            mem.last_accel = float(proposal.controls[self._accel])
        return self._named(proposal), SafetyState.NOMINAL

    def _safe_side(
        self,
        mem: SafetyMemory,
        now_ns: int,
        reasons: list[Reason],
        proposal: AppliedAction | None,
        target: AppliedAction,
        state: SafetyState,
        blending: bool,
        doubted: bool,
    ) -> tuple[AppliedAction, SafetyState]:
        """The command the safe side applies: the state's target, the model's braking where the
        inputs are not doubted, at most a jerk step from the last command, unless a trusted threat
        needs more braking."""
        if self._accel is None:
            return self._named(target), state
        a_target = float(target.controls[self._accel])
        # any state: a low-margin abstention holds in NOMINAL, and with the rule outside NOMINAL only
        # it kept none of the model's braking (a brake_hard proposal held at 0 for up to 1 s)
        if not blending and not doubted and proposal is not None and self.config.max_vetoed_brake:
            a_target = min(a_target, max(float(proposal.controls[self._accel]), -self.config.max_vetoed_brake))
        last = 0.0 if mem.last_accel is None else mem.last_accel
        a = self._step_towards(last, a_target)
        if blending:
            target, steer_met = self._blend_steer(mem, target)
            if abs(a_target - last) <= self._jerk_step and steer_met:  # met the model's command: it drives again
                assert proposal is not None
                mem.state, mem.fallback, mem.abstain_since_ns = SafetyState.NOMINAL, None, None
                self._trust(mem, proposal)
                return self._applied_nominal(mem, proposal)
        lead = None if self._lead_doubt == LeadDoubt.ALL else self._features
        threat = self.threat
        need = 0.0 if threat is None else threat.need(mem.lead, now_ns, lead, self._lead_doubt, mem.speed_estimate)
        if need > 0.0 and -need < a:
            a = float(np.float32(-need))
            reasons.append(Reason.THREAT_BRAKING)
        self._dead_reckon(mem, a, doubted)
        mem.last_accel = a
        if a != float(target.controls[self._accel]):
            target = target.with_control(self._accel, a)
        return self._named(target), state

    def _blend_steer(self, mem: SafetyMemory, proposal: AppliedAction) -> tuple[AppliedAction, bool]:
        """The model's steering reached from the safe side's at the lane keeper's rate limit (or
        the lateral jerk's, where faster), and whether it is met: a one-tick return from the keeper's
        angle is a step of lateral acceleration."""
        keeper = self._keeper
        if self._steer is None or keeper is None:
            return proposal, True
        wanted = float(proposal.controls[self._steer])
        steer = keeper.turn_towards(self._steer_before, wanted, keeper.return_rate(self._speed_now(mem)))
        if steer == wanted:
            return proposal, True
        return proposal.with_control(self._steer, steer), False

    def _follow_lead(self, mem: SafetyMemory, now_ns: int, x: FeatureRow | None) -> None:
        """Every tick: the runs of repeated lead readings the threat assessor reads a stuck one from."""
        threat = self.threat
        if threat is not None and threat.follows_runs:
            p, g, r = threat.lead_columns
            lead = _NO_LEAD if x is None else (float(x[p]), float(x[g]), float(x[r]))
            threat.stuck.follow(mem.lead.runs, now_ns, *lead)

    def follow_lead_rows(self, mem: SafetyMemory, ticks_ns: np.ndarray, x: np.ndarray, usable: np.ndarray) -> None:
        """`_follow_lead` over a replay's run of clean NOMINAL ticks (`usable` False: a frozen row)."""
        threat = self.threat
        if threat is not None and threat.follows_runs:
            lead = np.where(usable[:, None], x[:, list(threat.lead_columns)].astype(np.float64), np.nan)
            threat.stuck.follow_rows(mem.lead.runs, ticks_ns, lead)

    def _step_towards(self, last: float, target: float) -> float:
        """The command a jerk step at most from `last` towards `target`, as the float32 the wire
        carries: rounded towards `last` where rounding would make the step longer than the limit."""
        a = np.float32(min(max(target, last - self._jerk_step), last + self._jerk_step))
        if abs(float(a) - last) > self._jerk_step:
            a = np.nextafter(a, np.float32(last))
        return float(a)

    def _dead_reckon(self, mem: SafetyMemory, accel: float, doubted: bool) -> None:
        """The speed the standstill test reads: measured when this tick's speed may be read,
        otherwise the last estimate moved by the command applied (never below 0)."""
        x = self._features
        measured = float(x[self._speed]) if x is not None and self._speed is not None else math.nan
        if not doubted and math.isfinite(measured):
            mem.speed_estimate = abs(measured)
        elif mem.speed_estimate is not None:
            mem.speed_estimate = max(0.0, mem.speed_estimate + accel * self._period_s)

    def decide_batch(
        self,
        mems: list[SafetyMemory],
        now_ns: int,
        reasons: list[list[Reason]],
        proposals: list[AppliedAction | None],
        features: np.ndarray | None,
        use_features: list[bool] | None = None,
        actuation_only: list[bool] | None = None,
        release: list[bool] | None = None,
        lead_doubt: list[int] | None = None,
    ) -> list[tuple[AppliedAction, SafetyState]]:
        """`decide` for each row of a batch ticking at `now_ns`, with the same results, the same
        reasons added and the same memory left behind. `features` (rows, F): the rows' raw inputs;
        `use_features[i]` False where row i's must not be read (None: all may); `actuation_only`,
        `release`, `lead_doubt`: `decide`'s, per row (None: all False / NONE)."""
        nominal = SafetyState.NOMINAL
        steady = [not r and m.state is nominal for m, r in zip(mems, reasons)]
        out: list[tuple[AppliedAction, SafetyState]] = []
        lanes, own_speeds, at_rest, leads = self._steady_columns(features if any(steady) else None)
        lane, standstill = lanes is not None, own_speeds is not None
        keep = self.config.rollback_ticks + 1
        accel = self._accel
        threat = self.threat if leads is not None else None
        for i, mem in enumerate(mems):
            x = None if features is None or (use_features is not None and not use_features[i]) else features[i]
            proposal = proposals[i]
            if (
                not steady[i]
                or proposal is None
                or (release is not None and release[i])
                or mem.lead_hold
                or (at_rest is not None and at_rest[i])
            ):
                out.append(
                    self.decide(
                        mem,
                        now_ns,
                        reasons[i],
                        proposal,
                        None if x is None else x.tolist(),  # read value by value: list items cost less
                        actuation_only is not None and actuation_only[i],
                        release is not None and release[i],
                        LeadDoubt.NONE if lead_doubt is None else lead_doubt[i],
                    )
                )
                continue
            # `_decide`'s NOMINAL branch without distrust or LOW_MARGIN: `_trust`, inline
            mem.abstain_since_ns, mem.last_safe = None, proposal
            recent = mem.recent
            recent.append(proposal)
            if len(recent) > keep:
                del recent[0]
            if threat is not None:  # `_follow_lead`, inline
                threat.stuck.follow(mem.lead.runs, now_ns, *(leads[i] if x is not None else _NO_LEAD))  # type: ignore[index]
            if x is not None:
                if lane:
                    offset, heading, curvature, speed = lanes[i]  # type: ignore[index]
                    if math.isfinite(curvature):
                        mem.trusted_curvature = curvature
                    if math.isfinite(speed):
                        mem.trusted_speed = speed
                    if math.isfinite(curvature + speed + offset + heading):  # `_remember_lane`, inline
                        if (history := mem.lane_history) is None:
                            history = mem.lane_history = LaneHistory(self._history_len)
                        history.append((curvature, speed, offset, heading))
                if standstill and math.isfinite(speed := own_speeds[i]):  # type: ignore[index]
                    mem.speed_estimate = abs(speed)
            if accel is not None:
                mem.last_accel = float(proposal.controls[accel])
            out.append((self._named(proposal), nominal))
        return out

    def _steady_columns(self, features: np.ndarray | None) -> _SteadyColumns:
        """The columns `decide_batch` reads of its steady rows, as lists (None: not read): the trusted
        lane (offset, heading, curvature, speed), the own speed, at rest behind a stopped lead (such
        rows, and those ramping out of that hold, take `decide`), the lead (flag, gap, relative speed)."""
        if features is None:
            return _SteadyColumns(None, None, None, None)
        threat = self.threat if self.threat is not None and self.threat.follows_runs else None
        return _SteadyColumns(
            None if self._lane is None else features[:, list(self._lane)].tolist(),
            None if self._speed is None else features[:, self._speed].tolist(),
            None if self.standstill is None else self.standstill.engaged_rows(features).tolist(),
            None if threat is None else features[:, list(threat.lead_columns)].tolist(),
        )

    def _decide(
        self,
        mem: SafetyMemory,
        now_ns: int,
        reasons: list[Reason],
        proposal: AppliedAction | None,
        features: FeatureRow | None,
    ) -> tuple[AppliedAction, SafetyState, bool]:
        """The state's target action: (target, state, blending the model's proposal back in)."""
        distrust = any(r in DISTRUST for r in reasons)
        if mem.late_hold and mem.state is SafetyState.VETO_HOLD:
            if not distrust:  # a fresh observation after a late one: blend back at once (no dwell)
                mem.came_from, mem.state = SafetyState.VETO_HOLD, SafetyState.RECOVERING
                mem.clean_since_ns, mem.late_hold = now_ns - self._dwell_ns, False
            elif any(r in CONTENT_DISTRUST for r in reasons):
                mem.late_hold = False  # an ordinary hold from here on (its timer keeps running)
        if mem.state is SafetyState.NOMINAL:
            if distrust:
                mem.state, mem.hold_since_ns = SafetyState.VETO_HOLD, now_ns
                mem.late_hold = not any(r in CONTENT_DISTRUST for r in reasons)
                if Reason.OOD_VETO in reasons:  # only the gate's filter confirms late
                    self._roll_back(mem)
                    self._suspect_readings = self.config.rollback_ticks
            elif Reason.LOW_MARGIN in reasons:
                if mem.abstain_since_ns is None:
                    mem.abstain_since_ns = now_ns
                if now_ns - mem.abstain_since_ns >= self._abstain_ns and self._abstain_ns > 0:
                    mem.state, mem.hold_since_ns = SafetyState.FALLBACK_ACTIVE, now_ns
                    mem.abstain_since_ns = None
                    return self._fallback(mem, reasons), mem.state, False
                return self._abstain(mem, reasons, proposal), mem.state, False
            else:
                assert proposal is not None  # no distrust: the model scored this tick
                mem.abstain_since_ns = None
                self._trust(mem, proposal)
                return proposal, mem.state, False
        elif mem.state is SafetyState.RECOVERING:
            if distrust:
                mem.state = mem.came_from
            elif now_ns - mem.clean_since_ns >= self._dwell_ns and proposal is not None:
                return proposal, mem.state, True
        elif not distrust and not mem.stopped:  # VETO_HOLD or FALLBACK_ACTIVE with clean inputs: the dwell
            mem.came_from, mem.state, mem.clean_since_ns = mem.state, SafetyState.RECOVERING, now_ns
            if self._dwell_ns == 0 and proposal is not None:
                return proposal, mem.state, True

        if mem.state is SafetyState.VETO_HOLD and now_ns - mem.hold_since_ns >= self._hold_ns:
            mem.state, mem.late_hold = SafetyState.FALLBACK_ACTIVE, False
        in_fallback = mem.state is SafetyState.FALLBACK_ACTIVE or (
            mem.state is SafetyState.RECOVERING and mem.came_from is SafetyState.FALLBACK_ACTIVE
        )
        if in_fallback and not (mem.stopped or mem.released) and self._standing_still(mem):
            mem.stopped = True
        if mem.stopped:  # the manoeuvre ended in standstill: only a release ends the fallback
            mem.state = SafetyState.FALLBACK_ACTIVE
            reasons.append(Reason.STANDSTILL_HOLD)
        return (self._fallback(mem, reasons) if in_fallback else self._hold(mem, reasons)), mem.state, False

    def _standing_still(self, mem: SafetyMemory) -> bool:
        return mem.speed_estimate is not None and mem.speed_estimate <= self.config.standstill_speed

    def _named(self, action: AppliedAction) -> AppliedAction:
        """The action named by its acceleration's band (where the model's actions are the bands)."""
        if not self._banded:
            return action
        a = float(action.controls[self._accel])
        band = 3 if a > KEEP_AT_MOST else 2 if a >= BRAKE_BELOW else 1 if a >= BRAKE_HARD_BELOW else 0
        if math.isnan(a) or band == action.index:
            return action
        return AppliedAction(band, ACTIONS[band], action.controls)

    def band_indices(self, controls: np.ndarray) -> np.ndarray | None:
        """`_named`'s action index for each row of (rows, controls) commands; None where actions keep
        the model's names (a replay's NOMINAL ticks, vectorised)."""
        if not self._banded:
            return None
        return action_of_accel(controls[:, self._accel])

    def _speed_now(self, mem: SafetyMemory) -> float:
        """The speed the lateral rules use: the reading while the inputs are trusted, else the
        dead-reckoned estimate (a speed sensor in km/h read 96 "m/s" at 27 m/s and bounded the
        steering to a tenth of what kept the lane)."""
        x = self._features
        lane = self._lane
        measured = float(x[lane[3]]) if x is not None and lane is not None else math.nan
        if mem.speed_estimate is not None and self._doubted:
            return mem.speed_estimate
        # trusted, or doubted with nothing trusted before it (distrusted from the first tick): the
        # reading is the best there is
        return measured if math.isfinite(measured) else mem.trusted_speed

    def _bound_steer(self, mem: SafetyMemory, applied: AppliedAction) -> AppliedAction:
        keeper = self._keeper
        if self._lane is None or keeper is None or self._steer is None:
            return applied
        # the speed now (dead-reckoned while doubted): bounded at the speed before a fallback, the
        # keeper could not follow a 40 m radius even at walking pace. Without any trusted speed to
        # dead-reckon from, the larger of the reading and the last trusted one.
        now = self._speed_now(mem)
        speed = now if mem.speed_estimate is not None else max(mem.trusted_speed, now)
        if speed < 1.0:
            return applied
        limit = keeper.lateral_limit(speed)
        steer = float(applied.controls[self._steer])
        if abs(steer) <= limit:
            return applied
        # reached at the keeper's rate: the model's angle beyond the bound, cut in one tick, was a
        # step of lateral acceleration (0.009 rad at 21 m/s, 1.6 m/s^2)
        return applied.with_control(
            self._steer, keeper.turn_towards(self._steer_before, min(max(steer, -limit), limit))
        )

    @property
    def history_ticks(self) -> int:
        """How many of the newest trusted ticks the memory keeps lane readings of."""
        return self._history_len

    def trust_run(self, mem: SafetyMemory, proposals: list[AppliedAction], features: list[np.ndarray]) -> None:
        """What a run of clean NOMINAL ticks leaves in memory (replay scan), given the run's last
        proposals and the inputs of its last ticks, oldest first: as many as the proposals or more.
        Only the newest rollback_ticks + 1 proposals and `history_ticks` inputs can matter."""
        mem.abstain_since_ns = None
        older = len(features) - len(proposals)
        for k, x in enumerate(features):
            self._features = x
            if k < older:
                self._trust_readings(mem)
                continue
            self._trust(mem, proposals[k - older])
            if self._accel is not None:
                mem.last_accel = float(proposals[k - older].controls[self._accel])

    def _trust(self, mem: SafetyMemory, proposal: AppliedAction) -> None:
        """A NOMINAL tick: remember its action, and the lane, road and speed while inputs are trusted."""
        mem.last_safe, mem.released = proposal, False
        mem.recent.append(proposal)
        if len(mem.recent) > self.config.rollback_ticks + 1:
            del mem.recent[0]
        self._trust_readings(mem)

    def _trust_readings(self, mem: SafetyMemory) -> None:
        if mem.lane_estimate is not None:  # back from a hold: the readings before it are another road
            mem.lane_estimate = None
            if mem.lane_history is not None:
                mem.lane_history.clear()
        x = self._features
        if x is None:
            return
        if self._lane is not None:
            offset, heading, curvature, speed = (float(x[i]) for i in self._lane)
            if math.isfinite(curvature):
                mem.trusted_curvature = curvature
            if math.isfinite(speed):
                mem.trusted_speed = speed
            self._remember_lane(mem, curvature, speed, offset, heading)
        if self._speed is not None and math.isfinite(own := float(x[self._speed])):
            mem.speed_estimate = abs(own)

    def _remember_lane(self, mem: SafetyMemory, curvature: float, speed: float, offset: float, heading: float) -> None:
        """Keep a trusted tick's lane reading for the dead-reckoned lane (complete readings only)."""
        if math.isfinite(curvature + speed + offset + heading):
            history = mem.lane_history
            if history is None:
                history = mem.lane_history = LaneHistory(self._history_len)
            history.append((curvature, speed, offset, heading))

    def _roll_back(self, mem: SafetyMemory) -> None:
        """Hold what was applied before the suspect ticks; nothing that old: the safe action."""
        keep = len(mem.recent) - self.config.rollback_ticks
        mem.last_safe = mem.recent[keep - 1] if keep >= 1 else None
        mem.recent.clear()
        mem.rolled_back = True

    def _lane_keeping_steer(self, mem: SafetyMemory) -> tuple[float | None, bool]:
        """(steer, lane visible); steer None without lane keeping."""
        keeper = self._keeper
        if self._lane is None or keeper is None:
            return None, self._features is not None and all(map(math.isfinite, self._features))
        x, speed_now, before = self._features, self._speed_now(mem), self._steer_before
        if x is not None:
            # Read while readable, even where a check doubts the tick: the checks that veto most
            # (range, units, per-signal) doubt other signals, and a dead-reckoned lane over a
            # 100-400 m stop misses the next curve (a km/h speed sensor left the road that way).
            offset, heading, curvature, speed = (float(x[i]) for i in self._lane)
            if math.isfinite(offset) and math.isfinite(heading) and math.isfinite(speed):
                ahead = curvature if math.isfinite(curvature) else mem.trusted_curvature
                return keeper.keep(speed_now, before, ahead, offset, heading), True
        estimate = self._lane_estimate(mem)
        if estimate is None:  # no trusted reading to start from: the last curvature, open loop
            return keeper.turn_towards(before, keeper.steer_for(mem.trusted_curvature)), False
        curvature = estimate.road_curvature(keeper.config.preview_m)
        return keeper.keep(speed_now, before, curvature, estimate.offset, estimate.heading), False

    def _hold(self, mem: SafetyMemory, reasons: list[Reason]) -> AppliedAction:
        """The last trusted action (the safe action without one); outside NOMINAL its steering keeps
        the lane (a held angle is open loop: held from the middle of a lane change it leaves the road)."""
        if mem.last_safe is None:
            reasons.append(Reason.SAFE_DEFAULT)
        held = self.safe_action if mem.last_safe is None else mem.last_safe
        if mem.state is SafetyState.NOMINAL or self._steer is None:
            return held
        steer, _ = self._lane_keeping_steer(mem)
        return held if steer is None else held.with_control(self._steer, steer)

    def _abstain(self, mem: SafetyMemory, reasons: list[Reason], proposal: AppliedAction | None) -> AppliedAction:
        """A low-margin abstention: the last trusted action's acceleration (`_safe_side` keeps the
        model's braking) with the model's steering. The margin is between acceleration bands, and the
        steering is an output of its own on trusted inputs: held, it was open loop for up to
        `max_abstain_ms` (abstentions on real 10 Hz drives last up to 0.5 s)."""
        held = self._hold(mem, reasons)
        if proposal is None or self._steer is None:
            return held
        return held.with_control(self._steer, float(proposal.controls[self._steer]))

    def _fallback(self, mem: SafetyMemory, reasons: list[Reason]) -> AppliedAction:
        """The minimal-risk manoeuvre's target: its deceleration (the jerk limit is applied by
        `_safe_side`, from the command actually applied) and the lane keeper's steering."""
        reasons.append(Reason.FALLBACK)
        start = mem.fallback or mem.last_safe or self.safe_action
        controls = start.controls.copy()
        steer, visible = self._lane_keeping_steer(mem)
        if self._accel is not None:
            controls[self._accel] = -(self.config.fallback_decel if visible else self.config.blind_decel)
        if steer is not None and self._steer is not None:
            controls[self._steer] = steer
        mem.fallback = AppliedAction(self.safe_action.index, self.safe_action.name, controls)
        return mem.fallback


def fallback_profile(config: SafetyConfig, start_accel: float, period_ns: int, ticks: int) -> np.ndarray:
    """The fallback's acceleration command tick by tick from `start_accel`, lane visible (for tests and docs)."""
    step = config.jerk_limit * period_ns / 1e9
    out, a = np.empty(ticks), start_accel
    for k in range(ticks):
        a = min(max(-config.fallback_decel, a - step), a + step)
        out[k] = a
    return out
