"""The simulator as a gymnasium Env / VectorEnv, checked with gymnasium's own checker."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from dualloop.sim.env import make_scenario
from dualloop.sim.gym_env import CRASH_PENALTY, ENV_ID, HighwayEnv, HighwayVectorEnv, observation_bounds
from dualloop.sim.schema import FEATURE_INDEX, N_FEATURES, SENSOR_RANGE_M


@pytest.mark.parametrize("scenario", ["nominal_cruise", "cut_in", "noise_burst"])
def test_passes_gymnasium_check_env(scenario: str) -> None:
    env = gym.make(ENV_ID, scenario=scenario, duration_s=2.0, action_repeat=4)
    check_env(env.unwrapped, skip_render_check=True)
    env.close()


def test_spaces_follow_the_schema() -> None:
    env = HighwayEnv()
    assert env.observation_space.shape == (N_FEATURES,) and env.observation_space.dtype == np.float32
    gap = FEATURE_INDEX["lead_distance"]
    assert env.observation_space.low[gap] == 0.0 and env.observation_space.high[gap] == SENSOR_RANGE_M
    assert env.observation_space.high[FEATURE_INDEX["lead_present"]] == 1.0
    assert np.isinf(env.observation_space.high[FEATURE_INDEX["ego_speed"]])
    np.testing.assert_array_equal(env.action_space.low, [-8.0, -0.5])
    np.testing.assert_array_equal(env.action_space.high, [3.0, 0.5])
    assert np.isinf(observation_bounds("noise_burst")[1][gap])  # burst noise is added after the clipping


def test_unknown_scenario_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown scenario 'motorway'; known: nominal_cruise"):
        gym.make(ENV_ID, scenario="motorway")


def _drive(env: HighwayEnv, seed: int, steps: int) -> tuple[list[np.ndarray], list[float]]:
    obs, _ = env.reset(seed=seed)
    out, rewards = [obs], []
    for k in range(steps):
        obs, reward, terminated, truncated, _ = env.step(np.array([0.5 * np.sin(k / 10), 0.0], dtype=np.float32))
        out.append(obs)
        rewards.append(float(reward))
        if terminated or truncated:
            break
    return out, rewards


def test_seeded_reset_is_the_simulators_episode_and_deterministic() -> None:
    env = HighwayEnv("lead_brakes_hard", duration_s=1.0)
    first, rewards = _drive(env, 7, 50)
    again, rewards_again = _drive(env, 7, 50)
    np.testing.assert_array_equal(np.stack(first), np.stack(again))
    assert rewards == rewards_again
    other, _ = _drive(env, 8, 50)
    assert not np.array_equal(np.stack(first), np.stack(other))
    # the same episode as sim.env's own API with that scenario seed
    sim = make_scenario("lead_brakes_hard", seed=7, duration_s=1.0)
    np.testing.assert_array_equal(sim.observe()[0], first[0])
    sim.step(0.0, 0.0)
    np.testing.assert_array_equal(sim.observe()[0], first[1])
    # unseeded resets continue a seeded stream deterministically
    env.reset(seed=3)
    env.reset()
    drawn = env.scenario_seed
    env.reset(seed=3)
    env.reset()
    assert env.scenario_seed == drawn


def test_info_reports_collision_ttc_and_crash_terminates() -> None:
    env = HighwayEnv("stopped_vehicle_ahead", action_repeat=20)
    _, info = env.reset(seed=1)
    assert set(info) >= {"t", "collisions", "crashed", "off_road", "ttc", "min_ttc", "plan", "scenario_seed"}
    assert info["collisions"] == 0 and info["plan"].shape == (6,)
    terminated = truncated = False
    rewards = []
    while not (terminated or truncated):  # full throttle into the stopped car
        _, reward, terminated, truncated, info = env.step(np.array([3.0, 0.0], dtype=np.float32))
        rewards.append(reward)
    assert terminated and not truncated
    assert info["crashed"] and info["collisions"] == 1 and not info["off_road"]
    assert info["min_ttc"] < 1.0
    assert rewards[-1] < CRASH_PENALTY + 10.0 and min(rewards[:-1]) > 0.0


def test_time_up_truncates() -> None:
    env = HighwayEnv("nominal_cruise", duration_s=0.5, action_repeat=10)
    env.reset(seed=2)
    flags = [env.step(np.zeros(2, dtype=np.float32))[2:4] for _ in range(10)]
    assert flags[-1] == (False, True) and all(f == (False, False) for f in flags[:-1])


def test_vector_env_rows_are_the_single_envs() -> None:
    vec = gym.make_vec(ENV_ID, num_envs=3, vectorization_mode="vector_entry_point", scenario="cut_in", duration_s=1.0)
    assert isinstance(vec.unwrapped, HighwayVectorEnv)
    assert vec.observation_space.shape == (3, N_FEATURES) and vec.action_space.shape == (3, 2)
    obs, info = vec.reset(seed=20)
    assert vec.observation_space.contains(obs) and info["plan"].shape == (3, 6)
    vec.action_space.seed(0)
    actions = [vec.action_space.sample() for _ in range(30)]
    rows = [obs]
    for a in actions:
        obs, rewards, terminated, truncated, info = vec.step(a)
        assert rewards.shape == (3,) and terminated.dtype == bool
        rows.append(obs)
    for i in range(3):
        single = HighwayEnv("cut_in", duration_s=1.0)
        got = [single.reset(seed=20 + i)[0]] + [single.step(a[i])[0] for a in actions]
        np.testing.assert_array_equal(np.stack(got), np.stack(rows)[:, i])
    vec.close()


def test_vector_env_holds_ended_rows_and_resets_together() -> None:
    vec = HighwayVectorEnv(2, "stopped_vehicle_ahead", action_repeat=20)
    vec.reset(seed=[1, 5])
    crash = np.array([[3.0, 0.0], [-1.0, 0.0]], dtype=np.float32)  # row 0 drives into the car, row 1 stops
    terminated = np.zeros(2, dtype=bool)
    while not terminated[0]:
        obs, rewards, terminated, truncated, info = vec.step(crash)
    assert info["crashed"].tolist() == [True, False] and not terminated[1]
    held = obs[0].copy()
    obs, rewards, terminated, _, _ = vec.step(crash)
    np.testing.assert_array_equal(obs[0], held)
    assert rewards[0] == 0.0 and terminated[0]
    with pytest.raises(ValueError, match="resets its batch together"):
        vec.reset(options={"reset_mask": np.array([True, False])})
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 2\)"):
        vec.step(np.zeros(2))
    obs, _ = vec.reset(options={"reset_mask": np.array([True, True])})
    assert obs.shape == (2, N_FEATURES)
