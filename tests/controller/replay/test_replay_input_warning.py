"""`dualloop replay` of a log that cannot give its recorded decisions back says so: its decisions used
plans no observation carries (a server planner's, recorded before the recorder kept them), or its
first tick saw another input than the recorded one. A log that can, says nothing. Real MCAP files,
the real model runner, the real command line in process."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import replay_log
from dualloop.models import TEST_MODEL_PATH
from dualloop.v2 import controller_pb2 as pb


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A LOCKSTEP log with its decisions: observations carrying their plans, and the snapshots of a
    replay of them (what a recording of a planned session is, once its plans are kept). The plan ids
    look like rich markup, which the warning quotes: the report must print them as text."""
    tmp = tmp_path_factory.mktemp("input-warning")
    drive = synthetic_log(tmp / "drive.mcap", seconds=2.0, rate_hz=100.0)

    def markup_like(o: pb.Observation) -> None:
        if o.HasField("plan"):
            o.plan.plan_id = "[/x]" + o.plan.plan_id

    marked = _variant(drive, tmp / "marked.mcap", markup_like)
    return replay_log(marked, TEST_MODEL_PATH, out_path=tmp / "recorded.mcap").out_path  # type: ignore[return-value]


def _variant(recorded: Path, path: Path, change) -> Path:
    """The recorded log with its observations changed by `change` and its recorded decisions kept."""
    data = read_log(recorded)
    observations = []
    for msg in data.observations:
        copy = pb.Observation()
        copy.CopyFrom(msg)
        change(copy)
        observations.append(copy)
    return write_log(path, data.header, observations, data.snapshots)


def _replay(log: Path, tmp_path: Path, capsys) -> tuple[str, dict]:
    out = tmp_path / "replayed.mcap"
    assert main(["replay", str(log), "--model", str(TEST_MODEL_PATH), "--no-gate", "--out", str(out)]) == 0
    report = replay_log(log, TEST_MODEL_PATH).report.as_dict()
    return " ".join(capsys.readouterr().out.split()), report  # as one line: the terminal may wrap a long one


def test_a_log_that_gives_its_decisions_back_has_no_warning(recorded, tmp_path, capsys):
    printed, report = _replay(recorded, tmp_path, capsys)
    assert "warning:" not in printed and report["input_warning"] == ""


def test_a_log_without_the_plans_its_decisions_used_says_so(recorded, tmp_path, capsys):
    without_plans = _variant(recorded, tmp_path / "no-plans.mcap", lambda o: o.ClearField("plan"))
    printed, report = _replay(without_plans, tmp_path, capsys)
    assert report["input_warning"].startswith("the recorded decisions used 10 plans that no observation of the log ")
    assert "(the first '[/x]p0')" in report["input_warning"]
    assert f"gates none warning: {report['input_warning']}" in printed  # under the model, before the agreement
    assert printed.index("warning:") < printed.index("agreement with the actual action")


def test_a_lockstep_log_whose_first_input_changed_says_so(recorded, tmp_path, capsys):
    def nudge_first(o: pb.Observation) -> None:
        if o.seq == 1:
            o.features[0] += 0.5

    nudged = _variant(recorded, tmp_path / "nudged.mcap", nudge_first)
    first = read_log(recorded).snapshots[0]
    _, report = _replay(nudged, tmp_path, capsys)
    assert report["input_warning"].startswith("tick 0 saw another input than the recorded tick (input hash ")
    assert f"recorded {first.input_hash:016x})" in report["input_warning"]


def test_a_fleet_replay_prints_the_warning_under_its_log(recorded, tmp_path, capsys):
    without_plans = _variant(recorded, tmp_path / "no-plans.mcap", lambda o: o.ClearField("plan"))
    args = ["replay", str(recorded), str(without_plans), "--model", str(TEST_MODEL_PATH), "--no-gate"]
    assert main([*args, "--no-write", "--workers", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    warned = [i for i, line in enumerate(lines) if line.strip().startswith("warning:")]
    assert len(warned) == 1 and lines[warned[0] - 1].startswith("no-plans")
    assert "the recorded decisions used 10 plans that no observation" in lines[warned[0]]
