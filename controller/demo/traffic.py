"""The simulator's vehicles driven by the model: any subset of a SimEnv's vehicles (the ego and traffic
cars, in every episode of its batch) handed to a dualloop server through one DriveAgents stream.

Each vehicle is an agent, a session of its own: it sees its own features (sim.vehicle_view for a
traffic car, the ego's sensors for the ego), is sent a plan every 200 ms (the ego the simulator
planner's; a traffic car: keep its lane at its driver's desired speed) and, as its actual action,
the command its previous step applied; the snapshot's applied controls are what it does next step.
Traffic cars take the acceleration only (sim.world.World.drive_traffic: they keep their lane, as
the simulator has no steering model for them); the ego takes acceleration and steering. A car past
`exit_s` leaves the group and drives on with the simulator's own driver; the others go on.
LOCKSTEP waits for every tick's snapshots (a seed gives one run); REALTIME steps on the wall
clock at the tick period and applies each agent's newest snapshot.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import grpc
import numpy as np

from dualloop.controller.contract.agents_client import AgentsStream, agent_open, observation
from dualloop.sim.env import PLAN_PERIOD_S, SimEnv
from dualloop.sim.schema import BEHAVIOURS, make_plan
from dualloop.sim.vehicle_view import VehicleSensors, overlapping, past_lane_end
from dualloop.sim.world import EGO
from dualloop.v2 import controller_pb2 as pb

DT_NS = 5_000_000
_CLOSE_S = 60.0  # how long close() waits for the server to end a REALTIME stream


@dataclass(frozen=True)
class Agent:
    row: int  # the episode (batch row)
    col: int  # the vehicle (world column; 0 is the ego)
    session_id: str


@dataclass
class TrafficRecord:
    """What a run did: counts, and (keep=True) every agent's observations and snapshots."""

    agents: int = 0
    ticks: int = 0
    snapshots: int = 0
    # the ticks the server ran for the agents: the highest tick index a snapshot carried, + 1 (every
    # agent opens with the stream, so they tick on the same indices)
    server_ticks: int = 0
    collisions_between_agents: int = 0  # pairs of agents whose bodies began to overlap
    collisions_with_others: int = 0  # an agent and a vehicle the simulator drives
    collisions_others: int = 0  # two vehicles the simulator drives
    off_road: int = 0  # agents past the end of their lane, or the ego off the paved width
    left: list[str] = field(default_factory=list)
    not_nominal: int = 0  # snapshots whose safety state was not NOMINAL
    lateness_us: list[float] = field(default_factory=list)  # REALTIME: the snapshots' lateness
    client_behind: int = 0  # REALTIME: steps that started after their wall-clock slot
    agent_snapshots_dropped: int = 0
    errors: list[str] = field(default_factory=list)
    # each collision between two agents: (sim time s, the car behind, the car ahead, their speeds m/s
    # and the safety states of their last snapshots)
    agent_collisions: list[tuple[float, str, str, float, float, str, str]] = field(default_factory=list)
    sent: dict[str, list[pb.Observation]] = field(default_factory=dict)
    received: dict[str, list[pb.DecisionSnapshot]] = field(default_factory=dict)
    commanded: dict[str, list[float]] = field(default_factory=dict)  # the accel each step handed the car


class _Command(NamedTuple):
    """What an agent's newest snapshot tells its car: the applied action and the safety state."""

    accel: float
    steer: float
    action_index: int
    safety_state: int


def agents_of(env: SimEnv, columns: Sequence[int] | None, prefix: str = "car") -> list[Agent]:
    """The agents of `columns` (None: every vehicle, the ego included) in every episode; session ids
    name the scenario, the episode's seed and the vehicle."""
    cols = list(range(env.world.m)) if columns is None else [int(c) for c in columns]
    bad = [c for c in cols if not 0 <= c < env.world.m]
    if bad:
        raise ValueError(f"vehicle columns are 0..{env.world.m - 1} (0 is the ego); got {bad}")
    return [
        Agent(b, c, f"{prefix}-{env.name}-{seed}-{'ego' if c == EGO else c}")
        for b, seed in enumerate(env.instance.seeds)
        for c in cols
    ]


class TrafficAgents:
    """One DriveAgents stream driving `agents` of `env`; step() is one simulator step (5 ms)."""

    def __init__(
        self,
        env: SimEnv,
        channel: grpc.Channel,
        agents: Sequence[Agent],
        clock: int = pb.CLOCK_MODE_LOCKSTEP,
        exit_s: float | None = None,
        keep: bool = False,
    ) -> None:
        if abs(env.world.dt * 1e9 - DT_NS) > 1.0:
            raise ValueError(f"the simulator steps {env.world.dt} s; agents are driven at {DT_NS / 1e9} s")
        self.env, self.world, self.clock, self.keep = env, env.world, clock, keep
        self.agents = {a.session_id: a for a in agents}
        traffic_cols = sorted({a.col for a in agents if a.col != EGO})
        self._col_index = {c: i for i, c in enumerate(traffic_cols)}
        self.sensors = VehicleSensors(self.world, env.instance.seeds, traffic_cols) if traffic_cols else None
        knots = self.world.road.curvature_knots.shape[1]
        self.exit_s = (knots - 1) * self.world.road.knot_spacing if exit_s is None else exit_s
        self._plan_every = max(1, int(round(PLAN_PERIOD_S / self.world.dt)))
        self.record = TrafficRecord(agents=len(self.agents))
        self._cmd = np.zeros((self.world.batch, self.world.m, 2))  # accel, steer in effect per vehicle
        self._index = np.full((self.world.batch, self.world.m), -1, np.int64)
        self._state = np.zeros((self.world.batch, self.world.m), np.int64)  # the last snapshot's safety state
        self._has_snapshot = np.zeros((self.world.batch, self.world.m), dtype=bool)
        self._overlap = overlapping(self.world)
        self._past_end = past_lane_end(self.world) | self.world.off_road[:, None]
        self._latest: dict[str, _Command] = {}
        self._lock = threading.Lock()
        self.stream = AgentsStream(channel, columns=True)  # read as columns: no message per agent
        # the actual action each observation carries is the command the car's previous step applied
        self.stream.send(join=[agent_open(sid, clock, actual_controls_are_commands=True) for sid in self.agents])
        opened = self.stream.recv()
        for err in opened.errors:
            self._drop(err.session_id, f"{err.session_id}: {_status_name(err.code)} {err.message}")
        self._reader: threading.Thread | None = None
        if clock == pb.CLOCK_MODE_REALTIME:
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()
        self._t0 = time.monotonic()

    # ---- the stream ----------------------------------------------------------------------------
    def _drop(self, session_id: str, why: str) -> None:
        agent = self.agents.pop(session_id, None)
        if agent is not None:
            self._has_snapshot[agent.row, agent.col] = False
        self.record.errors.append(why)

    def _take(self, response: pb.DriveAgentsResponse) -> None:
        for err in response.errors:
            self._drop(err.session_id, f"{err.session_id}: {_status_name(err.code)} {err.message}")
        self.record.agent_snapshots_dropped = max(self.record.agent_snapshots_dropped, response.agent_snapshots_dropped)
        cols = response.columns
        n = len(cols.session_id)
        if not n:
            return
        # each agent's applied controls: the first two of its run in the column (accel, steer)
        counts = cols.applied_controls_count
        starts = np.cumsum([0, *counts[:-1]]).tolist()
        controls = cols.applied_controls
        with self._lock:
            for i, sid in enumerate(cols.session_id):
                state, at = cols.safety_state[i], starts[i]
                steer = controls[at + 1] if counts[i] >= 2 else 0.0
                self._latest[sid] = _Command(controls[at], steer, cols.applied_index[i], state)
                self.record.not_nominal += state != pb.SAFETY_STATE_NOMINAL
            self.record.snapshots += n
            self.record.server_ticks = max(self.record.server_ticks, max(cols.tick) + 1)
            if self.clock == pb.CLOCK_MODE_REALTIME:
                self.record.lateness_us += cols.lateness_us
            if self.keep:
                for snap in self.stream.snapshots(response):
                    self.record.received.setdefault(snap.session_id, []).append(snap)

    def _read(self) -> None:
        try:
            for response in self.stream.responses():
                self._take(response)
        except grpc.RpcError as err:
            self.record.errors.append(f"stream: {err.code().name} {err.details()}")

    # ---- one step ------------------------------------------------------------------------------
    def _observations(self) -> dict[str, pb.Observation]:
        env, k = self.env, self.world.step_index
        ego_features, ego_plan = env.observe()
        traffic = self.sensors.observe() if self.sensors is not None else None
        plan_now = k % self._plan_every == 0
        lane_keep = make_plan(self.world.v0, 0.0, BEHAVIOURS.index("keep")) if plan_now else None
        out: dict[str, pb.Observation] = {}
        for sid, a in self.agents.items():
            if a.col == EGO:
                x, plan = ego_features[a.row], ego_plan[a.row]
            else:
                assert traffic is not None  # every traffic column has its sensors
                x = traffic[a.row, self._col_index[a.col]]
                plan = lane_keep[a.row, a.col] if lane_keep is not None else None
            obs = observation(
                k + 1,
                k * DT_NS,
                x.tolist(),
                plan_id=f"sim-{k // self._plan_every}" if plan_now else "",
                plan=plan.tolist() if plan_now and plan is not None else None,
                sent_time_ns=time.time_ns() if self.clock == pb.CLOCK_MODE_REALTIME else 0,
            )
            if self._has_snapshot[a.row, a.col]:  # the command its previous step applied (none before)
                obs.actual.action_index = int(self._index[a.row, a.col])
                obs.actual.controls.extend(np.float32(self._cmd[a.row, a.col]).tolist())
            out[sid] = obs
        return out

    def _leaving(self) -> list[str]:
        w = self.world
        gone = [sid for sid, a in self.agents.items() if w.s[a.row, a.col] > self.exit_s]
        for sid in gone:
            a = self.agents.pop(sid)
            self._has_snapshot[a.row, a.col] = False
            self.record.left.append(sid)
        return gone

    def _apply(self) -> None:
        with self._lock:
            latest, self._latest = self._latest, ({} if self.clock == pb.CLOCK_MODE_LOCKSTEP else self._latest)
        for sid, cmd in latest.items():
            a = self.agents.get(sid)
            if a is None:
                continue
            self._cmd[a.row, a.col] = (cmd.accel, cmd.steer if a.col == EGO else 0.0)
            self._index[a.row, a.col] = cmd.action_index
            self._state[a.row, a.col] = cmd.safety_state
            self._has_snapshot[a.row, a.col] = True
        driven = self._has_snapshot.copy()
        driven[:, EGO] = False
        self.world.drive_traffic(driven, self._cmd[..., 0])

    def decide(self) -> tuple[np.ndarray, np.ndarray]:
        """Observe, send every agent's observation and hand each driven car its snapshot's command;
        the ego's command (B,) each, accel and steer: its snapshot's, or the simulator expert's when
        the ego is not an agent or has no snapshot yet. The caller steps the simulator."""
        env, w = self.env, self.world
        self._count_collisions()  # what the last step did, however the simulator was stepped
        k = w.step_index
        if self.clock == pb.CLOCK_MODE_REALTIME:
            slack = self._t0 + k * DT_NS / 1e9 - time.monotonic()
            if slack > 0:
                time.sleep(slack)
            else:
                self.record.client_behind += 1
        leave = self._leaving()
        obs = self._observations()
        if self.keep:
            for sid, o in obs.items():
                self.record.sent.setdefault(sid, []).append(o)
        self.stream.send(observations=obs, leave=leave)
        if self.clock == pb.CLOCK_MODE_LOCKSTEP:
            self._take(self.stream.recv())
        self._apply()
        ego_cmd = self._cmd[:, EGO]
        expert_accel, expert_steer = env.expert_action()
        ego_driven = self._has_snapshot[:, EGO]
        accel = np.where(ego_driven, ego_cmd[:, 0], expert_accel)
        steer = np.where(ego_driven, ego_cmd[:, 1], expert_steer)
        if self.keep:
            for sid, a in self.agents.items():
                applied = accel[a.row] if a.col == EGO else w.driven_command[a.row, a.col]
                driven = self._has_snapshot[a.row, a.col]
                self.record.commanded.setdefault(sid, []).append(float(applied) if driven else np.nan)
        self.record.ticks += 1
        return accel, steer

    def step(self) -> None:
        """One simulator step with every agent driven by its snapshot."""
        self.env.step(*self.decide())
        self._count_collisions()

    def _count_collisions(self) -> None:
        w = self.world
        overlap = overlapping(w)
        new = overlap & ~self._overlap
        self._overlap = overlap
        is_agent = np.zeros((w.batch, w.m), dtype=bool)
        for a in self.agents.values():
            is_agent[a.row, a.col] = True
        if new.any():
            both = is_agent[:, :, None] & is_agent[:, None, :]
            one = is_agent[:, :, None] ^ is_agent[:, None, :]
            self.record.collisions_between_agents += int((new & both).sum())
            self._note(np.argwhere(new & both))
            self.record.collisions_with_others += int((new & one).sum())
            self.record.collisions_others += int((new & ~both & ~one).sum())
        off = past_lane_end(w)
        off[:, EGO] |= w.off_road
        self.record.off_road += int((off & ~self._past_end & is_agent).sum())
        self._past_end = off

    def _note(self, pairs: np.ndarray) -> None:
        w = self.world
        ids = {(a.row, a.col): sid for sid, a in self.agents.items()}
        for b, i, j in pairs:
            back, front = (i, j) if w.s[b, i] <= w.s[b, j] else (j, i)
            self.record.agent_collisions.append(
                (
                    round(w.t, 3),
                    ids[b, back],
                    ids[b, front],
                    round(float(w.v[b, back]), 2),
                    round(float(w.v[b, front]), 2),
                    pb.SafetyState.Name(int(self._state[b, back])),
                    pb.SafetyState.Name(int(self._state[b, front])),
                )
            )

    def close(self) -> TrafficRecord:
        """Half-close the stream: the server closes every agent; the record of the run."""
        self._count_collisions()
        self.stream.close()
        if self._reader is not None:
            # the server ends the stream once it has closed every agent: until then their sessions count
            # against its limits, and a stream opened next with the same ids would be refused
            self._reader.join(_CLOSE_S)
            if self._reader.is_alive():
                self.stream.cancel()
                self.record.errors.append(f"stream: not ended {_CLOSE_S:.0f} s after the client closed it; cancelled")
        else:
            for response in self.stream.responses():
                self._take(response)
        return self.record


class ModelTraffic:
    """A gymnasium env's hook (HighwayEnv or HighwayVectorEnv `before_step`): the traffic cars
    `columns` (None: every one) of every sub-environment driven by the model through one DriveAgents
    stream, a new stream for each reset's episodes; the env's actions drive the ego.

        env = HighwayVectorEnv(8, "dense_traffic")
        env.before_step = traffic = ModelTraffic(channel)
        ...
        records = traffic.close()
    """

    def __init__(
        self,
        channel: grpc.Channel,
        columns: Sequence[int] | None = None,
        clock: int = pb.CLOCK_MODE_LOCKSTEP,
        exit_s: float | None = None,
    ) -> None:
        if columns is not None and EGO in columns:
            raise ValueError("the env's actions drive the ego: columns are traffic cars (1 and up)")
        self.channel, self.columns, self.clock, self.exit_s = channel, columns, clock, exit_s
        self.group: TrafficAgents | None = None
        self.records: list[TrafficRecord] = []

    def __call__(self, sim: SimEnv) -> None:
        if self.group is None or self.group.env is not sim:  # a reset built a new batch
            self._end_group()
            cols = range(1, sim.world.m) if self.columns is None else self.columns
            self.group = TrafficAgents(sim, self.channel, agents_of(sim, cols), self.clock, self.exit_s)
        self.group.decide()

    def _end_group(self) -> None:
        if self.group is not None:
            self.records.append(self.group.close())
            self.group = None

    def close(self) -> list[TrafficRecord]:
        """End the stream; the record of each reset's episodes."""
        self._end_group()
        return self.records


def _status_name(value: int) -> str:
    return next((c.name for c in grpc.StatusCode if c.value[0] == value), str(value))


def run_traffic(
    env: SimEnv,
    channel: grpc.Channel,
    columns: Sequence[int] | None = None,
    clock: int = pb.CLOCK_MODE_LOCKSTEP,
    steps: int | None = None,
    exit_s: float | None = None,
    keep: bool = False,
) -> TrafficRecord:
    """Drive `env` (its every vehicle, or `columns`) until it is done or for `steps` steps."""
    group = TrafficAgents(env, channel, agents_of(env, columns), clock, exit_s, keep)
    try:
        n = env.n_steps if steps is None else min(steps, env.n_steps)
        while env.world.step_index < n and not env.done:
            group.step()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM, maybe inside a read: the call can only be cancelled
        group.stream.cancel()
        raise
    except BaseException:
        group.close()
        raise
    return group.close()
