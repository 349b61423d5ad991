"""`dualloop qualify` from a QA pass of the model lifecycle: a stress scenario with nothing to judge
is said so (no traceback), a verdict with nothing judged is no pass, a failed run leaves no earlier
report in --out, and bad inputs are refused before the replay and the stress set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.controller.logs.synthetic import slice_log
from dualloop.controller.replay.lockstep import replay_log
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import log_pb2

# the documented quick look: one seed, 12 s episodes (every fault has started by then)
QUICK = ["--stress-seeds", "1", "--stress-duration", "12"]


def _qualify(out: Path, *extra: str) -> int:
    return main(["qualify", str(BASE_MODEL_PATH), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def shadow_without_actuals(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shadow session of the shipped model recorded from a stack that sent no actual actions."""
    d = tmp_path_factory.mktemp("shadow")
    src = read_log(slice_log(d / "src.mcap", 0, 200, "noactual"))
    for o in src.observations:
        o.ClearField("actual")
    header = log_pb2.SessionHeader()
    header.CopyFrom(src.header)
    log = write_log(d / "noactual.mcap", header, src.observations)
    replay_log(log, BASE_MODEL_PATH, DEFAULT_GATES, out_path=d / "rec.mcap")
    return d / "rec.mcap"


def test_a_stress_scenario_with_nothing_to_judge_is_said_not_judged(tmp_path, capsys):
    """low_friction is judged on ticks with a braking or acceleration demand, and 12 s episodes have
    none: that row is "not judged", the others are judged (it was a traceback, exit 1)."""
    out = tmp_path / "out"
    code = _qualify(out, *QUICK, "--stress-scenario", "low_friction")
    text = "".join(capsys.readouterr())
    assert code == 0, text
    report = json.loads((out / "qualify.json").read_text())
    (row,) = [c for c in report["checks"] if c["name"].startswith("gate AUROC on low_friction")]
    assert row["judged"] is False and row["passed"] and "not judged: no tick with a braking" in row["note"]
    assert "longer than 12 s" in row["note"]
    assert report["stress"]["candidate"]["gate_detection"]["low_friction"]["not_judged"]
    assert report["verdict"] == "pass" and any(c["judged"] for c in report["checks"])
    assert "n/a stress: gate AUROC on low_friction" in text


def test_a_verdict_with_nothing_judged_is_no_pass(tmp_path, capsys, shadow_without_actuals):
    """Shadow sessions without the stack's actual actions give nothing to compare: NOT JUDGED, exit
    2 (it was PASS, exit 0), with the report written."""
    out = tmp_path / "out"
    code = _qualify(out, "--stress-seeds", "0", "--shadow", str(shadow_without_actuals))
    text = "".join(capsys.readouterr())
    assert code == 2, text
    assert "verdict: NOT JUDGED: nothing to compare (shadow: neither model has a tick with the stack's" in text
    assert "PASS" not in text
    report = json.loads((out / "qualify.json").read_text())
    assert report["verdict"] == "not judged" and report["not_judged"] and not report["failed"]
    assert "NOT JUDGED" in (out / "qualify.html").read_text()


def test_a_failed_run_leaves_no_earlier_report(tmp_path, capsys):
    """A run that fails once its steps have started (episodes ending before the fault) removes the
    report an earlier run left in --out: none could be taken for this run's."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("qualify.json", "qualify.html"):
        (out / name).write_text("an earlier run's report")
    args = ["--stress-seeds", "1", "--stress-duration", "3", "--stress-scenario", "sensor_dropout"]
    assert _qualify(out, *args) == 2
    assert "the episodes end before the fault's onset" in "".join(capsys.readouterr())
    assert not (out / "qualify.json").exists() and not (out / "qualify.html").exists()


@pytest.mark.parametrize(
    "flag,make,words",
    [
        ("--int8", lambda p: p / "trunc.onnx", ["--int8", "trunc.onnx", "cannot load it"]),
        ("--shadow", lambda p: p / "trunc.onnx", ["--shadow", "trunc.onnx", "not an MCAP file"]),
        ("--out", lambda p: p / "a-file" / "q0", ["--out", "a-file/q0", "cannot write the report there"]),
    ],
)
def test_bad_inputs_are_refused_before_any_step(tmp_path, capsys, flag, make, words):
    """A truncated model or log, an --out that cannot be written: one line, exit 2, before the
    stress set runs (they were found only after it)."""
    (tmp_path / "trunc.onnx").write_bytes(BASE_MODEL_PATH.read_bytes()[:3000])
    (tmp_path / "a-file").write_text("a file, not a folder")
    argv = [*QUICK, "--stress-scenario", "sensor_dropout", flag, str(make(tmp_path))]
    out = tmp_path / "out"
    code = main(["qualify", str(BASE_MODEL_PATH), *(["--out", str(out)] if flag != "--out" else []), *argv])
    text = "".join(capsys.readouterr())
    assert code == 2, text
    for w in words:
        assert w in text
    assert "stress set" not in text and "Traceback" not in text
