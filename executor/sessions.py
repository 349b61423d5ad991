"""A session as the executor keeps it, and the errors that refuse a session or an observation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from dualloop.executor.history import HistoryState
from dualloop.executor.safety import SafetyMemory
from dualloop.executor.snapshot import Clock, Observation


class InvalidObservation(ValueError):
    """An observation that breaks the session's contract (shape, order); the message says how."""


class SessionError(ValueError):
    """Opening or addressing a session failed; the subclass says how (the server answers each with a
    status of its own: controller.serve.status.STATUS_OF_ERROR)."""


class SessionAlreadyOpen(SessionError):
    """A session with this id is open."""


class SessionRequestInvalid(SessionError):
    """The opening asks for what cannot be given: an empty id, an observation period out of range,
    features the model does not have."""


class TooManySessions(SessionError):
    """max_sessions sessions are open."""


class SessionNotOpen(SessionError):
    """No open session has this id."""


@dataclass(slots=True)
class Session:
    session_id: str
    clock: Clock
    shadow: bool
    include_decision_vector: bool
    plan: npt.NDArray[np.float32]
    slot: int  # row of this session in per-session state arrays (the gate's filter)
    # Whether the observations' actual controls are the command the vehicle was executing when each
    # was taken (controller.proto's contract), which the gate's actuation check compares with the
    # measured acceleration. False for logs whose actual action is a label (a comma2k19 import's is
    # the speed's slope over the next 0.5 s): the check then gives no verdict.
    actual_is_command: bool = True
    # The sensor profile: which features this session measures (None: all). Missing ones arrive as
    # NaN and are masked (docs/design-notes/real-sensors.md).
    present: npt.NDArray[np.bool_] | None = None
    # The sensor's observation period as declared; 0: measured from the observations' timestamps.
    observation_period_ns: int = 0
    # the recent intervals between observation timestamps (newest last) and the period they give
    intervals_ns: list[int] = field(default_factory=list)
    measured_period_ns: int = 0
    safety: SafetyMemory = field(default_factory=SafetyMemory)
    # The plan rule (docs/contract.md#plans): with require_plan, no valid plan is STALE_PLAN; with
    # expired_plan_is_stale (server-planner sessions), an expired one is, a missing one is not.
    require_plan: bool = False
    expired_plan_is_stale: bool = False
    has_plan: bool = False  # a plan was received (its id may be empty)
    plan_id: str = ""
    plan_created_ns: int = 0  # sensor time (the clock of the observations' timestamps)
    plan_valid_for_ns: int = 0  # resolved: the plan's own, or the default
    pending: Observation | None = None  # newest observation no tick has used yet (latest wins)
    current: Observation | None = None  # the observation the last tick used
    last_seq: int = 0  # seq starts at 1: 0 is proto3's unset value
    last_timestamp_ns: int | None = None
    observations_dropped: int = 0
    snapshots_dropped: int = 0
    next_tick_ns: int | None = None  # LOCKSTEP grid position
    lockstep_tick: int = 0
    ticks: int = 0
    last_tick_index: int | None = None  # REALTIME: the grid index of the session's previous tick
    history: HistoryState | None = None  # the model's history features' ring buffer (executor.history)
    history_due: bool = False  # REALTIME: the pending observation's history features are not derived yet


# What DecisionSnapshot.invalid_input may name, in the order it lists them.
INVALID_PARTS = ("features", "plan")


def without_invalid_content(obs: Observation) -> Observation:
    """The observation with a non-finite plan discarded and named in `invalid_parts` (the same object
    when it has none). Content errors never end a stream (docs/contract.md#invalid-input): a bad plan
    is not adopted. Actual controls are not decision inputs: a non-finite one means "not known" (a
    label often knows the acceleration, not the steering) and is kept as sent. Shapes must have been
    checked (those are structure errors)."""
    if obs.plan_values is None or bool(np.isfinite(obs.plan_values).all()):
        return obs
    return replace(
        obs,
        plan_id="",
        plan_values=None,
        invalid_parts=tuple(p for p in INVALID_PARTS if p in {*obs.invalid_parts, "plan"}),
    )


# How many recent intervals the measured observation period is the median of: enough that one lost
# observation (a double interval) does not move it.
PERIOD_WINDOW = 16


def median_interval(intervals: Sequence[int]) -> int:
    """The upper median of the intervals (an integer, so live ticks and a replay agree exactly)."""
    return sorted(intervals)[len(intervals) // 2] if intervals else 0


def note_observation_time(session: Session, timestamp_ns: int) -> None:
    """Measure the observation period from the timestamps of accepted observations (sensor time)."""
    last = session.last_timestamp_ns
    session.last_timestamp_ns = timestamp_ns
    if last is None or timestamp_ns <= last:
        return  # nothing to measure (a REALTIME clock that steps back is not an interval)
    intervals = session.intervals_ns
    intervals.append(timestamp_ns - last)
    if len(intervals) > PERIOD_WINDOW:
        del intervals[0]
    session.measured_period_ns = median_interval(intervals)
