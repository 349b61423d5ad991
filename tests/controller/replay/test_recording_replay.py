"""Every session of a server's recording replays: a real `dualloop serve` records 8 sessions at
once, is drained (SIGTERM) or killed (SIGKILL), and `dualloop replay` of its recording replays each
session into a log of its own whose decisions are those of a replay of that session's own log."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from mcap.reader import make_reader

from dualloop.controller.cli import main
from dualloop.controller.contract.client import DriveSession
from dualloop.controller.logs.format import TOPIC_HEADER, TOPIC_OBSERVATION, LogFileWriter
from dualloop.controller.logs.logfile import read_log, read_sessions, write_log
from dualloop.controller.logs.synthetic import REAL_DRIVE
from dualloop.controller.replay.lockstep import replay_log, session_file_name
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2
from tests.paths import REPO_ROOT

# ids that differ only in what a file name cannot hold, and one a file name must not take as a path
SESSIONS = ["car-0", "car-1", "car 2", "car/2", "../car-4", "car-5", "car-6", "car-7"]
TICKS = 120


def _serve(model: Path, record_dir: Path, stderr: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "serve", "--model", str(model), "--port", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUALLOOP_")}
    with open(stderr, "w") as err:
        proc = subprocess.Popen(
            [*cmd, "--record-dir", str(record_dir)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            cwd=REPO_ROOT,
            env=env,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r" on 127\.0\.0\.1:(\d+)", line)
    if not found:
        proc.kill()
        pytest.fail(f"serve did not start: {line!r} {stderr.read_text()}")
    return proc, f"127.0.0.1:{found.group(1)}"


def _drive(address: str, close: bool) -> None:
    """8 LOCKSTEP sessions open together, fed in turns (their records interleave in the file),
    each a different stretch of a real drive; close=False leaves them open."""
    source = read_log(REAL_DRIVE).observations
    with grpc.insecure_channel(address) as channel:
        sessions = [DriveSession(channel, sid, pb.CLOCK_MODE_LOCKSTEP) for sid in SESSIONS]
        for tick in range(TICKS):
            for k, session in enumerate(sessions):
                obs = source[k * 50 + tick]
                session.send(obs.seq, obs.timestamp_ns, list(obs.features))
                while session.recv().observation_seq < obs.seq:  # a tick per grid step: several per gap
                    pass
        for session in sessions:
            if close:
                session.close()
                assert not list(session.snapshots())  # every snapshot came already


def _replay_cli(recording: Path, out: Path, model: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "replay", str(recording), "--out", str(out)]
    return subprocess.run(
        [*cmd, "--model", str(model), "--no-gate", *extra],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=dict(os.environ, COLUMNS="200"),
        timeout=300,
    )


def _decisions(path: Path) -> list[tuple]:
    return [
        (
            s.tick,
            s.observation_seq,
            s.applied.index,
            tuple(s.applied.controls),
            s.proposed.action.index,
            s.safety_state,
            tuple(s.reasons),
        )
        for s in read_log(path).snapshots
    ]


def _assert_each_session_as_its_own_log(recording: Path, out: Path, model: Path, tmp_path: Path) -> None:
    sessions = read_sessions(recording)
    assert list(sessions) == SESSIONS
    for index, sid in enumerate(SESSIONS):
        data = sessions[sid]
        assert data.observations, sid
        own = write_log(tmp_path / f"own-{index}.mcap", data.header, data.observations)
        alone = replay_log(own, model, out_path=tmp_path / f"own-{index}.replayed.mcap")
        replayed = out / session_file_name(recording.stem, index, sid)
        assert replayed.is_file(), sorted(p.name for p in out.iterdir())
        assert read_log(replayed).session_id == sid
        decisions = _decisions(replayed)
        assert len(decisions) >= len(data.observations) == alone.report.observations
        assert decisions == _decisions(alone.out_path), sid


def test_every_session_of_a_drained_recording_replays(test_model_path, tmp_path):
    proc, address = _serve(test_model_path, tmp_path / "rec", tmp_path / "serve.err")
    try:
        _drive(address, close=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "serve.err").read_text()
    (recording,) = (tmp_path / "rec").glob("*.mcap")
    assert all(len(d.observations) == TICKS for d in read_sessions(recording).values())

    done = _replay_cli(recording, tmp_path / "out", test_model_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"replayed 8 of the 8 sessions of {recording}" in done.stdout.replace("\n", "")
    _assert_each_session_as_its_own_log(recording, tmp_path / "out", test_model_path, tmp_path)

    # one session by id: --out is its new log, as for a log of one session
    only = tmp_path / "one.mcap"
    one = _replay_cli(recording, only, test_model_path, "--session", "car/2")
    assert one.returncode == 0, one.stdout + one.stderr
    assert read_log(only).session_id == "car/2" and len(_decisions(only)) >= TICKS
    missing = _replay_cli(recording, tmp_path / "none", test_model_path, "--session", "car-9")
    assert missing.returncode == 2
    assert "no session 'car-9' (sessions: 'car-0', 'car-1'" in missing.stdout + missing.stderr

    # the live session against its replay: the same decisions (diff compared whole logs only, and a
    # recording holds every session)
    assert main(["diff", str(recording), str(only), "--session", "car/2"]) == 0
    assert main(["diff", str(recording), str(only)]) == 2  # different sessions: not the same input
    assert main(["diff", str(recording), str(only), "--session", "car-1"]) == 2  # car-1's input is not car/2's


def test_every_session_of_a_killed_recording_replays_its_complete_part(test_model_path, tmp_path):
    proc, address = _serve(test_model_path, tmp_path / "rec", tmp_path / "serve.err")
    try:
        _drive(address, close=False)
        time.sleep(2.0)  # the recorder flushes every 0.25 s: what was sent is on disk
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    (recording,) = (tmp_path / "rec").glob("*.mcap")

    refused = _replay_cli(recording, tmp_path / "out", test_model_path)
    assert refused.returncode == 2
    assert "--allow-truncated" in refused.stdout + refused.stderr

    done = _replay_cli(recording, tmp_path / "out", test_model_path, "--allow-truncated")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "replayed 8 of the 8 sessions" in done.stdout
    _assert_each_session_as_its_own_log(recording, tmp_path / "out", test_model_path, tmp_path)

    # the standard MCAP reader needs the file's end; `dualloop recover` writes what was readable whole
    with open(recording, "rb") as f, pytest.raises(Exception):  # noqa: B017 (the reader's own error types vary)
        list(make_reader(f).iter_messages())
    recovered = tmp_path / "recovered.mcap"
    cmd = [sys.executable, "-m", "dualloop.controller.cli", "recover", str(recording), str(recovered)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert run.returncode == 0 and "was cut" in run.stdout, run.stdout + run.stderr
    with open(recovered, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None and summary.statistics is not None
        messages = list(reader.iter_messages())
    assert len(messages) == summary.statistics.message_count
    by_session: dict[str, int] = {}
    for _, channel, _ in messages:
        if channel.topic == "/dualloop/observation":
            by_session[channel.metadata["session_id"]] = by_session.get(channel.metadata["session_id"], 0) + 1
    cut = read_sessions(recording)
    assert by_session == {sid: len(cut[sid].observations) for sid in SESSIONS}
    recovered_sessions = read_sessions(recovered)
    assert not any(d.truncated for d in recovered_sessions.values())
    assert all(recovered_sessions[s].snapshots == cut[s].snapshots for s in SESSIONS)
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert again.returncode == 2 and "exists" in again.stdout + again.stderr  # never overwrites


def test_an_id_a_client_opened_again_replays_as_each_of_its_sessions(test_model_path, tmp_path):
    """A simulator running episodes under the same id: each episode replays as the session it was
    (found by QA: `replay` of the recording stopped at a traceback, the other sessions not replayed)."""
    proc, address = _serve(test_model_path, tmp_path / "rec", tmp_path / "serve.err")
    source = read_log(REAL_DRIVE).observations
    try:
        with grpc.insecure_channel(address) as channel:
            for episode in range(2):
                session = DriveSession(channel, "car-0", pb.CLOCK_MODE_LOCKSTEP)
                for k in range(40 + 20 * episode):
                    obs = source[episode * 300 + k]
                    session.send(k + 1, obs.timestamp_ns, list(obs.features))
                    while session.recv().observation_seq < k + 1:
                        pass
                session.close()
                assert not list(session.snapshots())
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "serve.err").read_text()
    (recording,) = (tmp_path / "rec").glob("*.mcap")
    sessions = read_sessions(recording)
    assert list(sessions) == ["car-0", "car-0#2"]
    assert [len(d.observations) for d in sessions.values()] == [40, 60]

    done = _replay_cli(recording, tmp_path / "out", test_model_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"replayed 2 of the 2 sessions of {recording}" in done.stdout.replace("\n", "")
    for index, (key, data) in enumerate(sessions.items()):
        own = write_log(tmp_path / f"own-{index}.mcap", data.header, data.observations)
        alone = replay_log(own, test_model_path, out_path=tmp_path / f"own-{index}.replayed.mcap")
        replayed = tmp_path / "out" / session_file_name(recording.stem, index, key)
        assert read_log(replayed).session_id == "car-0"
        assert _decisions(replayed) == _decisions(alone.out_path), key
    second = _replay_cli(recording, tmp_path / "second.mcap", test_model_path, "--session", "car-0#2")
    assert second.returncode == 0, second.stdout + second.stderr
    assert _decisions(tmp_path / "second.mcap") == _decisions(
        tmp_path / "out" / session_file_name(recording.stem, 1, "car-0#2")
    )


def test_a_session_the_server_would_refuse_is_named_and_the_others_still_replay(test_model_path, tmp_path):
    source = read_log(REAL_DRIVE)
    path = tmp_path / "mixed.mcap"
    file = LogFileWriter(path)
    for sid in ("good", "bad"):
        head = log_pb2.SessionHeader()
        head.CopyFrom(source.header)
        head.session_id = sid
        file.write(TOPIC_HEADER, sid, head, 0)
    for k, obs in enumerate(source.observations[:50]):
        file.write(TOPIC_OBSERVATION, "good", obs, k)
        if k != 20:  # the bad session's seq goes back at its 21st
            file.write(TOPIC_OBSERVATION, "bad", obs, k)
        else:
            file.write(
                TOPIC_OBSERVATION, "bad", pb.Observation(seq=1, timestamp_ns=obs.timestamp_ns, features=obs.features), k
            )
    file.finish()
    done = _replay_cli(path, tmp_path / "out", test_model_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{path}: session 'bad' not replayed: observation seq 1 is not after the previous seq" in done.stderr
    assert "replayed 1 of the 2 sessions" in done.stdout.replace("\n", "") and "failed: 'bad'" in done.stdout
    assert len(_decisions(tmp_path / "out" / session_file_name(path.stem, 0, "good"))) >= 50
