"""The built-in simulator as a gymnasium environment (extra `gym`).

    import gymnasium as gym
    import dualloop.sim.gym_env  # registers dualloop/Highway-v0
    env = gym.make("dualloop/Highway-v0", scenario="cut_in")
    obs, info = env.reset(seed=3)           # obs: the 19 FEATURES, float32

HighwayEnv is one episode of SimEnv (squeezed); HighwayVectorEnv steps SimEnv's batch, one row per
sub-environment. `before_step` (either env) is called with the SimEnv before every simulator step: a
driver of traffic cars from outside (World.drive_traffic; controller/demo/traffic.py drives them
with the model) hooks in there. Row i of a vector env reset with seed s is the single env reset with seed s + i:
an episode never depends on the batch it was built in (sim.scenarios). docs/gymnasium.md documents
spaces, seeds, reward and info.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, SupportsFloat

import numpy as np
import numpy.typing as npt

try:
    import gymnasium as gym
    from gymnasium import spaces
    from gymnasium.vector import AutoresetMode, VectorEnv
except ModuleNotFoundError as _err:  # the lean install leaves gymnasium out
    raise ModuleNotFoundError(
        f"dualloop.sim.gym_env needs gymnasium>=1.1 ({_err}): pip install 'dualloop[gym]'", name="gymnasium"
    ) from _err

from dualloop.sim.env import SimEnv
from dualloop.sim.scenarios import SCENARIOS, build_scenario
from dualloop.sim.schema import (
    ACCEL_MAX,
    ACCEL_MIN,
    BOOL_FEATURES,
    FEATURE_INDEX,
    FEATURE_NAMES,
    GAP_FEATURES,
    N_FEATURES,
    SENSOR_RANGE_M,
    STEER_MAX,
    STEER_MIN,
)
from dualloop.sim.world import EGO

ENV_ID = "dualloop/Highway-v0"
# Reward: metres travelled along the road per step, and this once on the step an episode crashes
# (collision or off road). dualloop judges drives by their metrics (info), not by a reward; this one
# only makes the env usable by RL code out of the box.
CRASH_PENALTY: float = -100.0
_LEAD = (FEATURE_INDEX["lead_present"], FEATURE_INDEX["lead_distance"], FEATURE_INDEX["lead_rel_speed"])
_SEED_SPACE = 2**31  # scenario seeds drawn from np_random when reset() gets no seed


def observation_bounds(scenario: str) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """(low, high) of the 19 features as the sensors can report them in this scenario.

    Gaps are clipped to [0, SENSOR_RANGE_M] and flags are 0/1 (noise-free); speeds, accelerations,
    offsets and angles have no bound in the schema. A noise_burst fault adds noise after the gap
    clipping, so there the gaps are unbounded too (a clipped fault would not be the fault).
    """
    low = np.full(N_FEATURES, -np.inf, dtype=np.float32)
    high = np.full(N_FEATURES, np.inf, dtype=np.float32)
    for name in BOOL_FEATURES:
        low[FEATURE_INDEX[name]], high[FEATURE_INDEX[name]] = 0.0, 1.0
    if scenario != "noise_burst":
        for name in GAP_FEATURES:
            low[FEATURE_INDEX[name]], high[FEATURE_INDEX[name]] = 0.0, SENSOR_RANGE_M
    return low, high


def _check_scenario(scenario: str) -> None:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")


def _action_space() -> spaces.Box:
    return spaces.Box(
        np.array([ACCEL_MIN, STEER_MIN], dtype=np.float32),
        np.array([ACCEL_MAX, STEER_MAX], dtype=np.float32),
        dtype=np.float32,
    )


def _ttc(features: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Time to collision (s) with the in-lane lead from true features (..., N); inf if not closing."""
    present, gap, rel = (features[..., i] for i in _LEAD)
    closing = -rel
    return np.where((present > 0.5) & (closing > 0.0), gap / np.maximum(closing, 1e-9), np.inf)


class _Stepper:
    """What HighwayEnv and HighwayVectorEnv share: one SimEnv, action_repeat steps per action."""

    def __init__(self, scenario: str, action_repeat: int, end_on_collision: bool, params: dict[str, Any]) -> None:
        _check_scenario(scenario)
        self.before_step: Callable[[SimEnv], object] | None = None
        if action_repeat < 1:
            raise ValueError(f"action_repeat must be >= 1, got {action_repeat}")
        self.scenario = scenario
        self.action_repeat = action_repeat
        self.end_on_collision = end_on_collision
        self.params = params
        self.sim: SimEnv | None = None

    def start(self, seeds: list[int]) -> SimEnv:
        self.sim = SimEnv(build_scenario(self.scenario, seeds, **self.params), end_on_collision=self.end_on_collision)
        return self.sim

    def advance(
        self, accel: npt.NDArray[np.float64], steer: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_]]:
        """(distance travelled (B,), crashed this action (B,), done before it (B,))."""
        sim = self.sim
        if sim is None:
            raise RuntimeError("call reset() before step()")
        w = sim.world
        was_done = sim.done_mask.copy()
        crashed_before = w.crashed.copy()
        s0 = w.s[:, EGO].copy()
        for _ in range(self.action_repeat):
            if sim.done:
                break
            if self.before_step is not None:
                self.before_step(sim)
            sim.step(accel, steer)
        crashed_now = w.crashed & ~crashed_before
        return w.s[:, EGO] - s0, crashed_now, was_done

    def info(self, sim: SimEnv, min_ttc: npt.NDArray[np.float64]) -> dict[str, Any]:
        w = sim.world
        truth = sim.sensors.true()
        _, plan = sim.observe()
        return {
            "t": np.full(sim.batch, w.t),
            "collisions": w.collision_count.copy(),
            "crashed": w.crashed.copy(),
            "off_road": w.off_road.copy(),
            "ttc": _ttc(truth),
            "min_ttc": min_ttc.copy(),
            "plan": plan,
            "ood_onset_s": sim.instance.ood_onset_s.copy(),
        }


class _BeforeStepHook:
    """Both envs' `before_step`: their stepper's hook."""

    _stepper: _Stepper

    @property
    def before_step(self) -> Callable[[SimEnv], object] | None:
        """Called with the SimEnv before every simulator step (see the module's docstring)."""
        return self._stepper.before_step

    @before_step.setter
    def before_step(self, hook: Callable[[SimEnv], object] | None) -> None:
        self._stepper.before_step = hook


class HighwayEnv(_BeforeStepHook, gym.Env[npt.NDArray[Any], npt.NDArray[Any]]):
    """One episode of a registered scenario (sim.scenarios.SCENARIOS) per reset.

    scenario: its name; action_repeat: simulator steps (5 ms each) per action; end_on_collision:
    a crash terminates the episode; params: the scenario factory's keyword parameters (n_traffic,
    duration_s, ...).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(
        self, scenario: str = "nominal_cruise", action_repeat: int = 1, end_on_collision: bool = True, **params: Any
    ) -> None:
        self._stepper = _Stepper(scenario, action_repeat, end_on_collision, params)
        low, high = observation_bounds(scenario)
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.action_space = _action_space()
        self._min_ttc = np.full(1, np.inf)
        self.scenario_seed: int | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        """seed: the scenario seed of this episode (traffic, road, sensor noise); without one the
        next is drawn from the env's np_random (itself seeded by the last reset with a seed)."""
        super().reset(seed=seed)
        episode = int(seed) if seed is not None else int(self.np_random.integers(_SEED_SPACE))
        self.scenario_seed = episode
        sim = self._stepper.start([episode])
        self._min_ttc = _ttc(sim.sensors.true())
        return sim.observe()[0][0], self._info(sim)

    def step(self, action: npt.ArrayLike) -> tuple[npt.NDArray[np.float32], SupportsFloat, bool, bool, dict[str, Any]]:
        a = np.asarray(action, dtype=np.float64).reshape(2)
        distance, crashed, _ = self._stepper.advance(a[:1], a[1:])
        sim = self._stepper.sim
        assert sim is not None  # advance checked it
        self._min_ttc = np.minimum(self._min_ttc, _ttc(sim.sensors.true()))
        reward = float(distance[0]) + (CRASH_PENALTY if crashed[0] else 0.0)
        terminated = bool(sim.finished[0])
        truncated = bool(sim.done_mask[0]) and not terminated
        return sim.observe()[0][0], reward, terminated, truncated, self._info(sim)

    def _info(self, sim: SimEnv) -> dict[str, Any]:
        info = self._stepper.info(sim, self._min_ttc)
        out = {k: (v[0].item() if v.ndim == 1 else v[0]) for k, v in info.items()}
        out["scenario_seed"] = self.scenario_seed
        return out


class HighwayVectorEnv(_BeforeStepHook, VectorEnv[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]):
    """num_envs episodes of one scenario stepped as SimEnv's batch (no Python loop over episodes).

    The batch shares one clock, so it resets together: autoreset is DISABLED; a sub-env whose episode
    ended keeps returning its last observation, reward 0 and its terminated/truncated flag until
    reset(). reset(options={"reset_mask": m}) accepts only an all-True mask.
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.DISABLED}  # noqa: RUF012

    def __init__(
        self,
        num_envs: int,
        scenario: str = "nominal_cruise",
        action_repeat: int = 1,
        end_on_collision: bool = True,
        **params: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = num_envs
        self._stepper = _Stepper(scenario, action_repeat, end_on_collision, params)
        low, high = observation_bounds(scenario)
        self.single_observation_space = spaces.Box(low, high, dtype=np.float32)
        self.single_action_space = _action_space()
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._min_ttc = np.full(num_envs, np.inf)
        self._last_obs = np.zeros((num_envs, N_FEATURES), dtype=np.float32)
        self.scenario_seeds: list[int] = []

    @property
    def sim(self) -> SimEnv | None:
        """The SimEnv of the current batch (None before the first reset)."""
        return self._stepper.sim

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        """seed: an int s seeds sub-env i with s + i; a list gives each its own (None: drawn)."""
        mask = (options or {}).get("reset_mask")
        if mask is not None and not bool(np.all(mask)):
            raise ValueError("HighwayVectorEnv resets its batch together (one clock): reset_mask must be all True")
        seeds: list[int | None]
        if isinstance(seed, list):
            if len(seed) != self.num_envs:
                raise ValueError(f"seed list has {len(seed)} entries for {self.num_envs} sub-environments")
            seeds = seed
        elif seed is not None:
            seeds = [int(seed) + i for i in range(self.num_envs)]
        else:
            seeds = [None] * self.num_envs
        first = next((s for s in seeds if s is not None), None)
        if first is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(first)
        self.scenario_seeds = [int(s) if s is not None else int(self.np_random.integers(_SEED_SPACE)) for s in seeds]
        sim = self._stepper.start(self.scenario_seeds)
        self._min_ttc = _ttc(sim.sensors.true())
        self._last_obs = sim.observe()[0].copy()
        return self._last_obs.copy(), self._stepper.info(sim, self._min_ttc)

    def step(
        self, actions: npt.ArrayLike
    ) -> tuple[
        npt.NDArray[np.float32], npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_], dict[str, Any]
    ]:
        a = np.asarray(actions, dtype=np.float64)
        if a.shape != (self.num_envs, 2):
            raise ValueError(f"actions must have shape ({self.num_envs}, 2) (accel, steer), got {a.shape}")
        sim = self._stepper.sim
        if sim is None:
            raise RuntimeError("call reset() before step()")
        if sim.done:
            raise RuntimeError("every episode of the batch has ended: call reset()")
        distance, crashed, was_done = self._stepper.advance(a[:, 0], a[:, 1])
        live = ~was_done
        self._min_ttc = np.where(live, np.minimum(self._min_ttc, _ttc(sim.sensors.true())), self._min_ttc)
        self._last_obs[live] = sim.observe()[0][live]
        rewards = np.where(live, distance + np.where(crashed, CRASH_PENALTY, 0.0), 0.0)
        terminated = sim.finished.copy()
        truncated = sim.done_mask & ~terminated
        return self._last_obs.copy(), rewards, terminated, truncated, self._stepper.info(sim, self._min_ttc)


def _register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(
            id=ENV_ID,
            entry_point="dualloop.sim.gym_env:HighwayEnv",
            vector_entry_point="dualloop.sim.gym_env:HighwayVectorEnv",
        )


_register()

__all__ = ["CRASH_PENALTY", "ENV_ID", "FEATURE_NAMES", "HighwayEnv", "HighwayVectorEnv", "observation_bounds"]
