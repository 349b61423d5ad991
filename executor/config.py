"""Executor settings: what a user may tune, validated with errors that name the field."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dualloop.executor.safety import SafetyConfig

# 1 ms: the loop's timerfd wakes it within ~0.2 ms of the time asked for (p99, loaded 2-core VM),
# and a shorter guard leaves the loop more of each period for gRPC (docs/measurements.md).
DEFAULT_TICKER_GUARD_MS = 1.0


class ExecutorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tick_period_ms: float = Field(default=5.0, gt=0.0, le=1000.0)
    # Top-1 minus top-2 probability below this: abstain and hold the last applied action.
    min_margin: float = Field(default=0.05, ge=0.0, le=1.0)
    # An observation is late (STALE_OBSERVATION) when older than the session's observation period
    # plus this allowance for transport and jitter (a few ticks, like Autoware's input timeouts).
    max_observation_age_ms: float = Field(default=15.0, gt=0.0)
    # The observation period assumed for a session that declared none, until two observations have
    # measured it: the slowest common sensor rate (10 Hz), so a slow sensor's first interval is not late.
    assumed_observation_period_ms: float = Field(default=100.0, gt=0.0, le=10_000.0)
    # A plan older than this (three planner periods) is stale, like an input timeout. Sessions that
    # never received a plan run on the model's default plan and are not affected.
    max_plan_age_ms: float = Field(default=600.0, gt=0.0)
    safety: SafetyConfig = SafetyConfig()
    # With a gate: this many consecutive fresh observations identical to the previous one, every
    # component bit for bit, are a stuck sensor (OOD_VETO). 0 turns the check off, e.g. for a log
    # whose sensors are quantised so coarsely that they legitimately repeat.
    freeze_repeats: int = Field(default=2, ge=0)
    # With a gate: the per-signal checks (ood/signals.py: a signal stuck while it should change, speed
    # against acceleration, gap against relative speed, a flickering lead flag). False turns them off.
    signal_checks: bool = True
    max_sessions: int = Field(default=64, ge=1, le=4096)
    # LOCKSTEP: a timestamp jump longer than this is refused rather than ticked through.
    lockstep_max_gap_s: float = Field(default=10.0, gt=0.0)
    # How long before a deadline the loop stops serving gRPC and waits in its thread (see
    # controller/serve/ticker.py): the loop is blocked that long every tick.
    ticker_guard_ms: float = Field(default=DEFAULT_TICKER_GUARD_MS, ge=0.0, le=4.0)
    # The share of the tick period the models' forward passes may take (executor/model_cost.py): a
    # live model over it at start, or a candidate that takes the live model over it, is refused
    # with the measured figures; a running candidate over it is paused. 0: no check (every tick may
    # then overrun; it counts missed deadlines and the loop still serves between ticks).
    model_budget_fraction: float = Field(default=0.5, ge=0.0, le=1.0)

    @property
    def tick_period_ns(self) -> int:
        return int(round(self.tick_period_ms * 1e6))

    @property
    def model_budget_ns(self) -> int:
        """0: no budget."""
        return int(round(self.model_budget_fraction * self.tick_period_ns))

    @property
    def max_observation_age_ns(self) -> int:
        return int(round(self.max_observation_age_ms * 1e6))

    @property
    def assumed_observation_period_ns(self) -> int:
        return int(round(self.assumed_observation_period_ms * 1e6))
