"""Recorder and log reader: round trips, rotation, never blocking the caller, truncated files."""

from __future__ import annotations

import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from dualloop.controller.logs import recorder as recorder_module
from dualloop.controller.logs.format import (
    TOPIC_HEADER,
    TOPIC_OBSERVATION,
    TOPIC_SNAPSHOT,
    TOPIC_SUMMARY,
    LogFileWriter,
    rotated_files,
)
from dualloop.controller.logs.logfile import LogFileError, read_log, read_sessions, write_log
from dualloop.controller.logs.recorder import Recorder
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

PERIOD_NS = 5_000_000


def observation(i: int) -> pb.Observation:
    obs = pb.Observation(
        seq=i,
        timestamp_ns=i * PERIOD_NS,
        features=[float(i) + k / 10 for k in range(19)],
        actual=pb.ActualAction(action_index=i % 4, controls=[0.1 * (i % 7), -0.01]),
    )
    if i % 40 == 0:
        obs.plan.plan_id = f"client-plan-{i}"
        obs.plan.values.extend([20.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    return obs


def snapshot(session_id: str, i: int) -> pb.DecisionSnapshot:
    return pb.DecisionSnapshot(
        session_id=session_id,
        tick=i,
        scheduled_time_ns=i * PERIOD_NS,
        emit_time_ns=i * PERIOD_NS + 7_000,
        observation_seq=i,
        model_version="m1",
        reasons=[pb.REASON_CODE_LOW_MARGIN] if i % 3 == 0 else [],
        proposed=pb.Proposal(
            action=pb.Action(index=2, name="keep", controls=[0.0, 0.0]),
            probabilities=[0.1, 0.2, 0.6, 0.1],
            confidence=0.6,
            margin=0.4,
        ),
        applied=pb.Action(index=2, name="keep", controls=[0.0, 0.0]),
        safety_state=pb.SAFETY_STATE_NOMINAL,
        input_hash=0xDEADBEEF00000000 + i,
    )


def header(session_id: str) -> log_pb2.SessionHeader:
    return log_pb2.SessionHeader(
        session_id=session_id,
        clock=pb.CLOCK_MODE_LOCKSTEP,
        shadow=True,
        model_version="m1",
        model_schema_hash="abc123",
        config_json='{"port": 0}',
        source="grpc session",
    )


def as_bytes(messages: list) -> list[bytes]:
    return [m.SerializeToString(deterministic=True) for m in messages]


def test_round_trip_gives_identical_messages_in_order(tmp_path: Path) -> None:
    path = tmp_path / "session.mcap"
    sent_obs = {sid: [observation(i) for i in range(500)] for sid in ("car-1", "car-2")}
    sent_snaps = {sid: [snapshot(sid, i) for i in range(500)] for sid in ("car-1", "car-2")}
    plan = log_pb2.PlanRecord(
        session_id="car-1",
        created_time_ns=123,
        source="builtin",
        plan=pb.PlanUpdate(plan_id="p1", values=[15.0, 0, 1, 0, 0, 0]),
    )
    with Recorder(path) as rec:
        for sid in ("car-1", "car-2"):
            rec.open_session(header(sid))
        rec.write_plan(plan)
        for i in range(500):
            for sid in ("car-1", "car-2"):
                assert rec.write_observation(sid, sent_obs[sid][i])
                assert rec.write_snapshot(sent_snaps[sid][i])
    assert rec.stats.written == {"observation": 1000, "snapshot": 1000, "plan": 1} and rec.stats.total_dropped == 0

    sessions = read_sessions(path)
    assert list(sessions) == ["car-1", "car-2"]
    for sid, data in sessions.items():
        assert not data.truncated
        assert data.header.session_id == sid and data.header.source == "grpc session"
        assert data.header.model_schema_hash == "abc123" and data.header.format_version == 1
        assert as_bytes(data.observations) == as_bytes(sent_obs[sid])
        assert as_bytes(data.snapshots) == as_bytes(sent_snaps[sid])
        assert data.summary is not None and data.summary.observations_written == 500
        assert data.summary.snapshots_written == 500 and data.summary.observations_dropped == 0
    assert as_bytes(sessions["car-1"].plans) == as_bytes([plan])
    with pytest.raises(LogFileError, match="2 sessions"):
        read_log(path)
    assert read_log(path, session_id="car-2").observations[7].seq == 7


def test_write_log_round_trip(tmp_path: Path) -> None:
    obs = [observation(i) for i in range(300)]
    snaps = [snapshot("s", i) for i in range(300)]
    write_log(tmp_path / "x.mcap", header("s"), obs, snaps)
    data = read_log(tmp_path / "x.mcap")
    assert as_bytes(data.observations) == as_bytes(obs) and as_bytes(data.snapshots) == as_bytes(snaps)
    assert not data.truncated and data.messages_read == 601


def test_rotation_by_size_gives_files_readable_alone(tmp_path: Path) -> None:
    stem = tmp_path / "rot.mcap"
    with Recorder(stem, rotate_bytes=40_000, flush_interval_s=0.01) as rec:
        rec.open_session(header("car-1"))
        for i in range(3000):
            rec.write_observation("car-1", observation(i))
            if i % 200 == 0:
                time.sleep(0.002)  # let the writer keep up: this test is about rotation, not drops
    assert rec.stats.total_dropped == 0
    parts = rotated_files(stem)
    assert len(parts) >= 3 and parts == rec.stats.files
    assert [p.name for p in parts[:2]] == ["rot-0000.mcap", "rot-0001.mcap"]
    seqs: list[int] = []
    for part_index, part in enumerate(parts):
        alone = read_log(part)
        assert alone.header.session_id == "car-1" and alone.header.source == "grpc session"
        assert alone.header.part == part_index and not alone.truncated
        assert part.stat().st_size < 40_000 * 2
        seqs += [o.seq for o in alone.observations]
    assert seqs == list(range(3000))
    whole = read_log(stem)  # the stem resolves to all parts
    assert [o.seq for o in whole.observations] == seqs and whole.summary.observations_written == 3000


def test_rotation_by_duration(tmp_path: Path) -> None:
    with Recorder(tmp_path / "dur.mcap", rotate_seconds=0.15, flush_interval_s=0.01) as rec:
        for i in range(40):
            rec.write_observation("car-1", observation(i))
            time.sleep(0.01)
    parts = rotated_files(tmp_path / "dur.mcap")
    assert len(parts) >= 2
    assert all("no session header" in read_log(p).header.source for p in parts)  # still self-describing
    assert [o.seq for o in read_log(parts).observations] == list(range(40))


def test_caller_never_blocks_and_overflow_is_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stalled disk: the writer thread is stuck in its first write until released (or 30 s).
    release = threading.Event()
    original = Recorder._write_data

    def stalled_write(self: Recorder, *args: object) -> None:
        release.wait(30)
        original(self, *args)

    monkeypatch.setattr(recorder_module.Recorder, "_write_data", stalled_write)
    rec = Recorder(tmp_path / "burst.mcap", queue_size=100)
    rec.open_session(header("car-1"))
    rec.write_observation("car-1", observation(0))
    deadline = time.monotonic() + 5
    while rec.queue_depth and time.monotonic() < deadline:  # the writer has taken it and is stuck
        time.sleep(0.001)
    accepted, slowest_ns = 0, 0
    start = time.perf_counter_ns()
    for i in range(1, 5001):
        t = time.perf_counter_ns()
        accepted += rec.write_observation("car-1", observation(i))
        slowest_ns = max(slowest_ns, time.perf_counter_ns() - t)
    burst_s = (time.perf_counter_ns() - start) / 1e9
    assert accepted == 100 and rec.stats.dropped["observation"] == 4900
    # nothing waited for the stalled writer: a write that did would wait out the 30 s stall, and one
    # that waited even 1 ms per dropped record would take 5 s. The bounds leave room for a busy
    # machine to preempt this thread (about 20 ms for the whole burst when quiet).
    assert burst_s < 3.0 and slowest_ns < 2_000_000_000, (burst_s, slowest_ns)
    release.set()
    stats = rec.close()
    assert stats.written["observation"] == 101
    data = read_log(tmp_path / "burst.mcap")
    assert [o.seq for o in data.observations] == list(range(101))
    assert data.summary.observations_dropped == 4900


@pytest.mark.parametrize("keep_fraction", [0.2, 0.5, 0.77, 0.93, 0.999])
def test_reader_recovers_prefix_of_a_cut_file(tmp_path: Path, keep_fraction: float) -> None:
    path = tmp_path / "full.mcap"
    obs = [observation(i) for i in range(4000)]
    rec = Recorder(path, flush_interval_s=0.0)  # flush after every batch: many small chunks
    for i, o in enumerate(obs):
        rec.write_observation("car-1", o)
        if i % 100 == 0:
            time.sleep(0.003)
    rec.close()
    blob = path.read_bytes()
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(blob[: int(len(blob) * keep_fraction)])
    data = read_log(cut)
    assert data.truncated and str(cut) in data.truncation
    got = as_bytes(data.observations)
    assert got == as_bytes(obs[: len(got)])  # a clean prefix, nothing invented
    assert len(got) >= 4000 * keep_fraction - 1200


def test_not_an_mcap_file_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.mcap"
    bogus.write_bytes(b"time,ego_speed\n0,1\n")
    with pytest.raises(LogFileError, match="not an MCAP file"):
        read_log(bogus)
    with pytest.raises(FileNotFoundError, match="no such log"):
        read_log(tmp_path / "missing.mcap")


def _recorders_memory(snap: tracemalloc.Snapshot) -> int:
    """Bytes allocated by the recorder and the MCAP writer it drives, not by the rest of the process
    (log records, other threads, the interpreter's caches: noise that varies with the machine's load)."""
    kept = snap.filter_traces([tracemalloc.Filter(True, "*/logs/recorder.py"), tracemalloc.Filter(True, "*/mcap*")])
    return sum(stat.size for stat in kept.statistics("filename"))


def test_a_full_disk_stops_recording_once_and_holds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """/dev/full: every write fails with ENOSPC. The error is logged once, every record is counted
    as dropped, and the recorder keeps nothing of them (it used to keep the MCAP writer, whose index
    of the records it could not write grew for as long as the disk stayed full)."""
    tracemalloc.start()
    try:
        rec = Recorder("/dev/full", flush_interval_s=0.0)
        rec.open_session(header("car-1"))
        before = _recorders_memory(tracemalloc.take_snapshot())
        n = 30_000
        for i in range(n):
            while not rec.write_snapshot(snapshot("car-1", i)):  # queue full: let the writer drain
                time.sleep(0.001)
        stats = rec.close()
        held = _recorders_memory(tracemalloc.take_snapshot()) - before
    finally:
        tracemalloc.stop()
    assert "No space left" in stats.error
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "recorder" in r.getMessage()]
    assert len(errors) == 1, errors
    assert stats.written["snapshot"] + stats.dropped["snapshot"] == n
    assert stats.dropped["snapshot"] > n - 2000  # all but those handed to the writer before the first flush
    assert held < 1_000_000, f"{held} bytes still held after close"


def test_drops_after_a_write_error_are_reported_with_it_as_their_cause(caplog: pytest.LogCaptureFixture) -> None:
    """Found by QA: every 10 s after the disk filled, "the disk or the writer is slower than the
    sessions' records", though recording had stopped and nothing was slow."""
    rec = Recorder("/dev/full", flush_interval_s=0.0, drop_log_interval_s=0.0)
    rec.open_session(header("car-1"))
    for i in range(3000):
        while not rec.write_snapshot(snapshot("car-1", i)):
            time.sleep(0.001)
    rec.close()
    drops = [r.getMessage() for r in caplog.records if "records dropped" in r.getMessage()]
    assert drops and all("recording stopped at a write error (OSError: [Errno 28]" in m for m in drops), drops


def test_the_queue_is_bounded_in_bytes_and_its_drops_are_counted_and_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A stalled disk and large records: the queue never holds more than queue_bytes of them (its
    record bound is far away), every refused record is counted, and the writer logs the drops."""
    release = threading.Event()
    original = Recorder._write_data

    def stalled_write(self: Recorder, *args: object) -> None:
        release.wait(30)
        original(self, *args)

    monkeypatch.setattr(recorder_module.Recorder, "_write_data", stalled_write)
    limit = 64_000
    rec = Recorder(tmp_path / "bytes.mcap", queue_size=1_000_000, queue_bytes=limit, drop_log_interval_s=0.01)
    big_id = "s" * 128
    rec.open_session(header(big_id))
    rec.write_snapshot(snapshot(big_id, 0))
    deadline = time.monotonic() + 5
    while rec.queue_depth and time.monotonic() < deadline:  # the writer has taken it and is stuck
        time.sleep(0.001)
    accepted, accepted_bytes, largest = 0, 0, 0
    for i in range(1, 2001):
        snap = snapshot(big_id, i)
        if rec.write_snapshot(snap):
            accepted, accepted_bytes = accepted + 1, accepted_bytes + snap.ByteSize()
        largest = max(largest, snap.ByteSize())
        assert rec.queue_bytes <= limit
    assert rec.queue_bytes == accepted_bytes and limit - largest < accepted_bytes  # filled to the byte bound
    assert rec.queue_depth == accepted and accepted < 300
    assert rec.stats.dropped["snapshot"] == rec.stats.dropped_queue_full == 2000 - accepted
    release.set()
    stats = rec.close()
    assert stats.written["snapshot"] == accepted + 1 and stats.max_queue_bytes <= limit
    assert rec.queue_bytes == 0  # every byte counted in was counted out
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "dropped" in r.getMessage()]
    assert warnings and f"{2000 - accepted} records dropped" in warnings[0], warnings


def test_a_recorder_never_overwrites_a_file_and_names_never_repeat(tmp_path: Path) -> None:
    """Record files are created exclusively: an existing file is left as it was (the recording
    fails, loudly). unique_log_path gives distinct names within one second and one process."""
    taken = tmp_path / "taken.mcap"
    taken.write_bytes(b"someone else's recording")
    rec = Recorder(taken, exclusive=True)
    rec.open_session(header("car-1"))
    rec.write_snapshot(snapshot("car-1", 0))
    stats = rec.close()
    assert "FileExistsError" in stats.error and stats.dropped["snapshot"] == 1
    assert taken.read_bytes() == b"someone else's recording"
    names = {recorder_module.unique_log_path(tmp_path).name for _ in range(1000)}
    assert len(names) == 1000


def test_a_closed_session_leaves_little_behind(tmp_path: Path) -> None:
    """Memory the recorder keeps per closed session (longest allowed id): its channels in the open
    file's index, nothing else; bounded per session (measured in docs/measurements.md)."""
    tracemalloc.start()
    try:
        with Recorder(tmp_path / "many.mcap", plots=True) as rec:
            rec.open_session(header("warm-up"))
            rec.write_snapshot(snapshot("warm-up", 0))
            rec.close_session("warm-up")
            while rec.queue_depth:
                time.sleep(0.001)
            before = tracemalloc.get_traced_memory()[0]
            n = 500
            for k in range(n):
                sid = f"{k:04d}" + "s" * 124
                rec.open_session(header(sid))
                rec.write_observation(sid, observation(1))
                rec.write_snapshot(snapshot(sid, 1))
                rec.close_session(sid)
                if k % 50 == 0:
                    while rec.queue_depth:
                        time.sleep(0.001)
            while rec.queue_depth:
                time.sleep(0.001)
            time.sleep(0.05)  # the last record handled
            per_session = (tracemalloc.get_traced_memory()[0] - before) / n
            assert not rec._sessions and not rec._headers and not rec._plots
    finally:
        tracemalloc.stop()
    print(f"recorder: {per_session:.0f} bytes kept per closed session")
    assert per_session < 16_000, per_session
    assert len(read_sessions(tmp_path / "many.mcap")) == n + 1


def test_an_id_opened_again_after_closing_is_another_session_with_its_own_header(tmp_path: Path) -> None:
    """A simulator that runs episode after episode under the same agent ids (found by QA: the two
    episodes were read as one session whose seq went back to 1, and `replay` stopped at a traceback)."""
    path = tmp_path / "episodes.mcap"
    second = header("car-0")
    second.shadow = False  # the second episode opened with other settings
    with Recorder(path) as rec:
        rec.open_session(header("car-0"))
        rec.open_session(header("car-1"))
        for i in range(1, 4):
            assert rec.write_observation("car-0", observation(i)) and rec.write_observation("car-1", observation(i))
        rec.close_session("car-0")
        rec.open_session(second)
        for i in range(1, 3):
            assert rec.write_observation("car-0", observation(i))
        rec.close_session("car-0")
        rec.open_session(header("car-0"))
        assert rec.write_observation("car-0", observation(1))
    sessions = read_sessions(path)
    assert list(sessions) == ["car-0", "car-1", "car-0#2", "car-0#3"]
    assert [[o.seq for o in d.observations] for d in sessions.values()] == [[1, 2, 3], [1, 2, 3], [1, 2], [1]]
    assert {d.session_id for d in sessions.values()} == {"car-0", "car-1"}
    assert sessions["car-0"].header.shadow and not sessions["car-0#2"].header.shadow
    assert sessions["car-0"].summary is not None and sessions["car-0"].summary.observations_written == 3
    assert sessions["car-0#2"].summary is not None and sessions["car-0#2"].summary.observations_written == 2


def test_a_reopened_id_in_a_log_without_its_second_header_takes_the_first(tmp_path: Path) -> None:
    """Recordings made before the recorder wrote a header at each opening: the summary marks the close."""
    path = tmp_path / "old.mcap"
    file = LogFileWriter(path)
    file.write(TOPIC_HEADER, "car-0", header("car-0"), 0)
    file.write(TOPIC_OBSERVATION, "car-0", observation(1), 1)
    file.write(TOPIC_SUMMARY, "car-0", log_pb2.SessionSummary(session_id="car-0", observations_written=1), 2)
    file.write(TOPIC_OBSERVATION, "car-0", observation(1), 3)
    file.finish()
    sessions = read_sessions(path)
    assert list(sessions) == ["car-0", "car-0#2"]
    assert sessions["car-0#2"].header == sessions["car-0"].header
    assert [len(d.observations) for d in sessions.values()] == [1, 1]


def test_a_snapshot_after_a_summary_is_the_closed_sessions_last(tmp_path: Path) -> None:
    """Recordings of a DriveAgents leave made before the server recorded a leaving agent's last
    snapshots ahead of its close: they stay with that session, not a second one."""
    path = tmp_path / "left.mcap"
    file = LogFileWriter(path)
    file.write(TOPIC_HEADER, "veh-1", header("veh-1"), 0)
    file.write(TOPIC_OBSERVATION, "veh-1", observation(1), 1)
    file.write(TOPIC_SUMMARY, "veh-1", log_pb2.SessionSummary(session_id="veh-1", observations_written=1), 2)
    file.write(TOPIC_SNAPSHOT, "veh-1", snapshot("veh-1", 1), 3)
    file.finish()
    sessions = read_sessions(path)
    assert list(sessions) == ["veh-1"] and len(sessions["veh-1"].snapshots) == 1
