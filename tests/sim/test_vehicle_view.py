"""Traffic cars driven from outside the simulator (World.drive_traffic) and any vehicle's features
(sim.vehicle_view)."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.sim.env import make_batch
from dualloop.sim.schema import ACCEL_MIN, FEATURE_INDEX
from dualloop.sim.sensors import true_features
from dualloop.sim.vehicle_view import VehicleSensors, overlapping, past_lane_end, vehicle_features
from dualloop.sim.world import EGO

# the ego's features that do not come from its bicycle model (heading, yaw rate and the curvature it
# read during its last step do)
SHARED = [i for n, i in FEATURE_INDEX.items() if n not in ("heading_error", "yaw_rate", "road_curvature")]


def drive(env, steps: int) -> None:
    for _ in range(steps):
        env.step(*env.expert_action())


@pytest.mark.parametrize("scenario", ["dense_traffic", "slow_merge"])
def test_the_ego_seen_as_any_vehicle_has_the_ego_features(scenario):
    env = make_batch(scenario, [5, 6])
    drive(env, 400)
    mine = vehicle_features(env.world, [EGO, 3])
    np.testing.assert_allclose(mine[:, 0, SHARED], true_features(env.world)[:, SHARED], rtol=0, atol=1e-12)
    assert not np.array_equal(mine[:, 1, SHARED], mine[:, 0, SHARED])


def test_a_driven_car_takes_its_command_through_the_lag_and_keeps_its_lane():
    env = make_batch("dense_traffic", [11])
    w = env.world
    driven = np.zeros((1, w.m), dtype=bool)
    driven[0, 1:] = True
    cmd = np.full((1, w.m), -20.0)  # clipped to the control range
    w.drive_traffic(driven, cmd)
    lanes, a0 = w.lane_target.copy(), w.a.copy()
    env.step(*env.expert_action())
    expected = a0 + (ACCEL_MIN - a0) * (w.dt / w.vehicle.tau_accel)
    np.testing.assert_allclose(w.a[0, 1:], expected[0, 1:])
    cmd[:] = 0.5
    w.drive_traffic(driven, cmd)
    drive(env, 1000)  # 5 s: MOBIL rounds every second
    np.testing.assert_array_equal(w.lane_target[0, 1:], lanes[0, 1:])
    np.testing.assert_allclose(w.a[0, 1:], 0.5, atol=1e-6)


def test_a_world_without_driven_cars_steps_as_before():
    a, b = make_batch("cut_in", [3]), make_batch("cut_in", [3])
    b.world.drive_traffic(np.zeros((1, b.world.m), dtype=bool), np.zeros((1, b.world.m)))
    drive(a, 600)
    drive(b, 600)
    np.testing.assert_array_equal(a.world.s, b.world.s)
    np.testing.assert_array_equal(a.world.d, b.world.d)


def test_vehicle_sensors_are_seeded_per_car_and_noisy():
    env = make_batch("dense_traffic", [7])
    first = VehicleSensors(env.world, [7], [1, 2, 3]).observe()
    again = VehicleSensors(env.world, [7], [1, 2, 3]).observe()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, vehicle_features(env.world, [1, 2, 3]).astype(np.float32))
    with pytest.raises(ValueError, match="traffic columns"):
        VehicleSensors(env.world, [7], [0])


def test_overlaps_and_lane_ends_are_seen_for_every_vehicle():
    env = make_batch("slow_merge", [2])
    w = env.world
    assert not overlapping(w).any() and not past_lane_end(w).any()
    w.s[0, 2], w.d[0, 2] = w.s[0, 1] + 1.0, w.d[0, 1] + 0.5
    assert overlapping(w)[0, 1, 2] and overlapping(w).sum() == 1
    lane = int(w.road.lane_of(w.d[0, 3]))
    w.road.lane_end_s[0, lane] = w.s[0, 3] - 1.0
    assert past_lane_end(w)[0, 3]
