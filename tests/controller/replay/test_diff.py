from __future__ import annotations

import pytest

from dualloop.controller.cli import main
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


@pytest.fixture(scope="module")
def differing(tmp_path_factory):
    """Two short replays of the same slice of the real drive that differ (the shipped model with its
    gates, the untrained test model without): `dualloop diff` exits 1 on them."""
    d = tmp_path_factory.mktemp("differing")
    source = slice_log(d / "s.mcap", 1000, 1600, "comma2k19-comma2k19-example1")
    a = replay_log(source, BASE_MODEL_PATH, DEFAULT_GATES, out_path=d / "a.mcap").out_path
    b = replay_log(source, TEST_MODEL_PATH, out_path=d / "b.mcap").out_path
    return str(a), str(b)


def test_the_differing_pair_fails_and_a_full_tolerance_passes(differing, capsys):
    a, b = differing
    assert main(["diff", a, b]) == 1
    assert main(["diff", a, b, "--tolerance", "1", "--controls-tol", "0"]) == 0  # the range's ends are accepted
    assert main(["diff", a, a, "--tolerance", "0"]) == 0


@pytest.mark.parametrize(
    "option",
    [
        ("--tolerance", "nan"),  # compared False with every fraction: differing logs passed
        ("--tolerance", "-1"),  # identical logs failed
        ("--tolerance", "1.5"),
        ("--tolerance", "inf"),
        ("--controls-tol", "-5"),
        ("--controls-tol", "nan"),
    ],
)
def test_a_tolerance_out_of_range_is_refused_naming_the_option(differing, capsys, option):
    a, b = differing
    assert main(["diff", a, b, *option]) == 2
    out = capsys.readouterr()
    assert f"error: {option[0]} " in out.out + out.err and " -> " not in out.out  # refused before diffing


def test_an_unknown_field_is_refused_before_the_logs_are_read(differing, tmp_path, capsys):
    a, _ = differing
    assert main(["diff", a, a, "--field", "applied_index", "--field", "bogus"]) == 2
    text = "".join(capsys.readouterr())
    assert "--field: unknown diff field(s) bogus; choose from missing, applied_index" in text
    assert " -> " not in text  # refused before diffing
    # not even read: the field is named, not the missing log
    assert main(["diff", str(tmp_path / "none.mcap"), a, "--field", "bogus"]) == 2
    assert "--field: unknown diff field(s) bogus" in "".join(capsys.readouterr())


def test_an_empty_or_cut_log_is_refused_not_identical(differing, tmp_path, capsys):
    a, _ = differing
    empty = tmp_path / "empty.mcap"
    empty.write_bytes(b"")
    cut = tmp_path / "cut.mcap"
    cut.write_bytes(FIXTURE.read_bytes()[:20])
    assert main(["diff", str(empty), str(empty)]) == 2
    assert f"error: {empty}: empty file, not an MCAP log" in "".join(capsys.readouterr())
    assert main(["diff", str(cut), str(cut)]) == 2
    text = "".join(capsys.readouterr())
    assert f"error: {cut}: no sessions" in text and "identical" not in text
    assert main(["diff", a, str(cut)]) == 2
    assert f"{cut}: no sessions" in "".join(capsys.readouterr())
