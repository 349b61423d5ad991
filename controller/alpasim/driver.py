"""dualloop as an alpasim driver: carla-driver-interface's egodriver server around dualloop's executor.

Each egodriver session is one LOCKSTEP session of the executor in this process (the
`InProcessDecider` the demo drives the simulator with). At every `drive` call the newest egomotion
becomes an observation at its own timestamp (sensor time), the executor runs every 5 ms tick up to
it, and the last tick's applied action, held over the horizon, is the plan sent back
(`mapping.plan_from_controls`). The session's sensor profile is what its first drive's messages
measure (`mapping.measured_features`); the runtime's step (time_query_us - time_now_us) is its
declared observation period.

The server is carla-driver-interface's `EgodriverServicer` in its "carla" mode, which answers its
debug payload as a protobuf (`CarlaDriveDebugInfo`): its "alpasim" mode answers a pickle, and
nothing dualloop puts on the wire is a pickle. The subclass here only adds the checks that turn bad
input into an INVALID_ARGUMENT naming the field, before the package's bookkeeping stores it.
"""

from __future__ import annotations

import math
import os
import socket
import stat
import threading
from concurrent import futures
from dataclasses import dataclass

import grpc
import numpy as np
from carla_driver_interface.driver import BaseDriver, DriveContext, DriveResult, SessionState
from carla_driver_interface.geometry import Pose, Trajectory
from carla_driver_interface.protocol import (
    DriveRequest,
    DriveResponse,
    Empty,
    RolloutEgoTrajectory,
    RouteRequest,
    add_CarlaVehicleServiceServicer_to_server,
    add_EgodriverServiceServicer_to_server,
    channel_options,
)
from carla_driver_interface.service import EgodriverServicer

from dualloop.controller.alpasim.mapping import (
    EgodriverInputError,
    feature_vector,
    measured_features,
    plan_from_controls,
)
from dualloop.controller.contract.addresses import bare_host, host_port, is_loopback
from dualloop.controller.demo.closed_loop import InProcessDecider
from dualloop.executor.core import Executor
from dualloop.executor.sessions import InvalidObservation, SessionError
from dualloop.v2 import controller_pb2 as pb

# the plan sent back: long enough for a tracking controller to see where the held action leads,
# short next to how soon the runtime asks again (every step, 100 ms in alpasim's default config)
HORIZON_S = 3.0
POINT_PERIOD_S = 0.1
# the longest plan served: the held action extrapolated further says nothing the runtime could use
# (it asks again every step), and each answer's cost grows with it (an hour's plan took longer than
# the runtime's 20 s drive deadline, and held a handler thread past SIGTERM)
MAX_HORIZON_S = 10.0
# how long to wait for a server already on a unix socket to answer (it answers at once when it is live)
UNIX_PROBE_TIMEOUT_S = 2.0
# the wheelbase the model's steer angle means when the executor's configuration names none
DEFAULT_WHEELBASE_M = 2.7


@dataclass
class _Run:
    """One egodriver session's executor session."""

    decider: InProcessDecider
    provided: tuple[str, ...]
    seq: int = 0
    last_ts_ns: int | None = None
    snapshot: pb.DecisionSnapshot | None = None
    # the command the car was executing at the next observation: the last plan's held action
    actual: tuple[int, np.ndarray] | None = None


class DualloopDriver(BaseDriver):
    """A carla-driver-interface policy whose decisions are dualloop's executor's."""

    name = "dualloop"

    def __init__(self, executor: Executor, horizon_s: float = HORIZON_S, point_period_s: float = POINT_PERIOD_S):
        if not (0 < horizon_s <= MAX_HORIZON_S and point_period_s > 0):
            raise ValueError(
                f"horizon_s ({horizon_s}) must be > 0 and at most {MAX_HORIZON_S}, "
                f"point_period_s ({point_period_s}) > 0"
            )
        self.executor = executor
        self.horizon_s = horizon_s
        self.point_period_s = point_period_s
        lk = executor.config.safety.lane_keeping
        self.wheelbase_m = lk.wheelbase_m if lk is not None else DEFAULT_WHEELBASE_M
        self.feature_names = tuple(executor.card.feature_names)
        # the executor is single-threaded; the gRPC server's handler threads take turns
        self._lock = threading.Lock()
        self._runs: dict[str, _Run] = {}
        # rollouts started whose executor session opens at their first drive (its sensor profile is
        # what that drive measures): counted against max_sessions from the start
        self._started: set[str] = set()

    @property
    def sessions(self) -> int:
        return len(self._runs)

    def on_session_start(self, session: SessionState) -> None:
        """Refuse a rollout the executor has no room for now, not at its first drive (the servicer
        answers FAILED_PRECONDITION with this message)."""
        with self._lock:
            limit = self.executor.config.max_sessions
            if len(self._started) >= limit:
                raise SessionError(f"{limit} rollouts are open, the executor's max_sessions; close one first")
            self._started.add(session.uuid)

    def on_session_close(self, session: SessionState) -> None:
        with self._lock:
            self._started.discard(session.uuid)
            run = self._runs.pop(session.uuid, None)
            if run is not None:
                run.decider.close()

    def _open(self, uuid: str, measured: dict[str, float], step_us: int) -> _Run:
        provided = tuple(n for n in self.feature_names if n in measured)
        decider = InProcessDecider(
            self.executor, uuid, provided_features=provided, observation_period_ns=step_us * 1000
        )
        run = self._runs[uuid] = _Run(decider, provided)
        return run

    def drive(self, ctx: DriveContext) -> DriveResult:
        session = ctx.session
        with session.lock:
            stamps = session.ego_trajectory.timestamps_us
            pose_us = stamps[-1] if stamps else None
            state = session.latest_dynamic_state()
            route = session.route_waypoints_in_rig.copy()
        if pose_us is None:
            # nothing observed yet: the servicer answers an empty plan, the runtime's "hold"
            return DriveResult(trajectory_in_rig=Trajectory.empty(), debug_scalars={"observed": 0.0})
        measured = measured_features(state, route)
        if "ego_speed" not in measured:
            raise EgodriverInputError(
                "RolloutEgoTrajectory.dynamic_states[].linear_velocity is required: the plan starts "
                "from the ego's speed"
            )
        ts_ns = pose_us * 1000
        with self._lock:
            run = self._runs.get(session.uuid)
            if run is None:
                run = self._open(session.uuid, measured, ctx.time_query_us - ctx.time_now_us)
            # no newer egomotion since the last drive: that decision stands (LOCKSTEP time only
            # moves with observations)
            fresh = run.last_ts_ns is None or ts_ns > run.last_ts_ns
            if fresh:
                x = feature_vector(self.feature_names, run.provided, measured)
                snap = run.decider.decide(run.seq + 1, ts_ns, x, "", None, actual=run.actual)
                run.seq += 1
                run.last_ts_ns = ts_ns
                if snap is not None:  # None: no tick since the previous observation (both in one 5 ms)
                    run.snapshot = snap
            snap = run.snapshot
        if snap is None:
            return DriveResult(trajectory_in_rig=Trajectory.empty(), debug_scalars={"observed": 1.0})
        accel, steer = float(snap.applied.controls[0]), float(snap.applied.controls[1])
        with self._lock:
            run.actual = (snap.applied.index, np.array([accel, steer], np.float32))
        plan = Trajectory.empty()
        for p in plan_from_controls(
            accel, steer, measured["ego_speed"], self.horizon_s, self.point_period_s, self.wheelbase_m
        ):
            plan.append(ctx.time_now_us + p.dt_us, Pose.from_xyz_yaw(p.x, p.y, 0.0, p.yaw))
        return DriveResult(trajectory_in_rig=plan, debug_scalars=debug_scalars(snap, run.provided, measured, fresh))


def debug_scalars(
    snap: pb.DecisionSnapshot, provided: tuple[str, ...], measured: dict[str, float], fresh: bool
) -> dict[str, float]:
    """The decision in CarlaDriveDebugInfo.scalars (floats by name), for the runtime's logs."""
    out = {
        "observed": 1.0,
        "fresh_observation": float(fresh),
        "tick": float(snap.tick),
        "observation_seq": float(snap.observation_seq),
        "applied_index": float(snap.applied.index),
        "applied_accel": float(snap.applied.controls[0]),
        "applied_steer": float(snap.applied.controls[1]),
        "proposed_index": float(snap.proposed.action.index),
        "safety_state": float(snap.safety_state),
        "gate_score": float(snap.gate.score),
        "gate_threshold": float(snap.gate.threshold),
        "gate_veto": float(snap.gate.veto),
        "features_provided": float(len(provided)),
    }
    for code in snap.reasons:
        out[f"reason.{pb.ReasonCode.Name(code).removeprefix('REASON_CODE_')}"] = 1.0
    for name in provided:
        out[f"feature.{name}"] = measured.get(name, math.nan)
    return out


def _check_finite(context: grpc.ServicerContext, field: str, *values: float) -> None:
    if not all(math.isfinite(v) for v in values):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be finite, got {list(values)}")


class DualloopEgodriverServicer(EgodriverServicer):
    """carla-driver-interface's servicer ("carla" mode: no pickles) with dualloop's input checks."""

    def __init__(self, driver: DualloopDriver) -> None:
        super().__init__(driver, mode="carla")

    def submit_egomotion_observation(self, request: RolloutEgoTrajectory, context: grpc.ServicerContext) -> Empty:
        for i, p in enumerate(request.trajectory.poses):
            v, q = p.pose.vec, p.pose.quat
            where = f"RolloutEgoTrajectory.trajectory.poses[{i}].pose"
            _check_finite(context, where, v.x, v.y, v.z, q.w, q.x, q.y, q.z)
        for i, s in enumerate(request.dynamic_states):
            for name in ("linear_velocity", "linear_acceleration", "angular_velocity", "angular_acceleration"):
                vec = getattr(s, name)
                _check_finite(context, f"RolloutEgoTrajectory.dynamic_states[{i}].{name}", vec.x, vec.y, vec.z)
        return super().submit_egomotion_observation(request, context)

    def submit_route(self, request: RouteRequest, context: grpc.ServicerContext) -> Empty:
        for i, w in enumerate(request.route.waypoints):
            _check_finite(context, f"RouteRequest.route.waypoints[{i}]", w.x, w.y, w.z)
        return super().submit_route(request, context)

    def drive(self, request: DriveRequest, context: grpc.ServicerContext) -> DriveResponse:
        if request.time_query_us <= request.time_now_us:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"DriveRequest.time_query_us ({request.time_query_us}) must be after time_now_us "
                f"({request.time_now_us}): it is the time the runtime steps the car to",
            )
        try:
            return super().drive(request, context)
        except EgodriverInputError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"session {request.session_uuid}: {err}")
        except (InvalidObservation, SessionError) as err:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"session {request.session_uuid}: {err}")
        raise AssertionError("unreachable: context.abort raises")


def build_server(
    driver: DualloopDriver, host: str = "127.0.0.1", port: int = 0, max_workers: int = 4
) -> tuple[grpc.Server, int]:
    """A (not started) server for `driver` on loopback or a unix: socket; returns it and its port.
    carla-driver-interface serves the contract without TLS, as alpasim's runtime speaks it, so any
    other address is refused rather than exposing an unauthenticated driver."""
    unix = host.startswith(("unix:", "unix-abstract:"))
    if not (unix or is_loopback(host)):
        raise ValueError(
            f"--host {host}: the egodriver service has no TLS or authentication; serve it on loopback "
            "(127.0.0.1, ::1) or a unix: socket, and reach it through a tunnel or the runtime's own pod"
        )
    if not (unix or 0 <= port <= 65535):  # gRPC would bind the value modulo 65536 (70000: 4464)
        raise ValueError(f"--port {port}: must be 0..65535 (0: a free port)")
    # no SO_REUSEPORT (gRPC's default on Linux): a second driver on a port in use fails to bind,
    # instead of the kernel splitting the runtime's connections between the two
    options = [*channel_options(), ("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options)
    servicer = DualloopEgodriverServicer(driver)
    add_EgodriverServiceServicer_to_server(servicer, server)
    # the package's vehicle-command service (turn indicators): dualloop commands none (NO_COMMAND)
    add_CarlaVehicleServiceServicer_to_server(servicer, server)
    address = host if unix else host_port(host, port)
    # the flag the address came from, for the user to change
    flag = f"--host {host}" if unix else f"--port {port}"
    # said in one line, before gRPC logs its own
    if unix and (problem := _unix_socket_problem(host)) is not None:
        raise OSError(f"{flag}: could not bind the egodriver service ({problem})")
    if not unix and port and not _port_free(host, port):
        raise OSError(f"{flag}: could not bind the egodriver service to {address} (in use by another server)")
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:  # grpcio raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise OSError(f"{flag}: could not bind the egodriver service to {address}")
    return server, 0 if unix else bound


def _unix_socket_problem(host: str) -> str | None:
    """Why the unix: (or unix-abstract:) address `host` cannot be served now, or None. gRPC unlinks a
    socket file before binding its path, so a second driver would silently take a live one's path
    (and every new connection) while the first runs on unreachable: a socket something answers on
    is refused, one nothing answers on (left by a process that died) is replaced."""
    if host.startswith("unix-abstract:"):
        target = "\0" + host.removeprefix("unix-abstract:")
    else:
        rest = host.removeprefix("unix:")
        target = rest[2:] if rest.startswith("//") else rest  # unix:///abs/path is /abs/path
        folder = os.path.dirname(target) or "."
        if not os.path.isdir(folder):
            return f"the folder {folder} does not exist"
        if not os.path.exists(target):
            return None if os.access(folder, os.W_OK | os.X_OK) else f"no permission to create a file in {folder}"
        if not stat.S_ISSOCK(os.stat(target).st_mode):
            return f"{target} exists and is not a socket; choose another path"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(UNIX_PROBE_TIMEOUT_S)
        try:
            probe.connect(target)
        except (ConnectionRefusedError, FileNotFoundError):
            return None  # nobody listens: a stale socket file, or none
        except OSError as err:  # a listener too busy to accept counts as one, as does one we may not reach
            return f"could not tell whether a server listens on it ({err.strerror or 'timed out'}); choose another path"
    return "another server listens on it; stop it or choose another path"


def _port_free(host: str, port: int) -> bool:
    """Whether a listener could bind host:port now (SO_REUSEADDR as gRPC's: a closed connection's
    TIME_WAIT does not count, another listener does)."""
    bare = bare_host(host)
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("localhost" if bare.lower().startswith("localhost") else bare, port))
        except OSError:
            return False
    return True
