"""Observation / plan / action schema: the single source of truth.

Every other module (sim, model export, OOD gate, wire contract) should derive names, order and units
from the tuples below instead of re-typing them, so a reorder here is a reorder everywhere.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from dualloop.executor import action_labels as _labels
from dualloop.executor.default_plan import DefaultPlan


class Field(NamedTuple):
    name: str
    unit: str
    description: str


# Sensor horizon: a gap reads this value when there is no vehicle (or no lane) to measure.
SENSOR_RANGE_M: float = 150.0

FEATURES: tuple[Field, ...] = (
    Field("ego_speed", "m/s", "ego speed"),
    Field("ego_accel", "m/s^2", "ego longitudinal acceleration (actual, after actuator lag)"),
    Field("lead_present", "bool", "1 if a vehicle is ahead in the ego lane within sensor range"),
    Field("lead_distance", "m", "bumper-to-bumper gap to the in-lane lead, SENSOR_RANGE_M if none"),
    Field("lead_rel_speed", "m/s", "lead speed minus ego speed, 0 if none"),
    Field("lane_offset", "m", "lateral offset of ego from the centre of its current lane, + = left"),
    Field("heading_error", "rad", "ego heading minus road heading"),
    Field("yaw_rate", "rad/s", "ego yaw rate"),
    Field("road_curvature", "1/m", "road curvature at the ego position, + = turning left"),
    Field("left_lane_exists", "bool", "1 if there is a lane to the left of the ego lane"),
    Field("right_lane_exists", "bool", "1 if there is a lane to the right of the ego lane"),
    Field("left_front_gap", "m", "gap to the nearest vehicle ahead in the left lane"),
    Field("left_front_rel_speed", "m/s", "its speed minus ego speed, 0 if none"),
    Field("left_rear_gap", "m", "gap to the nearest vehicle behind in the left lane"),
    Field("left_rear_rel_speed", "m/s", "its speed minus ego speed, 0 if none"),
    Field("right_front_gap", "m", "gap to the nearest vehicle ahead in the right lane"),
    Field("right_front_rel_speed", "m/s", "its speed minus ego speed, 0 if none"),
    Field("right_rear_gap", "m", "gap to the nearest vehicle behind in the right lane"),
    Field("right_rear_rel_speed", "m/s", "its speed minus ego speed, 0 if none"),
)
FEATURE_NAMES: tuple[str, ...] = tuple(f.name for f in FEATURES)
FEATURE_UNITS: tuple[str, ...] = tuple(f.unit for f in FEATURES)
N_FEATURES: int = len(FEATURES)

PLAN: tuple[Field, ...] = (
    Field("target_speed", "m/s", "speed the executor should settle at"),
    Field(
        "target_lane_offset",
        "m",
        "lateral distance from ego lane centre to target lane centre (0 keep, +lane_width left)",
    ),
    Field("plan_keep", "bool", "behaviour one-hot: keep lane"),
    Field("plan_change_left", "bool", "behaviour one-hot: change to the left lane"),
    Field("plan_change_right", "bool", "behaviour one-hot: change to the right lane"),
    Field("plan_stop", "bool", "behaviour one-hot: come to a stop"),
)
PLAN_NAMES: tuple[str, ...] = tuple(f.name for f in PLAN)
PLAN_UNITS: tuple[str, ...] = tuple(f.unit for f in PLAN)
N_PLAN: int = len(PLAN)
BEHAVIOURS: tuple[str, ...] = ("keep", "change_left", "change_right", "stop")

# Discrete longitudinal decision, ordered from strongest braking to accelerating.
# The bands and the look-ahead label live in executor/action_labels.py (one definition for the sim,
# imports, replay and training).
ACTIONS: tuple[str, ...] = _labels.ACTIONS
N_ACTIONS: int = len(ACTIONS)
BRAKE_HARD_BELOW: float = _labels.BRAKE_HARD_BELOW
BRAKE_BELOW: float = _labels.BRAKE_BELOW
KEEP_AT_MOST: float = _labels.KEEP_AT_MOST


class Control(NamedTuple):
    name: str
    unit: str
    low: float
    high: float


CONTROLS: tuple[Control, ...] = (
    Control("accel", "m/s^2", -8.0, 3.0),
    Control("steer", "rad", -0.5, 0.5),  # front wheel angle, + = left
)
CONTROL_NAMES: tuple[str, ...] = tuple(c.name for c in CONTROLS)
ACCEL_MIN, ACCEL_MAX = CONTROLS[0].low, CONTROLS[0].high
STEER_MIN, STEER_MAX = CONTROLS[1].low, CONTROLS[1].high

# Indices used in hot paths, derived from the tuples so they cannot drift.
FEATURE_INDEX: dict[str, int] = {n: i for i, n in enumerate(FEATURE_NAMES)}
PLAN_INDEX: dict[str, int] = {n: i for i, n in enumerate(PLAN_NAMES)}
ACTION_INDEX: dict[str, int] = {n: i for i, n in enumerate(ACTIONS)}
SPEED_FEATURES: tuple[str, ...] = tuple(n for n in FEATURE_NAMES if n == "ego_speed" or n.endswith("rel_speed"))
GAP_FEATURES: tuple[str, ...] = tuple(n for n in FEATURE_NAMES if n.endswith("_gap") or n == "lead_distance")
BOOL_FEATURES: tuple[str, ...] = tuple(f.name for f in FEATURES if f.unit == "bool")


def label_from_accel(accel: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """Index into ACTIONS of each acceleration's band (`action_labels.action_of_accel`): a < -3.5
    brake_hard, < -0.5 brake, <= 0.5 keep, else accelerate; NaN -> -1 (no label)."""
    return _labels.action_of_accel(accel)


def make_plan(
    target_speed: npt.ArrayLike, target_lane_offset: npt.ArrayLike, behaviour: npt.ArrayLike
) -> npt.NDArray[np.float32]:
    """Build plan vectors (..., N_PLAN) float32; behaviour is an index into BEHAVIOURS."""
    speed = np.asarray(target_speed, dtype=np.float32)
    offset = np.asarray(target_lane_offset, dtype=np.float32)
    beh = np.asarray(behaviour, dtype=np.int64)
    shape = np.broadcast_shapes(speed.shape, offset.shape, beh.shape)
    plan = np.zeros(shape + (N_PLAN,), dtype=np.float32)
    plan[..., 0] = speed
    plan[..., 1] = offset
    one_hot = np.eye(len(BEHAVIOURS), dtype=np.float32)[np.broadcast_to(beh, shape)]
    plan[..., 2:] = one_hot
    return plan


# The plan of a drive that has none: a recorded human's, and a session's before its first plan. No
# behaviour (every one-hot 0) says "no plan"; its target speed is 25 m/s, raised to the measured ego
# speed above it (NO_PLAN_AT_LEAST, executor.default_plan): no plan never asks to slow down. Models
# are trained with it on human and human-like drives, so without a plan they propose what a driver
# would do (docs/design-notes/sim.md). Models before it (no plan_default_at_least in their cards) saw
# a fixed 25 m/s and read a motorway's 37 m/s as 12 m/s too fast.
NO_PLAN_TARGET_SPEED: float = 25.0
NO_PLAN_AT_LEAST: dict[str, str] = {"target_speed": "ego_speed"}


def no_plan() -> npt.NDArray[np.float32]:
    """The plan vector (N_PLAN,) float32 of a drive without a plan, before NO_PLAN_AT_LEAST raises it
    (a card's plan_default)."""
    plan = np.zeros(N_PLAN, dtype=np.float32)
    plan[PLAN_INDEX["target_speed"]] = NO_PLAN_TARGET_SPEED
    return plan


def no_plan_rows(
    features: npt.NDArray[np.floating], present: npt.NDArray[np.bool_] | None = None
) -> npt.NDArray[np.float32]:
    """(n, N_PLAN) the plan of each observation row (n, N_FEATURES) of a drive without a plan, as the
    executor gives a session without one when its card has NO_PLAN_AT_LEAST; `present`: the rows' sensor
    profiles (None: all measured)."""
    return DefaultPlan.named(no_plan(), PLAN_NAMES, FEATURE_NAMES, NO_PLAN_AT_LEAST).rows(features, present)


def clip_controls(
    accel: npt.ArrayLike, steer: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Clip commands into the ranges in CONTROLS (what an actuator would saturate to)."""
    return (
        np.clip(np.asarray(accel, dtype=np.float64), ACCEL_MIN, ACCEL_MAX),
        np.clip(np.asarray(steer, dtype=np.float64), STEER_MIN, STEER_MAX),
    )
