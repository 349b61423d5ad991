"""Randomised training drives (sim.realism): reproducible, per-episode, causal, and sensed as real
stacks sense (rates, profiles with NaN, look-ahead labels)."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.executor.action_labels import ACTIONS, action_of_accel
from dualloop.sim.env import make_batch
from dualloop.sim.expert import DriverStyle, Expert, ExpertParams
from dualloop.sim.realism import (
    LONGITUDINAL_FEATURES,
    RealismConfig,
    _sense_episode,
    run_realistic_batch,
    sample_traffic_drivers,
)
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES, N_FEATURES, PLAN_INDEX

SHORT = {"duration_s": 6.0}


def test_same_seeds_give_identical_rows_and_an_episode_does_not_depend_on_its_batch() -> None:
    a = run_realistic_batch("dense_traffic", [11, 12], **SHORT)
    b = run_realistic_batch("dense_traffic", [11, 12], **SHORT)
    np.testing.assert_array_equal(a.features, b.features)
    np.testing.assert_array_equal(a.label, b.label)
    alone = run_realistic_batch("dense_traffic", [12], **SHORT)
    np.testing.assert_array_equal(alone.features, a.features[a.episode == 1])
    np.testing.assert_array_equal(alone.plan, a.plan[a.episode == 1])
    other = run_realistic_batch("dense_traffic", [11, 12], RealismConfig(seed=1), **SHORT)
    assert not np.array_equal(np.nan_to_num(other.features[:10]), np.nan_to_num(a.features[:10]))


def test_profiles_rates_and_plans() -> None:
    data = run_realistic_batch("nominal_cruise", list(range(40, 64)), **SHORT)
    assert len(data) > 0 and data.features.shape[1] == N_FEATURES
    assert np.array_equal(np.isnan(data.features), ~data.present), "missing features are NaN, measured ones finite"
    assert data.present[:, FEATURE_INDEX["ego_speed"]].all()
    profiles = {s.profile for s in data.sensing}
    assert profiles == {"all", "longitudinal", "random"}
    for b, s in enumerate(data.sensing):
        rows = data.episode == b
        assert 0.01 - 1e-9 <= s.period_s <= 0.1 + 1e-9 and s.perception_period_s >= s.period_s - 1e-9
        if s.profile == "longitudinal":
            assert {FEATURE_NAMES[i] for i in np.flatnonzero(s.present)} == set(LONGITUDINAL_FEATURES)
        if rows.any() and not s.has_plan:
            # no plan: the target 25 m/s raised to the measured speed (every profile measures it)
            target = data.plan[rows, PLAN_INDEX["target_speed"]]
            assert np.array_equal(target, np.maximum(data.features[rows, FEATURE_INDEX["ego_speed"]], 25.0))
            assert (np.delete(data.plan[rows], PLAN_INDEX["target_speed"], axis=1) == 0).all()
            # without a plan the target is what the driver did: the label's own acceleration band
            assert (action_of_accel(data.controls[rows, 0]) == data.label[rows]).all()
    assert {s.has_plan for s in data.sensing} == {True, False}
    assert set(np.unique(data.label)) >= {ACTIONS.index(a) for a in ("brake", "keep", "accelerate")}


def _ramp_truth(n: int, dt: float, change_at: int) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth at 100 Hz: accelerating at 1 m/s^2, braking at -2 from record `change_at` on."""
    accel = np.where(np.arange(n) < change_at, 1.0, -2.0)
    speed = 10.0 + np.concatenate([[0.0], np.cumsum(accel[:-1] * dt)])
    truth = np.zeros((n, N_FEATURES), np.float32)
    truth[:, FEATURE_INDEX["ego_speed"]], truth[:, FEATURE_INDEX["ego_accel"]] = speed, accel
    truth[:, FEATURE_INDEX["lead_distance"]] = 150.0
    return truth, np.arange(n) * dt


@pytest.mark.parametrize("accelerometer_share", [0.0, 1.0])
def test_ego_accel_is_causal_and_the_label_looks_ahead(accelerometer_share: float) -> None:
    dt, change_at = 0.01, 500
    truth, t = _ramp_truth(1000, dt, change_at)
    quiet = RealismConfig(
        noise_scale=(0.0, 0.0),
        accelerometer_share=accelerometer_share,
        accelerometer_noise=(0.0, 0.0),
        accelerometer_bias=0.0,
        profile_weights=(1.0, 0.0, 0.0),
    )
    for seed in range(6):
        idx, x, label, la_accel, sensing, _ = _sense_episode(
            np.random.default_rng(seed), t, truth, np.ones(len(t), bool), quiet, dt
        )
        assert sensing.accelerometer == (accelerometer_share == 1.0)
        measured_at = t[idx] - sensing.latency_s  # the state each observation measured
        before = measured_at < change_at * dt - 1e-9
        # the past alone: nothing of the braking shows in an observation taken before it
        assert np.all(x[before, FEATURE_INDEX["ego_accel"]] > 0.5)
        # the label: the slope of the measured speed over the next 0.5 s (interpolated between
        # observations, so one period more before the braking shows)
        ahead = measured_at + 0.5 + sensing.period_s < change_at * dt - 1e-9
        assert (label[ahead] == ACTIONS.index("accelerate")).all()
        assert (label[measured_at >= change_at * dt] == ACTIONS.index("brake")).all()
        np.testing.assert_allclose(la_accel[ahead], 1.0, atol=1e-3)


def test_traffic_drivers_change_the_traffic_and_nothing_else() -> None:
    plain = make_batch("dense_traffic", [5], duration_s=2.0)
    varied = make_batch("dense_traffic", [5], duration_s=2.0)
    varied.world.drivers = sample_traffic_drivers([5], varied.world.m, RealismConfig())
    for env in (plain, varied):
        while not env.done:
            env.step(0.0, 0.0)
    assert not np.array_equal(plain.world.v[:, 1:], varied.world.v[:, 1:])
    np.testing.assert_array_equal(plain.world.v[:, 0], varied.world.v[:, 0])


def test_a_style_equal_to_the_expert_params_drives_the_same() -> None:
    p = ExpertParams()
    env = make_batch("cut_in", [3, 4], duration_s=1.0)
    ones = np.ones(2)
    styled = Expert(
        env.world,
        env.instance.cruise_speed,
        style=DriverStyle(p.time_gap * ones, p.min_gap * ones, p.a_max * ones, p.b_comf * ones),
    )
    for a, b in zip(env.expert.act(), styled.act()):
        np.testing.assert_array_equal(a, b)
