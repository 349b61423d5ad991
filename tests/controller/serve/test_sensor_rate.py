"""Sessions with a sensor rate and a sensor profile, over a real gRPC server on loopback."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.logs.format import actual_is_command
from dualloop.controller.logs.logfile import read_log, read_sessions
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.serve.log_stream import stream_logs
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb

MS = 1_000_000


def test_open_session_echoes_the_period_and_profile(server, channel):
    names = list(server.server.executor.card.feature_names)
    session = DriveSession(
        channel, "ten-hz", pb.CLOCK_MODE_REALTIME, observation_period_ns=100 * MS, provided_features=names[:5]
    )
    assert session.opened.observation_period_ns == 100 * MS
    assert list(session.opened.provided_features) == names[:5]
    x = np.full(19, np.nan, np.float32)
    x[:5] = [20.0, 0.1, 1.0, 40.0, -0.5]
    session.send(1, time.monotonic_ns(), x.tolist())
    snaps = [session.recv() for _ in range(10)]  # 50 ms of ticks on one 10 Hz observation
    session.cancel()
    assert all(s.observation_period_ns == 100 * MS for s in snaps)
    # one observation: only the tick that used it first is fresh (the outbox may have conflated it away)
    assert sum(not s.observation_held for s in snaps) <= 1 and all(s.observation_seq == 1 for s in snaps)
    assert all(
        pb.REASON_CODE_STALE_OBSERVATION not in s.reasons and pb.REASON_CODE_INVALID_INPUT not in s.reasons
        for s in snaps
    )


def test_unknown_provided_feature_is_invalid_argument(server, channel):
    with pytest.raises(grpc.RpcError) as err:
        DriveSession(channel, "typo", pb.CLOCK_MODE_REALTIME, provided_features=["ego_speed", "speed_kmh"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "speed_kmh" in err.value.details() and "GetModelInfo" in err.value.details()


def test_stream_a_log_at_20_hz(server, tmp_path):
    """A 100 Hz log streamed as a 20 Hz sensor: every snapshot says 50 ms, most ticks are held, and
    none is judged late (the machine may be loaded: no timing bound beyond the sensor's own)."""
    data = read_log(synthetic_log(tmp_path / "log.mcap", seconds=1.5, rate_hz=100.0))
    result = asyncio.run(stream_logs(server.address, [data], sessions_per_log=2, every=5))
    assert result.sessions == 2 and result.observations_sent == 2 * len(data.observations[::5])
    assert result.periods_ns == {50 * MS}
    assert result.snapshots > 2 * 1.0 / 0.005 * 0.5  # a snapshot per tick, minus conflation
    assert result.held / result.snapshots > 0.6


def test_stream_sends_an_imports_labels_but_not_as_commands(test_model_path, tmp_path):
    """An import's actual controls are a label from the drive's own speed: streamed with them (shadow
    statistics), but not declared commands (OpenSession.actual_controls_are_commands), so the actuation
    check does not judge them and the recording says so."""
    log = synthetic_log(tmp_path / "log.mcap", seconds=0.5, rate_hz=100.0)
    data = read_log(log)
    assert any(len(o.actual.controls) for o in data.observations), "the fixture must carry actual controls"
    assert not actual_is_command(data.header)
    with ServerThread(ServerConfig(model=test_model_path, port=0, record_dir=tmp_path / "rec")) as srv:
        asyncio.run(stream_logs(srv.address, [data]))
    (recorded,) = read_sessions(sorted((tmp_path / "rec").glob("*.mcap"))).values()
    sent = recorded.observations
    assert len(sent) == len(data.observations)
    assert [list(o.actual.controls) for o in sent] == [list(o.actual.controls) for o in data.observations]
    assert not actual_is_command(recorded.header)  # a replay of the recording skips the check too
    assert [o.actual.action_index for o in sent] == [o.actual.action_index for o in data.observations]


def test_a_new_sensor_profile_is_built_off_the_tick_loop_once(base_model):
    """Building a profile's gates takes ~90 ms: on the loop, every open session would miss deadlines."""
    config = ServerConfig(model=BASE_MODEL_PATH, gates=DEFAULT_GATES, port=0)
    with ServerThread(config, base_model) as srv, grpc.insecure_channel(srv.address) as channel:
        gating = srv.server.executor.gating
        built_on: list[str] = []
        build = gating._make_profile

        def watched(present: np.ndarray):  # the real build, its thread noted
            built_on.append(threading.current_thread().name)
            return build(present)

        gating._make_profile = watched
        names = list(srv.server.executor.card.feature_names)
        for k in range(2):  # the second session finds the profile made
            session = DriveSession(channel, f"radar-{k}", pb.CLOCK_MODE_LOCKSTEP, provided_features=names[:5])
            x = np.full(19, np.nan, np.float32)
            x[:5] = [20.0, 0.1, 1.0, 40.0, -0.5]
            session.send(1, 0, x.tolist())
            session.close()
            snaps = list(session.snapshots())
            assert len(snaps) == 1 and pb.REASON_CODE_INVALID_INPUT not in snaps[0].reasons
        assert len(built_on) == 1 and built_on[0] != "dualloop-server", built_on
