from __future__ import annotations

import pytest

from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.controller.logs.synthetic import REAL_DRIVE as FIXTURE
from dualloop.controller.logs.synthetic import slice_log
from dualloop.controller.replay.diff import NotSameInput, diff_exit_code, diff_logs, format_diff
from dualloop.controller.replay.lockstep import replay_log
from dualloop.executor.snapshot import Check
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH


@pytest.fixture(scope="module")
def replays(tmp_path_factory):
    d = tmp_path_factory.mktemp("diff")
    return {
        name: replay_log(FIXTURE, model, out_path=d / f"{name}.mcap").out_path
        for name, model in (("test", TEST_MODEL_PATH), ("test2", TEST_MODEL_PATH), ("base", BASE_MODEL_PATH))
    }


def test_two_models_migrate_and_fail_the_gate(replays):
    report = diff_logs(replays["test"], replays["base"])
    assert report.ticks == 11989 and report.first is not None
    assert report.migrations and sum(report.migrations.values()) == report.changed["applied_index"] > 0
    assert report.decisions.sum() == report.ticks
    assert diff_exit_code(report, tolerance=0.01) == 1
    assert diff_exit_code(report, tolerance=1.0) == 0
    assert "first divergence" in format_diff(report)


def test_same_model_twice_is_empty(replays):
    report = diff_logs(replays["test"], replays["test2"])
    assert report.first is None and report.migrations == {}
    assert all(v == 0 for v in report.changed.values())
    assert diff_exit_code(report, tolerance=0.0, fields=("applied_index", "reasons", "applied_controls")) == 0
    assert "identical within tolerance" in format_diff(report)


def test_different_inputs_are_refused(replays, tmp_path):
    other = replay_log(
        slice_log(tmp_path / "s.mcap", 0, 100, "comma2k19-comma2k19-example1"),
        TEST_MODEL_PATH,
        out_path=tmp_path / "o.mcap",
    ).out_path
    with pytest.raises(NotSameInput, match="observations"):
        diff_logs(replays["test"], other)


def test_unknown_field_is_an_error(replays):
    with pytest.raises(ValueError, match="unknown diff field"):
        diff_exit_code(diff_logs(replays["test"], replays["test2"]), fields=("nope",))


def test_send_times_are_not_input():
    """Two recordings of the same observations sent at different wall-clock times are the same input;
    different features are not."""
    from dualloop.controller.logs.logfile import LogData
    from dualloop.controller.replay.diff import _observation_digest
    from dualloop.v2 import controller_pb2 as pb
    from dualloop.v2 import log_pb2

    def log(sent: int, x: float) -> LogData:
        obs = [pb.Observation(seq=k + 1, timestamp_ns=k, features=[x] * 3, sent_time_ns=sent + k) for k in range(5)]
        return LogData(header=log_pb2.SessionHeader(session_id="s"), observations=obs)

    assert _observation_digest(log(1_700_000_000_000_000_000, 1.0)) == _observation_digest(log(0, 1.0))
    assert _observation_digest(log(0, 1.0)) != _observation_digest(log(0, 2.0))


def test_a_log_from_before_the_checks_still_diffs(tmp_path):
    """Logs written before DecisionSnapshot.checks existed read and diff: only which check vetoed is
    new; the combined veto agrees."""
    source = slice_log(tmp_path / "s.mcap", 1000, 1600, "comma2k19-comma2k19-example1")
    new = replay_log(source, BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp_path / "new.mcap").out_path
    data = read_log(new)
    for s in data.snapshots:
        assert len(s.checks) == len(Check)  # every check the shipped model and gates run
        s.ClearField("checks")
        s.ClearField("vetoed_by")
    old = write_log(tmp_path / "old.mcap", data.header, data.observations, data.snapshots)
    report = diff_logs(old, new)
    vetoes = sum(1 for s in read_log(new).snapshots if s.vetoed_by)
    assert report.changed["gate_veto"] == 0 and report.changed["applied_index"] == 0
    assert report.changed["vetoed_by"] == vetoes > 0
    assert "vetoed_by" in format_diff(report)
