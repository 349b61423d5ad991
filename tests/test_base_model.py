"""The shipped base model: a complete card, and collision-free closed-loop driving on held-out seeds."""

from __future__ import annotations

import numpy as np
import pytest

import ood
from controller.models import BASE_MODEL_PATH, DEFAULT_GATES
from executor.core import Executor
from executor.model_runner import DecisionModel
from sim import schema
from sim.closed_loop import drive_in_process
from sim.scenarios import NOMINAL_SCENARIOS

HELD_OUT = (950_001, 950_002)  # no training, validation, test, gate or demo seed is near these


@pytest.fixture(scope="module")
def base() -> DecisionModel:
    return DecisionModel(BASE_MODEL_PATH)


def test_card_is_complete(base):
    card = base.card
    assert card.size_class == "base" and card.version and card.temperature != 1.0
    assert card.feature_names == list(schema.FEATURE_NAMES) and card.actions == list(schema.ACTIONS)
    m = card.training_metrics
    for key in ("test_accuracy", "test_ece_before", "test_ece_after", "forward_b1_p50_us", "forward_b1_p99_us",
                *(f"test_recall_{a}" for a in schema.ACTIONS)):
        assert key in m, key
    assert m["test_accuracy"] > m["test_majority_baseline"] + 0.15
    assert m["test_ece_after"] < m["test_ece_before"]


def test_int8_variant_loads_with_its_card(base):
    int8 = DecisionModel(BASE_MODEL_PATH.with_suffix(".int8.onnx"))
    assert int8.card.feature_names == base.card.feature_names and int8.card.version != base.card.version


@pytest.mark.parametrize("scenario", NOMINAL_SCENARIOS)
def test_drives_nominal_scenarios_without_collision(base, scenario):
    gates = [ood.load_gate(g) for g in DEFAULT_GATES]
    for seed in HELD_OUT:
        run = drive_in_process(Executor(base, None, gates), scenario, seed)
        m = run.metrics
        assert m.collisions == 0 and not m.off_road, f"{scenario} seed {seed}: {m.collisions} collisions"
        assert np.isfinite(run.applied_accel).all() and len(run.t) > 100
