"""SessionOpened.limits over a real server with a non-default configuration: every limit reported is
the one the server enforces (docs/contract.md#limits)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dualloop.controller.contract.client import DEFAULT_CLIENT_WINDOW_BYTES, DriveSession, realtime_channel
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.executor.lane_keeping import LaneKeepingConfig
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import MS, sensor

TICK = 5 * MS
PLAN = [20.0, 0.0, 1.0, 0.0, 0.0, 0.0]
EXECUTOR = {
    "max_observation_age_ms": 25.0,
    "assumed_observation_period_ms": 50.0,
    "max_plan_age_ms": 300.0,
    "lockstep_max_gap_s": 0.5,
    "min_margin": 0.1,
    "freeze_repeats": 3,
    "safety": {
        "hold_timeout_ms": 120.0,
        "recovery_dwell_ms": 250.0,
        "max_abstain_ms": 700.0,
        "fallback_decel": 2.5,
        "blind_decel": 4.0,
        "fallback_jerk": 2.0,
    },
}


@pytest.fixture(scope="module")
def server(test_model_path: Path) -> Iterator[ServerThread]:
    config = ServerConfig(
        model=test_model_path,
        port=0,
        executor=EXECUTOR,
        max_receive_message_bytes=64 * 1024,
        client_window_bytes=16 * 1024,
        open_timeout_s=1.0,
    )
    with ServerThread(config) as srv:
        yield srv


@pytest.fixture()
def channel(server: ServerThread) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def lockstep(channel: grpc.Channel, name: str, **open_args: object) -> DriveSession:
    return DriveSession(channel, name, pb.CLOCK_MODE_LOCKSTEP, **open_args)  # type: ignore[arg-type]


def send(session: DriveSession, seq: int, ts: int, plan: list[float] | None = None, plan_id: str = "") -> None:
    session.send(seq, ts, sensor(seq), plan_id=plan_id, plan=plan)


def test_limits_are_the_running_configuration(channel: grpc.Channel, server: ServerThread) -> None:
    session = lockstep(channel, "limits")
    limits = session.opened.limits
    card = server.server.executor.card
    safe_index = list(card.actions).index(card.safe_action.action)
    assert (
        limits.max_observation_age_ns,
        limits.assumed_observation_period_ns,
        limits.default_plan_valid_for_ns,
        limits.lockstep_max_ticks,
        limits.lockstep_max_gap_ns,
        limits.hold_timeout_ns,
        limits.recovery_dwell_ns,
        limits.max_abstain_ns,
        limits.max_receive_message_bytes,
        limits.recommended_client_window_bytes,
        limits.open_timeout_ns,
    ) == (25 * MS, 50 * MS, 300 * MS, 100, 500 * MS, 120 * MS, 250 * MS, 700 * MS, 65536, 16384, 1000 * MS)
    assert (limits.fallback_decel, limits.blind_decel, limits.fallback_jerk) == (2.5, 4.0, 2.0)
    assert limits.min_margin == pytest.approx(0.1)
    assert limits.freeze_repeats == 0  # configured 3, but the check runs only with a gate: this server has none
    assert (limits.safe_action.index, limits.safe_action.name) == (safe_index, card.safe_action.action)
    assert list(limits.safe_action.controls) == pytest.approx(card.safe_action.controls)
    assert session.opened.require_plan is False
    session.close()


def test_hold_dwell_safe_default_and_plan_validity_are_enforced(channel: grpc.Channel) -> None:
    """require_plan without a plan: STALE_PLAN from the first tick, the safe default, the fallback after
    exactly hold_timeout_ns; a plan: RECOVERING, NOMINAL after exactly recovery_dwell_ns; the plan
    expires once older than default_plan_valid_for_ns."""
    session = lockstep(channel, "hold", require_plan=True)
    limits = session.opened.limits
    assert session.opened.require_plan is True
    snaps = []
    for k in range(140):
        plan_args = {"plan": PLAN, "plan_id": "p"} if k == 60 else {}
        send(session, k + 1, k * TICK, **plan_args)  # type: ignore[arg-type]
        snaps.append(session.recv())
    session.close()
    first = snaps[0]
    assert first.plan_state == pb.PLAN_STATE_NONE and pb.REASON_CODE_STALE_PLAN in first.reasons
    assert first.safety_state == pb.SAFETY_STATE_VETO_HOLD and pb.REASON_CODE_SAFE_DEFAULT in first.reasons
    # the safe action's braking, entered at the jerk limit from nothing applied before; its steering
    # turned towards the lane keeper's at most one rate step from the safe action's
    step = limits.jerk_limit * TICK / 1e9
    assert limits.jerk_limit == pytest.approx(2.0) and limits.fallback_jerk == pytest.approx(2.0)
    assert first.applied.controls[0] == pytest.approx(-step)
    steer_step = LaneKeepingConfig().max_steer_rate * TICK / 1e9
    assert abs(first.applied.controls[1] - limits.safe_action.controls[1]) <= steer_step + 1e-7
    assert first.applied.name == "keep"  # the band of what was applied
    fallback = next(s for s in snaps if s.safety_state == pb.SAFETY_STATE_FALLBACK_ACTIVE)
    assert fallback.scheduled_time_ns - first.scheduled_time_ns == limits.hold_timeout_ns
    assert snaps[60].safety_state == pb.SAFETY_STATE_RECOVERING and snaps[60].plan_state == pb.PLAN_STATE_VALID
    dwell = limits.recovery_dwell_ns // TICK  # then the model's command is blended in
    assert all(s.safety_state == pb.SAFETY_STATE_RECOVERING for s in snaps[60 : 60 + dwell])
    accel = [s.applied.controls[0] for s in snaps]
    assert max(abs(b - a) for a, b in zip(accel, accel[1:])) <= step + 1e-6
    assert snaps[61].plan_valid_for_ns == limits.default_plan_valid_for_ns
    valid_until = snaps[60].scheduled_time_ns + limits.default_plan_valid_for_ns
    for s in snaps[60:]:
        expired = s.scheduled_time_ns > valid_until
        assert s.plan_state == (pb.PLAN_STATE_EXPIRED if expired else pb.PLAN_STATE_VALID), s.tick
        assert (pb.REASON_CODE_STALE_PLAN in s.reasons) is expired


@pytest.mark.parametrize("declared_ms", [20, 0])
def test_observation_age_limit_is_enforced(channel: grpc.Channel, declared_ms: int) -> None:
    """Late = older than the observation period (declared, or assumed until measured) plus
    max_observation_age_ns: the held ticks after the first observation show where the line is."""
    session = lockstep(channel, f"age-{declared_ms}", observation_period_ns=declared_ms * MS)
    limits = session.opened.limits
    send(session, 1, 0)
    send(session, 2, 200 * MS)
    snaps = [session.recv() for _ in range(41)]
    session.close()
    period = declared_ms * MS or limits.assumed_observation_period_ns
    assert {s.observation_period_ns for s in snaps[:40]} == {period}
    for s in snaps[:40]:
        assert (pb.REASON_CODE_STALE_OBSERVATION in s.reasons) is (
            s.observation_age_ns > period + limits.max_observation_age_ns
        )
    assert any(pb.REASON_CODE_STALE_OBSERVATION in s.reasons for s in snaps)


def test_lockstep_gap_limit_is_enforced(channel: grpc.Channel) -> None:
    """One observation may advance lockstep_max_ticks ticks; one more is refused."""
    session = lockstep(channel, "gap")
    m = session.opened.limits.lockstep_max_ticks
    send(session, 1, 0)
    assert session.recv().tick == 0
    send(session, 2, m * TICK)  # ticks 1..m: exactly the limit
    assert [session.recv().tick for _ in range(m)] == list(range(1, m + 1))
    send(session, 3, (2 * m + 1) * TICK)  # ticks m+1..2m+1: one too many
    with pytest.raises(grpc.RpcError) as err:
        session.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "lockstep_max_gap_s" in err.value.details()


def test_message_size_limit_is_enforced(channel: grpc.Channel) -> None:
    """Under the limit, a wrong observation is judged on its content (INVALID_ARGUMENT); over it, gRPC
    refuses the message itself with RESOURCE_EXHAUSTED before the server reads it."""
    limit = 64 * 1024
    for n_floats, code in ((limit // 8, grpc.StatusCode.INVALID_ARGUMENT), (limit // 4 + 16, None)):
        session = lockstep(channel, f"size-{n_floats}")
        assert session.opened.limits.max_receive_message_bytes == limit
        request = pb.DriveRequest(observation=pb.Observation(seq=1, timestamp_ns=0, features=[1.0] * n_floats))
        assert (request.ByteSize() > limit) is (code is None)
        session.send_raw(request)
        with pytest.raises(grpc.RpcError) as err:
            session.recv()
        assert err.value.code() == (code or grpc.StatusCode.RESOURCE_EXHAUSTED), err.value.details()


def test_open_timeout_is_enforced(channel: grpc.Channel) -> None:
    done = threading.Event()

    def nothing() -> Iterator[pb.DriveRequest]:
        done.wait(30)
        yield from ()

    started = time.monotonic()  # before the call: the server's timer starts later still
    call = pb_grpc.ControllerServiceStub(channel).Drive(nothing())
    with pytest.raises(grpc.RpcError) as err:
        next(call)
    done.set()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "open_timeout_s=1.0" in err.value.details()
    assert time.monotonic() - started >= 1.0  # not before the limit


def test_open_timeout_holds_for_the_first_request_of_an_agents_stream(channel: grpc.Channel) -> None:
    """A DriveAgents stream that sends nothing ends as a Drive stream with no OpenSession does, rather
    than holding its call open for ever."""
    done = threading.Event()

    def nothing() -> Iterator[pb.DriveAgentsRequest]:
        done.wait(30)
        yield from ()

    started = time.monotonic()
    call = pb_grpc.ControllerServiceStub(channel).DriveAgents(nothing())
    assert next(call).limits.max_agents_per_stream > 0  # the stream's header comes at once
    with pytest.raises(grpc.RpcError) as err:
        next(call)
    done.set()
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "no DriveAgentsRequest within open_timeout_s=1.0 s" in err.value.details()
    assert time.monotonic() - started >= 1.0


def test_window_advice_is_the_client_helper_default(server: ServerThread) -> None:
    with realtime_channel(server.address) as ch:  # the helper's default is the server's default advice
        assert DriveSession(ch, "window", pb.CLOCK_MODE_REALTIME).opened.limits.recommended_client_window_bytes == 16384
    assert DEFAULT_CLIENT_WINDOW_BYTES == ServerConfig.model_fields["client_window_bytes"].default


def test_server_planner_plans_do_not_expire_on_a_foreign_sensor_clock(test_model_path: Path) -> None:
    """REALTIME with the server's planner and a sensor clock far from the server's (Unix epoch): the
    plans' age is sensor time from the observation each was planned from, and their validity is the
    planner's (BehaviourPlanner: 1 s), so they stay valid."""
    config = ServerConfig(model=test_model_path, port=0, planner={"source": "behaviour", "period_ms": 100.0})
    with ServerThread(config) as srv, realtime_channel(srv.address) as ch:
        session = DriveSession(ch, "planned", pb.CLOCK_MODE_REALTIME)
        stop = threading.Event()

        def produce() -> None:
            seq = 0
            while not stop.is_set():
                seq += 1
                session.send(seq, time.time_ns(), sensor(seq))
                time.sleep(0.005)

        producer = threading.Thread(target=produce)
        producer.start()
        try:
            snaps = []
            give_up = time.monotonic() + 20
            while len([s for s in snaps if s.plan_id]) < 150 and time.monotonic() < give_up:
                snaps.append(session.recv())
        finally:
            stop.set()
            producer.join()
            session.cancel()
    planned = [s for s in snaps if s.plan_id]
    assert len(planned) >= 150
    assert {s.plan_state for s in planned} == {pb.PLAN_STATE_VALID}
    assert {s.plan_valid_for_ns for s in planned} == {1_000_000_000}
    assert len({s.plan_id for s in planned}) > 2  # refreshed by the planner, period after period
    assert not any(pb.REASON_CODE_STALE_PLAN in s.reasons for s in snaps)
    assert all(s.plan_state == pb.PLAN_STATE_NONE for s in snaps if not s.plan_id)


def test_a_plan_s_own_validity_and_creation_time_over_the_wire(channel: grpc.Channel) -> None:
    session = lockstep(channel, "own-validity", require_plan=True)
    snaps = []
    for k in range(30):
        plan_args = {"plan": PLAN, "plan_id": "p", "plan_valid_for_ns": 50 * MS, "plan_created_ns": 0} if k == 5 else {}
        session.send(k + 1, k * TICK, sensor(k + 1), **plan_args)  # type: ignore[arg-type]
        snaps.append(session.recv())
    session.close()
    assert {s.plan_valid_for_ns for s in snaps[5:]} == {50 * MS}
    assert [s.plan_state for s in snaps[5:17]] == [pb.PLAN_STATE_VALID] * 11 + [pb.PLAN_STATE_EXPIRED]
    assert pb.REASON_CODE_STALE_PLAN in snaps[16].reasons and pb.REASON_CODE_STALE_PLAN not in snaps[15].reasons


class SilentRelay:
    """A TCP relay between clients and a server that can go silent: from then on it drops what
    either side sends, and closes nothing. To the server, a client whose host vanished."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.silent = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self.target)
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(src, dst), daemon=True).start()

    def _relay(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    return
                if not self.silent.is_set():
                    dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def test_a_client_whose_host_vanished_is_closed_at_the_keepalive(test_model_path: Path) -> None:
    """A LOCKSTEP session whose connection goes silent (no FIN, no RST: the client's host lost power
    or the network) is ended once the server's keepalive ping goes unanswered, and its slot freed;
    without the ping it would hold the slot for gRPC's default of two hours."""
    config = ServerConfig(model=test_model_path, port=0, keepalive_s=1.0, keepalive_timeout_s=1.0)
    with ServerThread(config) as srv:
        relay = SilentRelay(("127.0.0.1", srv.port))
        try:
            with grpc.insecure_channel(relay.address) as channel:
                session = lockstep(channel, "vanishing")
                send(session, 1, 0)
                assert session.recv().observation_seq == 1
                assert srv.call(lambda: sorted(srv.server.executor.sessions)) == ["vanishing"]
                relay.silent.set()
                give_up = time.monotonic() + 30  # a bound for a loaded machine, far past 2 s
                while srv.call(lambda: len(srv.server.executor.sessions)) and time.monotonic() < give_up:
                    time.sleep(0.1)
                assert srv.call(lambda: len(srv.server.executor.sessions)) == 0
                session.cancel()
        finally:
            relay.close()
