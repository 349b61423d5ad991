"""Recorded drives as rows (controller.training.recorded) and the offline evaluation beside the
baselines (controller.training.log_eval)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.training.driving_card import build_test_model
from dualloop.controller.training.log_eval import (
    baseline_actions,
    evaluate,
    model_actions,
    ratio_interval,
    ratio_text,
    score,
)
from dualloop.controller.training.recorded import LogRows, dataset_name, log_paths, read_log_rows, training_splits
from dualloop.executor.action_labels import ACTIONS
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH
from dualloop.sim import schema
from tests.controller.training.human_logs import LONGITUDINAL, human_drive


@pytest.fixture(scope="module")
def drives(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("drives")
    human_drive(folder / "a.mcap", "a", dataset="Alpha Set", seconds=300.0)
    (folder / "sub").mkdir()
    human_drive(folder / "sub" / "b.mcap", "b", dataset="Beta", seconds=60.0, seed=1)
    return folder


def test_rows_follow_the_sensor_profile_and_keep_the_labels(drives: Path) -> None:
    rows = read_log_rows([drives])
    assert rows.sessions == ("a", "b") and rows.datasets == ("alpha-set", "beta")
    measured = [schema.FEATURE_INDEX[n] for n in LONGITUDINAL]
    assert rows.present[:, measured].all() and (rows.present.sum(axis=1) == len(LONGITUDINAL)).all()
    assert np.isnan(rows.features[~rows.present]).all() and rows.valid.all()
    log = read_log(drives / "a.mcap")
    a = rows.session == 0
    np.testing.assert_array_equal(rows.label[a], [o.actual.action_index for o in log.observations])
    np.testing.assert_array_equal(rows.accel[a], np.float32([o.actual.controls[0] for o in log.observations]))
    assert (rows.label[a][-5:] == -1).all(), "the look-ahead runs past the end"
    assert rows.t_s[a][0] == 0.0 and rows.t_s[a][1] == pytest.approx(0.1)


def test_validation_stretches_are_fixed_and_training_rows_labelled(drives: Path) -> None:
    rows = read_log_rows(log_paths([drives / "a.mcap", drives / "sub"]))
    v = rows.validation
    assert 0 < v.sum() < len(rows) and np.array_equal(v, read_log_rows([drives]).validation)
    splits = training_splits(rows)
    total = sum(len(s) for per in splits.values() for s in per.values())
    assert total == int((rows.label >= 0).sum())
    for per in splits.values():
        for split in per.values():
            # trained with the plan the executor gives a session without one
            assert np.array_equal(split.plan, schema.no_plan_rows(split.features, split.present))
            assert np.isnan(split.controls[:, 1]).all()
            assert (split.label >= 0).all()


def test_a_missing_log_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        log_paths([tmp_path / "nope"])


def _rows(features: list[list[float]], labels: list[int]) -> LogRows:
    x = np.full((len(features), schema.N_FEATURES), np.nan, np.float32)
    cols = [schema.FEATURE_INDEX[n] for n in LONGITUDINAL]
    x[:, cols] = np.array(features, np.float32)
    present = np.zeros_like(x, bool)
    present[:, cols] = ~np.isnan(x[:, cols])
    n = len(labels)
    return LogRows(
        x, present, np.array(labels), np.zeros(n), np.zeros(n, np.int64), np.arange(n) * 0.1, ("s",), ("d",), ("f",)
    )


def test_baselines_by_hand() -> None:
    # speed, accel, lead present, gap, rel speed
    rows = _rows(
        [
            [10.0, -1.0, 1.0, 10.0, 0.0],  # gap error 10 - (3 + 16) = -9 -> -2.07: brake
            [10.0, 0.7, 1.0, 40.0, 0.0],  # gap error +21 -> 4.83, clipped to 3: accelerate
            [10.0, 0.2, 0.0, 150.0, 0.0],  # no lead: keep
            [10.0, np.nan, np.nan, np.nan, np.nan],  # not measured: n/a
        ],
        [1, 3, 2, 2],
    )
    b = baseline_actions(rows)
    assert b["keep"].tolist() == [2, 2, 2, 2]
    assert b["ego_accel"].tolist() == [ACTIONS.index("brake"), ACTIONS.index("accelerate"), 2, -1]
    assert b["time_gap"].tolist() == [ACTIONS.index("brake"), ACTIONS.index("accelerate"), 2, -1]


def test_score_is_agreement_and_balanced_accuracy() -> None:
    label = np.array([2, 2, 2, 2, 1, 3])
    pred = np.array([2, 2, 2, 2, 2, -1])
    s = score(pred, label)
    assert s.agreement == pytest.approx(4 / 6) and s.balanced_accuracy == pytest.approx((1.0 + 0.0 + 0.0) / 3)


def test_the_disagreement_ratio_has_a_block_bootstrap_interval() -> None:
    """Blocks of one drive are drawn whole: the interval holds the ratio, narrows with more blocks,
    is the same on every run, and is a point where every block has the same ratio."""
    rng = np.random.default_rng(1)

    def errors(blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        block = np.repeat(np.arange(blocks), 100)
        baseline_wrong = rng.random(len(block)) < 0.2
        model_wrong = baseline_wrong & (rng.random(len(block)) < 0.5)  # about half the baseline's errors
        return model_wrong, baseline_wrong, block

    few, many = errors(10), errors(400)
    low_few, high_few = ratio_interval(*few)
    low_many, high_many = ratio_interval(*many)
    ratio = many[0].sum() / many[1].sum()
    assert low_many < ratio < high_many and high_many - low_many < 0.5 * (high_few - low_few)
    assert ratio_interval(*many) == (low_many, high_many)
    same = np.tile([True, False, False, False], 50)
    assert ratio_interval(same, same, np.repeat(np.arange(20), 10)) == (1.0, 1.0)
    nothing = np.zeros(0, bool)
    assert all(np.isnan(ratio_interval(nothing, nothing, np.zeros(0, np.int64))))
    assert ratio_text(0.876, (0.7, 1.071)) == "0.88x [0.70-1.07]"
    assert ratio_text(0.876, (float("nan"), float("nan"))) == "0.88x"  # a report written before the interval


def test_the_model_sees_the_mask_and_an_invalid_row_disagrees(tmp_path: Path, drives: Path) -> None:
    rows = read_log_rows([drives])
    build_test_model(tmp_path / "m.onnx")
    model = DecisionModel(tmp_path / "m.onnx", warmup_batches=())
    pred = model_actions(model, rows)
    assert (pred >= 0).all(), "missing features are not invalid"
    broken = replace(rows, features=rows.features.copy())
    broken.features[0, schema.FEATURE_INDEX["ego_speed"]] = np.nan
    assert model_actions(model, broken)[0] == -1
    reports = evaluate(model, rows)
    assert [r.dataset for r in reports] == ["alpha-set", "beta", "all"]
    assert reports[-1].model.rows == int((rows.label >= 0).sum())
    assert reports[-1].baselines["ego_accel"].rows == reports[-1].model_on["ego_accel"].rows
    assert reports[0].best_baseline in ("keep", "ego_accel", "time_gap")


def test_dataset_name_of_the_importers_details(drives: Path) -> None:
    log = read_log(drives / "a.mcap")
    assert dataset_name(log) == "alpha-set"
    log.header.source_details["dataset"] = "OpenACC AstaZero (JRC), human car-following"
    assert dataset_name(log) == "openacc-astazero"
    del log.header.source_details["dataset"]
    assert dataset_name(log) == "test"


def test_ego_accel_supplied_another_way(drives: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """As a stack without an accelerometer: "derived" is each session's backward speed slope (computed here
    from the speeds by hand), "absent" is not measured; both leave every other feature as it was."""
    rows = read_log_rows([drives])
    accel, speed = schema.FEATURE_INDEX["ego_accel"], schema.FEATURE_INDEX["ego_speed"]
    derived = rows.with_ego_accel("derived")
    a = np.flatnonzero(rows.session == 0)
    i = a[20]  # 2 s in, 10 Hz: the 0.5 s window is 5 observations back
    by_hand = (rows.features[i, speed] - rows.features[i - 5, speed]) / (rows.t_s[i] - rows.t_s[i - 5])
    assert derived.features[i, accel] == pytest.approx(by_hand, rel=1e-5)
    assert not np.allclose(derived.features[a[10:], accel], rows.features[a[10:], accel])  # not the logged values
    others = np.arange(schema.N_FEATURES) != accel
    np.testing.assert_array_equal(derived.features[:, others], rows.features[:, others])
    absent = rows.with_ego_accel("absent")
    assert not absent.present[:, accel].any() and np.isnan(absent.features[:, accel]).all() and absent.valid.all()
    assert rows.with_ego_accel("logged") is rows
    with pytest.raises(ValueError, match="one of logged, derived, absent"):
        rows.with_ego_accel("imu")
    assert main(["eval-logs", str(drives), "--ego-accel", "absent", "--leave-one-out"]) == 2
    assert "only without --leave-one-out" in "".join(capsys.readouterr())
    # as such a stack scores: each dataset's ratio beside its interval, the report's own
    assert main(["eval-logs", str(drives), "--ego-accel", "absent"]) == 0
    printed = "".join(capsys.readouterr())
    for report in evaluate(BASE_MODEL_PATH, absent):
        low, high = report.disagreement_interval
        assert low <= report.disagreement_ratio <= high
        assert f"{report.disagreement_ratio:.2f}x [{low:.2f}-{high:.2f}]" in printed
