import math

import numpy as np
import pytest

from dualloop.sim.env import make_scenario, run_expert_episode
from dualloop.sim.scenarios import NOMINAL_SCENARIOS, OOD_SCENARIOS, SCENARIOS, build_scenario
from dualloop.sim.schema import N_FEATURES, N_PLAN, SENSOR_RANGE_M


def test_registry_lists_all_required_scenarios() -> None:
    assert set(NOMINAL_SCENARIOS) == {
        "nominal_cruise",
        "dense_traffic",
        "lead_brakes_hard",
        "cut_in",
        "stopped_vehicle_ahead",
        "slow_merge",
    }
    assert set(OOD_SCENARIOS) == {
        "sensor_dropout",
        "stuck_sensor",
        "noise_burst",
        "unit_mismatch_kmh",
        "low_friction",
        "speed_out_of_range",
    }
    for spec in SCENARIOS.values():
        assert spec.description and "\n" not in spec.description


@pytest.mark.parametrize("name", ["cut_in", "slow_merge"])
def test_a_scenario_that_needs_a_second_lane_refuses_one_lane_naming_both(name: str) -> None:
    """cut_in failed with numpy's "a cannot be empty"; slow_merge built a ramp with no lane to merge into."""
    with pytest.raises(ValueError, match=rf"^{name} needs n_lanes >= 2 \(.*\); got n_lanes=1$"):
        build_scenario(name, [1, 2], n_lanes=1)
    assert build_scenario(name, [1, 2], n_lanes=2).world.road.n_lanes == 2


@pytest.mark.parametrize("name", NOMINAL_SCENARIOS)
def test_nominal_features_shape_dtype_finite(name: str) -> None:
    env = make_scenario(name, seed=11, duration_s=2.0)
    while not env.done:
        f, p = env.observe()
        assert f.shape == (N_FEATURES,) and f.dtype == np.float32
        assert p.shape == (N_PLAN,) and p.dtype == np.float32
        assert np.isfinite(f).all() and np.isfinite(p).all()
        assert p[2:].sum() == 1.0
        assert (f[[3, 11, 13, 15, 17]] <= SENSOR_RANGE_M).all() and (f[[3, 11, 13, 15, 17]] >= 0).all()
        env.step(*env.expert_action())
    with pytest.raises(RuntimeError):
        env.step(0.0, 0.0)


def test_closed_loop_crash_is_counted_and_ends_episode() -> None:
    env = make_scenario("stopped_vehicle_ahead", seed=2)
    while not env.done:
        env.observe()
        env.step(1.0, 0.0)  # ignore the stopped car
    m = env.metrics()
    assert m.collisions == 1
    assert m.min_lead_gap_m < 1.0
    assert m.min_ttc_s < 1.0
    assert m.duration_s < env.duration_s
    assert len(m.series.t) == len(m.series.ego_speed) == round(m.duration_s / 0.005)


def test_metrics_hard_brakes_and_jerk() -> None:
    env = make_scenario("nominal_cruise", seed=1, duration_s=3.0)
    while not env.done:
        env.step(-8.0 if 1.0 <= env.t < 1.5 else 0.0, 0.0)
    m = env.metrics()
    assert m.hard_brakes == 1
    assert m.max_abs_jerk == pytest.approx(8.0 / 0.15, rel=0.05)  # first-order lag: max jerk = step / tau
    assert m.collisions == 0 and math.isfinite(m.max_abs_jerk)
    assert np.nanmin(m.series.accel) < -3.5


def test_run_expert_episode_records_training_pairs() -> None:
    metrics, data = run_expert_episode("cut_in", seed=4, every=2, duration_s=6.0)
    assert data.features.shape == (1, 600, N_FEATURES)
    assert data.plan.shape == (1, 600, N_PLAN)
    assert data.controls.shape == (1, 600, 2) and data.label.shape == (1, 600)
    assert data.valid.all()
    assert metrics.collisions == 0
    assert data.t[1] - data.t[0] == pytest.approx(0.01)


def test_the_end_of_an_on_ramp_reads_like_a_parked_car() -> None:
    """Where a lane ends the sensors see a stationary obstacle in that lane (own or neighbouring),
    as the world's traffic does; sensors that do not see lane ends (what the shipped model was
    trained on) read nothing there."""
    from dualloop.sim.schema import FEATURE_INDEX as F
    from dualloop.sim.sensors import true_features
    from dualloop.sim.world import EGO

    env = make_scenario("slow_merge", seed=900_001)
    w = env.world
    end = float(w.road.lane_end_s[0, 0])
    w.s[0, EGO], w.v[0, EGO] = end - 100.0, 15.0  # on the ramp (lane 0), which is empty of traffic
    x = true_features(w)
    assert x[0, F["lead_present"]] == 1.0
    assert x[0, F["lead_distance"]] == pytest.approx(100.0 - 0.5 * w.vehicle.length)
    assert x[0, F["lead_rel_speed"]] == pytest.approx(-15.0)
    blind = true_features(w, see_lane_ends=False)
    assert blind[0, F["lead_distance"]] == SENSOR_RANGE_M and blind[0, F["lead_present"]] == 0.0
    w.d[0, EGO] = w.road.lane_width  # merged: the ramp's end is now in the right lane
    x = true_features(w)
    assert x[0, F["right_lane_exists"]] == 1.0
    assert x[0, F["right_front_gap"]] == pytest.approx(100.0 - 0.5 * w.vehicle.length)
    assert x[0, F["right_front_rel_speed"]] == pytest.approx(-15.0)
    w.s[0, EGO] = end + 1.0  # past it there is no right lane any more
    assert true_features(w)[0, F["right_lane_exists"]] == 0.0
    far = make_scenario("slow_merge", seed=900_001)  # 250-350 m away: beyond the sensors' range
    assert far.observe()[0][F["lead_distance"]] == SENSOR_RANGE_M
