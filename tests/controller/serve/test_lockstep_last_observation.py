"""LOCKSTEP decides an observation at the first grid tick at or after its timestamp, and that tick
runs when a later observation reaches it: a stream's last observation, off the 5 ms grid, is accepted
and recorded but never decided, and the session counts it in observations_dropped (its session.close
event), for Drive and DriveAgents alike (docs/contract.md#realtime-and-lockstep). A replay of the
recording decides as the live session did. A real server on loopback (shipped model and gates,
recording on), the real CLI for replay and diff, real MCAP files."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from dualloop.controller.contract.agents_client import AgentsStream, agent_open, observation
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.logs.logfile import read_log, read_sessions, write_log
from dualloop.controller.serve.events import configure_logging
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.v2 import controller_pb2 as pb
from tests.controller.serve.inputs import sensor
from tests.controller.serve.servers import shipped
from tests.paths import REPO_ROOT

LOCKSTEP = pb.CLOCK_MODE_LOCKSTEP
HZ30 = 33_333_333  # a 30 Hz sensor's period: off the 5 ms grid
OFF_GRID = [k * HZ30 for k in range(4)]  # the last, 100 ms - 1 ns, is off the grid
ON_GRID = [*OFF_GRID[:3], 100_000_000]  # the last on the grid (20 ticks after the first)


def _drive(channel: grpc.Channel, session_id: str, timestamps: list[int]) -> list[int]:
    """A Drive LOCKSTEP session of these observations, half-closed: the seq each snapshot decided."""
    session = DriveSession(channel, session_id, LOCKSTEP)
    for seq, ts in enumerate(timestamps, 1):
        session.send(seq, ts, sensor(seq))
    session.close()
    return [s.observation_seq for s in session.snapshots()]


def _agent(channel: grpc.Channel, session_id: str, timestamps: list[int]) -> list[int]:
    group = AgentsStream(channel)
    group.send(join=[agent_open(session_id, LOCKSTEP)])
    group.recv()
    seqs = []
    for seq, ts in enumerate(timestamps, 1):
        group.send(observations={session_id: observation(seq, ts, sensor(seq))})
        seqs += [s.observation_seq for s in group.recv().snapshots]
    group.close()
    assert not list(group.responses())  # the half-close is not answered: nothing was waiting
    return seqs


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, list[int]], dict[str, dict], Path]:
    """(the seqs each session's snapshots decided, its session.close event, the recording)."""
    tmp = tmp_path_factory.mktemp("last-observation")
    stream = io.StringIO()
    root = logging.getLogger("dualloop")
    saved = (list(root.handlers), root.level, root.propagate)
    configure_logging("INFO", "json", stream)
    try:
        srv: ServerThread
        with shipped(record_dir=tmp / "rec") as srv, grpc.insecure_channel(srv.address) as channel:
            decided = {
                "drive-off": _drive(channel, "drive-off", OFF_GRID),
                "drive-on": _drive(channel, "drive-on", ON_GRID),
                "agent-off": _agent(channel, "agent-off", OFF_GRID),
            }
    finally:
        root.handlers[:], root.propagate = saved[0], saved[2]
        root.setLevel(saved[1])
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    closes = {e["session_id"]: e for e in events if e["event"] == "session.close"}
    (recording,) = (tmp / "rec").glob("*.mcap")
    return decided, closes, recording


def test_an_off_grid_last_observation_is_counted_dropped(served) -> None:
    decided, closes, _ = served
    for sid in ("drive-off", "agent-off"):
        assert sorted(set(decided[sid])) == [1, 2, 3], sid  # seq 4 was accepted, never decided
        close = closes[sid]
        assert (close["code"], close["last_seq"], close["observations_dropped"]) == ("OK", 4, 1), close
    assert sorted(set(decided["drive-on"])) == [1, 2, 3, 4]  # on the grid: its tick ran with it
    assert closes["drive-on"]["observations_dropped"] == 0


def test_a_replay_of_the_recording_decides_as_the_session_did(served, tmp_path: Path) -> None:
    decided, _, recording = served
    data = read_sessions(recording)["drive-off"]
    assert [o.seq for o in data.observations] == [1, 2, 3, 4]  # the last one recorded
    own = write_log(tmp_path / "own.mcap", data.header, data.observations, data.snapshots)
    replayed = tmp_path / "replayed.mcap"
    env = dict(os.environ, COLUMNS="200")
    cli = [sys.executable, "-m", "dualloop.controller.cli"]
    done = subprocess.run([*cli, "replay", str(own), "--out", str(replayed)], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert [s.observation_seq for s in read_log(replayed).snapshots] == decided["drive-off"]
    same = subprocess.run(
        [*cli, "diff", str(own), str(replayed)], capture_output=True, text=True, cwd=REPO_ROOT, env=env
    )
    assert same.returncode == 0, same.stdout + same.stderr
