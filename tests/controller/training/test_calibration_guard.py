"""`dualloop train` refuses to write a model worse calibrated than its own uncalibrated logits or
than the current default model on the same test split, unless forced."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dualloop.controller.gates.fitting import forward_rows
from dualloop.controller.training.calibration import expected_calibration_error, nll, probabilities
from dualloop.controller.training.calibration_guard import (
    CalibrationGuard,
    CalibrationRefused,
    calibration_problems,
    reference_metrics,
)
from dualloop.controller.training.data import DataConfig, Dataset, generate
from dualloop.controller.training.mlp import MLPConfig
from dualloop.controller.training.trainer import TrainOptions, train
from dualloop.executor.history import DEFAULT_HISTORY
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH

# the shipped model takes history features: the rows must have them to compare it on the same split;
# two scenarios, a few short drives (some realistic: rows with missing features)
TINY = DataConfig(
    train_episodes=3,
    val_episodes=2,
    test_episodes=2,
    every=10,
    duration_s=10.0,
    scenarios=("nominal_cruise", "lead_brakes_hard"),
    relabel_targets=False,
    realistic_episodes=(2, 1, 1),
    history=DEFAULT_HISTORY,
)
# two epochs: a model far from the shipped one's NLL
UNDERTRAINED = MLPConfig(hidden=(16, 16), max_epochs=2, patience=2, batch_size=128)


@pytest.fixture(scope="module")
def tiny() -> Dataset:
    return generate(TINY, 5)


def _metrics(ece_before: float, ece_after: float, nll_before: float, nll_after: float) -> dict[str, float | str]:
    return {
        "test_ece_before": ece_before,
        "test_ece_after": ece_after,
        "test_nll_before": nll_before,
        "test_nll_after": nll_after,
    }


def test_each_way_of_being_worse_is_named():
    guard = CalibrationGuard(None, ece_tolerance=0.01, nll_tolerance=0.02)
    assert calibration_problems(_metrics(0.05, 0.05, 0.5, 0.5), None, guard) == []
    assert calibration_problems(_metrics(0.05, 0.059, 0.5, 0.519), None, guard) == []  # within tolerance
    (p,) = calibration_problems(_metrics(0.05, 0.07, 0.5, 0.5), None, guard)
    assert p == "calibrated test ECE 0.0700 > uncalibrated 0.0500 + 0.01"
    (p,) = calibration_problems(_metrics(0.05, 0.05, 0.5, 0.53), None, guard)
    assert p.startswith("calibrated test NLL 0.5300 > uncalibrated")
    problems = calibration_problems(_metrics(0.05, 0.05, 0.5, 0.5), {"ece": 0.01, "nll": 0.2}, guard)
    assert problems == [
        "calibrated test ECE 0.0500 > the default model's 0.0100 + 0.01",
        "calibrated test NLL 0.5000 > the default model's 0.2000 + 0.02",
    ]
    # a reference that could not be compared (a string saying why) judges nothing
    assert calibration_problems(_metrics(0.05, 0.05, 0.5, 0.5), "other features", guard) == []


@pytest.mark.slow
def test_the_reference_is_scored_as_the_executor_feeds_it(tiny):
    """reference_metrics (the trainer's normaliser) equals the gate tools' forward (the executor's
    normalisation) on the same rows."""
    got = reference_metrics(BASE_MODEL_PATH, tiny.test)
    assert isinstance(got, dict)
    model = DecisionModel(BASE_MODEL_PATH, warmup_batches=())
    # forward_rows takes one sensor profile for all rows; the split mixes them, so group by profile
    t = model.card.temperature
    labels = tiny.test.label
    all_logits = np.zeros((len(labels), len(model.card.actions)))
    profiles, inverse = np.unique(tiny.test.present, axis=0, return_inverse=True)
    for k, present in enumerate(profiles):
        rows = np.flatnonzero(inverse.ravel() == k)
        out, _, _ = forward_rows(
            model, tiny.test.features[rows], tiny.test.plan[rows], present=present, history=tiny.test.history[rows]
        )
        all_logits[rows] = out
    assert got["ece"] == pytest.approx(expected_calibration_error(probabilities(all_logits, t), labels), abs=1e-4)
    assert got["nll"] == pytest.approx(nll(all_logits, labels, t), abs=1e-4)


@pytest.mark.slow
def test_an_undertrained_model_is_refused_and_not_written_unless_forced(tiny, tmp_path):
    out = tmp_path / "small.onnx"
    guard = CalibrationGuard(BASE_MODEL_PATH)
    with pytest.raises(CalibrationRefused, match=r"not writing .*small.onnx: .*the default model's.*--force"):
        train(
            "small",
            5,
            out,
            data=tiny,
            config=UNDERTRAINED,
            options=TrainOptions(measure_latency_in_card=False, guard=guard),
        )
    assert not out.exists()
    forced = train(
        "small",
        5,
        out,
        data=tiny,
        config=UNDERTRAINED,
        options=TrainOptions(measure_latency_in_card=False, guard=replace(guard, force=True)),
    )
    assert out.is_file() and forced.calibration_warnings
    assert isinstance(forced.reference_calibration, dict)
    # without a reference and with tolerances no model breaks, the same training is written silently
    loose = CalibrationGuard(None, ece_tolerance=1.0, nll_tolerance=10.0)
    other = tmp_path / "loose.onnx"
    result = train(
        "small",
        5,
        other,
        data=tiny,
        config=UNDERTRAINED,
        options=TrainOptions(measure_latency_in_card=False, guard=loose),
    )
    assert other.is_file() and result.calibration_warnings == []


def test_a_reference_with_other_inputs_is_not_compared(tiny):
    rows = replace(tiny.test, history=np.zeros((len(tiny.test), 0), np.float32))  # a training without history
    why = reference_metrics(BASE_MODEL_PATH, rows)
    assert isinstance(why, str) and "history features" in why


def test_the_shipped_model_would_be_written_by_its_own_recipe():
    """Retraining the shipped model (its card's test metrics, against itself) is not refused."""
    m = DecisionModel(BASE_MODEL_PATH, warmup_batches=()).card.training_metrics
    own = {"ece": float(m["test_ece_after"]), "nll": float(m["test_nll_after"])}
    assert calibration_problems(m, own, CalibrationGuard(BASE_MODEL_PATH)) == []
