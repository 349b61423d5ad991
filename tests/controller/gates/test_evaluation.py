"""`dualloop gate eval` with sensors that measure only some features: the evaluation judges every tick
as the executor does, and the simulator's stuck sensor is caught with either sensor profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.gates.evaluation import score_episodes
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.snapshot import Clock, Observation
from dualloop.sim.env import run_expert_batch
from dualloop.sim.schema import FEATURE_NAMES

LONGITUDINAL = np.array(
    [n in ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed") for n in FEATURE_NAMES]
)
TICK = 5_000_000


@pytest.fixture()
def model(base_model):  # noqa: ANN001, ANN201
    return base_model


@pytest.fixture()
def gates(base_gates):  # noqa: ANN001, ANN201
    return base_gates


@pytest.mark.parametrize("present", [None, LONGITUDINAL], ids=["all", "longitudinal"])
def test_the_stuck_sensor_is_caught_with_either_profile(model, gates, present) -> None:
    """Frozen features at cruise speed: vetoed at the second repeat, whether the sensors measure every
    feature or only the longitudinal ones (the others NaN, which never repeat exactly); nothing vetoed
    before the onset."""
    scored = score_episodes(model, gates, "stuck_sensor", [700_000, 700_001], present=present, duration_s=14.0)
    for b in range(2):
        onset = scored.onset_tick[b]
        assert not scored.alarm[b, :onset].any()
        assert scored.alarm[b, onset + 2 :].all()


def test_the_evaluation_judges_a_profile_as_the_executor_does(model, gates) -> None:
    """The raw-input gate on the longitudinal profile, tick by tick: the evaluation's vectorised scoring
    (completed rows, the profile's threshold and limits, present-only changes and freeze check) gives
    the executor's vetoes and scores."""
    (inputs,) = [g for g in gates if g.schema.source == "input_features"]
    params = {"duration_s": 12.0}
    scored = score_episodes(model, [inputs], "noise_burst", [700_002], present=LONGITUDINAL, **params)
    _, data = run_expert_batch("noise_burst", [700_002], **params)
    ex = Executor(model, ExecutorConfig(min_margin=0.0), [inputs])
    ex.open_session("a", clock=Clock.LOCKSTEP).present = LONGITUDINAL
    snaps = []
    for k in range(data.features.shape[1]):
        x = np.where(LONGITUDINAL, data.features[0, k], np.float32(np.nan))
        snaps += ex.advance_lockstep(
            "a",
            Observation(
                seq=k + 1,
                timestamp_ns=k * TICK,
                features=x,
                plan_id=f"p{k}",
                plan_values=data.plan[0, k],
                actual_controls=None if k == 0 else data.applied[0, k, :].astype(np.float32),
            ),
        )
    veto = np.array([s.gate_veto for s in snaps])
    np.testing.assert_array_equal(veto, scored.alarm[0])
    ratio = np.array([s.gate_score / s.gate_threshold for s in snaps])
    np.testing.assert_allclose(ratio, scored.score[0], rtol=1e-6)
    assert veto[scored.onset_tick[0] :].any() and not veto[: scored.onset_tick[0]].any()


@pytest.mark.parametrize("present", ["bogus_feature", "ego_speed,bogus_feature", ","])
def test_gate_eval_refuses_unknown_present_names_up_front_listing_the_valid_ones(
    present: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ge"
    assert main(["gate", "eval", "--present", present, "--out", str(out)]) == 2
    text = " ".join("".join(capsys.readouterr()).split())
    assert "error: --present names" in text
    assert "bogus_feature" in text or present == ","
    assert "the model's features: " + ", ".join(FEATURE_NAMES) in text  # the shipped model's are the simulator's
    assert not out.exists()  # refused before any scoring or output
