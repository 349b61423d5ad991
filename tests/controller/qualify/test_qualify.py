"""`dualloop qualify` end to end on small inputs: the untrained test model fails against the shipped
one, the shipped one passes against itself, and bad input exits 2 naming what to fix."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import slice_log
from dualloop.controller.qualify.run import QualifyInputs, qualify
from dualloop.controller.qualify.shadow_step import run_shadow_step
from dualloop.controller.replay.lockstep import replay_log
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH, gates_beside

# small enough for well under a minute per qualification: two 30 s slices of the real drive, one
# seed per scenario, 12 s episodes (every fault's onset is at 5-10 s), two OOD scenarios
QUICK = ["--stress-seeds", "1", "--stress-duration", "12", "--workers", "1"]
SCENARIOS = ("sensor_dropout", "unit_mismatch_kmh")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    d = tmp_path_factory.mktemp("logs")
    return [slice_log(d / f"part{i}.mcap", 300 * i, 300, f"part{i}") for i in range(2)]


def _run(tmp_path, candidate, logs, *extra):
    out = tmp_path / "out"
    argv = ["qualify", str(candidate), "--logs", *map(str, logs), "--out", str(out), *QUICK]
    for s in SCENARIOS:
        argv += ["--stress-scenario", s]
    return main([*argv, *extra]), out


@pytest.mark.slow
def test_the_untrained_model_fails_against_the_shipped_one(tmp_path, logs, capsys):
    code, out = _run(tmp_path, TEST_MODEL_PATH, logs)
    text = "".join(capsys.readouterr())
    assert code == 1
    report = json.loads((out / "qualify.json").read_text())
    assert report["verdict"] == "fail" and report["failed"]
    failed = {c["name"] for c in report["checks"] if not c["passed"]}
    # worse on the recorded drives and worse calibrated in simulation
    assert "pooled agreement (model top-1 vs human)" in failed
    assert "nominal accuracy vs expert" in failed
    assert re.search(r"verdict: FAIL: \d+ of \d+ criteria failed", text)
    assert "failed: FAIL replay: pooled agreement" in text
    # the baseline's numbers are the shipped model's own replay on the same logs
    assert report["models"]["baseline"]["path"] == str(BASE_MODEL_PATH)
    assert report["replay"]["migration"]["ticks"] > 0


@pytest.mark.slow
def test_the_shipped_model_passes_against_itself(tmp_path, logs, capsys):
    code, out = _run(tmp_path, BASE_MODEL_PATH, logs)
    capsys.readouterr()
    assert code == 0
    report = json.loads((out / "qualify.json").read_text())
    assert report["verdict"] == "pass" and not report["failed"]
    # the same model on the same inputs: nothing moved, the same numbers on both sides
    mig = np.array(report["replay"]["migration"]["matrix"])
    assert mig.sum() > 0 and mig.sum() == np.trace(mig)
    for c in report["checks"]:
        if c["baseline"] is not None:
            assert c["candidate"] == pytest.approx(c["baseline"]), c["name"]
    stress = report["stress"]["candidate"]
    assert set(stress["gate_detection"]) == set(SCENARIOS)
    assert stress["stressed"]["ticks"] > 0 and stress["nominal"]["ticks"] > 0
    # one HTML page with its plots inside
    page = (out / "qualify.html").read_text()
    assert "PASS" in page and page.count("data:image/png;base64,") >= 5


def test_a_tolerance_can_turn_a_pass_into_a_failure(tmp_path, logs, capsys):
    """An absolute limit no model meets fails the shipped model against itself: the gate can fail."""
    code, out = _run(
        tmp_path, BASE_MODEL_PATH, logs, "--stress-seeds", "0", "--set", "replay.max_disagreement_ratio=0.001"
    )
    assert code == 1
    report = json.loads((out / "qualify.json").read_text())
    assert [c["name"] for c in report["checks"] if not c["passed"]] == [
        "pooled disagreement ratio vs best trivial baseline"
    ]


@pytest.mark.parametrize(
    "make,words",
    [
        (lambda p: ["--set", "replay.agreement_drop=-2"], ["--set", "replay.agreement_drop"]),
        (lambda p: ["--criteria", str(p / "missing.toml")], ["missing.toml", "not found"]),
        (lambda p: ["--int8", str(TEST_MODEL_PATH)], ["--int8", "not from the candidate"]),
        (lambda p: ["--gate", str(p / "nogate.npz")], ["nogate.npz"]),
    ],
)
def test_bad_input_exits_2_naming_it(tmp_path, logs, capsys, make, words):
    (tmp_path / "nogate.npz").write_bytes(b"not a gate")
    code, _ = _run(tmp_path, BASE_MODEL_PATH, logs, "--stress-seeds", "0", *make(tmp_path))
    text = "".join(capsys.readouterr())
    assert code == 2
    for w in words:
        assert w in text


def test_a_file_that_is_not_a_model_or_a_log_exits_2(tmp_path, logs, capsys):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"nope")
    assert _run(tmp_path, bad, logs, "--stress-seeds", "0")[0] == 2
    assert "bad.onnx" in "".join(capsys.readouterr())
    assert _run(tmp_path, BASE_MODEL_PATH, [tmp_path / "none.mcap"], "--stress-seeds", "0")[0] == 2
    assert "none.mcap" in "".join(capsys.readouterr())


def test_shadow_evidence_is_the_replays_agreement(tmp_path, logs):
    """A recorded session of the shipped model: its agreement over every tick is the replay report's."""
    rec = replay_log(logs[0], BASE_MODEL_PATH, DEFAULT_GATES, out_path=tmp_path / "shadow.mcap")
    base = DecisionModel(BASE_MODEL_PATH, warmup_batches=()).card
    step = run_shadow_step([tmp_path / "shadow.mcap"], base, base)
    assert step.candidate.ticks == rec.report.ticks == len(read_log(tmp_path / "shadow.mcap").snapshots)
    assert step.candidate.applied is not None
    assert step.candidate.applied.agreement() == pytest.approx(rec.report.agreement_top1)
    assert step.candidate.veto_rate == pytest.approx(rec.report.gate_veto_fraction)
    assert all(c.passed for c in step.checks(QualifyInputs(BASE_MODEL_PATH, []).criteria.shadow))
    # recorded with another model than the candidate: bad input, the versions named
    test_card = DecisionModel(TEST_MODEL_PATH, warmup_batches=()).card
    with pytest.raises(ConfigError, match=f"no snapshots of the candidate.*{test_card.version}.*{base.version}"):
        run_shadow_step([tmp_path / "shadow.mcap"], test_card, base)


def test_the_shipped_model_gates_are_found_beside_it(tmp_path):
    assert gates_beside(BASE_MODEL_PATH) == tuple(DEFAULT_GATES)
    m = tmp_path / "cand.onnx"
    m.write_bytes(BASE_MODEL_PATH.read_bytes())
    assert gates_beside(m) == ()
    (tmp_path / "cand.gate.npz").write_bytes(DEFAULT_GATES[0].read_bytes())
    assert gates_beside(m) == (tmp_path / "cand.gate.npz",)


def test_nothing_to_judge_is_bad_input_not_a_pass():
    with pytest.raises(ConfigError, match="nothing to qualify"):
        qualify(QualifyInputs(BASE_MODEL_PATH, [], stress_seeds=0))


def test_episodes_that_end_before_the_fault_are_bad_input(tmp_path, logs, capsys):
    code, _ = _run(tmp_path, BASE_MODEL_PATH, logs[:1], "--stress-duration", "3")
    assert code == 2
    assert "--stress-duration 3.0: the episodes end before the fault's onset" in "".join(capsys.readouterr())
