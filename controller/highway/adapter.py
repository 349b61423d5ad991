"""highway-env's ego driven by dualloop over gRPC, at highway-env's own policy frequency.

Features come from highway-env's Kinematics observation (ego and nearby vehicles, absolute, not
normalised) read in the frame of the ego's lane (the road's lane geometry). What it cannot provide
(ego acceleration, yaw rate, road curvature) is declared missing in the session's sensor profile
(`provided_features`) and sent as NaN; nothing is differenced or guessed. The ego takes continuous
actions (ContinuousAction, longitudinal and lateral) held for one policy period, as highway-env
holds any action; the server ticks every 5 ms in LOCKSTEP over that period and the last tick's
applied action is the one highway-env executes.

highway-env's frame is the screen's (y down): lane index 0 is the leftmost lane, headings and
steering grow clockwise. dualloop's schema is + = left, so lateral quantities change sign here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, cast

import gymnasium as gym
import highway_env  # noqa: F401  (registers the environments)
import numpy as np
from highway_env.envs.common.abstract import AbstractEnv
from highway_env.envs.merge_env import MergeEnv
from highway_env.vehicle.behavior import IDMVehicle
from highway_env.vehicle.kinematics import Vehicle

from dualloop.controller.contract.client import DriveSession
from dualloop.sim.schema import CONTROLS, FEATURE_NAMES, N_FEATURES, SENSOR_RANGE_M
from dualloop.v2 import controller_pb2 as pb

TICK_NS = 5_000_000
MISSING = ("ego_accel", "yaw_rate", "road_curvature")
PROVIDED = tuple(n for n in FEATURE_NAMES if n not in MISSING)
_I = {n: i for i, n in enumerate(FEATURE_NAMES)}
ACCEL_RANGE = (CONTROLS[0].low, CONTROLS[0].high)
STEER_LIMIT = max(abs(CONTROLS[1].low), abs(CONTROLS[1].high))
# 5 m, every highway-env vehicle's length: the Kinematics observation gives centres, gaps are bumper to bumper
VEHICLE_LENGTH = Vehicle.LENGTH
OBSERVATION = {
    "type": "Kinematics",
    "vehicles_count": 15,
    "features": ["presence", "x", "y", "vx", "vy", "heading"],
    "absolute": True,
    "normalize": False,
    "see_behind": True,
    "order": "sorted",
}
ACTION = {
    "type": "ContinuousAction",
    "longitudinal": True,
    "lateral": True,
    # the model's own control ranges: a normalised action of +-1 is the model's limit
    "acceleration_range": list(ACCEL_RANGE),
    "steering_range": [-STEER_LIMIT, STEER_LIMIT],
}


class ContinuousMergeEnv(MergeEnv):
    """merge-v0 whose reward accepts a continuous action: highway-env 1.12's MergeEnv._rewards tests
    `action in [0, 2]` (discrete lane changes), which raises on an array. The reward is not used here."""

    def _rewards(self, action: Any) -> dict[str, float]:
        return super()._rewards(-1)


@dataclass(frozen=True)
class EnvSpec:
    """One suite configuration: a registered highway-env id and config overrides."""

    name: str
    env_id: str
    config: dict[str, Any] = field(default_factory=dict)


SUITE: dict[str, EnvSpec] = {
    "highway": EnvSpec("highway", "highway-v0"),
    "merge": EnvSpec("merge", "merge-v0"),
    # highway-fast-v0 (5 Hz simulation) with twice the default traffic density
    "dense": EnvSpec("dense", "highway-fast-v0", {"vehicles_density": 2.0, "vehicles_count": 40}),
}


def make_env(spec: EnvSpec, max_seconds: float | None = None, policy_hz: int | None = None) -> gym.Env:
    """policy_hz: overrides the env's policy_frequency (it must divide the simulation frequency)."""
    config = {**spec.config, "observation": OBSERVATION, "action": ACTION}
    if max_seconds is not None:
        config["duration"] = max_seconds
    if policy_hz is not None:
        config["policy_frequency"] = policy_hz
    if spec.env_id == "merge-v0":
        # the registered id's class, but for the reward (above); the same wrappers as gym.make
        return gym.wrappers.OrderEnforcing(ContinuousMergeEnv(config=config))
    return gym.make(spec.env_id, config=config)


def base(env: gym.Env) -> AbstractEnv:
    """The highway-env environment under gymnasium's wrappers (its road, ego and config)."""
    return cast(AbstractEnv, env.unwrapped)


def policy_period_ns(env: gym.Env) -> int:
    return round(1e9 / base(env).config["policy_frequency"])


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def features_from(env: gym.Env, obs: np.ndarray) -> np.ndarray:
    """The schema's features from one Kinematics observation (row 0 the ego); NaN where missing."""
    road = base(env).road
    ego_vehicle = base(env).vehicle
    f = np.full(N_FEATURES, np.nan, np.float32)
    ego = obs[0]
    pos = ego[1:3]
    lane_index = ego_vehicle.lane_index  # the lane highway-env itself places the ego in
    lane = road.network.get_lane(lane_index)
    s, r = lane.local_coordinates(pos)
    width = lane.width_at(s)
    lane_heading = lane.heading_at(s)
    direction = np.array([math.cos(lane_heading), math.sin(lane_heading)])
    v_ego = float(np.dot(ego[3:5], direction))
    f[_I["ego_speed"]] = float(np.hypot(ego[3], ego[4]))
    f[_I["lane_offset"]] = -r
    f[_I["heading_error"]] = -_wrap(float(ego[5]) - lane_heading)
    start, end, idx = lane_index
    n_lanes = len(road.network.graph[start][end])
    f[_I["left_lane_exists"]] = float(idx > 0)
    f[_I["right_lane_exists"]] = float(idx < n_lanes - 1)
    # nearest vehicle per (lane, side): -1 left, 0 ego lane, +1 right; ahead / behind
    nearest: dict[tuple[int, bool], tuple[float, float]] = {}
    for row in obs[1:]:
        if row[0] < 0.5:
            continue
        so, ro = lane.local_coordinates(row[1:3])
        rel_lane = round((ro - 0.0) / width)
        ds = so - s
        gap = abs(ds) - VEHICLE_LENGTH
        if rel_lane not in (-1, 0, 1) or gap > SENSOR_RANGE_M:
            continue
        key = (rel_lane, ds >= 0)
        if key not in nearest or gap < nearest[key][0]:
            nearest[key] = (max(gap, 0.0), float(np.dot(row[3:5], direction)) - v_ego)
    lead = nearest.get((0, True))
    f[_I["lead_present"]] = float(lead is not None)
    f[_I["lead_distance"]] = lead[0] if lead else SENSOR_RANGE_M
    f[_I["lead_rel_speed"]] = lead[1] if lead else 0.0
    for side, rel_lane in (("left", -1), ("right", 1)):
        for where, ahead in (("front", True), ("rear", False)):
            hit = nearest.get((rel_lane, ahead))
            f[_I[f"{side}_{where}_gap"]] = hit[0] if hit else SENSOR_RANGE_M
            f[_I[f"{side}_{where}_rel_speed"]] = hit[1] if hit else 0.0
    return f


def ttc_s(features: np.ndarray) -> float:
    """Time to collision with the in-lane lead (inf when none or not closing)."""
    closing = -float(features[_I["lead_rel_speed"]])
    if features[_I["lead_present"]] < 0.5 or closing <= 0:
        return math.inf
    return float(features[_I["lead_distance"]]) / closing


def to_highway_action(accel: float, steer: float) -> np.ndarray:
    """dualloop's (accel m/s^2, steer rad + = left) as ContinuousAction's normalised [-1, 1] pair."""
    lo, hi = ACCEL_RANGE
    a = 2.0 * (accel - lo) / (hi - lo) - 1.0
    return np.clip(np.array([a, -steer / STEER_LIMIT], np.float32), -1.0, 1.0)


@dataclass
class Episode:
    env: str
    seed: int
    driver: str  # "dualloop" or "idm"
    collided: bool
    seconds: float
    min_ttc_s: float
    vetoes: int = 0  # ticks whose applied action the gate vetoed
    fallback_s: float = 0.0
    ticks: int = 0
    nan_sent: int = 0  # features sent as NaN (the missing ones), over the episode
    off_road: bool = False


def _limit_s(env: gym.Env, max_seconds: float | None) -> float:
    """merge-v0 ends only past the ramp (or on a crash): an ego that stops would never end."""
    return max_seconds if max_seconds is not None else float(base(env).config.get("duration", 60))


def drive_dualloop(
    spec: EnvSpec, seed: int, channel: Any, max_seconds: float | None = None, policy_hz: int | None = None
) -> Episode:
    """One episode: every policy step an observation over a LOCKSTEP session, then highway-env steps
    with the applied action of the tick at the observation's time."""
    env = make_env(spec, max_seconds, policy_hz)
    period = policy_period_ns(env)
    if period % TICK_NS:
        raise ValueError(f"policy period {period} ns is not a whole number of 5 ms ticks")
    limit_ns = round(_limit_s(env, max_seconds) * 1e9)
    obs, _ = env.reset(seed=seed)
    session = DriveSession(
        channel,
        f"{spec.name}-{seed}",
        pb.CLOCK_MODE_LOCKSTEP,
        observation_period_ns=period,
        provided_features=PROVIDED,
        actual_controls_are_commands=True,
    )
    ep = Episode(spec.name, seed, "dualloop", False, 0.0, math.inf)
    actual: tuple[int, list[float]] | None = None
    k, done = 0, False
    while not done:
        features = features_from(env, obs)
        ep.min_ttc_s = min(ep.min_ttc_s, ttc_s(features))
        ep.nan_sent += int(np.isnan(features).sum())
        session.send(
            k + 1,
            k * period,
            features.tolist(),
            actual_index=None if actual is None else actual[0],
            actual_controls=() if actual is None else actual[1],
        )
        # the first observation is tick 0; each later one runs the ticks of one period up to its own
        for _ in range(1 if k == 0 else period // TICK_NS):
            snap = session.recv()
            ep.ticks += 1
            ep.vetoes += int(pb.REASON_CODE_OOD_VETO in snap.reasons)
            ep.fallback_s += TICK_NS / 1e9 * (snap.safety_state == pb.SAFETY_STATE_FALLBACK_ACTIVE)
        accel, steer = snap.applied.controls[0], snap.applied.controls[1]
        actual = (snap.applied.index, [accel, steer])
        obs, _, terminated, truncated, info = env.step(to_highway_action(accel, steer))
        ep.collided = ep.collided or bool(info.get("crashed", False))
        ep.off_road = ep.off_road or not base(env).vehicle.on_road
        k += 1
        done = terminated or truncated or k * period >= limit_ns
    ep.min_ttc_s = min(ep.min_ttc_s, ttc_s(features_from(env, obs)))
    ep.seconds = k * period / 1e9
    session.close()
    for _ in session.snapshots():  # drain to the server's end of stream
        pass
    env.close()
    return ep


def drive_idm(spec: EnvSpec, seed: int, max_seconds: float | None = None, policy_hz: int | None = None) -> Episode:
    """The same episode with highway-env's own IDMVehicle (IDM + MOBIL) in the ego's place: its
    act() ignores the action passed, so the env steps unchanged with a zero action."""
    env = make_env(spec, max_seconds, policy_hz)
    period = policy_period_ns(env)
    limit_ns = round(_limit_s(env, max_seconds) * 1e9)
    obs, _ = env.reset(seed=seed)
    hw = base(env)
    ego = hw.vehicle
    # the target speed the env rewards the ego for (its reward_speed_range's top), else the initial speed
    target = hw.config.get("reward_speed_range", [None, ego.speed])[1]
    idm = IDMVehicle(
        hw.road,
        ego.position,
        heading=ego.heading,
        speed=ego.speed,
        target_lane_index=ego.lane_index,
        target_speed=target,
    )
    hw.road.vehicles[hw.road.vehicles.index(ego)] = idm
    hw.controlled_vehicles = [idm]
    ep = Episode(spec.name, seed, "idm", False, 0.0, math.inf)
    k, done = 0, False
    zero = np.zeros(2, np.float32)
    while not done:
        ep.min_ttc_s = min(ep.min_ttc_s, ttc_s(features_from(env, obs)))
        obs, _, terminated, truncated, info = env.step(zero)
        ep.collided = ep.collided or bool(info.get("crashed", False))
        ep.off_road = ep.off_road or not base(env).vehicle.on_road
        k += 1
        done = terminated or truncated or k * period >= limit_ns
    ep.min_ttc_s = min(ep.min_ttc_s, ttc_s(features_from(env, obs)))
    ep.seconds = k * period / 1e9
    env.close()
    return ep
