"""Scenario registry: name -> (description, factory, ood flag).

A factory takes the episode seeds (one per batch row) plus keyword parameters and returns a
ScenarioInstance: the initial World, the sensor fault configuration and the episode duration. Each
episode is drawn from its own np.random.Generator(seed), so an episode does not depend on which
batch it was built in.

Every scenario has `followers` (default FOLLOWERS) human drivers behind the ego in its lane
(sim.world.Followers), drawn from a generator of their own: the rest of the episode draws exactly
what it drew without them, and followers=0 builds the traffic of before.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.sim.road import make_road, random_curvature
from dualloop.sim.sensors import FaultConfig
from dualloop.sim.world import Followers, Friction, IdmParams, TrafficScript, World

FloatArray = npt.NDArray[np.float64]

EGO_START_S: float = 200.0
LANE_WIDTH: float = 3.5
_IDM = IdmParams()
FOLLOWERS: int = 2  # human drivers behind the ego in its lane, in every scenario
_FOLLOWER_STREAM = 0xF0110  # their generator: default_rng([seed, _FOLLOWER_STREAM, crc32(scenario name)])


@dataclass
class EpisodeInit:
    """Initial state of one episode before batching (traffic arrays have the ego in column 0)."""

    curvature: FloatArray
    lane_end: FloatArray
    s: FloatArray
    lane: npt.NDArray[np.int64]
    v: FloatArray
    v0: FloatArray
    politeness: FloatArray
    cruise: float
    script: dict[str, dict[int, float]] = field(default_factory=dict)  # TrafficScript field -> car -> value
    friction: tuple[float, float, float, float] = (np.inf, 1.0, 8.0, 1.0)  # onset, brake, max, drive
    fault_onset: float = np.inf
    fault_duration: float = np.inf
    ood_onset: float = np.inf
    # (6, F): time gap, min gap, a_max, b_comf, max decel, reaction s of the followers, which are the
    # last F cars (add_followers)
    followers: FloatArray | None = None


@dataclass
class ScenarioInstance:
    name: str
    seeds: tuple[int, ...]
    world: World
    fault: FaultConfig
    duration_s: float
    cruise_speed: FloatArray  # (B,) the expert's desired speed
    ood_onset_s: FloatArray  # (B,) when the episode leaves the training distribution, inf if never
    ood: bool


@dataclass(frozen=True)
class ScenarioSpec:
    name: str
    description: str
    factory: Callable[..., ScenarioInstance]
    ood: bool = False
    # When an OOD scenario's fault can show in the observations at all: a sensor fault ("always")
    # on every tick after its onset; a fault of the vehicle ("under_demand", low friction) only
    # while the car is asked to brake or accelerate: before that the drive reads as on a dry road.
    observable: str = "always"


# ---- traffic placement -----------------------------------------------------------------------
def place_traffic(
    rng: np.random.Generator,
    n: int,
    lanes: Sequence[int],
    lane_speed: Sequence[float],
    gap_scale: tuple[float, float],
    exclude: Sequence[tuple[int, float, float]],
    around_s: float,
    fixed_gap: tuple[float, float] | None = None,
) -> tuple[FloatArray, npt.NDArray[np.int64], FloatArray]:
    """n cars on the given lanes, spaced by a random multiple of the IDM safe gap.

    exclude: (lane, s_from, s_to) zones kept free (around the ego and scripted cars). The n
    candidates nearest to around_s are kept, so the ego always has traffic to interact with.
    """
    cand_s, cand_lane, cand_v = [], [], []
    for lane in lanes:
        mean_v = lane_speed[lane]
        s = around_s - 250.0 + rng.uniform(0.0, 30.0)
        for _ in range(2 * n):
            v = max(0.0, mean_v + rng.normal(0.0, 1.0))
            ok = all(not (lz == lane and lo <= s <= hi) for lz, lo, hi in exclude)
            if ok:
                cand_s.append(s)
                cand_lane.append(lane)
                cand_v.append(v)
            if fixed_gap is None:
                gap = rng.uniform(*gap_scale) * (_IDM.min_gap + _IDM.time_gap * v)
            else:
                gap = rng.uniform(*fixed_gap)
            s += gap + 5.0
    order = np.argsort(np.abs(np.asarray(cand_s) - around_s), kind="stable")[:n]
    if order.size < n:
        raise ValueError("not enough room to place the requested traffic")
    return np.asarray(cand_s)[order], np.asarray(cand_lane, dtype=np.int64)[order], np.asarray(cand_v)[order]


def _ego_zone(lane: int, n_lanes: int, ego_s: float, behind: float, ahead: float) -> list[tuple[int, float, float]]:
    zones = [(lane, ego_s - behind, ego_s + ahead)]
    zones += [(adj, ego_s - 12.0, ego_s + 12.0) for adj in (lane - 1, lane + 1) if 0 <= adj < n_lanes]
    return zones


@dataclass(frozen=True)
class _Ego:
    """The ego at the start: its lane, speed and cruise speed, and how far behind and ahead of it
    random traffic keeps clear (m)."""

    lane: int
    v: float
    cruise: float
    behind_clear: float = 40.0
    ahead_clear: float = 40.0


@dataclass(frozen=True)
class _Traffic:
    """Random traffic: `n` cars in all (scripted ones included) at each lane's speed, spaced by
    `gap_scale`; on `lanes` (None: every lane), `fixed_gap_lanes` with their own spacing first."""

    n: int
    lane_speed: Sequence[float]
    gap_scale: tuple[float, float]
    lanes: Sequence[int] | None = None
    fixed_gap_lanes: dict[int, tuple[float, float]] | None = None


def _base_episode(
    rng: np.random.Generator,
    n_lanes: int,
    ego: _Ego,
    traffic: _Traffic,
    extra: Sequence[tuple[float, int, float, float]] = (),
    exclude: Sequence[tuple[int, float, float]] = (),
    lane_end: FloatArray | None = None,
) -> EpisodeInit:
    """Ego + scripted `extra` cars (s, lane, v, v0) + random traffic filling up to n_traffic."""
    ego_lane, ego_v, cruise = ego.lane, ego.v, ego.cruise
    n_traffic, lane_speed, gap_scale = traffic.n, traffic.lane_speed, traffic.gap_scale
    curvature = random_curvature(rng)
    ego_s = EGO_START_S
    zones = _ego_zone(ego_lane, n_lanes, ego_s, ego.behind_clear, ego.ahead_clear) + list(exclude)
    n_random = n_traffic - len(extra)
    lanes = list(range(n_lanes)) if traffic.lanes is None else list(traffic.lanes)
    parts_s, parts_lane, parts_v = [], [], []
    fixed = traffic.fixed_gap_lanes or {}
    normal_lanes = [ln for ln in lanes if ln not in fixed]
    counts = {ln: 0 for ln in lanes}
    if fixed:  # lanes with prescribed spacing get their share first
        share = max(1, n_random * len(fixed) // max(len(lanes), 1))
        for ln, gaps in fixed.items():
            s, la, v = place_traffic(rng, share, [ln], lane_speed, gap_scale, zones, ego_s + 60.0, gaps)
            parts_s.append(s)
            parts_lane.append(la)
            parts_v.append(v)
            counts[ln] = share
    remaining = n_random - sum(counts.values())
    if remaining > 0:
        s, la, v = place_traffic(rng, remaining, normal_lanes, lane_speed, gap_scale, zones, ego_s + 80.0)
        parts_s.append(s)
        parts_lane.append(la)
        parts_v.append(v)
    t_s = np.concatenate(parts_s) if parts_s else np.zeros(0)
    t_lane = np.concatenate(parts_lane) if parts_lane else np.zeros(0, np.int64)
    t_v = np.concatenate(parts_v) if parts_v else np.zeros(0)
    t_v0 = t_v + rng.uniform(0.5, 3.0, size=t_v.shape)
    ex = np.asarray(extra, dtype=np.float64).reshape(-1, 4)
    s = np.concatenate([[ego_s], ex[:, 0], t_s])
    lane = np.concatenate([[ego_lane], ex[:, 1].astype(np.int64), t_lane]).astype(np.int64)
    v = np.concatenate([[ego_v], ex[:, 2], t_v])
    v0 = np.concatenate([[cruise], ex[:, 3], t_v0])
    politeness = np.concatenate([[0.0], rng.uniform(0.1, 0.5, size=n_traffic)])
    ends = np.full(n_lanes, np.inf) if lane_end is None else lane_end
    return EpisodeInit(curvature, ends, s, lane, v, np.maximum(v0, 0.1), politeness, cruise)


def _lane_speeds(rng: np.random.Generator, n_lanes: int, slow: float, step: float) -> list[float]:
    return [slow + step * k + rng.uniform(-1.0, 1.0) for k in range(n_lanes)]


# ---- episode builders (one seed -> one EpisodeInit) -------------------------------------------
def _nominal(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
    ego_lane = int(rng.integers(0, n_lanes))
    ego_v = rng.uniform(24.0, 29.0)
    speeds = _lane_speeds(rng, n_lanes, 22.0, 3.0)
    return _base_episode(
        rng, n_lanes, _Ego(ego_lane, ego_v, rng.uniform(27.0, 31.0)), _Traffic(n_traffic, speeds, (1.3, 2.5))
    )


def _dense(rng: np.random.Generator, n_traffic: int = 30, n_lanes: int = 3) -> EpisodeInit:
    ego_lane = int(rng.integers(0, n_lanes))
    speeds = _lane_speeds(rng, n_lanes, 12.0, 2.0)
    ego_v = speeds[ego_lane]
    return _base_episode(rng, n_lanes, _Ego(ego_lane, ego_v, 25.0, 25.0, 30.0), _Traffic(n_traffic, speeds, (1.0, 1.5)))


def _with_lead(
    rng: np.random.Generator,
    n_traffic: int,
    n_lanes: int,
    headway: tuple[float, float],
    brake_at: float,
    brake_accel: float,
    hold_s: float | None,
) -> EpisodeInit:
    ego_lane = int(rng.integers(0, n_lanes))
    ego_v = rng.uniform(22.0, 28.0)
    gap = ego_v * rng.uniform(*headway)
    lead_s = EGO_START_S + 5.0 + gap
    speeds = _lane_speeds(rng, n_lanes, 22.0, 3.0)
    ep = _base_episode(
        rng,
        n_lanes,
        _Ego(ego_lane, ego_v, ego_v, behind_clear=60.0, ahead_clear=gap + 60.0),
        _Traffic(n_traffic, speeds, (1.3, 2.5)),
        extra=[(lead_s, ego_lane, ego_v, ego_v)],
    )
    stop_time = ego_v / -brake_accel
    end = brake_at + (stop_time + rng.uniform(1.0, 3.0) if hold_s is None else hold_s)
    ep.script = {"accel_start": {1: brake_at}, "accel_end": {1: end}, "accel_value": {1: brake_accel}}
    return ep


def _lead_brakes_hard(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
    return _with_lead(rng, n_traffic, n_lanes, (1.6, 2.2), rng.uniform(4.0, 7.0), rng.uniform(-7.0, -5.0), None)


def _need_lanes(scenario: str, n_lanes: int, minimum: int, why: str) -> None:
    """Refuse a lane count the scenario cannot be built on, naming both (before anything is drawn)."""
    if n_lanes < minimum:
        raise ValueError(f"{scenario} needs n_lanes >= {minimum} ({why}); got n_lanes={n_lanes}")


def _cut_in(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
    # first: on one lane rng.choice below fails with numpy's "a cannot be empty", which names neither
    _need_lanes("cut_in", n_lanes, 2, "the car that cuts in comes from a lane next to the ego's")
    ego_lane = int(rng.integers(0, n_lanes))
    side = int(rng.choice([s for s in (-1, 1) if 0 <= ego_lane + s < n_lanes]))
    from_lane = ego_lane + side
    ego_v = rng.uniform(22.0, 28.0)
    cut_at = rng.uniform(3.0, 5.0)
    cutter_v = ego_v - rng.uniform(1.0, 4.0)
    # Place it so that the bumper gap is 8-18 m at the moment it starts to cut in.
    cutter_s = EGO_START_S + 5.0 + rng.uniform(8.0, 18.0) + (ego_v - cutter_v) * cut_at
    speeds = _lane_speeds(rng, n_lanes, 22.0, 3.0)
    ep = _base_episode(
        rng,
        n_lanes,
        _Ego(ego_lane, ego_v, ego_v, behind_clear=60.0, ahead_clear=cutter_s - EGO_START_S + 60.0),
        _Traffic(n_traffic, speeds, (1.3, 2.5)),
        extra=[(cutter_s, from_lane, cutter_v, cutter_v)],
        exclude=[(from_lane, cutter_s - 40.0, cutter_s + 120.0)],
    )
    # Constant speed until the cut-in, so traffic ahead of it cannot make the ego pass it first.
    ep.script = {
        "lane_change_time": {1: cut_at},
        "lane_change_dir": {1: -side},
        "accel_start": {1: 0.0},
        "accel_end": {1: cut_at},
        "accel_value": {1: 0.0},
    }
    return ep


def _stopped_ahead(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
    ego_lane = int(rng.integers(0, n_lanes))
    ego_v = rng.uniform(22.0, 28.0)
    stopped_s = EGO_START_S + rng.uniform(120.0, 220.0)
    speeds = _lane_speeds(rng, n_lanes, 22.0, 3.0)
    ep = _base_episode(
        rng,
        n_lanes,
        _Ego(ego_lane, ego_v, ego_v, behind_clear=60.0, ahead_clear=stopped_s - EGO_START_S + 20.0),
        _Traffic(n_traffic, speeds, (1.3, 2.5)),
        extra=[(stopped_s, ego_lane, 0.0, 0.1)],
    )
    ep.script = {"accel_start": {1: 0.0}, "accel_end": {1: np.inf}, "accel_value": {1: -8.0}}
    return ep


def _slow_merge(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 4) -> EpisodeInit:
    """Lane 0 is an on-ramp that ends; lane 1 is slow with gaps just big enough to merge into."""
    # on one lane the ramp would end with no lane to merge into, and the slow lane's cars would be
    # placed on a lane the road does not have
    _need_lanes("slow_merge", n_lanes, 2, "lane 0 is the on-ramp, lane 1 the slow lane it merges into")
    ego_v = rng.uniform(14.0, 17.0)
    end = np.full(n_lanes, np.inf)
    end[0] = EGO_START_S + rng.uniform(250.0, 350.0)
    speeds = [0.0, rng.uniform(11.0, 14.0)] + [20.0 + 3.0 * k + rng.uniform(-1.0, 1.0) for k in range(n_lanes - 2)]
    return _base_episode(
        rng,
        n_lanes,
        _Ego(0, ego_v, 25.0),
        _Traffic(n_traffic, speeds, (1.3, 2.5), lanes=range(1, n_lanes), fixed_gap_lanes={1: (35.0, 60.0)}),
        lane_end=end,
    )


# ---- traffic behind the ego ---------------------------------------------------------------------
@dataclass(frozen=True)
class FollowerRanges:
    """What a follower draws, uniformly. Humans: a comfortable gap of about 1.2-2 s at highway speed
    (IDM time gap plus the slack of wanting to go a little faster), about 1 s to perceive and react,
    emergency braking of 6.5-8 m/s^2 (dry road, ordinary tyres)."""

    time_gap_s: tuple[float, float] = (1.1, 1.5)
    min_gap_m: tuple[float, float] = (1.5, 2.5)
    a_max: tuple[float, float] = (1.0, 2.0)
    b_comf: tuple[float, float] = (1.5, 2.5)
    max_decel: tuple[float, float] = (6.5, 8.0)
    reaction_s: tuple[float, float] = (0.8, 1.3)
    desired_over_ego: tuple[float, float] = (1.3, 1.5)  # desired speed / the ego's (start or cruise)


FOLLOWER_RANGES = FollowerRanges()


def add_followers(ep: EpisodeInit, rng: np.random.Generator, count: int, ranges: FollowerRanges) -> None:
    """Append `count` followers behind the ego in its lane, each at its IDM equilibrium gap to the car
    ahead at the ego's speed (steady following from t = 0). Traffic already behind the ego in that
    lane moves back as a block to leave them room; nothing else changes."""
    ego_s, ego_v, lane = float(ep.s[0]), float(ep.v[0]), int(ep.lane[0])
    draw = np.array(
        [
            rng.uniform(*r, size=count)
            for r in (
                ranges.time_gap_s,
                ranges.min_gap_m,
                ranges.a_max,
                ranges.b_comf,
                ranges.max_decel,
                ranges.reaction_s,
                ranges.desired_over_ego,
            )
        ]
    )
    v0 = max(ego_v, ep.cruise) * draw[6]
    ratio = ego_v / v0
    # IDM at dv = 0 is in equilibrium where 1 - (v/v0)^4 = (s*/s)^2
    gap = (draw[1] + draw[0] * ego_v) / np.sqrt(1.0 - ratio**4)
    length = 5.0
    s = ego_s - np.cumsum(gap + length)
    behind = (ep.lane == lane) & (ep.s < ego_s)
    behind[0] = False
    if behind.any():
        nearest = float(ep.s[behind].max())
        room = _IDM.min_gap + _IDM.time_gap * float(ep.v[behind][np.argmax(ep.s[behind])])
        shift = max(0.0, nearest - (s[-1] - length - room))
        ep.s = np.where(behind, ep.s - shift, ep.s)
    ep.s = np.concatenate([ep.s, s])
    ep.lane = np.concatenate([ep.lane, np.full(count, lane, np.int64)])
    ep.v = np.concatenate([ep.v, np.full(count, ego_v)])
    ep.v0 = np.concatenate([ep.v0, v0])
    ep.politeness = np.concatenate([ep.politeness, np.full(count, 0.3)])
    ep.followers = draw[:6]


# ---- OOD variants -------------------------------------------------------------------------------
def _with_fault(kind: str) -> Callable[..., EpisodeInit]:
    def build(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
        ep = _nominal(rng, n_traffic, n_lanes)
        ep.fault_onset = rng.uniform(5.0, 10.0)
        ep.fault_duration = rng.uniform(2.0, 4.0) if kind == "noise_burst" else np.inf
        ep.ood_onset = ep.fault_onset
        return ep

    return build


def _low_friction(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
    onset = rng.uniform(5.0, 10.0)
    ep = _with_lead(rng, n_traffic, n_lanes, (2.0, 2.5), onset + rng.uniform(2.0, 4.0), -3.5, 3.0)
    ep.friction = (onset, 0.4, 3.0, 0.7)
    ep.ood_onset = onset
    return ep


def _speed_out_of_range(rng: np.random.Generator, n_traffic: int = 20, n_lanes: int = 3) -> EpisodeInit:
    ego_lane = int(rng.integers(0, n_lanes))
    ego_v = rng.uniform(55.0, 60.0)
    speeds = _lane_speeds(rng, n_lanes, 22.0, 3.0)
    ep = _base_episode(
        rng, n_lanes, _Ego(ego_lane, ego_v, ego_v, ahead_clear=1500.0), _Traffic(n_traffic, speeds, (1.3, 2.5))
    )
    ep.ood_onset = 0.0
    return ep


# ---- batching -------------------------------------------------------------------------------------
def _script(episodes: Sequence[EpisodeInit], m: int) -> TrafficScript:
    sc = TrafficScript.empty(len(episodes), m)
    for b, ep in enumerate(episodes):
        for key, per_car in ep.script.items():
            arr = getattr(sc, key)
            for car, value in per_car.items():
                arr[b, car] = value
    return sc


def _followers(episodes: Sequence[EpisodeInit]) -> Followers | None:
    if episodes[0].followers is None:
        return None
    p = np.stack([ep.followers for ep in episodes if ep.followers is not None], axis=1)  # (6, B, F)
    return Followers(p[0], p[1], p[2], p[3], p[4], p[5])


def build_instance(
    name: str,
    seeds: Sequence[int],
    builder: Callable[..., EpisodeInit],
    duration_s: float,
    fault_kind: str,
    ood: bool,
    followers: int = FOLLOWERS,
    follower_ranges: FollowerRanges = FOLLOWER_RANGES,
    **params: Any,
) -> ScenarioInstance:
    if followers < 0:
        raise ValueError(f"followers must be >= 0, got {followers}")
    episodes = [builder(np.random.default_rng(int(sd)), **params) for sd in seeds]
    if followers:
        for sd, ep in zip(seeds, episodes):
            rng = np.random.default_rng([int(sd), _FOLLOWER_STREAM, zlib.crc32(name.encode())])
            add_followers(ep, rng, followers, follower_ranges)
    sizes = {ep.s.shape[0] for ep in episodes}
    if len(sizes) != 1:
        raise ValueError("all episodes of a batch need the same vehicle count")
    m = sizes.pop()
    n_lanes = episodes[0].lane_end.shape[0]
    road = make_road([ep.curvature for ep in episodes], n_lanes, LANE_WIDTH, [ep.lane_end for ep in episodes])
    stack = lambda attr: np.stack([getattr(ep, attr) for ep in episodes]).astype(np.float64)  # noqa: E731
    fr = np.asarray([ep.friction for ep in episodes], dtype=np.float64)
    world = World(
        road=road,
        s=stack("s"),
        d=stack("lane") * LANE_WIDTH,
        v=stack("v"),
        v0=stack("v0"),
        politeness=stack("politeness"),
        ego_psi=np.zeros(len(episodes)),
        friction=Friction(onset_s=fr[:, 0], brake_gain=fr[:, 1], max_decel=fr[:, 2], drive_gain=fr[:, 3]),
        script=_script(episodes, m),
        followers=_followers(episodes),
    )
    fault = FaultConfig(
        kind=fault_kind,
        onset_s=np.array([ep.fault_onset for ep in episodes]),
        duration_s=np.array([ep.fault_duration for ep in episodes]),
    )
    return ScenarioInstance(
        name=name,
        seeds=tuple(int(s) for s in seeds),
        world=world,
        fault=fault,
        duration_s=duration_s,
        cruise_speed=np.array([ep.cruise for ep in episodes]),
        ood_onset_s=np.array([ep.ood_onset for ep in episodes]),
        ood=ood,
    )


def _spec(
    name: str,
    description: str,
    builder: Callable[..., EpisodeInit],
    duration_s: float,
    ood: bool = False,
    fault_kind: str = "none",
    observable: str = "always",
) -> ScenarioSpec:
    def factory(seeds: Sequence[int] | int, duration_s: float = duration_s, **params: Any) -> ScenarioInstance:
        seed_list = [seeds] if isinstance(seeds, (int, np.integer)) else list(seeds)
        return build_instance(name, seed_list, builder, duration_s, fault_kind, ood, **params)

    return ScenarioSpec(name, description, factory, ood, observable)


SCENARIOS: dict[str, ScenarioSpec] = {
    s.name: s
    for s in (
        _spec("nominal_cruise", "3-lane highway, moderate traffic, straights and gentle curves", _nominal, 30.0),
        _spec("dense_traffic", "30 cars at 12-18 m/s with short gaps", _dense, 25.0),
        _spec(
            "lead_brakes_hard",
            "in-lane lead at 1.6-2.2 s headway brakes at 5-7 m/s^2 to a stop",
            _lead_brakes_hard,
            20.0,
        ),
        _spec("cut_in", "slower car 8-18 m ahead in the next lane cuts into the ego lane", _cut_in, 20.0),
        _spec("stopped_vehicle_ahead", "stationary car 120-220 m ahead in the ego lane", _stopped_ahead, 25.0),
        _spec("slow_merge", "on-ramp ends in 250-350 m; merge into slow lane with 35-60 m gaps", _slow_merge, 25.0),
        _spec(
            "sensor_dropout",
            "nominal cruise; all features read 0 from onset",
            _with_fault("dropout"),
            20.0,
            True,
            "dropout",
        ),
        _spec(
            "stuck_sensor",
            "nominal cruise; features freeze at their onset value",
            _with_fault("stuck"),
            20.0,
            True,
            "stuck",
        ),
        _spec(
            "noise_burst",
            "nominal cruise; large sensor noise for 2-4 s from onset",
            _with_fault("noise_burst"),
            20.0,
            True,
            "noise_burst",
        ),
        _spec(
            "unit_mismatch_kmh",
            "nominal cruise; speeds arrive in km/h from onset",
            _with_fault("unit_mismatch"),
            20.0,
            True,
            "unit_mismatch",
        ),
        _spec(
            "low_friction",
            "low-mu road from onset (brakes 40 %, max 3 m/s^2), then the lead brakes",
            _low_friction,
            20.0,
            True,
            observable="under_demand",
        ),
        _spec("speed_out_of_range", "ego at 55-60 m/s, far above the training range", _speed_out_of_range, 15.0, True),
    )
}
NOMINAL_SCENARIOS: tuple[str, ...] = tuple(n for n, s in SCENARIOS.items() if not s.ood)
OOD_SCENARIOS: tuple[str, ...] = tuple(n for n, s in SCENARIOS.items() if s.ood)


def build_scenario(name: str, seeds: Sequence[int] | int, **params: Any) -> ScenarioInstance:
    """Instantiate a registered scenario for one seed or a batch of seeds."""
    if name not in SCENARIOS:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    return SCENARIOS[name].factory(seeds, **params)
