"""Drive a simulated scenario in closed loop with the controller deciding every 5 ms tick.

The controller is reached either over gRPC (`GrpcDecider`: a real Drive session, LOCKSTEP for
reproducible runs or REALTIME paced by the wall clock) or in-process (`InProcessDecider`: the same
Executor the server wraps, for fast batch runs). Either way the loop is the same: observe, send the
observation (and the simulator planner's plan, unless the controller has a planner of its own),
apply the snapshot's applied action, step. Each observation carries, as its actual action, the
command the simulator applied at the step before it (what the car was executing when the
observation was taken; none on the first), as a shadow-mode stack sends the vehicle's command.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Protocol, cast

import grpc
import numpy as np

from dualloop.controller.contract.client import DriveSession, realtime_channel
from dualloop.controller.contract.lockstep_planning import LockstepPlanning
from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.executor.core import Executor
from dualloop.executor.snapshot import Clock, Observation
from dualloop.sim.env import SimEnv, make_scenario
from dualloop.sim.metrics import EpisodeMetrics
from dualloop.sim.schema import BEHAVIOURS, PLAN_INDEX
from dualloop.v2 import controller_pb2 as pb

DT_NS = 5_000_000
PLAN_PERIOD_STEPS = 40  # the simulator's planner publishes a plan every 200 ms


# The action in effect when an observation was taken: (action index or -1, controls float32).
Actual = tuple[int, np.ndarray]


def session_id(scenario: str, seed: int) -> str:
    """The session a scenario drives over gRPC; it names the session's plot topic in a recording."""
    return f"{scenario}-{seed}"


class Decider(Protocol):
    def decide(
        self,
        seq: int,
        timestamp_ns: int,
        features: np.ndarray,
        plan_id: str,
        plan: np.ndarray | None,
        actual: Actual | None = None,
    ) -> pb.DecisionSnapshot | None: ...

    def close(self) -> None: ...

    @property
    def has_planner(self) -> bool: ...


class InProcessDecider:
    """The executor in this process, one LOCKSTEP session; with `planner`, planned exactly as the
    gRPC server plans a LOCKSTEP session (controller.contract.lockstep_planning.LockstepPlanning, in-line)."""

    def __init__(
        self,
        executor: Executor,
        session_id: str,
        planner: LockstepPlanning | None = None,
        provided_features: tuple[str, ...] | None = None,
        observation_period_ns: int = 0,
    ) -> None:
        """`provided_features`, `observation_period_ns`: the sensor profile and rate, as OpenSession's."""
        self.executor = executor
        self.session_id = session_id
        self.planner = planner
        # planned by the server's planner: its plans expiring is a fault (STALE_PLAN), as on the server
        executor.open_session(
            session_id,
            Clock.LOCKSTEP,
            expired_plan_is_stale=planner is not None,
            provided_features=provided_features,
            observation_period_ns=observation_period_ns,
        )

    @property
    def has_planner(self) -> bool:
        return self.planner is not None

    def decide(self, seq, timestamp_ns, features, plan_id, plan, actual=None):
        obs = Observation(seq=seq, timestamp_ns=timestamp_ns, features=features, plan_id=plan_id, plan_values=plan)
        if actual is not None:
            obs.actual_index, obs.actual_controls = actual
        if self.planner is not None:
            obs.plan_id, obs.plan_values = "", None
            self.planner.plan_now(self.session_id, obs)
        snaps = self.executor.advance_lockstep(self.session_id, obs)
        if not snaps:
            return None
        msg = snapshot_to_proto(snaps[-1])
        return self.planner.decorate(self.session_id, msg) if self.planner is not None else msg

    def close(self) -> None:
        self.executor.close_session(self.session_id)
        if self.planner is not None:
            self.planner.forget(self.session_id)


class GrpcDecider:
    """A Drive session over gRPC. LOCKSTEP: one snapshot per observation, waited for.
    REALTIME: snapshots arrive on the server's clock; the newest one received is applied."""

    def __init__(self, address: str, session_id: str, clock: int = pb.CLOCK_MODE_LOCKSTEP) -> None:
        self.clock = clock
        self._channel = realtime_channel(address) if clock == pb.CLOCK_MODE_REALTIME else grpc.insecure_channel(address)
        # the simulator's actual action is the command its previous step applied: the actuation check may judge it
        self.session = DriveSession(self._channel, session_id, clock, actual_controls_are_commands=True)
        self.planner = self.session.opened.model.planner  # non-empty: the server plans, we must not
        self._latest: pb.DecisionSnapshot | None = None
        self._reader: threading.Thread | None = None
        if clock == pb.CLOCK_MODE_REALTIME:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    @property
    def has_planner(self) -> bool:
        return bool(self.planner)

    def _read(self) -> None:
        try:
            for snap in self.session.snapshots():
                self._latest = snap
        except grpc.RpcError:
            pass

    def decide(self, seq, timestamp_ns, features, plan_id, plan, actual=None):
        self.session.send(
            seq,
            timestamp_ns,
            features.tolist(),
            plan_id=plan_id,
            plan=plan.tolist() if plan is not None else None,
            actual_index=None if actual is None else actual[0],
            actual_controls=() if actual is None else actual[1].tolist(),
        )
        if self.clock == pb.CLOCK_MODE_LOCKSTEP:
            return self.session.recv()
        return self._latest

    def close(self) -> None:
        self.session.close()
        if self._reader is not None:
            self._reader.join(2)
        else:
            for _ in self.session.snapshots():  # drain to the server's end of stream
                pass
        self._channel.close()


@dataclass
class ClosedLoopRun:
    scenario: str
    seed: int
    metrics: EpisodeMetrics
    t: np.ndarray  # (T,) seconds
    applied_index: np.ndarray  # (T,) the discrete decision applied (-1 before the first snapshot)
    applied_accel: np.ndarray
    applied_steer: np.ndarray
    safety_state: np.ndarray
    reasons: np.ndarray  # (T,) bit mask: 1 << ReasonCode
    gate_score: np.ndarray  # NaN where the snapshot carried no gate result
    lateness_us: np.ndarray
    tick_work_us: np.ndarray  # the executor's own stages for this tick (pre, forward, gate, post)
    round_trip_us: np.ndarray  # observation sent -> snapshot in hand, wall clock
    plan_ids: list[str] = field(default_factory=list)
    ood_onset_s: float = float("inf")
    # One entry per plan the controller used, in order: (source, behaviour, target lane offset m,
    # target speed m/s); from the snapshots for a server planner, from what was sent otherwise.
    plans: list[tuple[str, str, float, float]] = field(default_factory=list)

    @property
    def plan_sources(self) -> list[str]:
        return sorted({p[0] for p in self.plans})

    @property
    def plan_changes(self) -> int:
        """Plans whose behaviour or target lane differs from the previous plan's."""
        return sum(1 for a, b in zip(self.plans, self.plans[1:]) if (a[1], a[2]) != (b[1], b[2]))

    def speed_changes(self, min_delta: float = 2.0) -> int:
        return sum(1 for a, b in zip(self.plans, self.plans[1:]) if abs(a[3] - b[3]) >= min_delta)

    def ticks_with(self, reason: int) -> int:
        return int(((self.reasons >> reason) & 1).sum())

    @property
    def plan_updates(self) -> int:
        return len([p for p in self.plan_ids if p])


_BEHAVIOUR_SLOTS = [PLAN_INDEX[f"plan_{b}"] for b in BEHAVIOURS]


def _sent_plan(plan: np.ndarray) -> tuple[str, str, float, float]:
    behaviour = BEHAVIOURS[int(np.argmax(plan[_BEHAVIOUR_SLOTS]))]
    return (
        "sim",
        behaviour,
        round(float(plan[PLAN_INDEX["target_lane_offset"]]), 2),
        float(plan[PLAN_INDEX["target_speed"]]),
    )


def run_closed_loop(
    env: SimEnv, decider: Decider, seed: int, send_plan: bool | None = None, realtime: bool = False
) -> ClosedLoopRun:
    """Until the episode ends. With `realtime`, each step waits for its wall-clock slot.
    send_plan None: send the simulator's plans only when the controller has no planner."""
    if send_plan is None:
        send_plan = not getattr(decider, "has_planner", False)
    sent: dict[str, tuple[str, str, float, float]] = {}
    plans: list[tuple[str, str, float, float]] = []
    n = env.n_steps
    rec = {k: np.full(n, np.nan) for k in ("t", "accel", "steer", "gate", "late", "rtt", "work")}
    idx = np.full(n, -1, np.int64)
    state = np.zeros(n, np.int64)
    reasons = np.zeros(n, np.int64)
    plan_ids: list[str] = []
    accel, steer = 0.0, 0.0  # nothing applied before the first decision
    actual: Actual | None = None  # what the previous step applied
    t_wall0 = time.monotonic()
    k = 0
    while not env.done and k < n:
        features, plan = env.observe()
        plan_id, plan_values = "", None
        if send_plan and k % PLAN_PERIOD_STEPS == 0:
            plan_id, plan_values = f"sim-{k // PLAN_PERIOD_STEPS}", plan
            sent[plan_id] = _sent_plan(plan)
        if realtime:
            slack = t_wall0 + k * DT_NS / 1e9 - time.monotonic()
            if slack > 0:
                time.sleep(slack)
        t0 = time.perf_counter_ns()
        snap = decider.decide(k + 1, k * DT_NS, features, plan_id, plan_values, actual)
        rec["rtt"][k] = (time.perf_counter_ns() - t0) / 1e3
        if snap is not None:
            accel, steer = snap.applied.controls[0], snap.applied.controls[1]
            idx[k] = snap.applied.index
            state[k] = snap.safety_state
            reasons[k] = sum(1 << r for r in snap.reasons)
            rec["gate"][k] = snap.gate.score if snap.HasField("gate") else np.nan
            rec["late"][k] = snap.lateness_us
            t = snap.timings
            rec["work"][k] = t.preprocess_us + t.forward_us + t.gate_us + t.postprocess_us
            if not plan_ids or plan_ids[-1] != snap.plan_id:
                plan_ids.append(snap.plan_id)
                if snap.HasField("plan"):
                    p = snap.plan
                    plans.append((p.source, p.behaviour, round(p.target_lane_offset, 2), p.target_speed))
                elif snap.plan_id in sent:
                    plans.append(sent.pop(snap.plan_id))
        rec["t"][k] = env.t
        rec["accel"][k], rec["steer"][k] = accel, steer
        env.step(accel, steer)
        # float32, as the wire carries it: in-process and gRPC runs see the same command
        actual = (int(idx[k]), np.array([accel, steer], np.float32))
        k += 1
    decider.close()
    return ClosedLoopRun(
        scenario=env.name,
        seed=seed,
        metrics=cast(EpisodeMetrics, env.metrics()),  # one episode: make_scenario's env is squeezed
        t=rec["t"][:k],
        applied_index=idx[:k],
        applied_accel=rec["accel"][:k],
        applied_steer=rec["steer"][:k],
        safety_state=state[:k],
        reasons=reasons[:k],
        gate_score=rec["gate"][:k],
        lateness_us=rec["late"][:k],
        tick_work_us=rec["work"][:k],
        round_trip_us=rec["rtt"][:k],
        plan_ids=plan_ids,
        ood_onset_s=float(env.instance.ood_onset_s[0]),
        plans=plans,
    )


def drive_in_process(
    executor: Executor, scenario: str, seed: int, planner: LockstepPlanning | None = None, **params
) -> ClosedLoopRun:
    """planner: e.g. LockstepPlanning(BehaviourPlanner(), 200_000_000), as a server with one plans."""
    env = make_scenario(scenario, seed, **params)
    return run_closed_loop(env, InProcessDecider(executor, f"{scenario}-{seed}", planner), seed)


def drive_over_grpc(
    address: str, scenario: str, seed: int, clock: int = pb.CLOCK_MODE_LOCKSTEP, **params
) -> ClosedLoopRun:
    env = make_scenario(scenario, seed, **params)
    decider = GrpcDecider(address, session_id(scenario, seed), clock)
    return run_closed_loop(env, decider, seed, realtime=clock == pb.CLOCK_MODE_REALTIME)
