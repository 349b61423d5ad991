"""The egodriver <-> dualloop mapping on its own (docs/alpasim.md's table), no gRPC."""

from __future__ import annotations

import math

import numpy as np
import pytest
from carla_driver_interface.protocol import DynamicState, Vec3

from dualloop.controller.alpasim.mapping import (
    EgodriverInputError,
    feature_vector,
    measured_features,
    plan_from_controls,
    route_features,
    state_features,
)


def _straight(offset_y: float, heading: float = 0.0, start: float = -4.0, n: int = 50) -> np.ndarray:
    s = start + 2.0 * np.arange(n)
    c, si = math.cos(heading), math.sin(heading)
    # a lane centre through (0, offset_y) in the rig frame, heading `heading`
    return np.stack([s * c, offset_y + s * si, np.zeros(n)], axis=1)


def _arc(radius: float, left: bool, n: int = 60) -> np.ndarray:
    """A lane centre through the origin heading along x, curving with the given radius."""
    phi = np.linspace(-0.05, 60.0 / radius, n)
    y = radius * (1 - np.cos(phi))
    return np.stack([radius * np.sin(phi), y if left else -y, np.zeros(n)], axis=1)


def test_route_left_of_the_ego_is_a_negative_offset():
    """The schema's lane_offset is + = ego left of its lane centre; a centre 0.5 m to the left of
    the rig's origin (y = +0.5) puts the ego 0.5 m right of it."""
    f = route_features(_straight(0.5))
    assert f["lane_offset"] == pytest.approx(-0.5)
    assert f["heading_error"] == pytest.approx(0.0)
    assert f["road_curvature"] == pytest.approx(0.0, abs=1e-9)
    assert route_features(_straight(-1.25))["lane_offset"] == pytest.approx(1.25)


def test_heading_error_is_ego_minus_road():
    """A road turning 0.1 rad to the left of the rig's x axis: the ego points 0.1 rad right of it."""
    assert route_features(_straight(0.0, heading=0.1))["heading_error"] == pytest.approx(-0.1)
    assert route_features(_straight(0.0, heading=-0.2))["heading_error"] == pytest.approx(0.2)


@pytest.mark.parametrize("left", [True, False])
def test_curvature_sign_and_size_follow_the_route(left):
    f = route_features(_arc(100.0, left))
    assert f["road_curvature"] == pytest.approx(0.01 if left else -0.01, rel=0.02)
    assert f["lane_offset"] == pytest.approx(0.0, abs=3e-3)  # the chords sag 1.5 mm inside the arc


def test_a_route_too_short_ahead_gives_no_curvature_and_one_point_gives_nothing():
    short = np.array([[-1.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
    assert "road_curvature" not in route_features(short)
    assert "lane_offset" in route_features(short)
    assert route_features(np.array([[3.0, 1.0, 0.0]])) == {}
    # repeated waypoints are one waypoint
    assert route_features(np.array([[3.0, 1.0, 0.0], [3.0, 1.0, 0.0]])) == {}


def test_non_finite_waypoint_is_named():
    route = _straight(0.0)
    route[3, 1] = np.nan
    with pytest.raises(EgodriverInputError, match=r"Route.waypoints\[3\]"):
        route_features(route)


def test_state_features_take_only_what_the_runtime_set():
    """proto3 tells an unset sub-message from a zero one: an unset acceleration is not 0 m/s^2."""
    assert state_features(DynamicState()) == {}
    assert state_features(None) == {}
    f = state_features(DynamicState(linear_velocity=Vec3(x=3.0, y=0.4, z=9.0)))
    assert f == {"ego_speed": pytest.approx(3.0)}  # along the car's heading: the rig's x
    f = state_features(
        DynamicState(
            linear_velocity=Vec3(x=10.0),
            linear_acceleration=Vec3(x=-2.0, y=0.7),
            angular_velocity=Vec3(z=0.05),
        )
    )
    assert f == {"ego_speed": 10.0, "ego_accel": -2.0, "yaw_rate": pytest.approx(0.05)}
    with pytest.raises(EgodriverInputError, match="linear_velocity"):
        state_features(DynamicState(linear_velocity=Vec3(x=math.inf)))


def test_a_reversing_car_has_a_negative_speed():
    """The rig's x is the car's forward axis: x = -20 is 20 m/s backwards, not 20 m/s (the gates'
    speed range ends just below 0, so they veto it; read as 20 m/s the model drove on, NOMINAL)."""
    assert state_features(DynamicState(linear_velocity=Vec3(x=-20.0)))["ego_speed"] == -20.0
    assert state_features(DynamicState(linear_velocity=Vec3(x=-20.0, y=0.5)))["ego_speed"] == -20.0


def test_a_plan_from_reversing_starts_from_a_standstill():
    """The model's actions drive forward only: braking while reversing answers a stop where the car
    is, never a plan continuing backwards or one starting forward at the reversing speed."""
    stop = plan_from_controls(-2.0, 0.0, -20.0, 3.0, 0.1, 2.7)
    assert all(p.x == 0.0 and p.y == 0.0 and p.yaw == 0.0 for p in stop)
    creep = plan_from_controls(1.0, 0.0, -20.0, 1.0, 0.1, 2.7)
    assert creep[-1].x == pytest.approx(0.5 * 1.0 * 1.0**2)


def test_feature_vector_is_nan_outside_the_profile_and_where_a_provided_one_dropped_out():
    names = ("ego_speed", "ego_accel", "lane_offset", "lead_distance")
    measured = measured_features(DynamicState(linear_velocity=Vec3(x=7.0)), _straight(0.25))
    x = feature_vector(names, ("ego_speed", "lane_offset", "ego_accel"), measured)
    assert x.dtype == np.float32
    assert x[0] == 7.0 and x[2] == pytest.approx(-0.25)
    assert np.isnan(x[1])  # provided but not measured this step: the executor says INVALID_INPUT
    assert np.isnan(x[3])  # not in the profile: missing


def test_plan_holds_the_controls_on_a_kinematic_bicycle():
    dt = 0.1
    cruise = plan_from_controls(0.0, 0.0, 10.0, 2.0, dt, 2.7)
    assert len(cruise) == 20 and cruise[0].dt_us == 100_000 and cruise[-1].dt_us == 2_000_000
    assert [p.x for p in cruise] == pytest.approx([10.0 * dt * (k + 1) for k in range(20)])
    assert all(p.y == 0.0 and p.yaw == 0.0 for p in cruise)
    accel = plan_from_controls(2.0, 0.0, 10.0, 1.0, dt, 2.7)
    assert accel[-1].x == pytest.approx(10.0 * 1.0 + 0.5 * 2.0 * 1.0**2)
    # braking to a stop: the car stops where v^2 / 2a says and stays there (never reverses)
    stop = plan_from_controls(-5.0, 0.0, 10.0, 4.0, dt, 2.7)
    xs = [p.x for p in stop]
    assert np.all(np.diff(xs) >= 0) and xs[-1] == pytest.approx(10.0**2 / (2 * 5.0))
    # steering left (+): the path bends left at yaw rate v tan(steer) / L
    left = plan_from_controls(0.0, 0.1, 10.0, 1.0, dt, 2.7)
    assert left[-1].y > 0 and left[-1].yaw == pytest.approx(10.0 * math.tan(0.1) / 2.7 * 1.0)
    radius = 2.7 / math.tan(0.1)
    assert math.hypot(left[-1].x, left[-1].y - radius) == pytest.approx(radius, rel=1e-4)
    with pytest.raises(EgodriverInputError):
        plan_from_controls(math.nan, 0.0, 10.0, 1.0, dt, 2.7)
