"""The server's planner: glue between a PlanSource and the executor's sessions.

REALTIME sessions are planned by a PlanScheduler (a worker process): the tick loop only calls
RealtimePlanning.on_tick, which asks for plans when a session's period has elapsed and applies the
plans that have finished, both non-blocking and spread over a few ticks. All sessions due at a
period boundary go to the worker as one batch, released at the boundary. LOCKSTEP sessions must stay deterministic,
so they are planned in-line at each period boundary of observation time (LockstepPlanning), by the
stream handler over gRPC or by controller.demo.closed_loop's InProcessDecider, with the same code either way.

A recorded session's plans go to its recording (PlanRecording): each plan the executor applied is a
PlanRecord on /dualloop/plan, and the session's next recorded observation carries it as its plan, the
form a replay reads, so that the recording replays with the plans the live session used.
"""

from __future__ import annotations

import asyncio
import functools
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from dualloop.controller.contract.lockstep_planning import KEEP_SUMMARIES, LockstepPlanning, PlanSummaries
from dualloop.controller.logs.recorder import Recorder
from dualloop.controller.serve.config import PlannerConfig
from dualloop.controller.serve.realtime_threads import lower_this_thread
from dualloop.executor.core import Executor
from dualloop.executor.sessions import Session
from dualloop.executor.snapshot import Clock, Observation
from dualloop.planner.behaviour import BehaviourPlanner
from dualloop.planner.onnx_planner import OnnxPlanner
from dualloop.planner.plan import Plan, PlanSource
from dualloop.planner.remote import RemotePlanner
from dualloop.planner.scheduler import PlanScheduler, SchedulerConfig
from dualloop.planner.tls import ClientTLS
from dualloop.planner.worker import SourceFactory
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

_NEVER = math.inf
# A batch's plans arrive together; applying them all in one tick made that tick's successor late
# (docs/design-notes/planner.md), so 8 a tick spreads a batch of 32 over 4 ticks (15 ms).
_APPLY_PER_TICK = 8
# Likewise the requests: each session's request goes out in one of the _SPREAD_TICKS ticks before
# its boundary (its observation up to 15 ms older), and the batch is released at the boundary.
_SPREAD_TICKS = 4


def make_source(
    source: str,
    path: str | None = None,
    address: str | None = None,
    deadline_s: float = 0.2,
    tls: ClientTLS | None = None,
) -> PlanSource:
    """Build a source by name; module level so that a partial of it can cross to a spawned worker."""
    if source == "behaviour":
        return BehaviourPlanner()
    if source == "onnx":
        return OnnxPlanner(str(path))
    if source == "remote":
        return RemotePlanner(str(address), deadline_s=deadline_s, tls=tls)
    raise ValueError(f"unknown planner source {source!r}")


def source_factory(cfg: PlannerConfig) -> SourceFactory:
    path = str(cfg.path) if cfg.path else None
    return functools.partial(make_source, cfg.source, path, cfg.address, cfg.deadline_s, cfg.tls)


def worker_deadline_s(cfg: PlannerConfig) -> float:
    """When a batch in flight is abandoned (its worker killed). A remote source gets slack past its
    own gRPC deadline, so that the call's DEADLINE_EXCEEDED (counted, worker kept) comes first and a
    kill is the last resort: the worker starts no new call after a third of this, and one more call
    then lasts at most 2/3 of it minus the slack (planner.scheduler.PlanScheduler.budget_s)."""
    return cfg.deadline_s * 1.5 + 0.02 if cfg.source == "remote" else cfg.deadline_s


@dataclass
class _Unrecorded:
    carry: pb.PlanUpdate | None = None  # the newest plan applied since the session's last recorded observation
    record: log_pb2.PlanRecord | None = None  # LOCKSTEP: written with its observation, once the executor took it


class PlanRecording:
    """The plans the server's planner applied to recorded sessions, for their recording.

    A replay reads plans only from the observations (Observation.plan), so the observation a session
    records next carries the newest plan applied since its previous one, as the executor used it
    (created at the timestamp of the observation it was planned from, valid for the planner's
    horizon), in place of any plan the client sent (the server ignores those). A LOCKSTEP plan applies
    at the observation it was planned before: the replay applies it at the same tick. A REALTIME plan
    applies on a tick between two observations: the replay applies it from the next one (the few
    ticks between are conditioned on the previous plan there), one reason a REALTIME recording does
    not replay tick for tick. Each applied plan is also a PlanRecord on /dualloop/plan, written where
    it applied: on its tick (REALTIME), just before its observation (LOCKSTEP)."""

    def __init__(self) -> None:
        self.recorder: Recorder | None = None
        self._sessions: dict[str, _Unrecorded] = {}  # the recorded sessions only: nothing kept for others

    def open(self, session_id: str, recorder: Recorder) -> None:
        self.recorder = recorder
        self._sessions[session_id] = _Unrecorded()

    def applied(
        self, session_id: str, plan: Plan, values: np.ndarray, created_ns: int, with_observation: bool = False
    ) -> None:
        """`plan` (its `values`, created at `created_ns` in sensor time) now conditions the session.
        with_observation: write its PlanRecord with the observation (LOCKSTEP), not now."""
        state = self._sessions.get(session_id)
        if state is None or self.recorder is None:
            return
        update = pb.PlanUpdate(
            plan_id=plan.plan_id, values=values.tolist(), valid_for_ns=plan.valid_for_ns, created_ns=created_ns
        )
        record = log_pb2.PlanRecord(session_id=session_id, created_time_ns=created_ns, plan=update, source=plan.source)
        state.carry = update
        if with_observation:
            state.record = record
        else:
            self.recorder.write_plan(record)

    def observation(self, session_id: str, msg: pb.Observation) -> pb.Observation:
        """The observation to record for `msg`: with the plan that applied since the previous one, without
        the client's plan. Never `msg` changed: it is what the client sent."""
        state = self._sessions.get(session_id)
        if state is None:
            return msg
        if state.record is not None and self.recorder is not None:
            self.recorder.write_plan(state.record)
            state.record = None
        carry, state.carry = state.carry, None
        if carry is None and not msg.HasField("plan"):
            return msg
        out = pb.Observation()
        out.CopyFrom(msg)
        out.ClearField("plan")
        if carry is not None:
            out.plan.CopyFrom(carry)
        return out

    def forget(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


class RealtimePlanning:
    """The tick loop's side of the PlanScheduler: request when due, apply what finished."""

    def __init__(
        self, executor: Executor, scheduler: PlanScheduler, period_ns: int, recording: PlanRecording | None = None
    ) -> None:
        self.executor = executor
        self.scheduler = scheduler
        self.period_ns = period_ns
        self.recording = recording
        self._due: dict[str, float] = {}  # next request time per session; inf: not ours (LOCKSTEP)
        self._slot: dict[str, int] = {}  # which of the _SPREAD_TICKS ticks before a boundary it asks in
        self._asked: set[str] = set()  # sessions that have had their first request
        self._opened = 0  # sessions seen, for the next one's slot
        self._earliest = 0.0
        self._release_at = _NEVER  # the boundary the requests made so far are sent at
        self._known = 0  # sessions at the last scan
        self._summaries = PlanSummaries()
        # per session: (request time, timestamp of the observation it planned from), oldest first;
        # a plan's age is sensor time, so it is created at its observation's timestamp
        self._requested: dict[str, list[tuple[int, int]]] = {}
        self.applied = 0
        # While paused no request is made or released; plans already asked for are still applied.
        # `dualloop bench planner` alternates busy and paused phases in one run, so that both see the
        # same machine noise.
        self.paused = False

    def on_tick(self, now_ns: int) -> None:
        """Cheap unless requests are due: one comparison, then one non-blocking poll."""
        ex = self.executor
        if not self.paused and (now_ns >= self._earliest or len(ex.sessions) != self._known):
            self._scan(now_ns)
        if now_ns >= self._release_at and not self.paused:
            self.scheduler.release()
            self._release_at = _NEVER
        for plan in self.scheduler.poll(_APPLY_PER_TICK):
            session = ex.sessions.get(plan.session_id)
            if session is None or session.clock is not Clock.REALTIME:
                continue
            values, created_ns = plan.values(), self._sensor_time(plan, session)
            changed = ex.set_plan(plan.session_id, values, plan.plan_id, created_ns, plan.valid_for_ns)
            if changed and self.recording is not None:
                self.recording.applied(plan.session_id, plan, values, created_ns)
            self._summaries.add(plan)
            self.applied += 1

    def _scan(self, now_ns: int) -> None:
        earliest = _NEVER
        for session_id, s in self.executor.sessions.items():
            due = self._due.get(session_id)
            if due is None:
                if s.clock is not Clock.REALTIME:
                    self._due[session_id] = _NEVER
                    continue
                self._slot[session_id] = self._opened % _SPREAD_TICKS
                self._opened += 1
                due = now_ns
            if now_ns >= due:
                obs = s.pending if s.pending is not None else s.current
                if obs is None:  # nothing to plan from yet: look again next tick
                    earliest = now_ns
                    continue
                self.scheduler.request(session_id, obs.features, now_ns)
                requested = self._requested.setdefault(session_id, [])
                requested.append((now_ns, obs.timestamp_ns))
                del requested[:-KEEP_SUMMARIES]  # unanswered requests (faults) are not kept
                # a session's first request goes out at once; later ones with the batch of the
                # boundary just ahead (they are made in the ticks before it)
                first = session_id not in self._asked
                self._asked.add(session_id)
                # the boundary it was asked for: the nearest one (the tick grid is not the period
                # grid, so the last few requests come a little after it)
                boundary = (now_ns + self.period_ns // 2) // self.period_ns * self.period_ns
                self._release_at = min(self._release_at, now_ns if first else boundary)
                due = self._next_boundary(now_ns) - self._slot[session_id] * self.executor.period_ns
                self._due[session_id] = due
            earliest = min(earliest, due)
        self._earliest = earliest
        self._known = len(self.executor.sessions)

    def _sensor_time(self, plan: Plan, session: Session) -> int:
        """The timestamp of the observation `plan` was made from (its request time is server time)."""
        requested = self._requested.get(plan.session_id, [])
        for k, (asked_ns, timestamp_ns) in enumerate(requested):
            if asked_ns == plan.created_ns:
                del requested[: k + 1]
                return timestamp_ns
        current = session.current or session.pending  # not asked by this loop: as of now
        return current.timestamp_ns if current is not None else 0

    def _next_boundary(self, now_ns: int) -> int:
        """The first multiple of the period on the monotonic clock at least half a period away.

        A session's first request goes out at once; after that every session is due at the same
        boundaries, so the scheduler sends all of them in one batch per period (one rollout)
        instead of one small batch for each tick some session happened to open in. The half period
        keeps a session that opened just before a boundary from asking again a tick later. A missed
        boundary is not made up for: the scheduler counts the overrun instead."""
        period = self.period_ns
        return -(-(now_ns + period // 2) // period) * period  # ceil to the grid

    def decorate(self, session_id: str, msg: pb.DecisionSnapshot) -> pb.DecisionSnapshot:
        return self._summaries.decorate(session_id, msg)

    def forget(self, session_id: str) -> None:
        self._due.pop(session_id, None)
        self._slot.pop(session_id, None)
        self._asked.discard(session_id)
        self._requested.pop(session_id, None)
        self._summaries.forget(session_id)
        self.scheduler.forget(session_id)  # its finished plans too: a new session may reuse the id
        self._earliest = 0.0  # rescan: another session may have taken this one's place


class ServerPlanning:
    """Both paths for one server, from its PlannerConfig (or a factory, for tests and custom sources)."""

    def __init__(self, cfg: PlannerConfig, executor: Executor, factory: SourceFactory | None = None) -> None:
        self.cfg = cfg
        self.factory = factory or source_factory(cfg)
        self.deadline_s = worker_deadline_s(cfg)
        self.scheduler = PlanScheduler(
            self.factory,
            SchedulerConfig(
                period_s=cfg.period_ms / 1e3,
                deadline_s=self.deadline_s,
                mode=cfg.worker,
                hold=True,
                idle_priority=None if cfg.idle_priority else False,
            ),
        )
        self.recording = PlanRecording()
        self.realtime = RealtimePlanning(executor, self.scheduler, cfg.period_ns, self.recording)
        self.lockstep: LockstepPlanning | None = None
        # LOCKSTEP plans run here, awaited by their stream: the loop (and REALTIME ticks) keeps going.
        self._pool = ThreadPoolExecutor(
            max_workers=4, thread_name_prefix="dualloop-lockstep-plan", initializer=lower_this_thread
        )
        self.name = ""

    def start(self) -> None:
        """Blocking (spawns the worker, builds the sources): call before the tick loop starts."""
        self.scheduler.start()
        self.lockstep = LockstepPlanning(self.factory(), self.cfg.period_ns)
        self.name = str(self.scheduler.stats()["source"] or getattr(self.lockstep.source, "name", self.cfg.source))

    def stop(self) -> None:
        self.scheduler.stop()
        self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.lockstep.source if self.lockstep else None, "close", None)
        if callable(close):
            close()

    async def plan_lockstep(self, session_id: str, obs: Observation) -> None:
        """Plan this LOCKSTEP observation if it reaches a period boundary; the result (or the
        fault, counted) is decided before the executor advances, so the run stays deterministic."""
        lock = self.lockstep
        assert lock is not None
        obs.plan_id, obs.plan_values = "", None  # the server's planner conditions this session
        request = lock.due(session_id, obs)
        if request is None:
            return
        loop = asyncio.get_running_loop()
        try:
            plan = await asyncio.wait_for(loop.run_in_executor(self._pool, lock.source.plan, request), self.deadline_s)
        except TimeoutError as err:
            lock.fail(err, timeout=True)
            return
        except Exception as err:  # noqa: BLE001 - the source's fault is counted, the session goes on
            lock.fail(err, timeout=type(err).__name__ == "PlanTimeout")
            return
        lock.accept(obs, plan)
        if obs.plan_values is not None:  # accept() conditioned the observation on the plan
            self.recording.applied(session_id, plan, obs.plan_values, obs.timestamp_ns, with_observation=True)

    def decorate(self, session_id: str, clock: int, msg: pb.DecisionSnapshot) -> pb.DecisionSnapshot:
        if clock == pb.CLOCK_MODE_LOCKSTEP:
            return self.lockstep.decorate(session_id, msg) if self.lockstep else msg
        return self.realtime.decorate(session_id, msg)

    def forget(self, session_id: str) -> None:
        self.realtime.forget(session_id)
        self.recording.forget(session_id)
        if self.lockstep is not None:
            self.lockstep.forget(session_id)

    def stats(self) -> dict[str, object]:
        out: dict[str, object] = {f"realtime_{k}": v for k, v in self.scheduler.stats().items()}
        out["realtime_applied"] = self.realtime.applied
        if self.lockstep is not None:
            out.update({f"lockstep_{k}": v for k, v in self.lockstep.counts.items()})
            out["lockstep_last_error"] = self.lockstep.last_error
        return out
