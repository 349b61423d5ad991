import numpy as np
import pytest

from dualloop.sim import schema


def test_feature_schema_order_and_units() -> None:
    assert schema.N_FEATURES == 19
    assert schema.FEATURE_NAMES[:5] == ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed")
    assert schema.FEATURE_NAMES[-1] == "right_rear_rel_speed"
    assert schema.FEATURE_UNITS[schema.FEATURE_INDEX["road_curvature"]] == "1/m"
    assert schema.SENSOR_RANGE_M == 150.0
    assert schema.PLAN_NAMES == (
        "target_speed",
        "target_lane_offset",
        "plan_keep",
        "plan_change_left",
        "plan_change_right",
        "plan_stop",
    )
    assert schema.ACTIONS == ("brake_hard", "brake", "keep", "accelerate")
    assert [(c.name, c.low, c.high) for c in schema.CONTROLS] == [("accel", -8.0, 3.0), ("steer", -0.5, 0.5)]
    assert set(schema.SPEED_FEATURES) == {"ego_speed"} | {n for n in schema.FEATURE_NAMES if n.endswith("rel_speed")}


@pytest.mark.parametrize(
    "accel, action",
    [
        (-8.0, "brake_hard"),
        (-3.5001, "brake_hard"),
        (-3.5, "brake"),
        (-0.5001, "brake"),
        (-0.5, "keep"),
        (0.0, "keep"),
        (0.5, "keep"),
        (0.5001, "accelerate"),
        (3.0, "accelerate"),
    ],
)
def test_label_from_accel_thresholds(accel: float, action: str) -> None:
    assert int(schema.label_from_accel(accel)) == schema.ACTION_INDEX[action]


def test_label_from_accel_is_vectorised() -> None:
    a = np.array([[-5.0, -1.0], [0.2, 1.0]])
    labels = schema.label_from_accel(a)
    assert labels.shape == (2, 2)
    assert labels.tolist() == [[0, 1], [2, 3]]


def test_make_plan_one_hot() -> None:
    plan = schema.make_plan([20.0, 0.0], [3.5, 0.0], [1, 3])
    assert plan.dtype == np.float32 and plan.shape == (2, 6)
    assert plan[0].tolist() == [20.0, 3.5, 0.0, 1.0, 0.0, 0.0]
    assert plan[1].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
