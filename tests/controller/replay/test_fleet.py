"""Fleet replay: the column-wise snapshot encoder and the bulk MCAP writer give the
bytes the per-message path gives, and a fleet's reports are the single-log replays' reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mcap.reader import make_reader

from dualloop.controller.bench.replay import rotated_drives
from dualloop.controller.cli import main
from dualloop.controller.contract.wire import snapshot_to_proto, without_wall_clock
from dualloop.controller.logs import logfile
from dualloop.controller.logs.bulk import NotFast, TopicMessages, read_messages, write_messages
from dualloop.controller.logs.format import (
    TOPIC_HEADER,
    TOPIC_OBSERVATION,
    TOPIC_SNAPSHOT,
    LogFileWriter,
    sensor_profile,
)
from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.controller.logs.synthetic import REAL_DRIVE, slice_log, synthetic_log
from dualloop.controller.replay.evaluation import evaluate_replay, unmeasured_features
from dualloop.controller.replay.fleet import FLEET_SCHEMA, format_fleet, replay_many
from dualloop.controller.replay.lockstep import (
    LoadedModel,
    _observations,
    executor_config_for,
    replay_log,
)
from dualloop.controller.replay.report import summarise
from dualloop.controller.replay.wire_batch import encode_snapshots
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.snapshot import Clock
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH


def _serialised(snaps):
    return [snapshot_to_proto(s).SerializeToString(deterministic=True) for s in snaps]


@pytest.mark.parametrize(
    "model,gates,rate_hz,faults,decision_vector",
    [
        (BASE_MODEL_PATH, DEFAULT_GATES, 150.0, True, False),  # every fault, off-grid, plans
        (BASE_MODEL_PATH, DEFAULT_GATES, 10.0, False, True),  # a slow sensor, the decision vector
        (TEST_MODEL_PATH, (), 200.0, True, False),  # no gates: no gate result, no checks but the margin
    ],
)
def test_encoded_snapshots_are_the_serialisers_bytes(tmp_path, model, gates, rate_hz, faults, decision_vector):
    log = synthetic_log(tmp_path / "s.mcap", seconds=5.0, rate_hz=rate_hz, faults=faults)
    data = read_log(log)
    ex = LoadedModel.load(model, gates).executor(executor_config_for(data.header))
    ex.open_session("s", Clock.LOCKSTEP, shadow=True, include_decision_vector=decision_vector)
    table = run_lockstep(ex, "s", _observations(data))
    snaps = table.snapshots()
    assert len(snaps) > 400
    assert encode_snapshots(table) == _serialised(snaps)


def test_encoded_snapshots_of_the_real_drive_with_a_sensor_profile(tmp_path):
    data = read_log(REAL_DRIVE)
    ex = LoadedModel.load(BASE_MODEL_PATH, DEFAULT_GATES).executor(executor_config_for(data.header))
    ex.open_session("drive", Clock.LOCKSTEP, shadow=False, provided_features=sensor_profile(data.header))
    table = run_lockstep(ex, "drive", _observations(data))
    assert encode_snapshots(table) == _serialised(table.snapshots())


def _groups(data, snapshots):
    first = data.observations[0].timestamp_ns
    return [
        TopicMessages(TOPIC_HEADER, [data.header.SerializeToString(deterministic=True)], np.array([first])),
        TopicMessages(
            TOPIC_OBSERVATION,
            [o.SerializeToString(deterministic=True) for o in data.observations],
            np.array([o.timestamp_ns for o in data.observations]),
        ),
        TopicMessages(
            TOPIC_SNAPSHOT,
            [s.SerializeToString(deterministic=True) for s in snapshots],
            np.array([s.scheduled_time_ns for s in snapshots]),
        ),
    ]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """A replay with gates of a log with every fault, written by replay_log (the bulk path)."""
    tmp = tmp_path_factory.mktemp("replayed")
    log = synthetic_log(tmp / "faults.mcap", seconds=5.0, rate_hz=200.0, faults=True)
    return log, replay_log(log, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp / "out.mcap")


@pytest.mark.parametrize("chunk_bytes", [100, 4096, 256 * 1024])
def test_bulk_writer_is_byte_identical_to_the_per_message_writer(tmp_path, replayed, chunk_bytes):
    data = read_log(replayed[1].out_path)
    reference = LogFileWriter(tmp_path / "ref.mcap", chunk_bytes=chunk_bytes)
    for topic, messages, times in (
        (TOPIC_HEADER, [data.header], [data.observations[0].timestamp_ns]),
        (TOPIC_OBSERVATION, data.observations, [o.timestamp_ns for o in data.observations]),
        (TOPIC_SNAPSHOT, data.snapshots, [s.scheduled_time_ns for s in data.snapshots]),
    ):
        for message, t in zip(messages, times):
            reference.write(topic, data.session_id, message, t)
    reference.finish()
    bulk = write_messages(tmp_path / "bulk.mcap", data.session_id, _groups(data, data.snapshots), chunk_bytes)
    assert bulk.read_bytes() == (tmp_path / "ref.mcap").read_bytes()
    # and the mcap library reads it through its summary and indexes, message for message
    with open(bulk, "rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None and summary.statistics is not None
        assert summary.statistics.message_count == 1 + len(data.observations) + len(data.snapshots)
        assert len(summary.chunk_indexes) == summary.statistics.chunk_count >= 1
        snapshot_data = [m.data for _, c, m in reader.iter_messages(topics=[TOPIC_SNAPSHOT])]
    assert snapshot_data == [s.SerializeToString(deterministic=True) for s in data.snapshots]


def test_replay_log_writes_what_the_per_message_path_writes(tmp_path, replayed):
    log, result = replayed
    source = read_log(log)
    reference = write_log(
        tmp_path / "ref.mcap", result.header, source.observations, (snapshot_to_proto(s) for s in result.snapshots)
    )
    assert result.out_path is not None and result.out_path.read_bytes() == reference.read_bytes()
    back = read_log(result.out_path)
    assert not back.truncated and back.observations == source.observations
    assert [without_wall_clock(s) for s in back.snapshots] == [
        without_wall_clock(snapshot_to_proto(s)) for s in result.snapshots
    ]


def _comparable(report: dict) -> str:
    """A report without what depends on the clock (its timings and the speed-up from them)."""
    return json.dumps({k: v for k, v in report.items() if k not in ("timings", "speedup")}, sort_keys=True)


@pytest.fixture(scope="module")
def fleet_logs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fleet")
    logs = [slice_log(tmp / f"drive{i}.mcap", i * 700, 600, f"s{i}") for i in range(3)]
    logs.append(synthetic_log(tmp / "faults.mcap", seconds=5.0, rate_hz=150.0, faults=True))
    return tmp, logs


@pytest.mark.parametrize("workers", [1, 2])
def test_fleet_reports_are_the_single_log_reports(fleet_logs, workers):
    """One worker replays every log with one model and gate load: nothing of one log may leak
    into the next (state in the shared model or gates would show here)."""
    tmp, logs = fleet_logs
    fleet = replay_many(
        logs, BASE_MODEL_PATH, DEFAULT_GATES, workers=workers, out_dir=tmp / f"w{workers}", progress=False
    )
    assert not fleet.errors and fleet.order == [str(p) for p in logs] and fleet.workers == workers
    for log in logs:
        single = replay_log(log, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp / "single.mcap")
        assert _comparable(fleet.reports[str(log)]) == _comparable(single.report.as_dict())
        written = tmp / f"w{workers}" / f"{Path(log).stem}.replayed.mcap"
        assert written.read_bytes() == (tmp / "single.mcap").read_bytes()


def test_fleet_per_log_rows_and_pooled_row_agree(fleet_logs):
    tmp, logs = fleet_logs
    waited = []  # the command line's own imports go here, while the workers start
    fleet = replay_many(logs, TEST_MODEL_PATH, (), workers=2, progress=False, while_waiting=lambda: waited.append(1))
    assert waited == [1]
    rows, pooled = fleet.per_log(), fleet.pooled()
    assert [r["log"] for r in rows] == [str(p) for p in logs]
    assert pooled["logs"] == len(rows) == 4 and pooled["failed"] == 0
    for key in ("ticks", "observations", "gate_veto_ticks"):
        assert pooled[key] == sum(r[key] for r in rows)
    assert pooled["drive_s"] == pytest.approx(sum(r["drive_s"] for r in rows))
    assert pooled["compute_s"] == pytest.approx(sum(r["compute_s"] for r in rows))
    assert pooled["worker_s"] == pytest.approx(sum(r["seconds"] for r in rows))
    # the pooled agreement is over ticks: the tick-weighted mean of the logs' agreements
    weighted = sum(r["agreement_top1"] * r["ticks"] for r in rows) / pooled["ticks"]
    assert pooled["agreement_top1"] == pytest.approx(weighted)
    assert pooled["speedup"] == pytest.approx(pooled["drive_s"] / pooled["wall_s"])
    assert min(r["seconds"] for r in rows) <= pooled["seconds_per_log"]["median"] <= pooled["seconds_per_log"]["p99"]
    json.dumps(fleet.as_dict(), allow_nan=False)
    table = format_fleet(fleet)
    assert all(Path(p).stem in table for p in logs) and "pooled (4 logs, 0 failed)" in table


def test_cli_fleet_report_json(fleet_logs, capsys):
    tmp, logs = fleet_logs
    bad = tmp / "not-a-log.mcap"
    bad.write_bytes(b"nothing")
    report = tmp / "fleet.json"
    args = ["replay", *map(str, logs[:2]), str(bad), "--model", str(TEST_MODEL_PATH), "--no-gate"]
    code = main([*args, "--workers", "2", "--no-write", "--report", str(report)])
    assert code == 1  # one log failed
    out = json.loads(report.read_text())
    assert out["schema"] == FLEET_SCHEMA and [r["log"] for r in out["logs"]] == [*map(str, logs[:2]), str(bad)]
    assert "error" in out["logs"][2] and str(bad) in out["errors"]
    assert out["pooled"]["logs"] == 2 and out["pooled"]["failed"] == 1
    printed = capsys.readouterr()
    assert "drive0" in printed.out and "failed" in printed.out
    # said as the one-log replay says it, the file named once (was "LogFileError: ...: 0 sessions (none); name one")
    assert out["errors"][str(bad)] == f"{bad}: not an MCAP log"
    assert f"failed: {bad}: not an MCAP log\n" in printed.out + printed.err


def test_an_empty_log_among_many_is_said_as_such(fleet_logs, capsys):
    tmp, logs = fleet_logs
    empty = tmp / "empty.mcap"
    empty.write_bytes(b"")
    args = ["replay", str(logs[0]), str(empty), "--model", str(TEST_MODEL_PATH), "--no-gate", "--no-write"]
    assert main([*args, "--workers", "2"]) == 1
    printed = capsys.readouterr()
    assert f"failed: {empty}: empty file, not an MCAP log" in printed.out + printed.err


def test_rotated_drives_are_distinct_valid_logs_of_the_real_drive(tmp_path):
    paths = rotated_drives(tmp_path, 3, seconds=10.0)
    source = {np.float32(o.features).tobytes() for o in read_log(REAL_DRIVE).observations}
    firsts = set()
    for p in paths:
        data = read_log(p)
        ts = np.array([o.timestamp_ns for o in data.observations])
        assert (
            not data.truncated and np.all(np.diff(ts) > 0) and (ts[-1] - ts[0]) / 1e9 == pytest.approx(10.0, abs=0.02)
        )
        assert [o.seq for o in data.observations] == list(range(1, len(ts) + 1))
        assert all(np.float32(o.features).tobytes() in source for o in data.observations)  # real samples only
        firsts.add(tuple(data.observations[0].features))
    assert len(firsts) == 3


@pytest.mark.parametrize("which", ["faults", "drive", "no-gates"])
def test_report_and_evaluation_from_the_table_are_those_from_the_snapshots(tmp_path, which):
    log = (
        REAL_DRIVE if which == "drive" else synthetic_log(tmp_path / "f.mcap", seconds=5.0, rate_hz=150.0, faults=True)
    )
    model, gates = (TEST_MODEL_PATH, ()) if which == "no-gates" else (BASE_MODEL_PATH, DEFAULT_GATES)
    data = read_log(log)
    observations = _observations(data)
    ex = LoadedModel.load(model, gates).executor(executor_config_for(data.header))
    ex.open_session("s", Clock.LOCKSTEP, shadow=True, provided_features=sensor_profile(data.header))
    table = run_lockstep(ex, "s", observations)
    snaps = table.snapshots()
    timings = {"compute_s": 0.01}
    a = summarise(table, ex, len(observations), 5.0, Path(log), timings).as_dict()
    b = summarise(snaps, ex, len(observations), 5.0, Path(log), timings).as_dict()
    assert json.dumps(a) == json.dumps(b)  # same numbers, same key order
    assert sum(a["safety_states"].values()) == len(snaps) and (which != "faults" or len(a["reasons"]) >= 4)
    unmeasured = unmeasured_features(data.header, ex.card.feature_names)
    if which == "no-gates":  # the test model's actions are not the label bands: no evaluation either way
        return
    e1 = evaluate_replay(table, observations, ex.card, log, unmeasured).as_dict()
    e2 = evaluate_replay(snaps, observations, ex.card, log, unmeasured).as_dict()
    assert json.dumps(e1) == json.dumps(e2) and e1["labelled"] > 0


def test_one_pass_reader_reads_what_the_stream_reader_reads(tmp_path, replayed, monkeypatch):
    out = replayed[1].out_path
    fast = logfile.read_log(out)
    truncated = tmp_path / "cut.mcap"
    truncated.write_bytes(out.read_bytes()[: out.stat().st_size // 2])
    with pytest.raises(NotFast):
        read_messages(truncated)  # no footer: LogReader reads it and says how far it got
    cut_fast_path = logfile.read_log(truncated)
    monkeypatch.setattr(logfile, "_fast_records", lambda files: None)
    slow = logfile.read_log(out)
    assert fast.header == slow.header and fast.observations == slow.observations
    assert fast.snapshots == slow.snapshots and fast.messages_read == slow.messages_read > 1000
    assert not fast.truncated and not slow.truncated
    cut = logfile.read_log(truncated)
    assert cut_fast_path.truncated and cut.truncated and cut_fast_path.truncation == cut.truncation
    assert len(cut_fast_path.snapshots) == len(cut.snapshots) < len(slow.snapshots)


def test_one_pass_reader_on_corrupted_files_leaves_them_to_the_stream_reader(tmp_path, replayed):
    """Flipped bytes anywhere: the one-pass reader reads the file or declines it (NotFast, never
    another exception, never a huge allocation); read_log then answers data or a LogFileError."""
    original = replayed[1].out_path.read_bytes()
    rng = np.random.default_rng(18)
    for trial in range(40):
        raw = bytearray(original)
        for at in rng.integers(0, len(raw), int(rng.integers(1, 4))):
            raw[at] = int(rng.integers(0, 256))
        path = tmp_path / f"c{trial}.mcap"
        path.write_bytes(bytes(raw))
        try:
            read_messages(path)
        except NotFast:
            pass
        try:
            logfile.read_log(path)
        except logfile.LogFileError:
            pass


def _without_timings(report: dict) -> dict:
    return {k: v for k, v in report.items() if k not in ("timings", "speedup")}


def test_a_loaded_model_replays_a_log_the_same_after_other_logs_as_a_fresh_process(tmp_path):
    # a fleet worker keeps its model and gates for every log: nothing of one log's sessions may
    # reach the next (A, then a faulty B, then A again: A's twice, and as a new process replays it)
    a = slice_log(tmp_path / "a.mcap", 0, 1500, "drive")
    b = synthetic_log(tmp_path / "b.mcap", seconds=5.0, rate_hz=150.0, faults=True)
    gates = [str(g) for g in DEFAULT_GATES]
    loaded = LoadedModel.load(BASE_MODEL_PATH, gates)
    runs = [
        replay_log(log, BASE_MODEL_PATH, gates, out_path=tmp_path / f"{k}-{log.stem}.out.mcap", loaded=loaded)
        for k, log in enumerate((a, b, a))
    ]
    first, again = runs[0], runs[2]
    fresh_out = tmp_path / "fresh.mcap"
    args = ["replay", str(a), "--model", str(BASE_MODEL_PATH), *(x for g in gates for x in ("--gate", g))]
    subprocess.run([sys.executable, "-m", "dualloop.controller.cli", *args, "--out", str(fresh_out)], check=True)
    fresh = json.loads(fresh_out.with_suffix(".json").read_text())
    assert first.out_path.read_bytes() == again.out_path.read_bytes() == fresh_out.read_bytes()
    one, two = first.report.as_dict(), again.report.as_dict()
    assert json.dumps(_without_timings(one)) == json.dumps(_without_timings(two))
    assert json.loads(json.dumps(_without_timings(one), default=float)) == _without_timings(fresh)
    assert runs[1].report.gate_veto_ticks > 0 and runs[1].report.reasons  # B vetoes: its filters end busy
