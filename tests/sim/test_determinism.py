import numpy as np
import pytest

from dualloop.sim.env import make_batch, make_scenario, run_expert_batch


def _trajectory(name: str, seed: int, steps: int = 600) -> tuple[np.ndarray, np.ndarray]:
    env = make_scenario(name, seed)
    feats, states = [], []
    for _ in range(steps):
        f, _ = env.observe()
        feats.append(f)
        accel, steer = env.expert_action()
        env.step(accel, steer)
        states.append(np.concatenate([env.world.s[0], env.world.d[0], env.world.v[0]]))
    return np.array(feats), np.array(states)


def test_same_seed_gives_identical_trajectories() -> None:
    f1, s1 = _trajectory("nominal_cruise", 7)
    f2, s2 = _trajectory("nominal_cruise", 7)
    np.testing.assert_array_equal(f1, f2)
    np.testing.assert_array_equal(s1, s2)


def test_different_seeds_differ() -> None:
    f1, s1 = _trajectory("nominal_cruise", 7, steps=50)
    f2, s2 = _trajectory("nominal_cruise", 8, steps=50)
    assert not np.array_equal(s1, s2)
    assert not np.array_equal(f1, f2)


@pytest.mark.slow
def test_episode_does_not_depend_on_its_batch() -> None:
    _, alone = run_expert_batch("cut_in", [5], duration_s=3.0)
    _, batch = run_expert_batch("cut_in", [4, 5, 6], duration_s=3.0)
    np.testing.assert_array_equal(alone.features[0], batch.features[1])
    np.testing.assert_array_equal(alone.controls[0], batch.controls[1])
    # stepped targets and relabelled targets come from the episode's own seed too
    _, alone = run_expert_batch("dense_traffic", [5], duration_s=12.0, every=20, relabel=True)
    _, batch = run_expert_batch("dense_traffic", [4, 5, 6], duration_s=12.0, every=20, relabel=True)
    assert alone.alt_plan is not None and batch.alt_plan is not None
    np.testing.assert_array_equal(alone.plan[0], batch.plan[1])
    np.testing.assert_array_equal(alone.alt_plan[0], batch.alt_plan[1])


def test_batch_env_shapes() -> None:
    env = make_batch("dense_traffic", [1, 2, 3, 4], duration_s=0.05)
    f, p = env.observe()
    assert f.shape == (4, 19) and p.shape == (4, 6)
    while not env.done:
        env.step(np.zeros(4), np.zeros(4))
    assert env.step_index == 10
