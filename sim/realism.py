"""Training drives randomised the way real driving differs from the simulator's defaults, so a model
trained here is not surprised by a recorded drive.

The simulator's own sensors suit a controller: every feature at 200 Hz, no latency, little noise,
and one expert driver. Real drives (docs/design-notes/real-sensors.md) come from 10-100 Hz sensors
that measure a few of the features, with noise and latency, and from many different people.
`run_realistic_batch` drives episodes of a scenario with a population of drivers:

- the ego's car-following style (sim.expert.DriverStyle), desired speed, reaction delay and a
  wandering of its executed acceleration; every traffic car's IDM parameters and a slow wave on its
  desired speed (sim.world.TrafficDrivers); in part of the drives every speed is scaled down
  (congested and urban traffic);

and turns each episode's ground truth into what a real sensor stack would have logged:

- an observation period of 10-100 ms and a latency; the surrounding-vehicle features (radar,
  camera) update at their own rate, at most the observation rate, and are held in between;
- noise scaled from the simulator's sensor noise;
- a sensor profile: all features, the five longitudinal ones, or a random subset; the others NaN;
- ego_accel as a real stack gives it, causal: the slope of the measured speed over the previous
  0.5 s (executor.action_labels.backward_accel), or an accelerometer (true value, noise, bias);
- the label of a recorded human: the band of the measured speed's slope over the next 0.5 s
  (executor.action_labels.lookahead_labels).

Every random choice of an episode comes from its own seed, so an episode does not depend on its
batch, and a RealismConfig.seed picks another population for the same episodes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.executor.action_labels import ACCEL_WINDOW_S, backward_accel, lookahead_labels
from dualloop.executor.history import HistoryDeriver
from dualloop.sim.env import EXPERT_TARGET_STEPS, ActionNoise, SimEnv
from dualloop.sim.expert import DriverStyle
from dualloop.sim.scenarios import SCENARIOS, build_scenario
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES, N_FEATURES, N_PLAN, SENSOR_RANGE_M, no_plan_rows
from dualloop.sim.sensors import NOMINAL_SIGMA
from dualloop.sim.world import TrafficDrivers

FloatArray = npt.NDArray[np.float64]
Range = tuple[float, float]

# What a longitudinal-only sensor stack measures (OpenACC, NGSIM): the ego's speed and acceleration
# and the in-lane lead.
LONGITUDINAL_FEATURES: tuple[str, ...] = ("ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed")
PROFILES: tuple[str, ...] = ("all", "longitudinal", "random")
# Features measured by looking at other vehicles (radar, camera): they update at the perception rate.
SURROUNDING_FEATURES: tuple[str, ...] = tuple(
    n for n in FEATURE_NAMES if n.startswith("lead_") or n.endswith("_gap") or n.endswith("_rel_speed")
)
_SURROUNDING = np.array([FEATURE_INDEX[n] for n in SURROUNDING_FEATURES])
_GAP_COLS = np.array([i for i, n in enumerate(FEATURE_NAMES) if n.endswith("_gap") or n == "lead_distance"])
_SPEED, _ACCEL = FEATURE_INDEX["ego_speed"], FEATURE_INDEX["ego_accel"]


@dataclass(frozen=True)
class RealismConfig:
    """Ranges each episode draws from (uniform unless said); the defaults are what the shipped model
    was trained with (docs/design-notes/sim.md)."""

    # sensing
    rates_hz: tuple[float, ...] = (10.0, 20.0, 25.0, 50.0, 100.0)  # observation rate, one of these
    perception_hz: tuple[float, ...] = (10.0, 20.0, 50.0, 100.0)  # surrounding features, capped at the rate
    latency_s: Range = (0.0, 0.15)
    noise_scale: Range = (0.5, 3.0)  # x the simulator's sensor noise (sim.sensors.NOMINAL_SIGMA)
    profile_weights: tuple[float, float, float] = (0.3, 0.45, 0.25)  # all, longitudinal, random
    random_keep: Range = (0.2, 0.9)  # share of the other features a random profile measures
    accelerometer_share: float = 0.3  # ego_accel from an accelerometer, else the backward slope
    accelerometer_noise: Range = (0.02, 0.3)  # m/s^2, 1 sigma
    accelerometer_bias: float = 0.3  # m/s^2, uniform in +-
    # drivers
    time_gap: Range = (0.8, 2.4)  # s
    min_gap: Range = (1.5, 4.0)  # m
    a_max: Range = (0.8, 2.5)  # m/s^2
    b_comf: Range = (1.2, 3.5)  # m/s^2
    desired_scale: Range = (0.7, 1.1)  # x the scenario's cruise speed
    reaction_s: Range = (0.0, 0.5)  # the ego's executed acceleration lags its intention by this
    wander_std: Range = (0.0, 0.5)  # m/s^2: an Ornstein-Uhlenbeck wander on the executed acceleration
    wave_amplitude: Range = (0.0, 0.5)  # traffic's desired speed swings by this fraction
    wave_period_s: Range = (10.0, 40.0)
    slow_share: float = 0.5  # drives whose speeds are all scaled down
    slow_scale: Range = (0.3, 1.0)
    # rows
    no_plan_share: float = 0.6  # drives recorded without a plan (schema.no_plan_rows), as human drives are
    row_period_s: float = 0.05  # at most one training row per 50 ms of a drive: neighbours add little
    fine_steps: int = 2  # ground truth recorded every 2 steps (10 ms): the finest observation period
    seed: int = 0

    def __post_init__(self) -> None:
        if abs(sum(self.profile_weights) - 1.0) > 1e-9:
            raise ValueError(f"profile_weights must sum to 1, got {self.profile_weights}")
        if self.fine_steps < 1:
            raise ValueError(f"fine_steps must be >= 1, got {self.fine_steps}")


@dataclass
class EpisodeSensing:
    """What one episode's sensor stack was (for reports and tests)."""

    period_s: float
    perception_period_s: float
    latency_s: float
    noise_scale: float
    profile: str
    present: npt.NDArray[np.bool_]  # (N_FEATURES,)
    accelerometer: bool
    has_plan: bool


@dataclass
class RealisticData:
    """Flat training rows (N, ...) of a batch; only labelled rows of valid (not crashed) driving."""

    features: npt.NDArray[np.float32]  # NaN where the profile does not measure a feature
    present: npt.NDArray[np.bool_]
    plan: npt.NDArray[np.float32]  # the expert's plan, or schema.no_plan_rows
    label: npt.NDArray[np.int64]  # look-ahead band of the measured speed
    controls: npt.NDArray[np.float32]  # (accel, steer): the expert's command with a plan, else
    # (look-ahead accel, expert's steer), as a recorded human's actual action
    episode: npt.NDArray[np.int64]  # index into the batch's seeds
    sensing: list[EpisodeSensing]
    # (N, H) history features (executor.history) from each episode's whole observation stream as
    # the executor receives it (float32, its timestamps); None unless asked for
    history: npt.NDArray[np.float32] | None = None

    def __len__(self) -> int:
        return int(self.label.shape[0])


def _rng(seed: int, config: RealismConfig, stream: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), config.seed, 0x7EA1, stream])


def _uniform(rng: np.random.Generator, r: Range, size: int) -> FloatArray:
    return rng.uniform(r[0], r[1], size)


def _draw(rng: np.random.Generator, r: Range) -> float:
    return float(rng.uniform(r[0], r[1]))


def sample_expert_style(seeds: Sequence[int], config: RealismConfig) -> DriverStyle:
    ranges = (config.time_gap, config.min_gap, config.a_max, config.b_comf)
    draws = np.array([[_draw(g, r) for r in ranges] for g in (_rng(s, config, 1) for s in seeds)]).reshape(-1, 4)
    return DriverStyle(draws[:, 0].copy(), draws[:, 1].copy(), draws[:, 2].copy(), draws[:, 3].copy())


def sample_traffic_drivers(seeds: Sequence[int], m: int, config: RealismConfig) -> TrafficDrivers:
    cols = []
    for s in seeds:
        g = _rng(s, config, 2)
        ranges = (config.time_gap, config.min_gap, config.a_max, config.b_comf, config.wave_amplitude)
        row = [_uniform(g, r, m) for r in ranges]
        row.append(_uniform(g, config.wave_period_s, m))
        row.append(_uniform(g, (0.0, 2.0 * math.pi), m))
        cols.append(np.stack(row))
    a = np.stack(cols, axis=1)  # (7, B, M)
    return TrafficDrivers(a[0], a[1], a[2], a[3], a[4], a[5], a[6])


def _speed_scale(seeds: Sequence[int], config: RealismConfig) -> FloatArray:
    out = np.ones(len(seeds))
    for b, s in enumerate(seeds):
        g = _rng(s, config, 3)
        slow = g.random() < config.slow_share
        scale = _draw(g, config.slow_scale)
        desired = _draw(g, config.desired_scale)
        out[b] = (scale if slow else 1.0) * desired
    return out


def make_realistic_env(name: str, seeds: Sequence[int], config: RealismConfig, **params: object) -> SimEnv:
    """A batch of a nominal scenario with a population of drivers (speeds scaled down in part)."""
    if name not in SCENARIOS or SCENARIOS[name].ood:
        raise ValueError(f"realistic drives are of nominal scenarios, not {name!r}")
    instance = build_scenario(name, list(seeds), **params)
    world = instance.world
    scale = _speed_scale(seeds, config)
    # Every speed of the episode (ego, traffic, their wishes) scales together, so the scenario's
    # story (a lead that brakes, a car that cuts in) stays the same, slower.
    world.v *= scale[:, None]
    world.v0 = np.maximum(world.v0 * scale[:, None], 0.1)
    instance.cruise_speed = instance.cruise_speed * scale
    world.drivers = sample_traffic_drivers(seeds, world.m, config)
    return SimEnv(instance, target_steps=EXPERT_TARGET_STEPS, expert_style=sample_expert_style(seeds, config))


@dataclass
class _Truth:
    """Ground truth every config.fine_steps steps, (B, T, ...)."""

    t: FloatArray
    features: npt.NDArray[np.float32]
    plan: npt.NDArray[np.float32]
    command: npt.NDArray[np.float32]  # the expert's own (accel, steer), before delay and wander
    valid: npt.NDArray[np.bool_]


def _drive(env: SimEnv, seeds: Sequence[int], config: RealismConfig) -> _Truth:
    """Run the episodes: the ego executes the expert's acceleration late by its reaction time, with a
    wander; its steering is the expert's on time (a late pure pursuit weaves, and the labels here
    are longitudinal)."""
    b, n_steps, dt = env.batch, env.n_steps, env.world.dt
    reaction = np.array([int(round(_draw(_rng(s, config, 4), config.reaction_s) / dt)) for s in seeds])
    wander_std = np.array([_draw(_rng(s, config, 5), config.wander_std) for s in seeds])
    wander, _ = ActionNoise(accel_std=1.0, steer_std=0.0, tau_s=1.0, seed=config.seed).sample(seeds, n_steps, dt)
    wander *= wander_std[:, None]
    intended = np.zeros((n_steps, b))
    n_rec = (n_steps + config.fine_steps - 1) // config.fine_steps
    truth = _Truth(
        np.zeros(n_rec),
        np.zeros((b, n_rec, N_FEATURES), np.float32),
        np.zeros((b, n_rec, N_PLAN), np.float32),
        np.zeros((b, n_rec, 2), np.float32),
        np.zeros((b, n_rec), bool),
    )
    rows = np.arange(b)
    k = 0
    while not env.done:
        i = env.step_index
        accel, steer = env.expert.act()
        intended[i] = accel
        if i % config.fine_steps == 0:
            truth.t[k] = env.t
            truth.features[:, k] = env.sensors.true()
            truth.plan[:, k] = env.expert.plan_vector
            truth.command[:, k, 0], truth.command[:, k, 1] = accel, steer
            truth.valid[:, k] = ~env.done_mask
            k += 1
        executed = intended[np.maximum(i - reaction, 0), rows] + wander[:, i]
        env.step(executed, steer)
    truth.t, truth.features, truth.plan = truth.t[:k], truth.features[:, :k], truth.plan[:, :k]
    truth.command, truth.valid = truth.command[:, :k], truth.valid[:, :k]
    return truth


def _profile(rng: np.random.Generator, config: RealismConfig) -> tuple[str, npt.NDArray[np.bool_]]:
    kind = PROFILES[int(rng.choice(len(PROFILES), p=config.profile_weights))]
    if kind == "all":
        present = np.ones(N_FEATURES, bool)
    elif kind == "longitudinal":
        present = np.isin(np.array(FEATURE_NAMES), LONGITUDINAL_FEATURES)
    else:
        present = rng.random(N_FEATURES) < _draw(rng, config.random_keep)
    present[_SPEED] = True  # every drive measures its speed: the label is made of it
    return kind, present


def _noise_sigma(truth: FloatArray, scale: float) -> FloatArray:
    """Per-sample sigma as sim.sensors gives it, scaled: gaps grow with distance; nothing detected
    (a gap at the sensor range) is reported exactly."""
    sigma = np.broadcast_to(NOMINAL_SIGMA.astype(np.float64) * scale, truth.shape).copy()
    sigma[:, _GAP_COLS] += 0.005 * scale * truth[:, _GAP_COLS]
    nothing = truth[:, _GAP_COLS] >= SENSOR_RANGE_M
    sigma[:, _GAP_COLS] = np.where(nothing, 0.0, sigma[:, _GAP_COLS])
    sigma[:, _GAP_COLS + 1] = np.where(nothing, 0.0, sigma[:, _GAP_COLS + 1])
    return sigma


def _sense_episode(
    rng: np.random.Generator,
    t: FloatArray,
    truth: npt.NDArray[np.float32],
    valid: npt.NDArray[np.bool_],
    config: RealismConfig,
    fine_dt: float,
    history: HistoryDeriver | None = None,
) -> tuple[npt.NDArray[np.int64], FloatArray, npt.NDArray[np.int64], FloatArray, EpisodeSensing, FloatArray]:
    """One episode's observations: (record index of each row, its features with NaN where not
    measured, its label, its look-ahead acceleration, the sensing drawn, its history features)."""
    n = int(valid.sum())  # valid is a prefix
    rate = float(rng.choice(config.rates_hz))
    period = max(1, int(round(1.0 / (rate * fine_dt))))
    perception_rate = min(float(rng.choice(config.perception_hz)), rate)
    perception = max(period, int(round(1.0 / (perception_rate * fine_dt))))
    latency = int(round(_draw(rng, config.latency_s) / fine_dt))
    scale = _draw(rng, config.noise_scale)
    profile, present = _profile(rng, config)
    accelerometer = bool(rng.random() < config.accelerometer_share)
    imu_sigma = _draw(rng, config.accelerometer_noise)
    imu_bias = _draw(rng, (-1.0, 1.0)) * config.accelerometer_bias
    phase, perception_phase = int(rng.integers(period)), int(rng.integers(perception))
    noise = rng.standard_normal((max(n, 1), N_FEATURES))
    sensing = EpisodeSensing(
        period * fine_dt, perception * fine_dt, latency * fine_dt, scale, profile, present, accelerometer, False
    )
    obs = np.arange(phase + latency, n, period)  # record index of each observation's timestamp
    empty = np.zeros(0, np.int64)
    n_hist = 0 if history is None else len(history)
    if len(obs) < 2:
        return empty, np.zeros((0, N_FEATURES)), empty, np.zeros(0), sensing, np.zeros((0, n_hist))
    state = obs - latency  # what it measured
    held = np.maximum(state - (state - perception_phase) % perception, 0)  # last perception update
    x = truth[state].astype(np.float64)
    x[:, _SURROUNDING] = truth[held][:, _SURROUNDING]
    unit = noise[state]
    unit[:, _SURROUNDING] = noise[held][:, _SURROUNDING]  # a held measurement keeps its noise
    x += _noise_sigma(x, scale) * unit
    x[:, _GAP_COLS] = np.clip(x[:, _GAP_COLS], 0.0, SENSOR_RANGE_M)
    t_obs = t[obs]
    if accelerometer:
        x[:, _ACCEL] = truth[state, _ACCEL] + imu_sigma * rng.standard_normal(len(obs)) + imu_bias
    else:
        x[:, _ACCEL] = backward_accel(t_obs, x[:, _SPEED])
    label, la_accel = lookahead_labels(t_obs, x[:, _SPEED])
    x[:, ~present] = np.nan
    # from every observation the executor would receive, before the training rows are picked
    hist = (
        np.zeros((len(obs), 0))
        if history is None
        else history.batch(np.round(t_obs * 1e9).astype(np.int64), x.astype(np.float32))
    )
    # rows: labelled, past the accel window's warm-up, at most one per row_period
    every = max(1, int(round(config.row_period_s / (period * fine_dt))))
    # (observations stop where the episode crashed: no label looks past it). backward_accel is NaN
    # where float rounding puts t - 0.5 s just before the first sample: such a row is one the
    # executor would refuse, not a training row.
    keep = (label >= 0) & (t_obs >= ACCEL_WINDOW_S) & (np.arange(len(obs)) % every == int(rng.integers(every)))
    keep &= (np.isfinite(x) | ~present).all(axis=1)
    return obs[keep], x[keep], label[keep], la_accel[keep], sensing, hist[keep]


def run_realistic_batch(
    name: str,
    seeds: Sequence[int],
    config: RealismConfig | None = None,
    history: HistoryDeriver | None = None,
    **params: object,
) -> RealisticData:
    """Drive len(seeds) episodes of a nominal scenario with a population of drivers and sense them
    as real sensor stacks do (module docstring); with `history`, also each row's history features."""
    config = config or RealismConfig()
    env = make_realistic_env(name, seeds, config, **params)
    truth = _drive(env, seeds, config)
    fine_dt = env.world.dt * config.fine_steps
    parts: list[tuple[np.ndarray, ...]] = []
    sensing: list[EpisodeSensing] = []
    hists: list[np.ndarray] = []
    for b, seed in enumerate(seeds):
        rng = _rng(seed, config, 6)
        idx, x, label, la_accel, sense, hist = _sense_episode(
            rng, truth.t, truth.features[b], truth.valid[b], config, fine_dt, history
        )
        hists.append(hist)
        sense.has_plan = bool(rng.random() >= config.no_plan_share)
        sensing.append(sense)
        controls = truth.command[b, idx].copy()
        if sense.has_plan:
            plan = truth.plan[b, idx]
        else:
            plan = no_plan_rows(x, np.broadcast_to(sense.present, x.shape))
            controls[:, 0] = la_accel
        present = np.broadcast_to(sense.present, x.shape)
        parts.append((x, present, plan, label, controls, np.full(len(idx), b, np.int64)))
    cat = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    return RealisticData(
        features=cat[0].astype(np.float32),
        present=cat[1].astype(bool),
        plan=cat[2].astype(np.float32),
        label=cat[3].astype(np.int64),
        controls=cat[4].astype(np.float32),
        episode=cat[5].astype(np.int64),
        sensing=sensing,
        history=None if history is None else np.concatenate(hists).astype(np.float32),
    )
