"""The minimal-risk manoeuvre over a real server: a session whose inputs turn invalid at 20 m/s is
stopped in lane within R157's 4 m/s^2 at the jerk limit, stays stopped with clean inputs until the
client releases it, and a replay of the recording repeats every decision, the release included."""

from __future__ import annotations

from pathlib import Path

import grpc
import numpy as np
import pytest

from dualloop.controller.contract.client import DriveSession
from dualloop.controller.replay.lockstep import replay_log
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import MS, sensor

TICK = 5 * MS
NAN = [float("nan")] * 19


def _drive(session: DriveSession, k: int, features: list[float], release: bool = False) -> pb.DecisionSnapshot:
    session.send(seq=k + 1, timestamp_ns=k * TICK, features=features, release_standstill=release)
    return session.recv()


def test_the_fallback_stops_and_only_a_release_lets_the_session_drive_again(
    test_model_path: Path, tmp_path: Path
) -> None:
    rec = tmp_path / "rec"
    config = ServerConfig(model=test_model_path, port=0, record_dir=rec)
    with ServerThread(config) as srv, grpc.insecure_channel(srv.address) as channel:
        session = DriveSession(channel, "mrm", pb.CLOCK_MODE_LOCKSTEP)
        assert session.opened.limits.jerk_limit == pytest.approx(2.5)
        assert session.opened.limits.standstill_speed == pytest.approx(0.1)
        limits = session.opened.limits  # the stopped-lead hold's, as configured (executor.safety.standstill)
        assert (limits.stopped_lead_rest_speed, limits.stopped_lead_speed, limits.stopped_lead_max_gap) == (
            pytest.approx(0.2),
            pytest.approx(0.5),
            pytest.approx(8.0),
        )
        snaps = [_drive(session, k, sensor(k + 1)) for k in range(40)]
        k = 40
        while pb.REASON_CODE_STANDSTILL_HOLD not in snaps[-1].reasons:  # the sensors die at ~20 m/s
            snaps.append(_drive(session, k, NAN))
            k += 1
            assert k < 3000, "never came to a standstill"
        faulty = snaps[40:]
        accel = np.array([s.applied.controls[0] for s in snaps[39:]], np.float64)
        assert accel.min() == pytest.approx(-4.0)  # blind: R157's 4 m/s^2, no more
        assert np.abs(np.diff(accel)).max() <= 2.5 * 0.005  # every step at the jerk limit
        fallback = [s for s in faulty if s.safety_state == pb.SAFETY_STATE_FALLBACK_ACTIVE]
        assert fallback and all(pb.REASON_CODE_FALLBACK in s.reasons and s.hazard_lights for s in fallback)
        assert not any(s.hazard_lights for s in snaps[:40])
        stopped_s = (k - 40) * 0.005
        assert 5.0 < stopped_s < 8.0  # ~20 m/s at up to 4 m/s^2, after the hold and the ramp
        standing = sensor(k + 1)
        standing[0] = 0.0
        held = [_drive(session, k + j, standing) for j in range(400)]  # clean, and still held
        assert all(s.safety_state == pb.SAFETY_STATE_FALLBACK_ACTIVE for s in held)
        assert all(pb.REASON_CODE_STANDSTILL_HOLD in s.reasons and s.applied.controls[0] < 0 for s in held)
        assert all(s.hazard_lights for s in held)
        k += 400
        released = [_drive(session, k, standing, release=True)]
        released += [_drive(session, k + j, standing) for j in range(1, 1500)]
        session.close()
    states = [s.safety_state for s in released]
    assert states[0] == pb.SAFETY_STATE_RECOVERING and pb.REASON_CODE_STANDSTILL_HOLD not in released[0].reasons
    assert states[-1] == pb.SAFETY_STATE_NOMINAL
    back = states.index(pb.SAFETY_STATE_NOMINAL)
    accel = np.array([s.applied.controls[0] for s in held[-1:] + released[: back + 1]], np.float64)
    assert np.abs(np.diff(accel)).max() <= 2.5 * 0.005  # blended back in
    live = snaps + held + released
    # the recording (written out as the server stopped) replays to the same decisions, the release included
    (log,) = sorted(rec.glob("*.mcap"))
    replayed = replay_log(log, test_model_path).snapshots
    assert len(replayed) == len(live)
    assert [int(s.safety_state) for s in replayed] == [s.safety_state for s in live]
    assert [[int(r) for r in s.reasons] for s in replayed] == [list(s.reasons) for s in live]
    np.testing.assert_array_equal(
        np.array([s.applied.controls for s in replayed], np.float32),
        np.array([list(s.applied.controls) for s in live], np.float32),
    )
