"""The input contract on a real server on loopback: shadow statistics per session instance (proposed and
applied, resettable), the actuation check only on declared commands, one rule for invalid input
(structure ends the stream, content never does, live and replay agree), malformed bytes, and
serving on every loopback spelling."""

from __future__ import annotations

import socket

import grpc
import numpy as np
import pytest
from pydantic import ValidationError

from dualloop.controller.contract.addresses import host_port, is_loopback
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.controller.logs.format import actual_is_command
from dualloop.controller.logs.logfile import read_log, read_sessions
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import replay_log
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import MS, sensor


def _drive(channel, session_id: str, n: int, actual_index: int = 2) -> list[pb.DecisionSnapshot]:
    s = DriveSession(channel, session_id, pb.CLOCK_MODE_LOCKSTEP, shadow=True)
    snaps = []
    for k in range(n):
        s.send(k + 1, k * 5 * MS, sensor(k), actual_index=actual_index, actual_controls=[0.1, 0.0])
        snaps.append(s.recv())
    s.close()
    assert list(s.snapshots()) == []
    return snaps


def _rpc_error(fn, *args) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        fn(*args)
    return err.value


# -- shadow semantics ---------------------------------------------------------------------------


def test_shadow_stats_per_session_instance_with_proposed_agreement_and_reset(server, channel):
    stub = pb_grpc.ControllerServiceStub(channel)
    first = DriveSession(channel, "car", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
    instance = first.opened.session_instance
    assert len(instance) == 32
    snaps = []
    for k in range(30):
        s_actual = k % 4  # every action in turn: agreement is partial, for applied and proposed
        first.send(k + 1, k * 5 * MS, sensor(k), actual_index=s_actual, actual_controls=[0.1, 0.0])
        snaps.append((s_actual, first.recv()))
    first.close()
    assert list(first.snapshots()) == []
    stats = stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="car"))
    assert stats.session_instance == instance and stats.session_id == "car"
    applied = np.zeros((4, 4), int)
    proposed = np.zeros((4, 4), int)
    for actual, snap in snaps:
        applied[actual, snap.applied.index] += 1
        if snap.proposed.action.index >= 0:
            proposed[actual, snap.proposed.action.index] += 1
    assert (np.array(stats.confusion).reshape(4, 4) == applied).all()
    assert (np.array(stats.proposed_confusion).reshape(4, 4) == proposed).all() and proposed.sum() == 30
    groups = {g.key: g for g in stats.proposed_groups}
    assert groups["all"].ticks == 30 and groups["all"].agreeing == np.trace(proposed)
    mae = np.mean([abs(snap.proposed.action.controls[0] - 0.1) for _, snap in snaps])
    assert groups["all"].control_mae[0] == pytest.approx(mae, rel=1e-4)

    # the same session id opened again starts fresh; the closed instance stays readable by its id
    (snap,) = _drive(channel, "car", 1)
    again = stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="car"))
    assert again.session_instance != instance and sum(again.confusion) == 1
    old = stub.GetShadowStats(pb.GetShadowStatsRequest(session_instance=instance))
    assert old.session_instance == instance and sum(old.confusion) == 30 and old.session_id == "car"

    # reset: answered, then counted afresh
    answered = stub.GetShadowStats(pb.GetShadowStatsRequest(session_instance=instance, reset=True))
    assert sum(answered.confusion) == 30
    after = stub.GetShadowStats(pb.GetShadowStatsRequest(session_instance=instance))
    assert sum(after.confusion) == 0 and len(after.groups) == 0 and sum(after.proposed_confusion) == 0

    err = _rpc_error(stub.GetShadowStats, pb.GetShadowStatsRequest(session_id="bus", session_instance=instance))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "instance of session 'car', not 'bus'" in err.details()
    err = _rpc_error(stub.GetShadowStats, pb.GetShadowStatsRequest(session_instance="f" * 32))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    err = _rpc_error(stub.GetShadowStats, pb.GetShadowStatsRequest())
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "needs session_id" in err.details()


def test_closed_instances_kept_are_bounded(server, channel):
    server.call(setattr, server.server.runtime.shadows, "KEEP_CLOSED", 2)
    instances = []
    for k in range(3):
        s = DriveSession(channel, f"short-{k}", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
        instances.append(s.opened.session_instance)
        s.close()
        assert list(s.snapshots()) == []
    stub = pb_grpc.ControllerServiceStub(channel)
    gone = (pb.GetShadowStatsRequest(session_instance=instances[0]), pb.GetShadowStatsRequest(session_id="short-0"))
    for request in gone:
        assert _rpc_error(stub.GetShadowStats, request).code() == grpc.StatusCode.NOT_FOUND
    assert stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="short-2")).session_instance == instances[2]
    assert len(server.call(lambda: server.server.runtime.shadows.instances)) == 2


def test_actuation_check_only_on_declared_commands(base_model, tmp_path):
    observations = read_log(synthetic_log(tmp_path / "drive.mcap", seconds=2.0, rate_hz=200.0)).observations
    t0 = observations[0].timestamp_ns
    for o in observations:
        t = (o.timestamp_ns - t0) / 1e9
        accel = o.features[1] if np.isfinite(o.features[1]) else 0.0
        del o.actual.controls[:]
        o.actual.controls.extend([accel - (1.0 if 0.3 <= t < 0.9 else 0.0), 0.0])
    config = ServerConfig(model=BASE_MODEL_PATH, gates=DEFAULT_GATES, port=0, record_dir=tmp_path / "rec")
    with ServerThread(config, base_model) as srv, grpc.insecure_channel(srv.address) as channel:
        threshold = srv.call(lambda: srv.server.executor.gating.actuation.threshold)
        by_check = {}
        for declared in (True, False):
            s = DriveSession(
                channel, f"declared-{declared}", pb.CLOCK_MODE_LOCKSTEP, actual_controls_are_commands=declared
            )
            for o in observations:
                s.send_raw(pb.DriveRequest(observation=o))
            s.close()
            snaps = list(s.snapshots())
            assert len(snaps) > 300
            by_check[declared] = [x.gate.veto for x in snaps if x.gate.threshold == pytest.approx(threshold)]
        stats = pb_grpc.ControllerServiceStub(channel).GetShadowStats(
            pb.GetShadowStatsRequest(session_id="declared-False")
        )
    assert any(by_check[True])  # the check judged the declared commands and caught the shortfall
    assert by_check[False] == []  # undeclared: never judged ...
    assert all(g.control_mae[0] > 0 for g in stats.groups)  # ... but used for the shadow statistics
    recorded = read_sessions(sorted((tmp_path / "rec").glob("*.mcap")))
    assert actual_is_command(recorded["declared-True"].header)
    assert not actual_is_command(recorded["declared-False"].header)  # a replay of it skips the check too


# -- one rule for invalid input ---------------------------------------------------------------


def test_content_errors_are_reported_and_discarded_never_ending_the_stream(server, channel):
    s = DriveSession(channel, "content", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
    plan = [10.0, 3.5, 0.0, 1.0, 0.0, 0.0]
    s.send(1, 0, sensor(1), plan_id="p1", plan=plan, actual_index=2, actual_controls=[0.1, 0.0])
    good = s.recv()
    assert good.plan_id == "p1" and list(good.invalid_input) == [] and pb.REASON_CODE_INVALID_INPUT not in good.reasons
    # a plan with NaN: not adopted, the previous plan stays
    s.send(2, 5 * MS, sensor(2), plan_id="p2", plan=[np.nan, *plan[1:]], actual_index=2, actual_controls=[0.1, 0.0])
    bad_plan = s.recv()
    assert list(bad_plan.invalid_input) == ["plan"] and pb.REASON_CODE_INVALID_INPUT in bad_plan.reasons
    assert bad_plan.plan_id == "p1" and bad_plan.plan_age_ns == 5 * MS
    # an actual control not known (NaN): not an error, no reason; not counted in the MAE
    s.send(3, 10 * MS, sensor(3), actual_index=2, actual_controls=[np.nan, 0.0])
    unknown_actual = s.recv()
    assert list(unknown_actual.invalid_input) == [] and pb.REASON_CODE_INVALID_INPUT not in unknown_actual.reasons
    # a measured feature with NaN: held as before, and named
    x = sensor(4)
    x[2] = float("nan")
    s.send(4, 15 * MS, x, plan_id="p3", plan=[np.nan] * 6)
    bad_both = s.recv()
    assert list(bad_both.invalid_input) == ["features", "plan"] and pb.REASON_CODE_INVALID_INPUT in bad_both.reasons
    # nothing accepted was lost: the stream goes on with p1, and a good plan is adopted again
    s.send(5, 20 * MS, sensor(5), plan_id="p2", plan=plan)
    recovered = s.recv()
    assert recovered.plan_id == "p2" and list(recovered.invalid_input) == []
    stats = pb_grpc.ControllerServiceStub(channel).GetShadowStats(pb.GetShadowStatsRequest(session_id="content"))
    s.close()
    assert list(s.snapshots()) == []
    groups = {g.key: g for g in stats.groups}
    assert stats.ticks_invalid_actual_controls == 1
    assert groups["all"].ticks == 3  # the index of the tick with an unknown control still counts ...
    # ... its controls do not: the error is the mean over the two ticks with known controls
    mae = np.mean([abs(snap.applied.controls[0] - 0.1) for snap in (good, bad_plan)])
    assert groups["all"].control_mae[0] == pytest.approx(mae, rel=1e-4)


def test_realtime_content_errors_keep_the_stream_and_the_plan(channel):
    s = DriveSession(channel, "rt-content", pb.CLOCK_MODE_REALTIME)
    plan = [10.0, 3.5, 0.0, 1.0, 0.0, 0.0]

    def until_seq(seq: int) -> pb.DecisionSnapshot:
        while (snap := s.recv()).observation_seq != seq:
            pass
        return snap

    s.send(1, 0, sensor(1), plan_id="p1", plan=plan)
    assert until_seq(1).plan_id == "p1"
    s.send(2, 5 * MS, sensor(2), plan_id="p2", plan=[np.nan] * 6, actual_index=1, actual_controls=[np.nan, 0.0])
    bad = until_seq(2)
    assert list(bad.invalid_input) == ["plan"] and pb.REASON_CODE_INVALID_INPUT in bad.reasons
    assert bad.plan_id == "p1"
    s.send(3, 10 * MS, sensor(3))
    good = until_seq(3)
    assert good.plan_id == "p1" and list(good.invalid_input) == [] and pb.REASON_CODE_INVALID_INPUT not in good.reasons
    s.cancel()


@pytest.mark.parametrize(
    "mutate, text",
    [
        (lambda o: o.features.pop(), "Observation.features has 18 values; expected 19"),
        (lambda o: o.plan.values.extend([1.0, 2.0]), "Observation.plan.values (plan 'p') has 2 values; expected 6"),
        (lambda o: o.actual.controls.extend([0.0] * 3), "Observation.actual.controls has 3 values; expected 2"),
        (lambda o: setattr(o.actual, "action_index", 4), "Observation.actual.action_index is 4; expected -1"),
    ],
)
@pytest.mark.parametrize("clock", [pb.CLOCK_MODE_LOCKSTEP, pb.CLOCK_MODE_REALTIME])
def test_structure_errors_end_the_stream_naming_field_and_sizes(channel, clock, mutate, text):
    s = DriveSession(channel, "", clock)
    obs = pb.Observation(seq=1, timestamp_ns=0, features=sensor(1))
    obs.plan.plan_id = "p"
    mutate(obs)
    if not obs.plan.values:  # only the plan case sends one
        obs.ClearField("plan")
    s.send_raw(pb.DriveRequest(observation=obs))
    err = _rpc_error(s.recv)
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert text in err.details()


def test_live_lockstep_and_replay_agree_on_invalid_input(test_model, test_model_path, tmp_path):
    """A recorded LOCKSTEP session with non-finite plans and actual controls, replayed (vectorised):
    the same decisions tick by tick."""
    source = read_log(synthetic_log(tmp_path / "drive.mcap", seconds=1.5, rate_hz=150.0)).observations
    with_plans = [k for k, o in enumerate(source) if o.HasField("plan")]
    assert len(with_plans) > 4
    source[with_plans[1]].plan.values[0] = float("nan")
    source[with_plans[3]].plan.values[2] = float("inf")
    for k in (5, 6, 40):
        source[k].actual.controls[0] = float("nan")
    with ServerThread(ServerConfig(model=test_model_path, port=0, record_dir=tmp_path / "rec"), test_model) as srv:
        with grpc.insecure_channel(srv.address) as channel:
            s = DriveSession(channel, "live", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
            for o in source:
                s.send_raw(pb.DriveRequest(observation=o))
            s.close()
            live = list(s.snapshots())
    assert sum("plan" in x.invalid_input for x in live) >= 2
    unknown = [x for x in live if x.observation_seq in {source[k].seq for k in (5, 6, 40)}]
    assert unknown and not any(x.invalid_input or pb.REASON_CODE_INVALID_INPUT in x.reasons for x in unknown)
    (log,) = sorted((tmp_path / "rec").glob("*.mcap"))
    replayed = replay_log(log, test_model_path).snapshots
    assert len(replayed) == len(live)
    exact = ("tick", "observation_seq", "reasons", "safety_state", "invalid_input", "input_hash", "plan_id")
    for a, b in zip(live, (snapshot_to_proto(x) for x in replayed)):
        # the decisions exactly; probabilities and controls to 1e-5 (the replay's forward pass runs on
        # another batch size, docs/duplicated-rules.md)
        assert [getattr(a, f) for f in exact] == [getattr(b, f) for f in exact]
        assert (a.plan_age_ns, a.proposed.action.index, a.applied.index) == (
            b.plan_age_ns,
            b.proposed.action.index,
            b.applied.index,
        )
        np.testing.assert_allclose(a.applied.controls, b.applied.controls, atol=1e-5)
        np.testing.assert_allclose(a.proposed.probabilities, b.proposed.probabilities, atol=1e-5)


# -- malformed bytes ------------------------------------------------------------------------------


def _identity(b: bytes) -> bytes:
    return b


def test_malformed_bytes_are_invalid_argument_with_a_human_message(channel):
    garbage = b"\xff\xff\xff\xff\x0f"
    drive = channel.stream_stream(
        "/dualloop.v2.ControllerService/Drive", request_serializer=_identity, response_deserializer=_identity
    )
    err = _rpc_error(lambda: list(drive(iter([garbage]))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "(5 bytes) is not a valid dualloop.v2.DriveRequest" in err.details() and "class" not in err.details()
    # after a valid open, mid-stream
    opening = pb.DriveRequest(open=pb.OpenSession(session_id="g", clock=pb.CLOCK_MODE_LOCKSTEP)).SerializeToString()
    responses = drive(iter([opening, garbage]))
    assert pb.DriveResponse.FromString(next(responses)).WhichOneof("msg") == "opened"
    err = _rpc_error(lambda: list(responses))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "DriveRequest" in err.details()
    for method, name in (("GetStats", "GetStatsRequest"), ("GetShadowStats", "GetShadowStatsRequest")):
        unary = channel.unary_unary(
            f"/dualloop.v2.ControllerService/{method}", request_serializer=_identity, response_deserializer=_identity
        )
        err = _rpc_error(unary, garbage)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and f"dualloop.v2.{name}" in err.details()


# -- loopback -------------------------------------------------------------------------------------


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["[::1]", "::1", "localhost", "127.0.0.1"])
def test_serving_and_connecting_on_every_loopback_spelling(test_model, test_model_path, host):
    ipv6 = "::1" in host
    if ipv6 and not _has_ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    with ServerThread(ServerConfig(model=test_model_path, port=0, host=host), test_model) as srv:
        targets = [srv.address, host_port(host, srv.port)]
        if host == "localhost":
            targets.append(f"localhost:{srv.port}")
        for target in targets:
            with grpc.insecure_channel(target) as channel:
                s = DriveSession(channel, "", pb.CLOCK_MODE_LOCKSTEP)
                s.send(1, 0, sensor(1))
                assert s.recv().tick == 0
                s.close()
    assert srv.address.startswith("[::1]:" if ipv6 else "127.0.0.1:")


@pytest.mark.parametrize("host", ["10.1.2.3", "0.0.0.0", "::", "[::]", "example.com", "192.168.0.1"])
def test_non_loopback_is_refused_unless_allowed(test_model_path, host):
    assert not is_loopback(host)
    with pytest.raises(ValidationError, match="not a loopback address"):
        ServerConfig(model=test_model_path, host=host)
    assert ServerConfig(model=test_model_path, host=host, allow_insecure_non_loopback=True).host == host


def test_a_realtime_client_that_half_closes_at_once_gets_its_last_decision(server, channel):
    """REALTIME: observations sent and the stream half-closed straight away. Each was accepted, so the
    newest is decided (at the next tick) and its snapshot sent before the stream ends OK."""
    stub = pb_grpc.ControllerServiceStub(channel)
    for n in (1, 3):
        requests = [pb.DriveRequest(open=pb.OpenSession(session_id=f"brief-{n}", clock=pb.CLOCK_MODE_REALTIME))]
        requests += [
            pb.DriveRequest(observation=pb.Observation(seq=k + 1, timestamp_ns=k * 5 * MS, features=sensor(k)))
            for k in range(n)
        ]
        responses = list(stub.Drive(iter(requests), timeout=30))  # raises unless the status is OK
        snaps = [r.snapshot for r in responses if r.HasField("snapshot")]
        assert snaps and snaps[-1].observation_seq == n, [s.observation_seq for s in snaps]
