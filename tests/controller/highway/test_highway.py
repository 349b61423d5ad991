"""highway-env (the real package, extra `highway`) driven by dualloop over gRPC."""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # before highway-env imports pygame

from dualloop.controller.highway.adapter import (  # noqa: E402
    MISSING,
    PROVIDED,
    SUITE,
    TICK_NS,
    drive_idm,
    features_from,
    make_env,
    policy_period_ns,
    to_highway_action,
)
from dualloop.controller.highway.suite import run_dualloop, run_suite  # noqa: E402
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES  # noqa: E402
from dualloop.sim.schema import ACCEL_MAX, ACCEL_MIN, FEATURE_NAMES, SENSOR_RANGE_M, STEER_MAX  # noqa: E402

I = {n: i for i, n in enumerate(FEATURE_NAMES)}  # noqa: E741


def test_features_provided_are_measured_and_missing_are_nan():
    env = make_env(SUITE["highway"])
    obs, _ = env.reset(seed=5)
    f = features_from(env, obs)
    assert np.isnan(f[[I[n] for n in MISSING]]).all()
    assert np.isfinite(f[[I[n] for n in PROVIDED]]).all()
    ego = env.unwrapped.vehicle
    assert f[I["ego_speed"]] == pytest.approx(ego.speed, abs=1e-3)
    lanes = len(env.unwrapped.road.network.graph[ego.lane_index[0]][ego.lane_index[1]])
    assert f[I["left_lane_exists"]] == float(ego.lane_index[2] > 0)
    assert f[I["right_lane_exists"]] == float(ego.lane_index[2] < lanes - 1)
    assert 0.0 <= f[I["lead_distance"]] <= SENSOR_RANGE_M
    env.close()


def test_lateral_signs_follow_the_schema_left_positive():
    """highway-env's y grows to the right (lane 0 is leftmost): one metre towards a higher lane
    index is -1 m of lane offset, a heading turned that way a negative heading error."""
    env = make_env(SUITE["highway"])
    env.reset(seed=5)
    base = env.unwrapped
    ego = base.vehicle
    lane = base.road.network.get_lane(ego.lane_index)
    s, _ = lane.local_coordinates(ego.position)
    ego.position = lane.position(s, 1.0)
    ego.heading = lane.heading_at(s) + 0.1
    f = features_from(env, base.observation_type.observe())
    assert f[I["lane_offset"]] == pytest.approx(-1.0, abs=1e-3)
    assert f[I["heading_error"]] == pytest.approx(-0.1, abs=1e-3)
    env.close()


def test_actions_map_onto_continuous_action_ranges():
    np.testing.assert_allclose(to_highway_action(ACCEL_MAX, 0.0), [1.0, 0.0])
    np.testing.assert_allclose(to_highway_action(ACCEL_MIN, 0.0), [-1.0, 0.0])
    # + = left in dualloop, clockwise (right) in highway-env
    np.testing.assert_allclose(to_highway_action(0.0, STEER_MAX)[1], -1.0)
    env = make_env(SUITE["highway"])
    lo, hi = env.unwrapped.action_type.acceleration_range
    assert (lo, hi) == (ACCEL_MIN, ACCEL_MAX)
    env.close()


@pytest.mark.parametrize("name", list(SUITE))
def test_idm_baseline_runs_every_suite_env(name):
    """merge too: its reward is patched to accept the continuous action the ego space declares."""
    ep = drive_idm(SUITE[name], 1000, max_seconds=2.0)
    assert ep.driver == "idm" and ep.seconds == pytest.approx(2.0)
    assert not ep.collided


def test_bad_arguments_are_named_before_any_server_starts():
    with pytest.raises(ValueError, match="unknown nowhere.*highway, merge, dense"):
        run_suite(BASE_MODEL_PATH, (), ["nowhere"], 1)
    with pytest.raises(ValueError, match="--policy-hz 3: must divide"):
        run_suite(BASE_MODEL_PATH, (), ["highway"], 1, policy_hz=3)


def test_policy_frequency_override_sets_the_declared_period():
    env = make_env(SUITE["dense"], policy_hz=5)
    assert policy_period_ns(env) == 200_000_000
    env.close()


@pytest.mark.slow
def test_one_short_episode_through_a_real_server():
    """A `dualloop serve` child on loopback with the shipped model, its gates and the behaviour
    planner; 3 s of highway at 1 Hz: 3 observations, 1 + 2 x 200 LOCKSTEP ticks."""
    [ep] = run_dualloop(BASE_MODEL_PATH, DEFAULT_GATES, ["highway"], [1000], 3.0)
    env = make_env(SUITE["highway"])
    period = policy_period_ns(env)
    env.close()
    steps = round(ep.seconds * 1e9 / period)
    assert steps == 3
    assert ep.ticks == 1 + (steps - 1) * period // TICK_NS
    assert ep.nan_sent == steps * len(MISSING)
    assert ep.min_ttc_s > 0
    assert not ep.collided and not ep.off_road
