"""The INT8 check of `dualloop qualify --int8`: quantize's per-class comparison, one check per class."""

from __future__ import annotations

import pytest

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.qualify.criteria import Int8Criteria
from dualloop.controller.qualify.int8_step import int8_checks, run_int8_step
from dualloop.controller.training.data import DataConfig
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, MODELS_DIR, TEST_MODEL_PATH

SMALL = DataConfig(
    train_episodes=1,
    val_episodes=1,
    test_episodes=2,
    every=10,
    duration_s=10.0,
    scenarios=("nominal_cruise", "lead_brakes_hard"),
    relabel_targets=False,
    realistic_episodes=(0, 0, 1),
)


@pytest.mark.slow
def test_one_check_per_class_with_support_and_the_limit_is_the_flag():
    fp32, int8 = DecisionModel(BASE_MODEL_PATH), DecisionModel(MODELS_DIR / "base.int8.onnx")
    report = run_int8_step(fp32, int8, 0.02, SMALL)
    checks = int8_checks(report, Int8Criteria(max_recall_drop=0.02))
    supported = [r for r in report["per_class"] if r["support"] > 0]
    assert len(checks) == len(supported) > 0
    for c, r in zip(checks, supported):
        assert c.candidate == pytest.approx(r["recall_drop"])
        assert c.passed == (r["recall_drop"] <= 0.02)
        assert c.passed == (not r["flagged"])  # the same limit as quantize's flag
    # no class fails when any drop is allowed
    assert all(c.passed for c in int8_checks(report, Int8Criteria(max_recall_drop=1.0)))


def test_an_int8_file_of_another_model_is_bad_input():
    int8 = DecisionModel(MODELS_DIR / "base.int8.onnx")
    source = int8.card.training_metrics["quantized_from"]
    with pytest.raises(ConfigError, match=f"quantised from model version {source}, not from the candidate"):
        run_int8_step(DecisionModel(TEST_MODEL_PATH), int8, 0.02, SMALL)
