"""What a planner produces (Plan), what it is given (PlanRequest) and what a planner is (PlanSource).

A plan is small and self-describing: a behaviour mode, a target speed, a target lane offset and a
validity horizon. The executor consumes it as a float32 vector in sim.schema.PLAN order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import BEHAVIOURS, N_FEATURES, N_PLAN, PLAN_INDEX

DEFAULT_VALID_FOR_NS: int = 1_000_000_000  # 1 s: five planner periods, so one lost plan is harmless
_SPEED, _OFFSET, _ONE_HOT = PLAN_INDEX["target_speed"], PLAN_INDEX["target_lane_offset"], PLAN_INDEX["plan_keep"]


class PlanError(ValueError):
    """A plan that the executor must not use (unknown behaviour, non-finite values)."""


@dataclass(frozen=True, slots=True)
class Plan:
    plan_id: str
    session_id: str
    created_ns: int  # controller time the plan refers to (the request's now_ns)
    valid_for_ns: int  # usable until created_ns + valid_for_ns
    source: str  # planner name, for logs and reports
    behaviour: str  # one of sim.schema.BEHAVIOURS
    target_speed: float  # m/s
    target_lane_offset: float  # m, + = left

    def __post_init__(self) -> None:
        if self.behaviour not in BEHAVIOURS:
            raise PlanError(f"plan {self.plan_id!r}: behaviour {self.behaviour!r} is not one of {BEHAVIOURS}")
        if not (math.isfinite(self.target_speed) and math.isfinite(self.target_lane_offset)):
            raise PlanError(
                f"plan {self.plan_id!r}: non-finite target ({self.target_speed}, {self.target_lane_offset})"
            )
        if self.target_speed < 0.0:
            raise PlanError(f"plan {self.plan_id!r}: negative target speed {self.target_speed}")
        if self.valid_for_ns <= 0:
            raise PlanError(f"plan {self.plan_id!r}: validity horizon must be positive, got {self.valid_for_ns}")

    @property
    def expires_ns(self) -> int:
        return self.created_ns + self.valid_for_ns

    @property
    def behaviour_index(self) -> int:
        return BEHAVIOURS.index(self.behaviour)

    def values(self) -> npt.NDArray[np.float32]:
        """(N_PLAN,) float32 in sim.schema.PLAN order: what the executor's model is conditioned on.
        The same vector as sim.schema.make_plan, built directly: the server's tick loop applies a
        whole batch of plans in one tick, and make_plan's broadcasting costs ~9 us a plan."""
        v = np.zeros(N_PLAN, dtype=np.float32)
        v[_SPEED] = self.target_speed
        v[_OFFSET] = self.target_lane_offset
        v[_ONE_HOT + self.behaviour_index] = 1.0
        return v


@dataclass(frozen=True, slots=True)
class PlanRequest:
    session_id: str
    features: npt.NDArray[np.float32]  # (N_FEATURES,) in sim.schema.FEATURES order
    now_ns: int
    previous: Plan | None = None

    def __post_init__(self) -> None:
        if self.features.shape != (N_FEATURES,):
            raise ValueError(f"features must have shape ({N_FEATURES},), got {self.features.shape}")


def make_plan_id(source: str, session_id: str, now_ns: int) -> str:
    """Deterministic id: the same request replayed gives the same id (lockstep replays stay identical)."""
    return f"{source}/{session_id}/{now_ns}"


@runtime_checkable
class PlanSource(Protocol):
    """Anything that turns a request into a plan. plan() may block, be slow or raise: callers on the
    executor's path never call it directly, the PlanScheduler runs it in its own worker."""

    name: str

    def plan(self, request: PlanRequest) -> Plan: ...
