"""The simulator as a gymnasium Env / VectorEnv, checked with gymnasium's own checker."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.wrappers.vector import RecordEpisodeStatistics

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
    assert rewards[0] == 0.0 and not terminated[0]  # the end was reported once
    with pytest.raises(ValueError, match="resets its batch together"):
        vec.reset(options={"reset_mask": np.array([True, False])})
    with pytest.raises(ValueError, match=r"actions must have shape \(2, 2\)"):
        vec.step(np.zeros(2))
    obs, _ = vec.reset(options={"reset_mask": np.array([True, True])})
    assert obs.shape == (2, N_FEATURES)


def _same_info(single: dict, vec: dict, row: int) -> None:
    assert set(single) == set(vec)
    for key, value in single.items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(vec[key][row]), err_msg=key)


def _rows_against_singles(
    scenario: str, seeds: list[int], actions: list[np.ndarray], **params: object
) -> dict[int, tuple[np.ndarray, dict]]:
    """Each row of the vector env is the single env with its seed and actions, step for step, the
    step its episode ends included; after it the row is frozen: reward 0, no flags, the same obs and
    info. Returns the rows that ended: their last observation and info."""
    vec = HighwayVectorEnv(len(seeds), scenario, **params)
    obs, info = vec.reset(seed=list(seeds))
    singles = [HighwayEnv(scenario, **params) for _ in seeds]
    for i, (env, seed) in enumerate(zip(singles, seeds)):
        o, inf = env.reset(seed=seed)
        np.testing.assert_array_equal(o, obs[i])
        _same_info(inf, info, i)
    ended: dict[int, tuple[np.ndarray, dict]] = {}
    for a in actions:
        if vec.sim is not None and vec.sim.done:
            break
        obs, rewards, terminated, truncated, info = vec.step(a)
        for i, env in enumerate(singles):
            if i in ended:  # frozen until reset
                held_obs, held_info = ended[i]
                np.testing.assert_array_equal(obs[i], held_obs)
                _same_info(held_info, info, i)
                assert rewards[i] == 0.0 and not terminated[i] and not truncated[i]
                continue
            o, r, term, trunc, inf = env.step(a[i])
            np.testing.assert_array_equal(o, obs[i])
            assert r == rewards[i] and term == terminated[i] and trunc == truncated[i]
            _same_info(inf, info, i)
            if term or trunc:
                ended[i] = (o, inf)
    return ended


def test_vector_rows_match_the_single_env_on_the_step_they_crash() -> None:
    # row 0 brakes late into the braking lead, row 2 steers off the road: both crash within a
    # 20-step action, row 1 runs on until time is up
    a = np.array([[3.0, 0.0], [0.0, 0.0], [-2.0, 0.3]], dtype=np.float32)
    ended = _rows_against_singles("lead_brakes_hard", [10, 11, 12], [a] * 200, action_repeat=20, duration_s=7.0)
    assert [ended[i][1]["crashed"] for i in range(3)] == [True, False, True]
    assert ended[0][1]["t"] == pytest.approx(5.525) and ended[2][1]["t"] == pytest.approx(0.625)  # mid-action
    assert ended[1][1]["t"] == pytest.approx(7.0)  # time up


def test_a_row_ending_mid_action_leaves_the_other_rows_sensor_faults_alone() -> None:
    # noise_burst: reading the sensors draws burst noise for every bursting row, so row 0's crash,
    # read mid-action while row 1 bursts, must not shift row 1's noise stream
    env = HighwayVectorEnv(2, "noise_burst")
    _, info = env.reset(seed=[4, 5])
    onset = float(info["ood_onset_s"][1])
    before = int(np.ceil((onset + 0.5) / 0.1))  # 100 ms actions until row 1 has burst for 0.5 s
    straight = np.zeros((2, 2), dtype=np.float32)
    off_road = np.array([[0.0, 0.5], [0.0, 0.0]], dtype=np.float32)
    ended = _rows_against_singles("noise_burst", [4, 5], [straight] * before + [off_road] * 20, action_repeat=20)
    t_crash = ended[0][1]["t"]
    assert list(ended) == [0] and onset < t_crash < onset + 2.0 and round(t_crash / 0.1) * 0.1 != t_crash


def test_record_episode_statistics_counts_real_episode_ends() -> None:
    vec = RecordEpisodeStatistics(HighwayVectorEnv(2, "lead_brakes_hard", action_repeat=20, duration_s=8.0))
    vec.reset(seed=10)
    ends = steps = 0
    while not vec.unwrapped.sim.done:
        _, _, _, _, info = vec.step(np.array([[3.0, 0.0], [0.0, 0.0]], dtype=np.float32))
        ends += int(info["_episode"].sum()) if "episode" in info else 0
        steps += 1
    assert steps == 78 and ends == 2 and vec.episode_count == 2
    assert vec.length_queue[0] == 56 and vec.return_queue[0] < CRASH_PENALTY + 200.0
    with pytest.raises(ValueError, match=r"reset_mask must be all True, got \[True, False\]"):
        vec.reset(options={"reset_mask": np.array([True, False])})


@pytest.mark.parametrize("render_mode", [None, "rgb_array"])
def test_render_mode_is_gymnasiums_keyword(render_mode: str | None) -> None:
    if render_mode is None:
        obs, _ = gym.make(ENV_ID, render_mode=None).reset(seed=0)
        assert obs.shape == (N_FEATURES,)
        vec = gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", render_mode=None)
        assert vec.reset(seed=0)[0].shape == (2, N_FEATURES)
        return
    with pytest.raises(ValueError, match=r"render_mode must be None \(this env does not render\), got 'rgb_array'"):
        gym.make(ENV_ID, render_mode=render_mode)
    with pytest.raises(ValueError, match="render_mode must be None"):
        gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", render_mode=render_mode)


def test_before_step_reaches_the_env_through_gym_make() -> None:
    calls: list[float] = []
    env = gym.make(ENV_ID, action_repeat=5, before_step=lambda sim: calls.append(sim.t))
    env.reset(seed=0)
    env.step(np.zeros(2, dtype=np.float32))
    assert len(calls) == 5
    env.unwrapped.before_step = None  # the other pattern that reaches the env (docs/gymnasium.md)
    env.step(np.zeros(2, dtype=np.float32))
    assert len(calls) == 5
    with pytest.raises(TypeError, match="before_step must be None or a callable taking the SimEnv, got 3"):
        HighwayEnv(before_step=3)


def test_a_nan_action_is_refused_naming_its_entries() -> None:
    env = HighwayEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must not be NaN .*NaN at action\[1\] \(steer\)"):
        env.step(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match=r"action must have shape \(2,\) \(accel, steer\), got \(3,\)"):
        env.step(np.zeros(3))
    obs, *_ = env.step(np.array([np.inf, -np.inf]))  # +-inf is clipped, as before
    assert np.isfinite(obs).all()
    vec = HighwayVectorEnv(3)
    vec.reset(seed=0)
    with pytest.raises(ValueError, match=r"NaN at actions\[1, 0\] \(accel\), actions\[2, 1\] \(steer\)"):
        vec.step(np.array([[0.0, 0.0], [np.nan, 0.0], [0.0, np.nan]]))


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ({"n_trafic": 3}, TypeError, r"unknown parameter n_trafic=3 .*accepted: scenario, .* n_traffic, n_lanes"),
        ({"n_traffic": -1}, ValueError, r"n_traffic must be an int >= 0, got -1"),
        ({"n_lanes": 0}, ValueError, r"n_lanes must be an int >= 1, got 0"),
        ({"duration_s": 0}, ValueError, r"duration_s must be a finite number > 0 \(seconds\), got 0"),
        ({"duration_s": -1.0}, ValueError, r"duration_s must be a finite number > 0 \(seconds\), got -1.0"),
        ({"action_repeat": 2.5}, TypeError, r"action_repeat must be an int >= 1, got 2.5"),
        ({"action_repeat": 0}, ValueError, r"action_repeat must be an int >= 1, got 0"),
        ({"end_on_collision": "no"}, TypeError, r"end_on_collision must be a bool, got 'no'"),
        # the reason was numpy's "a cannot be empty unless no samples are taken"
        (
            {"scenario": "cut_in", "n_lanes": 1},
            ValueError,
            r"scenario 'cut_in' cannot be built with n_lanes=1: cut_in needs n_lanes >= 2 \(the car that cuts in",
        ),
        # was accepted: an on-ramp ending with no lane to merge into
        (
            {"scenario": "slow_merge", "n_lanes": 1},
            ValueError,
            r"scenario 'slow_merge' cannot be built with n_lanes=1: slow_merge needs n_lanes >= 2 \(lane 0 is the "
            r"on-ramp",
        ),
    ],
)
def test_bad_parameters_are_refused_when_the_env_is_made(params: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        gym.make(ENV_ID, **params)
    with pytest.raises(error, match=message):
        gym.make_vec(ENV_ID, num_envs=2, vectorization_mode="vector_entry_point", **params)
    with pytest.raises(TypeError, match=r"num_envs must be an int >= 1, got 1.5"):
        HighwayVectorEnv(1.5)  # type: ignore[arg-type]
