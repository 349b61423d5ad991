"""DriveAgents with recording on: each agent is recorded as a session of its own, and `dualloop replay
--session` and `dualloop diff` work on one agent's recording as on a Drive session's. A real server on
loopback (shipped model and gates), the real CLI in subprocesses, real MCAP files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dualloop.controller.contract.agents_client import AgentsStream, agent_open
from dualloop.controller.contract.wire import without_wall_clock
from dualloop.controller.logs.format import TOPIC_SUMMARY
from dualloop.controller.logs.logfile import LogReader, read_log, read_sessions, write_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import _observations
from dualloop.controller.serve.config import ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.test_agents import agent_inputs
from tests.paths import REPO_ROOT

AGENTS = ["veh-0", "veh-1", "veh-2"]
N = 80


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dualloop.controller.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, COLUMNS="200"),
        timeout=300,
    )


def _decisions(snaps: list[pb.DecisionSnapshot]) -> list[tuple]:
    return [
        (s.tick, s.observation_seq, s.applied.index, tuple(s.applied.controls), s.proposed.action.index)
        + (s.safety_state, tuple(s.reasons), tuple(s.vetoed_by))
        for s in snaps
    ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[Path, dict[str, list[pb.DecisionSnapshot]], Path]:
    """3 LOCKSTEP agents on one stream (veh-1 leaves half-way), recorded; the recording and what the
    stream answered each agent."""
    tmp = tmp_path_factory.mktemp("agents-rec")
    driving = _observations(read_log(synthetic_log(tmp / "syn.mcap", seconds=3.0, rate_hz=100.0)))
    inputs = {sid: agent_inputs(driving, i, N) for i, sid in enumerate(AGENTS)}
    got: dict[str, list[pb.DecisionSnapshot]] = {sid: [] for sid in AGENTS}
    config = ServerConfig(model=BASE_MODEL_PATH, gates=list(DEFAULT_GATES), port=0, record_dir=tmp / "rec")
    with ServerThread(config) as srv, grpc.insecure_channel(srv.address) as channel:
        group = AgentsStream(channel)
        group.send(join=[agent_open(sid, pb.CLOCK_MODE_LOCKSTEP) for sid in AGENTS])
        group.recv()
        for k in range(N):
            live = [s for s in AGENTS if s != "veh-1" or k < N // 2]
            group.send(observations={s: inputs[s][k] for s in live}, leave=["veh-1"] if k == N // 2 - 1 else [])
            for snap in group.recv().snapshots:
                got[snap.session_id].append(snap)
        group.close()
        list(group.responses())
    (recording,) = (tmp / "rec").glob("*.mcap")
    return recording, got, tmp


def test_each_agent_is_a_session_of_the_recording(recorded):
    recording, got, _ = recorded
    sessions = read_sessions(recording)
    assert list(sessions) == AGENTS
    for sid in AGENTS:
        data = sessions[sid]
        assert data.header.session_id == sid and data.header.clock == pb.CLOCK_MODE_LOCKSTEP
        assert len(data.observations) == (N // 2 if sid == "veh-1" else N)
        # every snapshot the stream sent the agent, in its log
        assert [without_wall_clock(s) for s in data.snapshots] == [without_wall_clock(s) for s in got[sid]]
    # the agent that left: its last snapshots before its summary (they were recorded after its close)
    left = [r.topic for r in LogReader([recording]) if r.session_id == "veh-1"]
    assert left[-1] == TOPIC_SUMMARY and left.count(TOPIC_SUMMARY) == 1


def test_replay_and_diff_one_agent(recorded):
    recording, got, tmp = recorded
    replayed = tmp / "veh-2.replayed.mcap"
    done = _cli("replay", str(recording), "--session", "veh-2", "--out", str(replayed))
    assert done.returncode == 0, done.stdout + done.stderr
    log = read_log(replayed)
    assert log.session_id == "veh-2"
    assert _decisions(log.snapshots) == _decisions(got["veh-2"])  # the replay decides as the server did

    data = read_sessions(recording)["veh-2"]  # the agent's own part of the recording, as a log of one
    own = write_log(tmp / "veh-2.own.mcap", data.header, data.observations, data.snapshots)
    same = _cli("diff", str(own), str(replayed))
    assert same.returncode == 0, same.stdout + same.stderr
    assert "identical within tolerance" in same.stdout

    other = read_sessions(recording)["veh-0"]  # another agent's log: diff refuses to compare
    theirs = write_log(tmp / "veh-0.own.mcap", other.header, other.observations, other.snapshots)
    refused = _cli("diff", str(theirs), str(replayed))
    assert refused.returncode == 2 and "hold different sessions" in refused.stdout + refused.stderr
