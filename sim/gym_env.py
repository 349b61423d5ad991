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

import copy
import math
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
from dualloop.sim.scenarios import SCENARIOS, FollowerRanges, build_scenario
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
from dualloop.sim.sensors import Sensors
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


# The scenario factories' keyword parameters (sim.scenarios: the builders' and build_instance's) and
# what each accepts; checked when an env is made, so a typo fails at gym.make, not at reset().
_SCENARIO_PARAMS: dict[str, str] = {
    "duration_s": "a finite number > 0 (seconds)",
    "n_traffic": "an int >= 0",
    "n_lanes": "an int >= 1",
    "followers": "an int >= 0",
    "follower_ranges": "a sim.scenarios.FollowerRanges",
}
_ENV_PARAMS = ("scenario", "action_repeat", "end_on_collision", "render_mode", "before_step")
_CONTROLS = ("accel", "steer")
Hook = Callable[[SimEnv], object]


def _check_int(name: str, value: object, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_scenario_params(scenario: str, params: dict[str, Any]) -> None:
    unknown = [k for k in params if k not in _SCENARIO_PARAMS]
    if unknown:
        raise TypeError(
            f"unknown parameter {unknown[0]}={params[unknown[0]]!r} for dualloop/Highway-v0; accepted: "
            f"{', '.join(_ENV_PARAMS)} and the scenario's {', '.join(_SCENARIO_PARAMS)}"
        )
    for name, minimum in (("n_traffic", 0), ("n_lanes", 1), ("followers", 0)):
        if name in params:
            _check_int(name, params[name], minimum)
    if "duration_s" in params:
        d = params["duration_s"]
        if not isinstance(d, (int, float, np.integer, np.floating)) or isinstance(d, (bool, np.bool_)):
            raise TypeError(f"duration_s must be {_SCENARIO_PARAMS['duration_s']}, got {d!r}")
        if not (math.isfinite(d) and d > 0):
            raise ValueError(f"duration_s must be {_SCENARIO_PARAMS['duration_s']}, got {d!r}")
    ranges = params.get("follower_ranges", FollowerRanges())
    if not isinstance(ranges, FollowerRanges):
        raise TypeError(f"follower_ranges must be {_SCENARIO_PARAMS['follower_ranges']}, got {ranges!r}")
    try:  # a combination the scenario cannot build (cut_in on one lane) fails here, not at reset()
        build_scenario(scenario, [0], **params)
    except ValueError as err:
        given = ", ".join(f"{k}={v!r}" for k, v in params.items())
        raise ValueError(f"scenario {scenario!r} cannot be built with {given}: {err}") from err


def _check_env_params(
    scenario: object, action_repeat: object, end_on_collision: object, before_step: object, params: dict[str, Any]
) -> None:
    """Every parameter of either env, refused with what it accepts when the env is made."""
    if not isinstance(scenario, str) or scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; known: {', '.join(SCENARIOS)}")
    _check_int("action_repeat", action_repeat, 1)
    if not isinstance(end_on_collision, (bool, np.bool_)):
        raise TypeError(f"end_on_collision must be a bool, got {end_on_collision!r}")
    if before_step is not None and not callable(before_step):
        raise TypeError(f"before_step must be None or a callable taking the SimEnv, got {before_step!r}")
    _check_scenario_params(scenario, params)


def _check_render_mode(render_mode: object, modes: list[str]) -> None:
    if render_mode is not None and render_mode not in modes:
        accepted = f"None or one of {modes}" if modes else "None (this env does not render)"
        raise ValueError(f"render_mode must be {accepted}, got {render_mode!r}")


def _action_array(action: npt.ArrayLike, shape: tuple[int, ...], name: str) -> npt.NDArray[np.float64]:
    """The action(s) as float64 of `shape`, (..., (accel, steer)); NaN refused (the simulator would
    index its road with it), +-inf left to the simulator's clipping to the action space."""
    try:
        a = np.asarray(action, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be numbers of shape {shape} (accel, steer), got {action!r}") from err
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (accel, steer), got {a.shape}")
    nan = np.argwhere(np.isnan(a))
    if len(nan):
        where = ", ".join(f"{name}[{', '.join(str(int(i)) for i in idx)}] ({_CONTROLS[idx[-1]]})" for idx in nan[:4])
        raise ValueError(f"{name} must not be NaN (+-inf is clipped to the action space); NaN at {where}")
    return a


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


Rows = dict[str, npt.NDArray[Any]]
# A row's info entries (the single env's info is row 0's) and where min_ttc, the env's own, goes.
_INFO_KEYS = ("t", "collisions", "crashed", "off_road", "ttc", "plan", "ood_onset_s")
_MIN_TTC_AT = _INFO_KEYS.index("ttc") + 1


def _rows_now(sim: SimEnv, sensors: Sensors) -> Rows:
    """Every row's state now: its observation read from `sensors`, its ego's s, whether its episode
    has ended (finished: crashed and crashes end it; done: that or time up) and its info entries."""
    w = sim.world
    return {
        "obs": sensors.observe(),
        "s": w.s[:, EGO].copy(),
        "finished": sim.finished.copy(),
        "done": sim.done_mask.copy(),
        "t": np.full(sim.batch, w.t),
        "collisions": w.collision_count.copy(),
        "crashed": w.crashed.copy(),
        "off_road": w.off_road.copy(),
        "ttc": _ttc(sim.sensors.true()),
        "plan": sim.expert.plan_vector.copy(),
        "ood_onset_s": sim.instance.ood_onset_s.copy(),
    }


def _read_ended(sim: SimEnv, rows: Rows | None, ended: npt.NDArray[np.bool_]) -> Rows:
    """`rows` with the rows `ended` read now, mid-action. The observation comes from a copy of the
    sensors: a read changes a sensor's fault state (the stuck sample, the burst noise stream) in
    every row, and the rows still running must see the sensors as the single env's would."""
    probe = copy.deepcopy(sim.sensors, {id(sim.world): sim.world})
    now = _rows_now(sim, probe)
    if rows is None:
        return now
    for key, value in rows.items():
        value[ended] = now[key][ended]
    return rows


class _Stepper:
    """What HighwayEnv and HighwayVectorEnv share: one SimEnv, action_repeat steps per action."""

    def __init__(self, scenario: str, action_repeat: int, end_on_collision: bool, params: dict[str, Any]) -> None:
        self.before_step: Hook | None = None
        self.scenario = scenario
        self.action_repeat = int(action_repeat)
        self.end_on_collision = bool(end_on_collision)
        self.params = params
        self.sim: SimEnv | None = None

    def start(self, seeds: list[int]) -> SimEnv:
        self.sim = SimEnv(build_scenario(self.scenario, seeds, **self.params), end_on_collision=self.end_on_collision)
        return self.sim

    def advance(
        self, accel: npt.NDArray[np.float64], steer: npt.NDArray[np.float64]
    ) -> tuple[Rows, npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """One action: action_repeat simulator steps, fewer for a row whose episode ends within them.

        Returns every row's state (_rows_now) on the step its share of the action ended (the step its
        episode ended, or the action's last), the metres its ego travelled and whether it crashed
        in that share. The batch keeps stepping a row that ended (one world), so a row is read on the
        step it ended, as the single env, which stops there; rows that had ended before are the
        caller's to hold.
        """
        sim = self.sim
        if sim is None:
            raise RuntimeError("call reset() before step()")
        w = sim.world
        live = ~sim.done_mask
        s0, crashed0 = w.s[:, EGO].copy(), w.crashed.copy()
        early: Rows | None = None
        read = np.zeros(sim.batch, dtype=bool)
        for k in range(self.action_repeat):
            if sim.done:
                break
            if self.before_step is not None:
                self.before_step(sim)
            sim.step(accel, steer)
            ended = live & sim.done_mask & ~read
            if ended.any() and not sim.done and k + 1 < self.action_repeat:  # else read below, now
                early = _read_ended(sim, early, ended)
                read |= ended
        rows = _rows_now(sim, sim.sensors)
        if early is not None:
            for key, value in rows.items():
                value[read] = early[key][read]
        return rows, rows["s"] - s0, rows["crashed"] & ~crashed0


class _BeforeStepHook:
    """Both envs' `before_step`: their stepper's hook."""

    _stepper: _Stepper

    @property
    def before_step(self) -> Hook | None:
        """Called with the SimEnv before every simulator step (see the module's docstring). On an env
        from gym.make set it with before_step=... or on env.unwrapped: gymnasium's wrappers keep an
        attribute assigned to them to themselves."""
        return self._stepper.before_step

    @before_step.setter
    def before_step(self, hook: Hook | None) -> None:
        if hook is not None and not callable(hook):
            raise TypeError(f"before_step must be None or a callable taking the SimEnv, got {hook!r}")
        self._stepper.before_step = hook


class HighwayEnv(_BeforeStepHook, gym.Env[npt.NDArray[Any], npt.NDArray[Any]]):
    """One episode of a registered scenario (sim.scenarios.SCENARIOS) per reset.

    scenario: its name; action_repeat: simulator steps (5 ms each) per action; end_on_collision:
    a crash terminates the episode; render_mode: None (the env does not render; gymnasium passes
    it); before_step: the hook (see the module's docstring); params: the scenario factory's keyword
    parameters (n_traffic, n_lanes, duration_s, followers, follower_ranges).
    """

    metadata = {"render_modes": []}  # noqa: RUF012 (gymnasium's class attribute)

    def __init__(
        self,
        scenario: str = "nominal_cruise",
        action_repeat: int = 1,
        end_on_collision: bool = True,
        render_mode: str | None = None,
        before_step: Hook | None = None,
        **params: Any,
    ) -> None:
        _check_env_params(scenario, action_repeat, end_on_collision, before_step, params)
        _check_render_mode(render_mode, self.metadata["render_modes"])
        self.render_mode = render_mode
        self._stepper = _Stepper(scenario, action_repeat, end_on_collision, params)
        self.before_step = before_step
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
        rows = _rows_now(sim, sim.sensors)
        self._min_ttc = rows["ttc"].copy()
        return rows["obs"][0], self._info(rows)

    def step(self, action: npt.ArrayLike) -> tuple[npt.NDArray[np.float32], SupportsFloat, bool, bool, dict[str, Any]]:
        a = _action_array(action, (2,), "action")
        rows, distance, crashed = self._stepper.advance(a[:1], a[1:])
        self._min_ttc = np.minimum(self._min_ttc, rows["ttc"])
        reward = float(distance[0]) + (CRASH_PENALTY if crashed[0] else 0.0)
        terminated = bool(rows["finished"][0])
        truncated = bool(rows["done"][0]) and not terminated
        return rows["obs"][0], reward, terminated, truncated, self._info(rows)

    def _info(self, rows: Rows) -> dict[str, Any]:
        items = [(k, rows[k][0].item() if rows[k].ndim == 1 else rows[k][0]) for k in _INFO_KEYS]
        items.insert(_MIN_TTC_AT, ("min_ttc", self._min_ttc[0].item()))
        return dict([*items, ("scenario_seed", self.scenario_seed)])


class HighwayVectorEnv(_BeforeStepHook, VectorEnv[npt.NDArray[Any], npt.NDArray[Any], npt.NDArray[Any]]):
    """num_envs episodes of one scenario stepped as SimEnv's batch (no Python loop over episodes).

    Row i is the single env reset with its seed, step for step, the step its episode ends included.
    The batch shares one clock, so it resets together: autoreset is DISABLED and reset_mask must be
    all True. A row whose episode ended is frozen until reset(): its last observation and info,
    reward 0 and terminated = truncated = False (the end is reported once, as gymnasium counts it).
    """

    metadata = {"render_modes": [], "autoreset_mode": AutoresetMode.DISABLED}  # noqa: RUF012

    def __init__(
        self,
        num_envs: int,
        scenario: str = "nominal_cruise",
        action_repeat: int = 1,
        end_on_collision: bool = True,
        render_mode: str | None = None,
        before_step: Hook | None = None,
        **params: Any,
    ) -> None:
        _check_int("num_envs", num_envs, 1)
        _check_env_params(scenario, action_repeat, end_on_collision, before_step, params)
        _check_render_mode(render_mode, self.metadata["render_modes"])
        self.render_mode = render_mode
        self.num_envs = int(num_envs)
        self._stepper = _Stepper(scenario, action_repeat, end_on_collision, params)
        self.before_step = before_step
        low, high = observation_bounds(scenario)
        self.single_observation_space = spaces.Box(low, high, dtype=np.float32)
        self.single_action_space = _action_space()
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._min_ttc = np.full(num_envs, np.inf)
        self._rows: Rows = {}
        self.scenario_seeds: list[int] = []

    @property
    def sim(self) -> SimEnv | None:
        """The SimEnv of the current batch (None before the first reset)."""
        return self._stepper.sim

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[npt.NDArray[np.float32], dict[str, Any]]:
        """seed: an int s seeds sub-env i with s + i; a list gives each its own (None: drawn)."""
        self._check_reset_mask((options or {}).get("reset_mask"))
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
        self._rows = _rows_now(sim, sim.sensors)
        self._min_ttc = self._rows["ttc"].copy()
        return self._rows["obs"].copy(), self._info()

    def _check_reset_mask(self, mask: object) -> None:
        # One World steps every row on one clock (t, step_index) and before_step drives one SimEnv per
        # reset (ModelTraffic: one stream), so a row cannot restart while the others run on.
        if mask is None:
            return
        m = np.asarray(mask)
        if m.shape != (self.num_envs,) or m.dtype != np.bool_:
            raise ValueError(f"reset_mask must be a bool array of shape ({self.num_envs},), got {mask!r}")
        if not m.all():
            raise ValueError(
                f"HighwayVectorEnv resets its batch together (one simulator clock): reset_mask must be all True, "
                f"got {m.tolist()}; an ended sub-environment stays frozen (reward 0) until the whole batch resets"
            )

    def step(
        self, actions: npt.ArrayLike
    ) -> tuple[
        npt.NDArray[np.float32], npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.bool_], dict[str, Any]
    ]:
        a = _action_array(actions, (self.num_envs, 2), "actions")
        sim = self._stepper.sim
        if sim is None:
            raise RuntimeError("call reset() before step()")
        if sim.done:
            raise RuntimeError("every episode of the batch has ended: call reset()")
        live = ~sim.done_mask
        rows, distance, crashed = self._stepper.advance(a[:, 0], a[:, 1])
        for key, value in self._rows.items():  # an ended row keeps what it last reported
            value[live] = rows[key][live]
        self._min_ttc = np.where(live, np.minimum(self._min_ttc, rows["ttc"]), self._min_ttc)
        rewards = np.where(live, distance + np.where(crashed, CRASH_PENALTY, 0.0), 0.0)
        terminated = live & rows["finished"]
        truncated = live & rows["done"] & ~rows["finished"]
        return self._rows["obs"].copy(), rewards, terminated, truncated, self._info()

    def _info(self) -> dict[str, Any]:
        items = [(k, self._rows[k].copy()) for k in _INFO_KEYS]
        items.insert(_MIN_TTC_AT, ("min_ttc", self._min_ttc.copy()))
        return dict([*items, ("scenario_seed", np.array(self.scenario_seeds, dtype=np.int64))])


def _register() -> None:
    if ENV_ID not in gym.registry:
        gym.register(
            id=ENV_ID,
            entry_point="dualloop.sim.gym_env:HighwayEnv",
            vector_entry_point="dualloop.sim.gym_env:HighwayVectorEnv",
        )


_register()

__all__ = ["CRASH_PENALTY", "ENV_ID", "FEATURE_NAMES", "HighwayEnv", "HighwayVectorEnv", "observation_bounds"]
