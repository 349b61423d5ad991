"""Traffic behind the ego: human followers with a reaction delay, rear-end collisions, and the ground
truth that phantom braking is measured against."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.sim.env import make_scenario
from dualloop.sim.metrics import phantom_braking_s
from dualloop.sim.scenarios import SCENARIOS, FollowerRanges, build_scenario
from dualloop.sim.world import EGO

DT = 0.005


def _follower_gap(env) -> float:
    """Bumper gap from the first follower to the ego."""
    w = env.world
    f1 = w.m - w.followers.count
    return float(w.s[0, EGO] - w.s[0, f1] - w.vehicle.length)


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_has_followers_behind_the_ego_in_its_lane(name: str) -> None:
    w = build_scenario(name, [900_001, 3]).world
    assert w.followers is not None and w.followers.count >= 1
    cols = slice(w.m - w.followers.count, w.m)
    assert (w.road.lane_of(w.d[:, cols]) == w.road.lane_of(w.d[:, EGO])[:, None]).all()
    assert (w.s[:, cols] < w.s[:, EGO, None] - w.vehicle.length).all()
    assert ((w.followers.reaction_s > 0.5) & (w.followers.reaction_s < 1.5)).all()
    assert ((w.followers.max_decel >= 6.0) & (w.followers.max_decel <= 8.0)).all()
    # the cars behind the followers were moved back as a block, never into them
    lane = w.road.lane_of(w.d)
    for b in range(w.batch):
        in_lane = np.sort(w.s[b, lane[b] == lane[b, EGO]])
        assert (np.diff(in_lane) > w.vehicle.length).all()


def test_followers_can_be_left_out_and_leave_the_rest_of_the_traffic_as_it_was() -> None:
    with_f = build_scenario("nominal_cruise", [5], followers=2).world
    without = build_scenario("nominal_cruise", [5], followers=0).world
    assert without.followers is None and with_f.m == without.m + 2
    same = with_f.s[0, : without.m]
    lane = without.road.lane_of(without.d[0])
    moved = (lane == lane[EGO]) & (without.s[0] < without.s[0, EGO])
    np.testing.assert_array_equal(same[~moved], without.s[0, ~moved])  # only cars behind, in the lane
    np.testing.assert_array_equal(with_f.v[0, : without.m], without.v[0])


@pytest.mark.parametrize("name", ["nominal_cruise", "dense_traffic", "sensor_dropout"])
def test_followers_keep_a_comfortable_gap_in_steady_driving(name: str) -> None:
    env = make_scenario(name, 900_002, duration_s=12.0)
    headways = []
    while not env.done:
        env.step(*env.expert_action())
        if env.step_index % 100 == 0 and env.world.v[0, -2] > 5.0:
            headways.append(_follower_gap(env) / env.world.v[0, -2])
    assert env.metrics().collisions == 0
    assert len(headways) > 10
    assert 1.1 < min(headways) and max(headways) < 2.2, headways


def test_a_follower_reacts_to_a_hard_brake_after_its_reaction_delay() -> None:
    env = make_scenario("nominal_cruise", 900_001, duration_s=10.0)
    w = env.world
    f1 = w.m - w.followers.count
    reaction = float(w.followers.reaction_s[0, 0])
    brake_at = 4.0
    t, follower_a, gap = [], [], []
    while not env.done:
        env.step(-6.0 if env.t >= brake_at else 0.0, 0.0)
        t.append(w.t)
        follower_a.append(w.a[0, f1])
        gap.append(_follower_gap(env))
    t_arr, a_arr, gap_arr = np.array(t), np.array(follower_a), np.array(gap)
    # not before it could have seen the brake, and soon after it did
    first_brake = t_arr[np.argmax(a_arr < -1.0)]
    assert brake_at + reaction - 0.05 <= first_brake <= brake_at + reaction + 0.6
    assert a_arr.min() < -5.0  # it ends up braking hard, not gently
    before = gap_arr[t_arr < brake_at]
    assert gap_arr.min() < 0.5 * before.min()  # the ego's brake ate up its gap
    m = env.metrics()
    assert m.min_rear_ttc_s < 3.0 and m.min_rear_gap_m < 0.5 * before.min()


def test_a_hard_brake_in_front_of_a_close_follower_is_a_rear_end_collision() -> None:
    close = FollowerRanges(time_gap_s=(0.6, 0.6), desired_over_ego=(1.5, 1.5), reaction_s=(1.2, 1.2))
    env = make_scenario("nominal_cruise", 900_001, duration_s=10.0, follower_ranges=close)
    assert env.world.v[0, EGO] > 20.0
    while not env.done:
        env.step(-8.0 if env.t >= 3.0 else 0.0, 0.0)
    m = env.metrics()
    assert m.collisions == 1 and m.rear_end_collisions == 1
    assert m.min_rear_ttc_s < 1.0
    assert m.duration_s < 10.0  # a crash ends the episode
    # the same brake in front of the scenario's ordinary followers at 3 m/s^2 hurts nobody
    env = make_scenario("nominal_cruise", 900_001, duration_s=10.0)
    while not env.done:
        env.step(-3.0 if env.t >= 3.0 else 0.0, 0.0)
    gentle = env.metrics()
    assert gentle.collisions == 0 and gentle.rear_end_collisions == 0


def test_a_crash_into_the_car_ahead_is_not_a_rear_end() -> None:
    env = make_scenario("stopped_vehicle_ahead", seed=2)
    while not env.done:
        env.step(1.0, 0.0)
    m = env.metrics()
    assert m.collisions == 1 and m.rear_end_collisions == 0


def test_followers_are_deterministic_for_a_seed() -> None:
    def run() -> np.ndarray:
        env = make_scenario("cut_in", 17, duration_s=6.0)
        while not env.done:
            env.step(-5.0 if 2.0 <= env.t < 3.0 else 0.0, 0.0)
        return np.concatenate([env.world.s[0], env.world.v[0]])

    np.testing.assert_array_equal(run(), run())


def test_ground_truth_threat_sees_the_braking_lead_and_nothing_on_an_empty_lane() -> None:
    env = make_scenario("lead_brakes_hard", 900_001, duration_s=20.0)
    needs = []
    while not env.done:
        env.step(*env.expert_action())
        needs.append(env.world.ego_threat()[0][0])
    m = env.metrics()
    assert max(needs) > 2.0  # the lead's stop calls for braking
    assert m.phantom_braking_s == 0.0  # and the expert brakes only for it
    env = make_scenario("speed_out_of_range", 900_001, duration_s=3.0)  # nothing ahead for 1.5 km
    env.step(0.0, 0.0)
    need, ttc = env.world.ego_threat()
    assert need[0] == 0.0 and np.isinf(ttc[0])


def test_phantom_braking_counts_braking_without_a_reason_ahead() -> None:
    n = 1000  # 5 s
    speed = np.full(n, 25.0)
    accel = np.zeros(n)
    cmd = np.zeros(n)
    need = np.zeros(n)
    ttc = np.full(n, np.inf)
    cmd[100:300] = -6.0  # 1 s of command
    accel[120:320] = -5.0  # the car follows 0.1 s late
    assert phantom_braking_s(DT, speed, accel, cmd, need, ttc) == pytest.approx(220 * DT)
    # a real need ahead (until 0.5 s into the braking) excuses the braking for 1 s after it ends
    need[:200] = 3.0
    assert phantom_braking_s(DT, speed, accel, cmd, need, ttc) == 0.0
    need[:] = 0.0
    need[:110] = 3.0  # its memory ends at step 110 + 200 = 310
    assert phantom_braking_s(DT, speed, accel, cmd, need, ttc) == pytest.approx((320 - 310) * DT)
    need[:] = 0.0
    ttc[250:260] = 2.0  # a car closing within 3 s is a reason too
    assert phantom_braking_s(DT, speed, accel, cmd, need, ttc) == pytest.approx((250 - 100) * DT)
    # mild braking is never phantom; a braking command at standstill decelerates nothing
    ttc[:] = np.inf
    assert phantom_braking_s(DT, speed, np.full(n, -1.9), np.full(n, -1.9), need, ttc) == 0.0
    assert phantom_braking_s(DT, np.zeros(n), np.zeros(n), np.full(n, -4.0), need, ttc) == 0.0


def test_ego_rear_is_the_car_behind_in_the_ego_lane_as_ego_neighbours_finds_it() -> None:
    env = make_scenario("dense_traffic", 900_003, duration_s=4.0)
    w, checked = env.world, 0
    while not env.done:
        env.step(*env.expert_action())
        gap, closing = w.ego_rear()
        _, _, rear_gap, rear_v = w.ego_neighbours(w.ego_lane()[:, None])
        assert gap[0] == rear_gap[0, 0]
        if np.isfinite(gap[0]):
            assert closing[0] == pytest.approx(rear_v[0, 0] - w.v[0, EGO])
            checked += 1
    assert checked > 100
