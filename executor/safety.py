"""The safe-state machine: what the executor applies when a tick cannot be trusted.

    NOMINAL --distrust--> VETO_HOLD --hold_timeout--> FALLBACK_ACTIVE
       ^                     |  clean                    |  clean
       |                     v                           v
       +---clean dwell--- RECOVERING <-------------------+
                             | distrust: back to where it came from (the hold timer keeps running)

- VETO_HOLD applies the last action that passed every check (or the model's safe action).
- FALLBACK_ACTIVE is the minimal-risk action: decelerate towards `fallback_decel` with at most
  `fallback_jerk`, keeping the last trusted steering (a curve stays a curve); never a stale
  command held forever.
- RECOVERING keeps the safe side in charge until the inputs have been clean for `recovery_dwell`;
  only then does the model's proposal drive again (Simplex: switch back after a clean dwell).
Times are tick times, so LOCKSTEP runs reproduce every transition exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from executor.snapshot import AppliedAction, Reason, SafetyState


class SafetyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hold_timeout_ms: float = Field(300.0, ge=0.0)
    recovery_dwell_ms: float = Field(500.0, ge=0.0)
    fallback_decel: float = Field(3.0, gt=0.0, description="m/s^2, comfortable braking")
    fallback_jerk: float = Field(2.5, gt=0.0, description="m/s^3, jerk limit while entering the fallback")
    # LOW_MARGIN abstentions hold the last action tick by tick; this many in a row escalate to the
    # fallback so an undecided model cannot keep an old command forever.
    max_abstain_ms: float = Field(1000.0, ge=0.0)
    accel_control: str = "accel"  # which control is longitudinal acceleration
    steer_control: str = "steer"


DISTRUST = frozenset({Reason.OOD_VETO, Reason.INVALID_INPUT, Reason.MODEL_ERROR, Reason.STALE_OBSERVATION,
                      Reason.STALE_PLAN})


@dataclass(slots=True)
class SafetyMemory:
    """Per-session state of the machine."""

    state: SafetyState = SafetyState.NOMINAL
    hold_since_ns: int = 0
    clean_since_ns: int = 0
    came_from: SafetyState = SafetyState.VETO_HOLD  # where RECOVERING falls back to
    abstain_since_ns: int | None = None
    last_safe: AppliedAction | None = None  # the last action that passed every check
    fallback: AppliedAction | None = None  # the fallback command as it ramps down


class SafetyMachine:
    def __init__(self, config: SafetyConfig, control_names: list[str], period_ns: int,
                 safe_action: AppliedAction) -> None:
        self.config = config
        self._accel = control_names.index(config.accel_control) if config.accel_control in control_names else None
        self._steer = control_names.index(config.steer_control) if config.steer_control in control_names else None
        self._hold_ns = int(config.hold_timeout_ms * 1e6)
        self._dwell_ns = int(config.recovery_dwell_ms * 1e6)
        self._abstain_ns = int(config.max_abstain_ms * 1e6)
        self._jerk_step = config.fallback_jerk * period_ns / 1e9
        self.safe_action = safe_action

    def decide(self, mem: SafetyMemory, now_ns: int, reasons: list[Reason],
               proposal: AppliedAction | None) -> tuple[AppliedAction, SafetyState]:
        """Advance one tick; `reasons` may gain FALLBACK / SAFE_DEFAULT. Returns (applied, state)."""
        distrust = any(r in DISTRUST for r in reasons)
        if mem.state is SafetyState.NOMINAL:
            if distrust:
                mem.state, mem.hold_since_ns = SafetyState.VETO_HOLD, now_ns
            elif Reason.LOW_MARGIN in reasons:
                if mem.abstain_since_ns is None:
                    mem.abstain_since_ns = now_ns
                if now_ns - mem.abstain_since_ns >= self._abstain_ns and self._abstain_ns > 0:
                    mem.state, mem.hold_since_ns = SafetyState.FALLBACK_ACTIVE, now_ns
                    mem.abstain_since_ns = None
                    return self._fallback(mem, reasons), mem.state
                return self._hold(mem, reasons), mem.state
            else:
                mem.abstain_since_ns = None
                mem.last_safe = proposal
                return proposal, mem.state
        elif mem.state is SafetyState.RECOVERING:
            if distrust:
                mem.state = mem.came_from
            elif now_ns - mem.clean_since_ns >= self._dwell_ns and proposal is not None:
                mem.state = SafetyState.NOMINAL
                mem.fallback = None
                mem.abstain_since_ns = None
                mem.last_safe = proposal
                return proposal, mem.state
        elif not distrust:  # VETO_HOLD or FALLBACK_ACTIVE with clean inputs: start the dwell
            mem.came_from, mem.state, mem.clean_since_ns = mem.state, SafetyState.RECOVERING, now_ns
            if self._dwell_ns == 0 and proposal is not None:
                mem.state = SafetyState.NOMINAL
                mem.fallback = None
                mem.last_safe = proposal
                return proposal, mem.state

        if mem.state is SafetyState.VETO_HOLD and now_ns - mem.hold_since_ns >= self._hold_ns:
            mem.state = SafetyState.FALLBACK_ACTIVE
        in_fallback = mem.state is SafetyState.FALLBACK_ACTIVE or (
            mem.state is SafetyState.RECOVERING and mem.came_from is SafetyState.FALLBACK_ACTIVE)
        return (self._fallback(mem, reasons) if in_fallback else self._hold(mem, reasons)), mem.state

    def _hold(self, mem: SafetyMemory, reasons: list[Reason]) -> AppliedAction:
        if mem.last_safe is None:
            reasons.append(Reason.SAFE_DEFAULT)
            return self.safe_action
        return mem.last_safe

    def _fallback(self, mem: SafetyMemory, reasons: list[Reason]) -> AppliedAction:
        reasons.append(Reason.FALLBACK)
        start = mem.fallback or mem.last_safe or self.safe_action
        controls = start.controls.copy()
        if self._accel is not None:
            target = -self.config.fallback_decel
            a = float(controls[self._accel])
            # ramp towards the comfortable deceleration, never faster than the jerk limit
            controls[self._accel] = max(a - self._jerk_step, target) if a > target else min(a + self._jerk_step, target)
        mem.fallback = AppliedAction(self.safe_action.index, self.safe_action.name, controls)
        return mem.fallback


def fallback_profile(config: SafetyConfig, start_accel: float, period_ns: int, ticks: int) -> np.ndarray:
    """The fallback's acceleration command tick by tick from `start_accel` (for tests and docs)."""
    step = config.fallback_jerk * period_ns / 1e9
    out, a = np.empty(ticks), start_accel
    for k in range(ticks):
        a = max(a - step, -config.fallback_decel) if a > -config.fallback_decel else min(a + step, -config.fallback_decel)
        out[k] = a
    return out
