"""planner.proto, RemotePlanner and the reference server, over real gRPC on loopback."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dualloop.planner.behaviour import BehaviourPlanner
from dualloop.planner.plan import Plan, PlanRequest
from dualloop.planner.remote import PlanTimeout, RemotePlanner, RemotePlannerError, serve_planner
from dualloop.planner.scheduler import PlanScheduler, SchedulerConfig
from dualloop.planner.wire import (
    BEHAVIOUR_TO_WIRE,
    plan_from_pb,
    plan_to_pb,
    request_bytes,
    request_from_pb,
    request_to_pb,
)
from dualloop.sim.schema import BEHAVIOURS, FEATURE_INDEX, N_FEATURES, SENSOR_RANGE_M
from dualloop.v2 import planner_pb2 as pb
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


def features() -> np.ndarray:
    x = np.zeros(N_FEATURES, np.float32)
    x[FEATURE_INDEX["ego_speed"]] = 25.0
    x[FEATURE_INDEX["lead_present"]] = 1.0
    x[FEATURE_INDEX["lead_distance"]], x[FEATURE_INDEX["lead_rel_speed"]] = 30.0, -10.0
    for name in ("left_front_gap", "left_rear_gap", "right_front_gap", "right_rear_gap"):
        x[FEATURE_INDEX[name]] = SENSOR_RANGE_M
    x[FEATURE_INDEX["left_lane_exists"]] = 1.0
    return x


class BlockedSource:
    """Never answers until released (a planner that has wedged)."""

    name = "blocked"

    def __init__(self) -> None:
        self.release = threading.Event()

    def plan(self, request: PlanRequest) -> Plan:
        self.release.wait(30.0)
        raise RuntimeError("released")


class BrokenSource:
    name = "broken"

    def plan(self, request: PlanRequest) -> Plan:
        raise ValueError("model weights are NaN")


def test_stubs_match_planner_proto(tmp_path):
    from grpc_tools import protoc

    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={tmp_path}",
        f"--pyi_out={tmp_path}",
        f"--grpc_python_out={tmp_path}",
        "dualloop/v2/planner.proto",
    ]
    assert protoc.main(args) == 0
    for name in ("planner_pb2.py", "planner_pb2.pyi", "planner_pb2_grpc.py"):
        fresh = (tmp_path / "dualloop" / "v2" / name).read_text()
        assert fresh == (ROOT / "proto" / "dualloop" / "v2" / name).read_text(), f"{name} drifted from planner.proto"


def test_planner_proto_is_typed_and_covers_every_behaviour():
    from google.protobuf.descriptor import FieldDescriptor

    for message in pb.DESCRIPTOR.message_types_by_name.values():
        for field in message.fields:
            assert field.type != FieldDescriptor.TYPE_BYTES, f"{message.name}.{field.name}"
    assert pb.DESCRIPTOR.package == "dualloop.v2"
    assert sorted(BEHAVIOUR_TO_WIRE) == sorted(BEHAVIOURS)


def test_wire_round_trip():
    previous = Plan("p/1", "car", 5, 10**9, "x", "change_left", 22.5, 3.5)
    request = PlanRequest("car", features(), 200_000_005, previous)
    back = request_from_pb(pb.PlanRequest.FromString(request_to_pb(request).SerializeToString()))
    assert back.previous == previous and back.now_ns == request.now_ns
    np.testing.assert_array_equal(back.features, request.features)
    assert plan_from_pb(plan_to_pb(previous)) == previous
    with pytest.raises(ValueError, match="behaviour"):
        plan_from_pb(pb.PlanResponse(plan_id="bad", valid_for_ns=1))


def test_request_bytes_is_request_to_pb():
    """The scheduler's fast encoder gives the same message as the reference one."""
    previous = Plan("p/1", "car", 5, 10**9, "x", "change_left", 22.5, 3.5)
    for prev in (None, previous):
        request = PlanRequest("car", features(), 200_000_005, prev)
        fast = request_bytes(
            "car", request.features, request.now_ns, plan_to_pb(prev).SerializeToString() if prev else b""
        )
        assert pb.PlanRequest.FromString(fast) == request_to_pb(request)
        back = request_from_pb(pb.PlanRequest.FromString(fast))
        assert back.previous == prev and back.now_ns == request.now_ns
        np.testing.assert_array_equal(back.features, request.features)


def test_remote_planner_against_reference_server():
    with serve_planner(BehaviourPlanner(), port=0) as server:
        assert server.host == "127.0.0.1"
        remote = RemotePlanner(server.address, deadline_s=1.0)
        p = remote.plan(PlanRequest("car-1", features(), 42))
        assert (p.session_id, p.created_ns, p.behaviour) == ("car-1", 42, "change_left")
        p2 = remote.plan(PlanRequest("car-1", features(), 43, previous=p))
        assert p2.behaviour == "change_left"
        remote.close()


def test_remote_errors_are_clear():
    with serve_planner(BrokenSource(), port=0) as server:
        with pytest.raises(RemotePlannerError, match="model weights are NaN"):
            RemotePlanner(server.address, deadline_s=1.0).plan(PlanRequest("car-1", features(), 0))


def test_remote_planner_times_out_at_its_deadline():
    source = BlockedSource()
    server = serve_planner(source, port=0)
    try:
        remote = RemotePlanner(server.address, deadline_s=0.15)
        t0 = time.perf_counter()
        with pytest.raises(PlanTimeout, match="did not answer within 150 ms"):
            remote.plan(PlanRequest("car-1", features(), 0))
        elapsed = time.perf_counter() - t0
        # at the deadline, not at the source's release (never, here); room for a busy machine above it
        assert 0.14 <= elapsed < 1.0, elapsed
    finally:
        source.release.set()
        server.stop()


def test_serve_planner_refuses_non_loopback_by_default():
    with pytest.raises(ValueError, match="loopback"):
        serve_planner(BehaviourPlanner(), host="0.0.0.0")


def test_scheduler_with_remote_source_counts_remote_timeouts():
    source = BlockedSource()
    server = serve_planner(source, port=0)
    try:
        factory = functools.partial(RemotePlanner, server.address, 0.1)
        with PlanScheduler(factory, SchedulerConfig(deadline_s=1.0)) as sched:
            sched.request("car-1", features(), 0)
            give_up = time.monotonic() + 3.0
            while sched.stats()["timeouts"] < 1 and time.monotonic() < give_up:
                sched.poll()  # poll() is what moves the scheduler's work along
                time.sleep(0.01)
            stats = sched.stats()
            # The remote gave up at its own deadline: a timeout, and no need to replace the worker.
            assert stats["timeouts"] == 1 and stats["restarts"] == 0, stats
            assert "did not answer" in stats["last_error"]
    finally:
        source.release.set()
        server.stop()


def test_a_remote_that_times_out_costs_one_deadline_per_batch_not_one_per_session():
    source = BlockedSource()
    server = serve_planner(source, port=0, max_workers=8)
    try:
        factory = functools.partial(RemotePlanner, server.address, 0.1)
        with PlanScheduler(factory, SchedulerConfig(deadline_s=0.4)) as sched:
            for i in range(3):
                sched.request(f"car-{i}", features(), 0)
            give_up = time.monotonic() + 3.0
            while sched.stats()["timeouts"] < 3 and time.monotonic() < give_up:
                sched.poll()
                time.sleep(0.01)
            stats = sched.stats()
            # After the first remote timeout the rest of the batch is not attempted but asked again:
            # each session times out on its own deadline, and the worker is never killed.
            assert stats["timeouts"] == 3 and stats["restarts"] == 0 and stats["requeued"] == 3, stats
            assert stats["batches"] == 3 and stats["batch_time_us_p99"] < 0.4e6
    finally:
        source.release.set()
        server.stop()
