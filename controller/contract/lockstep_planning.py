"""LOCKSTEP sessions planned in-line at each period boundary of their observation time: the same code
in the server's Drive handler and in the in-process closed loop (controller.demo.closed_loop), so
that a drive planned either way is the same record."""

from __future__ import annotations

from dataclasses import dataclass, field

from dualloop.executor.snapshot import Observation
from dualloop.planner.plan import Plan, PlanRequest, PlanSource
from dualloop.v2 import controller_pb2 as pb

KEEP_SUMMARIES = 4  # a session's snapshots can name the plan before the current one (LOCKSTEP)


def summary_of(plan: Plan) -> pb.PlanSummary:
    return pb.PlanSummary(
        source=plan.source,
        behaviour=plan.behaviour,
        target_speed=plan.target_speed,
        target_lane_offset=plan.target_lane_offset,
    )


class PlanSummaries:
    """plan id -> PlanSummary for the last few plans of each session (to annotate snapshots)."""

    def __init__(self) -> None:
        self._by_session: dict[str, dict[str, pb.PlanSummary]] = {}

    def add(self, plan: Plan) -> None:
        book = self._by_session.setdefault(plan.session_id, {})
        book[plan.plan_id] = summary_of(plan)
        while len(book) > KEEP_SUMMARIES:
            del book[next(iter(book))]

    def decorate(self, session_id: str, msg: pb.DecisionSnapshot) -> pb.DecisionSnapshot:
        book = self._by_session.get(session_id)
        summary = book.get(msg.plan_id) if book else None
        if summary is not None:
            msg.plan.CopyFrom(summary)
        return msg

    def forget(self, session_id: str) -> None:
        self._by_session.pop(session_id, None)


@dataclass
class _LockstepSession:
    next_ns: int | None = None  # the next period boundary in observation time
    previous: Plan | None = None


@dataclass
class LockstepPlanning:
    """Plans a LOCKSTEP session at each period boundary of its observation time, in-line."""

    source: PlanSource
    period_ns: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("plans", "errors", "timeouts"), 0))
    last_error: str = ""
    _sessions: dict[str, _LockstepSession] = field(default_factory=dict)
    _summaries: PlanSummaries = field(default_factory=PlanSummaries)

    def due(self, session_id: str, obs: Observation) -> PlanRequest | None:
        """The request to plan before this observation is ticked, or None between boundaries.
        The grid starts at the session's first observation, like the executor's tick grid."""
        state = self._sessions.setdefault(session_id, _LockstepSession())
        ts = obs.timestamp_ns
        if state.next_ns is None:
            state.next_ns = ts
        if ts < state.next_ns:
            return None
        state.next_ns += ((ts - state.next_ns) // self.period_ns + 1) * self.period_ns
        try:
            return PlanRequest(session_id, obs.features, ts, state.previous)
        except ValueError as err:  # wrong-length features: the executor refuses the observation itself
            self.fail(err)
            return None

    def accept(self, obs: Observation, plan: Plan) -> None:
        """Condition the executor from this observation's timestamp on (the request's time), for as
        long as the planner says the plan is valid."""
        self.counts["plans"] += 1
        self._sessions.setdefault(plan.session_id, _LockstepSession()).previous = plan
        self._summaries.add(plan)
        obs.plan_id, obs.plan_values = plan.plan_id, plan.values()
        obs.plan_created_ns, obs.plan_valid_for_ns = 0, plan.valid_for_ns  # 0: the observation's timestamp

    def fail(self, err: BaseException, timeout: bool = False) -> None:
        # The old plan stays; once too old, the executor degrades with STALE_PLAN.
        self.counts["timeouts" if timeout else "errors"] += 1
        self.last_error = f"{type(err).__name__}: {err}"

    def plan_now(self, session_id: str, obs: Observation) -> None:
        """Synchronous: for the in-process closed loop (controller.demo.closed_loop.InProcessDecider)."""
        request = self.due(session_id, obs)
        if request is None:
            return
        try:
            plan = self.source.plan(request)
        except Exception as err:  # noqa: BLE001 - a raising source is counted, never fatal
            self.fail(err)
            return
        self.accept(obs, plan)

    def decorate(self, session_id: str, msg: pb.DecisionSnapshot) -> pb.DecisionSnapshot:
        return self._summaries.decorate(session_id, msg)

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._summaries.forget(session_id)
        forget = getattr(self.source, "forget", None)
        if callable(forget):  # per-session memory (e.g. a lane-change cooldown): replays start clean
            forget(session_id)
