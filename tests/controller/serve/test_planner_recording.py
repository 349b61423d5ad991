"""A session planned by the server's own planner is recorded with its plans: each plan the executor
applied is a PlanRecord on /dualloop/plan and rides in the recorded observation it applied from, the
form `dualloop replay` reads, so a LOCKSTEP recording replays with the same decisions (`dualloop
diff` exit 0). A real server on loopback (the shipped model and gates, the behaviour planner), real
MCAP files, the real `dualloop replay` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from dualloop.controller.cli import main
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.logs.logfile import LogData, read_log, read_sessions
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import SessionOptions, replay_log
from dualloop.controller.serve.config import PlannerConfig, ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from tests.paths import REPO_ROOT

SECONDS = 3.0  # 15 planner periods of 200 ms
RATE_HZ = 100.0


def _server(record_dir: Path) -> ServerThread:
    # the thread worker: REALTIME plans without spawning a process (LOCKSTEP plans in-line either way)
    planner = PlannerConfig(source="behaviour", worker="thread")
    config = ServerConfig(
        model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0, record_dir=record_dir, planner=planner
    )
    return ServerThread(config)


def _inputs(tmp: Path) -> list[pb.Observation]:
    """A real drive's features with a client plan every 200 ms, which a server-planned session ignores:
    a recording that kept them would replay with plans the live session never used."""
    return read_log(synthetic_log(tmp / "drive.mcap", seconds=SECONDS, rate_hz=RATE_HZ)).observations


def _recording(record_dir: Path) -> LogData:
    (recording,) = record_dir.glob("*.mcap")
    (data,) = read_sessions(recording).values()
    return data


def _carried(data: LogData) -> list[str]:
    """The plan ids the recorded observations carry, in order."""
    return [o.plan.plan_id for o in data.observations if o.HasField("plan")]


@pytest.fixture(scope="module")
def lockstep_recording(tmp_path_factory) -> tuple[Path, list[pb.DecisionSnapshot]]:
    """One LOCKSTEP session of a server with the behaviour planner, recorded; and what it answered."""
    tmp = tmp_path_factory.mktemp("planned-lockstep")
    inputs = _inputs(tmp)
    got: list[pb.DecisionSnapshot] = []
    with _server(tmp / "rec") as srv, grpc.insecure_channel(srv.address) as channel:
        session = DriveSession(channel, "planned", pb.CLOCK_MODE_LOCKSTEP, actual_controls_are_commands=True)
        assert session.opened.model.planner  # the server plans this session
        for obs in inputs:
            session.send_raw(pb.DriveRequest(observation=obs))
            while not got or got[-1].observation_seq < obs.seq:
                got.append(session.recv())
        session.close()
        got += session.snapshots()
    (recording,) = (tmp / "rec").glob("*.mcap")
    return recording, got


def test_every_plan_the_session_used_is_recorded_where_it_applied(lockstep_recording):
    recording, live = lockstep_recording
    data = _recording(recording.parent)
    used = list(dict.fromkeys(s.plan_id for s in live if s.plan_id))
    assert len(used) >= SECONDS / 0.2 - 1  # the planner planned every period, not the client
    assert not any(p.startswith("p") and p[1:].isdigit() for p in used), "the client's plans were used"
    assert [r.plan.plan_id for r in data.plans] == used
    assert {r.source for r in data.plans} == {"behaviour"}
    assert data.summary is not None and data.summary.plans_written == len(used)
    # each plan rides in the observation it applied from (its timestamp the plan's creation), and no
    # observation keeps the client's plan, which the live session never used
    assert _carried(data) == used
    by_seq = {o.seq: o for o in data.observations}
    for record in data.plans:
        first = next(s for s in live if s.plan_id == record.plan.plan_id)
        carrier = by_seq[first.observation_seq]
        assert carrier.plan == record.plan and record.created_time_ns == carrier.timestamp_ns
    # an expired plan was STALE_PLAN in the live session (the server plans it): its replay opens it so too
    assert SessionOptions.of_header(data.header).expired_plan_is_stale


def test_its_replay_makes_the_same_decisions(lockstep_recording, tmp_path):
    recording, _ = lockstep_recording
    out = tmp_path / "replayed.mcap"
    done = subprocess.run(
        [sys.executable, "-m", "dualloop.controller.cli", "replay", str(recording), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, COLUMNS="200"),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "input" not in done.stderr, done.stderr  # no warning that the log lacks what its decisions used
    replayed = read_log(out)
    assert [s.plan_id for s in replayed.snapshots] == [s.plan_id for s in _recording(recording.parent).snapshots]
    assert main(["diff", str(recording), str(out)]) == 0


def test_a_realtime_recording_carries_each_applied_plan(tmp_path):
    """REALTIME plans apply on the server's tick, between observations: each is recorded when applied
    and carried by the next observation recorded, so a replay is conditioned on the same plans."""
    inputs = _inputs(tmp_path)[:150]
    with _server(tmp_path / "rec") as srv, grpc.insecure_channel(srv.address) as channel:
        session = DriveSession(channel, "planned-rt", pb.CLOCK_MODE_REALTIME)
        start = time.monotonic()
        for k, obs in enumerate(inputs):
            time.sleep(max(0.0, start + k / RATE_HZ - time.monotonic()))  # the sensor's own pace
            session.send_raw(pb.DriveRequest(observation=obs))
        session.close()
        assert list(session.snapshots())
    (recording,) = (tmp_path / "rec").glob("*.mcap")
    data = _recording(tmp_path / "rec")
    recorded = [r.plan.plan_id for r in data.plans]
    applied = list(dict.fromkeys(s.plan_id for s in data.snapshots if s.plan_id))
    # the last plan may have applied after the last tick, or after the last observation
    assert len(applied) >= 3 and recorded[: len(applied)] == applied
    # each observation carries the newest plan applied since the one before it: in order, all of them
    # but one applied after the last observation, or one replaced before an observation came (the
    # client stalled for a planner period, on a loaded machine)
    carried = _carried(data)
    assert len(carried) >= 2 and carried == [p for p in recorded if p in carried]
    assert all(o.plan.created_ns <= o.timestamp_ns for o in data.observations if o.HasField("plan"))
    replayed = replay_log(recording, BASE_MODEL_PATH, DEFAULT_GATES)
    replay_plans = list(dict.fromkeys(s.plan_id for s in replayed.snapshots if s.plan_id))
    assert replay_plans == carried
