"""The safe-state machine: what the executor applies when a tick cannot be trusted.

    NOMINAL --distrust--> VETO_HOLD --hold_timeout--> FALLBACK_ACTIVE
       ^                     |  clean                    |  clean
       |                     v                           v
       +---clean dwell--- RECOVERING <-------------------+
                             | distrust: back to where it came from (the hold timer keeps running)

- VETO_HOLD applies the last action that passed every check (or the model's safe action).
- On a gate veto, VETO_HOLD rolls back `rollback_ticks`: the gate's sequential filter confirms a
  fault a few ticks after it began, and the actions of those ticks were computed from suspect input
  (holding one of them sent the car off the road in the sensor-dropout scenario). Invalid input,
  stale input and model errors are caught in their own tick, so their hold is the last action.
- FALLBACK_ACTIVE is the minimal-risk action: decelerate towards `fallback_decel` with at most
  `fallback_jerk`, and keep the lane with a simple lane keeper that does not involve the model:
  steer along the last trusted road curvature, corrected (within a small bound) by the lane offset
  and heading error while those read finite. Never a stale command held forever.
- RECOVERING keeps the safe side in charge until the inputs have been clean for `recovery_dwell`;
  only then does the model's proposal drive again (Simplex: switch back after a clean dwell).
- A late observation (STALE_OBSERVATION alone) is not distrust of what the sensors said: it holds
  the last action (VETO_HOLD), and the first tick with a fresh observation drives again, with no
  dwell. Past `hold_timeout` the sensor is gone and the fallback takes over as for any hold; any
  other reason during the hold makes it an ordinary one (rollback aside), recovered with the dwell.
Times are tick times, so LOCKSTEP runs reproduce every transition exactly.

`decide` is the reference, one session at a time. `decide_batch` is the live tick's: every session
of a batch at once, equal to `decide` row by row (tests/executor/test_safety_batch.py checks it on
random sequences). Almost every row of a live tick is *steady*: NOMINAL with no reason, so it applies
the model's proposal and remembers it; those rows take one pass with their inputs read as columns,
and only the rows with a reason or a state to leave go through `decide`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dualloop.executor.snapshot import AppliedAction, Reason, SafetyState


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
    # Every held or fallback steering command is bounded so that the lateral acceleration stays
    # below this at the current speed (the larger of measured and last trusted): a steer held from
    # 25 m/s is violent at 55 m/s (0.034 rad there is ~37 m/s^2).
    max_lateral_accel: float = Field(default=3.0, gt=0.0, description="m/s^2")


class SafetyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hold_timeout_ms: float = Field(default=300.0, ge=0.0)
    recovery_dwell_ms: float = Field(default=500.0, ge=0.0)
    fallback_decel: float = Field(default=3.0, gt=0.0, description="m/s^2, comfortable braking")
    # When the fallback cannot see the lane (inputs frozen or non-finite), lateral control is open
    # loop on the last trusted curvature: stop sooner (a stuck sensor drifted off a curve at 3 m/s^2).
    blind_decel: float = Field(default=5.0, gt=0.0, description="m/s^2, braking while the lane is not visible")
    fallback_jerk: float = Field(default=2.5, gt=0.0, description="m/s^3, jerk limit while entering the fallback")
    # LOW_MARGIN abstentions hold the last action tick by tick; this many in a row escalate to the
    # fallback so an undecided model cannot keep an old command forever.
    max_abstain_ms: float = Field(default=1000.0, ge=0.0)
    accel_control: str = "accel"  # which control is longitudinal acceleration
    steer_control: str = "steer"
    # Braking is monotone: while the model is not trusted, the applied acceleration is the lower of
    # the safe side's and the model's proposal, the latter bounded here. A veto may add braking but
    # never remove the braking the model asked for (a gate vetoing the model's hard braking behind a
    # braking lead must not make the car brake less). 0 disables.
    max_vetoed_brake: float = Field(default=6.0, ge=0.0, description="m/s^2")
    # How far back the hold reaches: at least the gate filter's worst confirmation delay (n - 1
    # for k-of-n 3/5).
    rollback_ticks: int = Field(default=4, ge=0)
    # None: the fallback holds the last trusted steering instead of keeping the lane.
    lane_keeping: LaneKeepingConfig | None = LaneKeepingConfig()


DISTRUST = frozenset(
    {Reason.OOD_VETO, Reason.INVALID_INPUT, Reason.MODEL_ERROR, Reason.STALE_OBSERVATION, Reason.STALE_PLAN}
)
# Reasons that doubt the inputs' content; lateness alone (STALE_OBSERVATION) does not.
CONTENT_DISTRUST = DISTRUST - {Reason.STALE_OBSERVATION}


@dataclass(slots=True)
class SafetyMemory:
    """Per-session state of the machine."""

    state: SafetyState = SafetyState.NOMINAL
    hold_since_ns: int = 0
    clean_since_ns: int = 0
    came_from: SafetyState = SafetyState.VETO_HOLD  # where RECOVERING falls back to
    abstain_since_ns: int | None = None
    last_safe: AppliedAction | None = None  # the action the hold applies
    fallback: AppliedAction | None = None  # the fallback command as it ramps down
    recent: list[AppliedAction] = field(default_factory=list)  # NOMINAL actions, newest last
    trusted_curvature: float = 0.0
    trusted_speed: float = 0.0
    rolled_back: bool = False  # the last hold reached back past suspect ticks
    late_hold: bool = False  # the VETO_HOLD is for a late observation only (no dwell to leave it)


class SafetyMachine:
    def __init__(
        self,
        config: SafetyConfig,
        control_names: list[str],
        period_ns: int,
        safe_action: AppliedAction,
        feature_names: list[str] | None = None,
    ) -> None:
        self.config = config
        lk, names = config.lane_keeping, feature_names or []
        needed = (lk.offset_feature, lk.heading_feature, lk.curvature_feature, lk.speed_feature) if lk else ()
        # Lane keeping needs its four features in the model's schema; otherwise hold the steering.
        self._lane = tuple(names.index(n) for n in needed) if lk and all(n in names for n in needed) else None
        self._accel = control_names.index(config.accel_control) if config.accel_control in control_names else None
        self._steer = control_names.index(config.steer_control) if config.steer_control in control_names else None
        self._hold_ns = int(config.hold_timeout_ms * 1e6)
        self._dwell_ns = int(config.recovery_dwell_ms * 1e6)
        self._abstain_ns = int(config.max_abstain_ms * 1e6)
        self._jerk_step = config.fallback_jerk * period_ns / 1e9
        self.safe_action = safe_action

    @property
    def hold_timeout_ns(self) -> int:
        return self._hold_ns

    @property
    def recovery_dwell_ns(self) -> int:
        return self._dwell_ns

    @property
    def max_abstain_ns(self) -> int:
        return self._abstain_ns

    def decide(
        self,
        mem: SafetyMemory,
        now_ns: int,
        reasons: list[Reason],
        proposal: AppliedAction | None,
        features: np.ndarray | None = None,
    ) -> tuple[AppliedAction, SafetyState]:
        """Advance one tick; `reasons` may gain FALLBACK / SAFE_DEFAULT. Returns (applied, state).

        `features` are this tick's raw inputs, used only by the fallback's lane keeper."""
        applied, state = self._decide(mem, now_ns, reasons, proposal, features)
        if state is SafetyState.NOMINAL:
            return applied, state
        applied = self._bound_steer(mem, applied)
        if proposal is None or self._accel is None or not self.config.max_vetoed_brake:
            return applied, state
        wanted = max(float(proposal.controls[self._accel]), -self.config.max_vetoed_brake)
        if wanted < applied.controls[self._accel]:
            controls = applied.controls.copy()
            controls[self._accel] = wanted
            applied = AppliedAction(applied.index, applied.name, controls)
        return applied, state

    def decide_batch(
        self,
        mems: list[SafetyMemory],
        now_ns: int,
        reasons: list[list[Reason]],
        proposals: list[AppliedAction | None],
        features: np.ndarray | None,
        use_features: list[bool] | None = None,
    ) -> list[tuple[AppliedAction, SafetyState]]:
        """`decide` for each row of a batch ticking at `now_ns`, with the same results, the same
        reasons added and the same memory left behind. `features` (rows, F): the rows' raw inputs;
        `use_features[i]` False where row i's must not steer the fallback (None: all may)."""
        nominal = SafetyState.NOMINAL
        steady = [not r and m.state is nominal for m, r in zip(mems, reasons)]
        out: list[tuple[AppliedAction, SafetyState]] = []
        lane = self._lane if features is not None else None
        if lane is not None and any(steady):  # the trusted road, read as two columns
            assert features is not None
            curvatures, speeds = features[:, lane[2]].tolist(), features[:, lane[3]].tolist()
        keep = self.config.rollback_ticks + 1
        for i, mem in enumerate(mems):
            x = None if features is None or (use_features is not None and not use_features[i]) else features[i]
            proposal = proposals[i]
            if not steady[i] or proposal is None:
                out.append(self.decide(mem, now_ns, reasons[i], proposal, x))
                continue
            # `_decide`'s NOMINAL branch without distrust or LOW_MARGIN: `_trust`, inline
            mem.abstain_since_ns = None
            mem.last_safe = proposal
            recent = mem.recent
            recent.append(proposal)
            if len(recent) > keep:
                del recent[0]
            if lane is not None and x is not None:
                if math.isfinite(curvature := curvatures[i]):
                    mem.trusted_curvature = curvature
                if math.isfinite(speed := speeds[i]):
                    mem.trusted_speed = speed
            out.append((proposal, nominal))
        return out

    def _decide(
        self,
        mem: SafetyMemory,
        now_ns: int,
        reasons: list[Reason],
        proposal: AppliedAction | None,
        features: np.ndarray | None,
    ) -> tuple[AppliedAction, SafetyState]:
        distrust = any(r in DISTRUST for r in reasons)
        self._features = features
        if mem.late_hold and mem.state is SafetyState.VETO_HOLD:
            if not distrust:  # a fresh observation after a late one: drive again at once
                mem.state, mem.late_hold = SafetyState.NOMINAL, False
            elif any(r in CONTENT_DISTRUST for r in reasons):
                mem.late_hold = False  # an ordinary hold from here on (its timer keeps running)
        if mem.state is SafetyState.NOMINAL:
            if distrust:
                mem.state, mem.hold_since_ns = SafetyState.VETO_HOLD, now_ns
                mem.late_hold = not any(r in CONTENT_DISTRUST for r in reasons)
                if Reason.OOD_VETO in reasons:  # only the gate's filter confirms late
                    self._roll_back(mem)
            elif Reason.LOW_MARGIN in reasons:
                if mem.abstain_since_ns is None:
                    mem.abstain_since_ns = now_ns
                if now_ns - mem.abstain_since_ns >= self._abstain_ns and self._abstain_ns > 0:
                    mem.state, mem.hold_since_ns = SafetyState.FALLBACK_ACTIVE, now_ns
                    mem.abstain_since_ns = None
                    return self._fallback(mem, reasons), mem.state
                return self._hold(mem, reasons), mem.state
            else:
                assert proposal is not None  # no distrust: the model scored this tick
                mem.abstain_since_ns = None
                self._trust(mem, proposal)
                return proposal, mem.state
        elif mem.state is SafetyState.RECOVERING:
            if distrust:
                mem.state = mem.came_from
            elif now_ns - mem.clean_since_ns >= self._dwell_ns and proposal is not None:
                mem.state = SafetyState.NOMINAL
                mem.fallback = None
                mem.abstain_since_ns = None
                self._trust(mem, proposal)
                return proposal, mem.state
        elif not distrust:  # VETO_HOLD or FALLBACK_ACTIVE with clean inputs: start the dwell
            mem.came_from, mem.state, mem.clean_since_ns = mem.state, SafetyState.RECOVERING, now_ns
            if self._dwell_ns == 0 and proposal is not None:
                mem.state = SafetyState.NOMINAL
                mem.fallback = None
                self._trust(mem, proposal)
                return proposal, mem.state

        if mem.state is SafetyState.VETO_HOLD and now_ns - mem.hold_since_ns >= self._hold_ns:
            mem.state, mem.late_hold = SafetyState.FALLBACK_ACTIVE, False
        in_fallback = mem.state is SafetyState.FALLBACK_ACTIVE or (
            mem.state is SafetyState.RECOVERING and mem.came_from is SafetyState.FALLBACK_ACTIVE
        )
        return (self._fallback(mem, reasons) if in_fallback else self._hold(mem, reasons)), mem.state

    def _bound_steer(self, mem: SafetyMemory, applied: AppliedAction) -> AppliedAction:
        lk = self.config.lane_keeping
        if self._lane is None or lk is None or self._steer is None:
            return applied
        speed = mem.trusted_speed
        if self._features is not None and math.isfinite(measured := float(self._features[self._lane[3]])):
            speed = max(speed, measured)
        if speed < 1.0:
            return applied
        limit = math.atan(lk.wheelbase_m * lk.max_lateral_accel / (speed * speed))
        steer = float(applied.controls[self._steer])
        if abs(steer) <= limit:
            return applied
        controls = applied.controls.copy()
        controls[self._steer] = min(max(steer, -limit), limit)
        return AppliedAction(applied.index, applied.name, controls)

    def trust_run(self, mem: SafetyMemory, proposals: list[AppliedAction], features: list[np.ndarray]) -> None:
        """What a run of clean NOMINAL ticks leaves in memory, given the run's last proposals (and
        their ticks' inputs): only the newest rollback_ticks + 1 of them can matter (replay scan)."""
        mem.abstain_since_ns = None
        for proposal, x in zip(
            proposals[-(self.config.rollback_ticks + 1) :], features[-(self.config.rollback_ticks + 1) :]
        ):
            self._features = x
            self._trust(mem, proposal)

    def _trust(self, mem: SafetyMemory, proposal: AppliedAction) -> None:
        """A NOMINAL tick: remember its action, and the road's curvature while inputs are trusted."""
        mem.last_safe = proposal
        mem.recent.append(proposal)
        if len(mem.recent) > self.config.rollback_ticks + 1:
            del mem.recent[0]
        if self._lane is not None and self._features is not None:
            curvature, speed = self._features[self._lane[2]], self._features[self._lane[3]]
            if np.isfinite(curvature):
                mem.trusted_curvature = float(curvature)
            if np.isfinite(speed):
                mem.trusted_speed = float(speed)

    def _roll_back(self, mem: SafetyMemory) -> None:
        """Hold what was applied before the suspect ticks; nothing that old: the safe action."""
        keep = len(mem.recent) - self.config.rollback_ticks
        mem.last_safe = mem.recent[keep - 1] if keep >= 1 else None
        mem.recent.clear()
        mem.rolled_back = True

    def _lane_keeping_steer(self, mem: SafetyMemory) -> tuple[float | None, bool]:
        """(steer, lane visible); steer None without lane keeping."""
        lk = self.config.lane_keeping
        if self._lane is None or lk is None:
            return None, self._features is not None and bool(np.isfinite(self._features).all())
        steer = math.atan(lk.wheelbase_m * mem.trusted_curvature)
        x = self._features
        if x is not None:
            offset, heading, _, speed = (float(x[i]) for i in self._lane)
            if math.isfinite(offset) and math.isfinite(heading) and math.isfinite(speed):
                correction = -heading - math.atan(lk.gain * offset / max(speed, 1.0))
                return steer + min(max(correction, -lk.max_correction_rad), lk.max_correction_rad), True
        return steer, False

    def _hold(self, mem: SafetyMemory, reasons: list[Reason]) -> AppliedAction:
        if mem.last_safe is None:
            reasons.append(Reason.SAFE_DEFAULT)
            return self.safe_action
        return mem.last_safe

    def _fallback(self, mem: SafetyMemory, reasons: list[Reason]) -> AppliedAction:
        reasons.append(Reason.FALLBACK)
        start = mem.fallback or mem.last_safe or self.safe_action
        controls = start.controls.copy()
        steer, visible = self._lane_keeping_steer(mem)
        if self._accel is not None:
            target = -(self.config.fallback_decel if visible else self.config.blind_decel)
            a = float(controls[self._accel])
            # ramp towards the comfortable deceleration, never faster than the jerk limit
            controls[self._accel] = max(a - self._jerk_step, target) if a > target else min(a + self._jerk_step, target)
        if steer is not None and self._steer is not None:
            controls[self._steer] = steer
        mem.fallback = AppliedAction(self.safe_action.index, self.safe_action.name, controls)
        return mem.fallback


def fallback_profile(config: SafetyConfig, start_accel: float, period_ns: int, ticks: int) -> np.ndarray:
    """The fallback's acceleration command tick by tick from `start_accel` (for tests and docs)."""
    step = config.fallback_jerk * period_ns / 1e9
    out, a = np.empty(ticks), start_accel
    for k in range(ticks):
        a = (
            max(a - step, -config.fallback_decel)
            if a > -config.fallback_decel
            else min(a + step, -config.fallback_decel)
        )
        out[k] = a
    return out
