"""The ONNX planner source: its file contract, its validation errors, and valid plans out of it."""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest

from dualloop.planner.onnx_planner import METADATA_KEY, OnnxPlanner, PlannerFileError, export_planner_mlp
from dualloop.planner.plan import PlanRequest, PlanSource
from dualloop.sim.schema import BEHAVIOURS, FEATURE_INDEX, N_FEATURES, PLAN_INDEX


@pytest.fixture(scope="module")
def planner_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("onnx") / "planner.onnx"
    export_planner_mlp(path)
    return path


def test_builder_writes_a_large_card(planner_path):
    card = json.loads(onnx.load(str(planner_path)).metadata_props[0].value)
    assert card["size_class"] == "large" and card["behaviours"] == list(BEHAVIOURS) and len(card["version"]) == 12


def test_random_weights_give_valid_plans(planner_path):
    planner = OnnxPlanner(planner_path)
    assert isinstance(planner, PlanSource)
    rng = np.random.default_rng(1)
    seen = set()
    for i in range(300):
        x = rng.normal(0, 1, N_FEATURES).astype(np.float32) * 30.0
        x[FEATURE_INDEX["left_lane_exists"]] = float(i % 2)
        x[FEATURE_INDEX["right_lane_exists"]] = float((i // 2) % 2)
        p = planner.plan(PlanRequest("s", x, i))
        v = p.values()
        assert np.all(np.isfinite(v)) and 0.0 <= p.target_speed <= planner.card["max_speed"]
        one_hot = v[PLAN_INDEX["plan_keep"] :]
        assert one_hot.sum() == 1.0 and set(one_hot.tolist()) <= {0.0, 1.0}
        if x[FEATURE_INDEX["left_lane_exists"]] == 0:
            assert p.behaviour != "change_left"
        if x[FEATURE_INDEX["right_lane_exists"]] == 0:
            assert p.behaviour != "change_right"
        assert p.target_lane_offset == {"change_left": 3.5, "change_right": -3.5}.get(p.behaviour, 0.0)
        seen.add(p.behaviour)
    assert len(seen) >= 2


def test_nan_features_are_refused(planner_path):
    x = np.full(N_FEATURES, np.nan, np.float32)
    with pytest.raises(ValueError, match="NaN"):
        OnnxPlanner(planner_path).plan(PlanRequest("s", x, 0))


def _rewrite_card(src, dst, card: str | None):
    model = onnx.load(str(src))
    del model.metadata_props[:]
    if card is not None:
        entry = model.metadata_props.add()
        entry.key, entry.value = METADATA_KEY, card
    onnx.save(model, str(dst))


def test_missing_card_names_the_file(planner_path, tmp_path):
    bad = tmp_path / "no_card.onnx"
    _rewrite_card(planner_path, bad, None)
    with pytest.raises(PlannerFileError, match=rf"{bad}.*no '{METADATA_KEY}'"):
        OnnxPlanner(bad)


def test_card_not_matching_the_schema_names_the_file_and_field(planner_path, tmp_path):
    card = json.loads(onnx.load(str(planner_path)).metadata_props[0].value)
    card["features"] = list(reversed(card["features"]))
    bad = tmp_path / "reordered.onnx"
    _rewrite_card(planner_path, bad, json.dumps(card))
    with pytest.raises(PlannerFileError, match=rf"{bad}.*features .* do not match sim.schema.FEATURES"):
        OnnxPlanner(bad)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(PlannerFileError, match="absent.onnx"):
        OnnxPlanner(tmp_path / "absent.onnx")


def test_plan_time_is_small(planner_path):
    planner = OnnxPlanner(planner_path)
    x = np.zeros(N_FEATURES, np.float32)
    times = []
    for i in range(200):
        t0 = time.perf_counter()
        planner.plan(PlanRequest("s", x, i))
        times.append(time.perf_counter() - t0)
    assert np.median(times) < 5e-3
