"""dualloop as an alpasim driver, driven end to end by carla-driver-interface's FakeLoop (extra
`alpasim`): real gRPC on loopback, the real executor with models/base.onnx and its gates."""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from carla_driver_interface.geometry import Pose, Trajectory
from carla_driver_interface.protocol import (
    DriveRequest,
    DriveSessionCloseRequest,
    DriveSessionRequest,
    DynamicState,
    EgodriverServiceStub,
    RolloutEgoTrajectory,
    Route,
    RouteRequest,
    Vec3,
    channel_options,
    unpack_debug_info,
)
from carla_driver_interface.testing import FakeCamera, FakeLoop

from dualloop.controller.alpasim.driver import DualloopDriver, build_server
from dualloop.controller.server_process import ServerProcess
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.sim.schema import ACCEL_MAX, ACCEL_MIN, STEER_MAX, STEER_MIN
from dualloop.v2 import controller_pb2 as pb

STEP_S = 0.1
# the route-derived features and the speed: what FakeLoop's messages measure
PROVIDED = ("ego_speed", "lane_offset", "heading_error", "road_curvature")
# FakeLoop renders every camera each step; a tiny one keeps the loop about the driver, not numpy
CAMERA = FakeCamera(width=32, height=18)


@pytest.fixture()
def driver(base_model, base_gates):
    return DualloopDriver(Executor(base_model, None, base_gates))


@pytest.fixture()
def address(driver):
    server, port = build_server(driver, "127.0.0.1", 0)
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None).wait()


def test_fake_loop_drives_dualloop_and_the_car_does_what_the_decisions_say(driver, address):
    steps = 40
    with FakeLoop(address, [CAMERA], step_s=STEP_S, initial_speed_mps=20.0, initial_lateral_offset_m=0.3) as loop:
        result = loop.run(steps, seed=7)
    assert result.steps == steps and not result.terminated_by_policy
    assert driver.sessions == 0  # close_session closed the executor's session
    scalars = [dict(d.scalars) for d in result.debug]
    assert all(d.policy_name == "dualloop" for d in result.debug)
    for k, s in enumerate(scalars):
        # one fresh observation per step, every 5 ms tick up to it: 20 ticks per 100 ms step
        assert s["fresh_observation"] == 1.0 and s["observation_seq"] == k + 1
        assert s["tick"] == 20 * k
        assert s["features_provided"] == len(PROVIDED)
        assert all(f"feature.{n}" in s for n in PROVIDED)
        accel, steer = s["applied_accel"], s["applied_steer"]
        assert math.isfinite(accel) and ACCEL_MIN <= accel <= ACCEL_MAX
        assert math.isfinite(steer) and STEER_MIN <= steer <= STEER_MAX
        # the features are the loop's state: speed as measured, the start lane's centre at y = 0
        assert s["feature.ego_speed"] == pytest.approx(result.speeds_mps[k], abs=1e-6)
        assert s["feature.lane_offset"] == pytest.approx(result.lateral_offsets_m[k], abs=1e-6)
        assert s["feature.heading_error"] == pytest.approx(result.ego.poses[k].yaw, abs=1e-6)
        assert s["feature.road_curvature"] == pytest.approx(0.0, abs=1e-6)  # a straight road
    # the mapping: the applied accel held for a step moves the car by (v + a dt / 2) dt, which
    # FakeLoop reads back as its next speed (it follows the plan exactly); a stop is a stop
    for k in range(steps - 1):
        v, a = result.speeds_mps[k], scalars[k]["applied_accel"]
        expected = v + a * STEP_S / 2 if v + a * STEP_S >= 0 else v * v / (-2 * a) / STEP_S
        assert result.speeds_mps[k + 1] == pytest.approx(expected, abs=2e-3)
    # and the applied steer turns the car by v tan(steer) / L over the step (about the rear axle)
    yaw = [p.yaw for p in result.ego.poses]
    for k in range(steps - 1):
        v0, a = result.speeds_mps[k], scalars[k]["applied_accel"]
        dist = result.speeds_mps[k + 1] * STEP_S
        turn = dist * math.tan(scalars[k]["applied_steer"]) / driver.wheelbase_m
        assert yaw[k + 1] - yaw[k] == pytest.approx(turn, abs=1e-4), (k, v0, a)
    # the model drives: not every decision is the same (it reacts to the offset it started with)
    assert len({round(s["applied_steer"], 4) for s in scalars}) > 1


def test_same_seed_same_run(driver, address):
    """LOCKSTEP: sensor time drives the executor, so two runs decide the same to the bit."""
    runs = []
    for _ in range(2):
        with FakeLoop(address, [CAMERA], step_s=STEP_S, initial_speed_mps=15.0) as loop:
            runs.append(loop.run(10, seed=3))
    a, b = ([(s["applied_accel"], s["applied_steer"]) for s in (dict(d.scalars) for d in r.debug)] for r in runs)
    assert a == b
    np.testing.assert_array_equal(runs[0].ego.positions, runs[1].ego.positions)


def test_concurrent_rollouts_decide_as_they_would_alone(driver, address):
    """The server's handler threads share one executor; each rollout is its own LOCKSTEP session, so
    two at once give exactly what each gives alone."""

    def rollout(speed: float) -> list[tuple[float, float]]:
        with FakeLoop(address, [CAMERA], step_s=STEP_S, initial_speed_mps=speed, initial_lateral_offset_m=0.2) as loop:
            result = loop.run(15, seed=5)
        return [(d.scalars["applied_accel"], d.scalars["applied_steer"]) for d in result.debug]

    alone = [rollout(12.0), rollout(25.0)]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(rollout, (12.0, 25.0)))
    assert together == alone
    assert alone[0] != alone[1]
    assert driver.sessions == 0


def _egomotion(session: str, t_us: int, speed: float | None) -> RolloutEgoTrajectory:
    msg = RolloutEgoTrajectory(session_uuid=session)
    msg.trajectory.CopyFrom(Trajectory([t_us], [Pose.from_xyz_yaw(0.0, 0.0, 0.0, 0.0)]).to_proto())
    if speed is not None:
        msg.dynamic_states.append(DynamicState(linear_velocity=Vec3(x=speed)))
    return msg


@pytest.fixture()
def stub(address):
    with grpc.insecure_channel(address, options=channel_options()) as channel:
        yield EgodriverServiceStub(channel)


def _open(stub: EgodriverServiceStub) -> str:
    session = str(uuid.uuid4())
    stub.start_session(DriveSessionRequest(session_uuid=session, random_seed=1), timeout=10)
    return session


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_bad_inputs_get_a_status_naming_the_field(stub, driver):
    session = _open(stub)
    code, details = _code(lambda: stub.submit_egomotion_observation(_egomotion(session, 0, math.nan), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "dynamic_states[0].linear_velocity" in details
    route = Route(timestamp_us=0, waypoints=[Vec3(x=0.0), Vec3(x=math.inf), Vec3(x=4.0)])
    code, details = _code(lambda: stub.submit_route(RouteRequest(session_uuid=session, route=route), timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "waypoints[1]" in details
    drive = DriveRequest(session_uuid=session, time_now_us=0, time_query_us=0)
    code, details = _code(lambda: stub.drive(drive, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "time_query_us" in details
    # egomotion without dynamic states: no speed to plan from
    stub.submit_egomotion_observation(_egomotion(session, 0, None), timeout=10)
    drive = DriveRequest(session_uuid=session, time_now_us=0, time_query_us=100_000)
    code, details = _code(lambda: stub.drive(drive, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "linear_velocity is required" in details
    stub.close_session(DriveSessionCloseRequest(session_uuid=session), timeout=10)
    code, details = _code(lambda: stub.drive(DriveRequest(session_uuid="nope", time_query_us=1), timeout=10))
    assert code == grpc.StatusCode.NOT_FOUND and "nope" in details
    assert driver.sessions == 0


def test_a_rollout_beyond_max_sessions_is_refused_at_start(base_model):
    driver = DualloopDriver(Executor(base_model, ExecutorConfig(max_sessions=1)))
    server, port = build_server(driver, "127.0.0.1", 0)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=channel_options()) as channel:
            stub = EgodriverServiceStub(channel)
            first = _open(stub)
            code, details = _code(lambda: _open(stub))
            assert code == grpc.StatusCode.FAILED_PRECONDITION and "max_sessions" in details
            stub.close_session(DriveSessionCloseRequest(session_uuid=first), timeout=10)
            _open(stub)  # room again
    finally:
        server.stop(grace=None).wait()


def test_a_sensor_that_drops_out_is_invalid_input_not_a_guess(stub):
    """The profile is fixed by the first drive; a later step without the route leaves the route's
    features NaN, which the executor reports (INVALID_INPUT) instead of deciding on made-up values."""
    session = _open(stub)
    stub.submit_egomotion_observation(_egomotion(session, 0, 10.0), timeout=10)
    ahead = [Vec3(x=float(x)) for x in range(0, 60, 2)]
    stub.submit_route(RouteRequest(session_uuid=session, route=Route(timestamp_us=0, waypoints=ahead)), timeout=10)
    first = stub.drive(DriveRequest(session_uuid=session, time_now_us=0, time_query_us=100_000), timeout=10)
    stub.submit_route(RouteRequest(session_uuid=session, route=Route(timestamp_us=100_000)), timeout=10)
    stub.submit_egomotion_observation(_egomotion(session, 100_000, 10.0), timeout=10)
    second = stub.drive(DriveRequest(session_uuid=session, time_now_us=100_000, time_query_us=200_000), timeout=10)
    stub.close_session(DriveSessionCloseRequest(session_uuid=session), timeout=10)
    s1, s2 = (_scalars(r) for r in (first, second))
    assert "reason.INVALID_INPUT" not in s1 and s1["features_provided"] == 4
    assert s2["reason.INVALID_INPUT"] == 1.0 and math.isnan(s2["feature.lane_offset"])
    assert s1["safety_state"] == pb.SAFETY_STATE_NOMINAL and s2["safety_state"] == pb.SAFETY_STATE_VETO_HOLD
    assert len(second.trajectory.poses) > 1  # still a plan: the safety machine's held action


def test_a_reversing_car_is_vetoed_and_answered_with_a_stop(stub):
    """linear_velocity.x = -20 is the car reversing at 20 m/s: outside the shipped gates' speed range,
    so OOD_VETO from the first step, then the fallback's braking, and every plan stands still where
    the car is. Read as +20 m/s (hypot), it was NOMINAL with the +20 m/s plan: 58.7 m forward."""
    forward = _open(stub)
    stub.submit_egomotion_observation(_egomotion(forward, 0, 20.0), timeout=10)
    ahead = stub.drive(DriveRequest(session_uuid=forward, time_now_us=0, time_query_us=100_000), timeout=10)
    stub.close_session(DriveSessionCloseRequest(session_uuid=forward), timeout=10)
    assert _scalars(ahead)["safety_state"] == pb.SAFETY_STATE_NOMINAL and ahead.trajectory.poses[-1].pose.vec.x > 50
    session = _open(stub)
    answers = []
    for k in range(30):  # 3 s of 100 ms steps
        stub.submit_egomotion_observation(_egomotion(session, k * 100_000, -20.0), timeout=10)
        drive = DriveRequest(session_uuid=session, time_now_us=k * 100_000, time_query_us=(k + 1) * 100_000)
        answers.append(stub.drive(drive, timeout=10))
    stub.close_session(DriveSessionCloseRequest(session_uuid=session), timeout=10)
    scalars = [_scalars(r) for r in answers]
    assert all(s["feature.ego_speed"] == -20.0 for s in scalars)
    assert all(s["reason.OOD_VETO"] == 1.0 and s["safety_state"] != pb.SAFETY_STATE_NOMINAL for s in scalars)
    assert scalars[-1]["safety_state"] == pb.SAFETY_STATE_FALLBACK_ACTIVE and scalars[-1]["applied_accel"] < 0
    for r in answers:
        assert len(r.trajectory.poses) > 1
        assert all(abs(p.pose.vec.x) < 1e-6 and abs(p.pose.vec.y) < 1e-6 for p in r.trajectory.poses)


def _scalars(response) -> dict[str, float]:
    debug = unpack_debug_info(response.debug_info.unstructured_debug_info)
    assert debug is not None, "the debug payload is a CarlaDriveDebugInfo protobuf (never a pickle)"
    return dict(debug.scalars)


def test_only_loopback_or_a_unix_socket(driver):
    for host in ("0.0.0.0", "::", "192.168.1.10"):
        with pytest.raises(ValueError, match="no TLS"):
            build_server(driver, host, 0)


@pytest.mark.slow
def test_the_command_serves_on_loopback_until_sigterm():
    server = ServerProcess(command="alpasim")
    try:
        assert f"serving egodriver.EgodriverService on {server.address}" in server.stdout_text()
        with FakeLoop(server.address, [CAMERA], step_s=STEP_S, initial_speed_mps=10.0) as loop:
            assert loop.run(5).steps == 5
        assert server.stop(timeout_s=30, sig=signal.SIGTERM) == 0 and server.stopped_in_time
    finally:
        server.stop()


def test_the_command_refuses_a_non_loopback_host():
    proc = subprocess.run(
        [sys.executable, "-m", "dualloop", "alpasim", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "no TLS" in proc.stderr + proc.stdout
