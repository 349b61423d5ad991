"""A real server on loopback, real gRPC clients, real onnxruntime."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession, realtime_channel
from dualloop.controller.contract.wire import without_wall_clock
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc
from tests.controller.serve.inputs import sensor


def open_sessions(server) -> list[str]:
    return server.call(lambda: sorted(server.server.executor.sessions))


def test_realtime_one_snapshot_per_tick(server, channel):
    missed_before = server.server.runtime.ticker.missed
    session = DriveSession(channel, "rt", pb.CLOCK_MODE_REALTIME)
    stop = threading.Event()

    def produce() -> None:
        seq = 0
        while not stop.is_set():
            seq += 1
            session.send(seq, time.monotonic_ns(), sensor(seq))
            time.sleep(0.005)

    producer = threading.Thread(target=produce)
    producer.start()
    snaps = [session.recv() for _ in range(260)]  # 1.3 s of 5 ms ticks
    missed = server.server.runtime.ticker.missed - missed_before
    stop.set()
    producer.join()
    session.cancel()
    ticks = np.array([s.tick for s in snaps])
    # snapshots_dropped counts the session's drops so far, including snapshots replaced before the
    # first one this client read (a busy machine can delay the stream's first read by a tick or
    # more): only the drops after snaps[0] lie inside the span
    dropped = snaps[-1].snapshots_dropped - snaps[0].snapshots_dropped
    # every tick in the span reached the client, unless the server reported it dropped (slow
    # client) or missed (a deadline the machine could not keep); nothing else may go missing
    span = ticks[-1] - ticks[0] + 1
    assert np.all(np.diff(ticks) >= 1)
    assert len(ticks) + dropped <= span <= len(ticks) + dropped + missed
    assert all(s.session_id == "rt" for s in snaps)
    assert all(np.isfinite(s.applied.controls).all() for s in snaps)
    # observations were fresh: a new one arrives every ~5 ms
    assert np.median([s.observation_age_ns for s in snaps]) < 10_000_000


def lockstep_run(channel, session_id: str, n: int = 400) -> list[pb.DecisionSnapshot]:
    session = DriveSession(channel, session_id, pb.CLOCK_MODE_LOCKSTEP, include_decision_vector=True)
    out = []
    for k in range(n):
        x = sensor(k)
        if k == 123:
            x[3] = float("nan")
        # a 10 ms step now and then: the tick in between uses the older observation
        ts = 10_000_000_000 + k * 5_000_000 + (5_000_000 if k > 200 else 0)
        session.send(k + 1, ts, x)
        out.append(session.recv())
        if k == 201:
            out.append(session.recv())
    session.close()
    assert list(session.snapshots()) == []  # nothing more after the half-close
    return out


def test_lockstep_runs_are_byte_identical(server, channel):
    a = lockstep_run(channel, "ls-a")
    b = lockstep_run(channel, "ls-b")
    assert len(a) == len(b) == 401
    for x, y in zip(a, b):
        y.session_id = x.session_id  # the only input that differs between the runs
        assert without_wall_clock(x) == without_wall_clock(y)
    assert [s.tick for s in a] == list(range(401))
    assert pb.REASON_CODE_INVALID_INPUT in a[123].reasons
    assert len(a[0].decision_vector) == 64
    # and the comparison is sensitive: a different input gives different bytes
    assert without_wall_clock(a[5]) != without_wall_clock(a[6])


def test_wrong_length_features_is_invalid_argument(channel):
    session = DriveSession(channel, "bad", pb.CLOCK_MODE_REALTIME)
    session.send(1, 0, [1.0] * 18)
    with pytest.raises(grpc.RpcError) as err:
        session.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Observation.features has 18 values; expected 19" in err.value.details()


def test_nan_gives_invalid_input_and_finite_action(channel):
    session = DriveSession(channel, "nan", pb.CLOCK_MODE_LOCKSTEP)
    session.send(1, 0, sensor(1))
    good = session.recv()
    x = sensor(2)
    x[0] = float("nan")
    session.send(2, 5_000_000, x)
    bad = session.recv()
    assert pb.REASON_CODE_INVALID_INPUT in bad.reasons
    # the last valid action is held; its steering only ever shrinks, to the lateral-acceleration bound
    assert bad.applied.index == good.applied.index and bad.applied.controls[0] == good.applied.controls[0]
    assert abs(bad.applied.controls[1]) <= abs(good.applied.controls[1])
    assert np.isfinite(bad.applied.controls).all()


def test_disconnect_removes_session(server, channel):
    session = DriveSession(channel, "gone", pb.CLOCK_MODE_REALTIME)
    session.send(1, 0, sensor(1))
    session.recv()
    assert "gone" in open_sessions(server)
    t0 = time.monotonic()
    session.cancel()
    while "gone" in open_sessions(server) and time.monotonic() - t0 < 5.0:
        time.sleep(0.001)
    assert "gone" not in open_sessions(server)
    # on the cancel itself (a tick or two), not on a stream timeout of seconds; the bound leaves room
    # for a machine busy with other work
    assert time.monotonic() - t0 < 0.5


def test_get_model_info_matches_model_file(channel, test_model):
    info = pb_grpc.ControllerServiceStub(channel).GetModelInfo(pb.GetModelInfoRequest()).model
    card = test_model.card
    assert [f.name for f in info.features] == card.feature_names
    assert [f.unit for f in info.features] == [f.unit for f in card.features]
    assert list(info.actions) == card.actions
    assert [c.name for c in info.controls] == [c.name for c in card.controls]
    assert info.model_version == card.version and info.schema_hash == card.schema_hash()
    assert info.decision_vector_size == card.decision_vector_size
    assert info.tick_period_ns == 5_000_000


@pytest.mark.parametrize(
    "request_msg, code, text",
    [
        (
            pb.DriveRequest(open=pb.OpenSession(session_id="x", clock=7)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "REALTIME (1) or LOCKSTEP (2); got 7",
        ),
        (pb.DriveRequest(open=pb.OpenSession(session_id="x")), grpc.StatusCode.INVALID_ARGUMENT, "got 0"),
        (
            pb.DriveRequest(observation=pb.Observation(seq=1)),
            grpc.StatusCode.INVALID_ARGUMENT,
            "first message of a Drive stream must be 'open'",
        ),
        (
            pb.DriveRequest(
                open=pb.OpenSession(session_id="x", clock=pb.CLOCK_MODE_REALTIME, expected_schema_hash="0123")
            ),
            grpc.StatusCode.FAILED_PRECONDITION,
            "built observations for schema 0123",
        ),
    ],
)
def test_malformed_open(channel, request_msg, code, text):
    call = pb_grpc.ControllerServiceStub(channel).Drive(iter([request_msg]))
    with pytest.raises(grpc.RpcError) as err:
        list(call)
    assert err.value.code() == code
    assert text in err.value.details()


def test_second_open_and_duplicate_ids(channel):
    first = DriveSession(channel, "dup", pb.CLOCK_MODE_REALTIME)
    with pytest.raises(grpc.RpcError) as err:
        DriveSession(channel, "dup", pb.CLOCK_MODE_REALTIME)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    first.send_raw(pb.DriveRequest(open=pb.OpenSession(session_id="again", clock=pb.CLOCK_MODE_REALTIME)))
    with pytest.raises(grpc.RpcError) as err:
        first.recv()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "carries only observations" in err.value.details()


def test_server_survives_bad_clients_and_serves_many(server, channel):
    # a broken client first ...
    bad = DriveSession(channel, "bad", pb.CLOCK_MODE_LOCKSTEP)
    bad.send(1, 0, [0.0])
    with pytest.raises(grpc.RpcError):
        bad.recv()
    # ... then 16 sessions at once all get decisions
    sessions = [DriveSession(channel, f"m{i}", pb.CLOCK_MODE_LOCKSTEP) for i in range(16)]
    for i, s in enumerate(sessions):
        s.send(1, 0, sensor(i))
    results = [s.recv() for s in sessions]
    assert sorted(r.session_id for r in results) == sorted(f"m{i}" for i in range(16))
    assert len(open_sessions(server)) == 16
    for s in sessions:
        s.close()
        assert list(s.snapshots()) == []
    t0 = time.monotonic()
    while open_sessions(server) and time.monotonic() - t0 < 2:
        time.sleep(0.005)
    assert open_sessions(server) == []


def test_session_id_generated_and_shadow_marked(channel):
    s = DriveSession(channel, "", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
    assert len(s.session_id) == 12
    s.send(1, 0, sensor(1), actual_index=2, actual_controls=[0.1, 0.0])
    snap = s.recv()
    assert snap.shadow and snap.session_id == s.session_id


def test_slow_realtime_client_is_conflated_not_buffered(server):
    """A client that stops reading loses intermediate snapshots (counted), never stalls the server."""
    channel = realtime_channel(server.address)
    session = DriveSession(channel, "slow", pb.CLOCK_MODE_REALTIME, include_decision_vector=True)
    session.send(1, 0, sensor(1))
    first = session.recv()
    ticks_before = server.server.runtime.stats.ticks
    time.sleep(2.0)  # not reading: the small HTTP/2 window fills, then the outbox starts replacing
    ticks_during = server.server.runtime.stats.ticks - ticks_before
    assert ticks_during > 300  # the executor kept ticking for everyone
    box = server.call(lambda: server.server.runtime.outboxes["slow"])
    assert box.dropped > 0
    later = [session.recv() for _ in range(100)]
    session.cancel()
    channel.close()
    assert later[-1].snapshots_dropped > 0
    received_ticks = [first.tick] + [s.tick for s in later]
    span = received_ticks[-1] - received_ticks[0] + 1
    assert span > len(received_ticks)  # ticks were skipped for this client, not queued without bound


def test_get_stats_reports_and_resets(server, channel):
    stub = pb_grpc.ControllerServiceStub(channel)
    idle = stub.GetStats(pb.GetStatsRequest(reset=True))
    assert idle.ticks == 0  # no REALTIME session: no tick needed keeping time
    session = DriveSession(channel, "stats", pb.CLOCK_MODE_REALTIME)
    session.send(1, 0, sensor(1))
    session.recv()
    time.sleep(0.3)
    first = stub.GetStats(pb.GetStatsRequest(reset=True))
    assert first.ticks >= 40 and sum(first.lateness_histogram) == first.ticks
    assert len(first.lateness_histogram) == len(first.lateness_bucket_upper_us) + 1
    assert first.lateness_p50_us <= first.lateness_p99_us <= first.lateness_max_us
    assert first.window_s > 0.25
    after = stub.GetStats(pb.GetStatsRequest())
    session.cancel()
    assert after.ticks < first.ticks and after.window_s < first.window_s
    assert sum(after.lateness_histogram) == after.ticks


def test_shadow_agreement_over_grpc(channel):
    stub = pb_grpc.ControllerServiceStub(channel)
    s = DriveSession(channel, "shadow", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
    applied = []
    for k in range(40):
        # the "vehicle" did action 2 (keep) with accel 0.1 on even ticks; nothing known on odd ones
        known = k % 2 == 0
        s.send(
            k + 1,
            k * 5_000_000,
            sensor(k),
            actual_index=2 if known else None,
            actual_controls=[0.1, 0.0] if known else (),
        )
        snap = s.recv()
        assert snap.shadow
        applied.append((known, snap.applied.index, list(snap.applied.controls), snap.safety_state))
    stats = stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="shadow"))
    s.close()
    groups = {g.key: g for g in stats.groups}
    known = [a for a in applied if a[0]]
    assert stats.ticks_without_actual == 20 and groups["all"].ticks == 20
    assert groups["all"].agreeing == sum(1 for a in known if a[1] == 2)
    confusion = np.array(stats.confusion).reshape(4, 4)
    assert confusion[2].sum() == 20 and confusion[[0, 1, 3]].sum() == 0  # the vehicle only ever kept
    expected_mae = np.mean([abs(a[2][0] - 0.1) for a in known])
    assert groups["all"].control_mae[0] == pytest.approx(expected_mae, rel=1e-4)
    assert sum(g.ticks for k, g in groups.items() if k.startswith("state:")) == 20
    with pytest.raises(grpc.RpcError) as err:
        stub.GetShadowStats(pb.GetShadowStatsRequest(session_id="nobody"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_sessions_are_recorded(test_model_path, tmp_path):
    """Every accepted observation and every snapshot of a session lands in its MCAP log."""
    from dualloop.controller.logs.logfile import read_sessions
    from dualloop.controller.serve.config import ServerConfig
    from dualloop.controller.serve.lifecycle import ServerThread

    with ServerThread(ServerConfig(model=test_model_path, port=0, record_dir=tmp_path)) as srv:
        with grpc.insecure_channel(srv.address) as channel:
            s = DriveSession(channel, "rec", pb.CLOCK_MODE_LOCKSTEP, shadow=True)
            sent = []
            for k in range(50):
                s.send(k + 1, k * 5_000_000, sensor(k), actual_index=2, actual_controls=[0.0, 0.0])
                sent.append(s.recv())
            s.send(51, 250_000_000, [1.0] * 5)  # refused: must not be in the log
            with pytest.raises(grpc.RpcError):
                s.recv()
    (log_file,) = tmp_path.glob("*.mcap")
    logs = read_sessions(log_file)
    data = logs["rec"]
    assert data.header.session_id == "rec" and data.header.shadow and data.header.source == "grpc session"
    assert [o.seq for o in data.observations] == list(range(1, 51))
    assert [o.actual.action_index for o in data.observations] == [2] * 50
    assert [x.tick for x in data.snapshots] == [x.tick for x in sent]
    assert [x.input_hash for x in data.snapshots] == [x.input_hash for x in sent]
    assert not data.truncated


def test_a_burst_of_observations_waits_for_the_tick_and_none_is_lost(server):
    """A client that sends far faster than 200 Hz: its reads yield to each tick's deadline (the
    ticker's hand-over), and every observation is still taken in order, the last one decided on."""
    channel = realtime_channel(server.address)
    session = DriveSession(channel, "burst", pb.CLOCK_MODE_REALTIME)
    hand_overs = server.server.runtime.ticker.hand_overs
    n = 3000
    for seq in range(1, n + 1):
        session.send(seq, time.monotonic_ns(), sensor(seq))
    deadline = time.monotonic() + 60
    seen = 0
    while seen < n and time.monotonic() < deadline:
        seen = session.recv().observation_seq
    session.cancel()
    channel.close()
    assert seen == n  # the final observation reached the executor: nothing accepted was dropped
    assert server.server.runtime.ticker.hand_overs > hand_overs
