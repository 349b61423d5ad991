from dataclasses import replace

import numpy as np
import pytest

from dualloop.sim.env import SimEnv
from dualloop.sim.scenarios import build_scenario
from dualloop.sim.schema import FEATURE_INDEX, SPEED_FEATURES
from dualloop.sim.sensors import FaultConfig

SEED = 3


def _run(name: str, faulty: bool, seconds: float) -> tuple[np.ndarray, np.ndarray, SimEnv]:
    inst = build_scenario(name, [SEED], duration_s=seconds)
    if not faulty:
        inst = replace(inst, fault=FaultConfig())
    env = SimEnv(inst, squeeze=True)
    feats, times = [], []
    while not env.done:
        f, _ = env.observe()
        feats.append(f)
        times.append(env.t)
        env.step(*env.expert_action())
    return np.array(feats), np.array(times), env


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sensor_dropout", "stuck_sensor", "noise_burst", "unit_mismatch_kmh"])
def test_fault_changes_features_from_onset_only(name: str) -> None:
    seconds = 14.0 if name == "noise_burst" else 11.0  # onsets are 5-10 s, bursts last 2-4 s
    faulty, t, env = _run(name, True, seconds)
    clean, _, _ = _run(name, False, seconds)
    onset = float(env.instance.fault.onset_s[0])
    assert 5.0 <= onset <= 10.0
    before, after = t < onset, t >= onset
    np.testing.assert_array_equal(faulty[before], clean[before])
    # Stuck reads its onset sample once, then lags the truth: compare from the next step on.
    first_diff = np.flatnonzero((faulty != clean).any(axis=1))[0]
    assert t[first_diff] - onset < 0.011
    if name == "sensor_dropout":
        assert (faulty[after] == 0.0).all()
    elif name == "stuck_sensor":
        assert (faulty[after] == faulty[after][0]).all()
    elif name == "noise_burst":
        end = onset + float(env.instance.fault.duration_s[0])
        window = after & (t < end)
        assert (faulty[window] != clean[window]).any(axis=1).mean() > 0.99
        np.testing.assert_array_equal(faulty[t >= end], clean[t >= end])


def test_unit_mismatch_multiplies_speeds_by_3_6() -> None:
    faulty, t, env = _run("unit_mismatch_kmh", True, 11.0)
    clean, _, _ = _run("unit_mismatch_kmh", False, 11.0)
    after = t >= float(env.instance.fault.onset_s[0])
    speed_cols = [FEATURE_INDEX[n] for n in SPEED_FEATURES]
    other = [i for i in range(clean.shape[1]) if i not in speed_cols]
    np.testing.assert_array_equal(faulty[after][:, speed_cols], clean[after][:, speed_cols] * np.float32(3.6))
    np.testing.assert_array_equal(faulty[after][:, other], clean[after][:, other])
    assert faulty[after][:, FEATURE_INDEX["ego_speed"]].min() > 60.0


def test_low_friction_acts_from_onset() -> None:
    inst = build_scenario("low_friction", [SEED])
    onset = float(inst.ood_onset_s[0])
    world = inst.world
    while world.t < onset - 1e-9:
        brake = -6.0 if world.t >= onset - 1.0 else 0.0
        world.step(np.array([brake]), np.array([0.0]))
    v_before = world.v[0, 0]
    assert world.a[0, 0] < -5.9  # full braking right up to the onset
    for _ in range(400):
        world.step(np.array([-6.0]), np.array([0.0]))
    # After the onset the same command achieves 40 % of it (capped at 3 m/s^2 by the tyres).
    assert world.a[0, 0] == pytest.approx(-2.4, abs=0.01)
    assert v_before - world.v[0, 0] < 2.0 * 3.0


def test_speed_out_of_range_starts_far_above_training_speeds() -> None:
    faulty, _, _ = _run("speed_out_of_range", True, 1.0)
    assert faulty[:, FEATURE_INDEX["ego_speed"]].min() > 50.0
