"""Sensor model: world state -> FEATURES (float32), with seeded noise and injectable faults.

Noise for step k is a fixed function of (seed, k) however often observe() is called, because it
comes from per-episode generators in fixed-size blocks indexed by the world's step counter. Faults
are applied on top of the noisy output and use their own generator, so a faulty run is identical to
its nominal twin before the fault's onset: that is what makes detection delay measurable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import FEATURE_INDEX, FEATURES, N_FEATURES, SENSOR_RANGE_M, SPEED_FEATURES
from dualloop.sim.world import EGO, World

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

FAULT_KINDS: tuple[str, ...] = ("none", "dropout", "stuck", "noise_burst", "unit_mismatch")
KMH_PER_MS: float = 3.6
_BLOCK = 256  # steps of noise drawn at once per episode

# 1-sigma of the nominal measurement noise, per feature unit kind (absolute part).
_NOMINAL_SIGMA: dict[str, float] = {
    "ego_speed": 0.05,
    "ego_accel": 0.05,
    "lead_distance": 0.15,
    "lead_rel_speed": 0.1,
    "lane_offset": 0.03,
    "heading_error": 0.003,
    "yaw_rate": 0.002,
    "road_curvature": 5e-5,
}
_GAP_SIGMA, _GAP_SIGMA_REL, _REL_SPEED_SIGMA = 0.3, 0.005, 0.2
# Burst noise: large enough to be obviously abnormal, per feature.
_BURST_SIGMA: dict[str, float] = {
    "ego_speed": 3.0,
    "ego_accel": 2.0,
    "lane_offset": 0.5,
    "heading_error": 0.05,
    "yaw_rate": 0.05,
    "road_curvature": 0.005,
}
_BURST_GAP, _BURST_REL = 15.0, 3.0


def _sigma_vector(table: dict[str, float], gap: float, rel: float) -> npt.NDArray[np.float32]:
    sigma = np.zeros(N_FEATURES, dtype=np.float32)
    for i, f in enumerate(FEATURES):
        if f.name in table:
            sigma[i] = table[f.name]
        elif f.name.endswith("_gap") or f.name == "lead_distance":
            sigma[i] = gap
        elif f.name.endswith("rel_speed"):
            sigma[i] = rel
    return sigma


NOMINAL_SIGMA = _sigma_vector(_NOMINAL_SIGMA, _GAP_SIGMA, _REL_SPEED_SIGMA)
BURST_SIGMA = _sigma_vector(_BURST_SIGMA, _BURST_GAP, _BURST_REL)
# Whether training and gate-fitting data come from sensors that see where a lane ends, as closed-loop
# driving does. The models/base.onnx trained before lane ends were visible kept the old view (False)
# so that it still reproduced; the model retrained for stepped target speeds sees them.
TRAINING_SEES_LANE_ENDS: bool = True

_GAP_COLS = np.array([i for i, f in enumerate(FEATURES) if f.name.endswith("_gap") or f.name == "lead_distance"])
_SPEED_COLS = np.array([FEATURE_INDEX[n] for n in SPEED_FEATURES])


@dataclass
class FaultConfig:
    """One fault kind for a batch; onset (and window for noise bursts) per episode, seconds."""

    kind: str = "none"
    onset_s: FloatArray | float = np.inf
    duration_s: FloatArray | float = np.inf  # only noise_burst ends; the others last

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}, expected one of {FAULT_KINDS}")


def _with_lane_ends(
    world: World, lanes: IntArray, front_gap: FloatArray, front_v: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Front gaps and speeds (B, 3) with the end of each lane that ends ahead of the ego seen as a
    parked car at the end of the lane, as World.leader_gap shows it to traffic."""
    road = world.road
    s_e = world.s[:, EGO]
    safe = np.clip(lanes, 0, road.n_lanes - 1)
    end = road.lane_end_s[np.arange(world.batch)[:, None], safe]
    end_gap = end - s_e[:, None] - 0.5 * world.vehicle.length
    closer = (lanes == safe) & (s_e[:, None] < end) & (end_gap < front_gap)
    return np.where(closer, end_gap, front_gap), np.where(closer, 0.0, front_v)


def true_features(world: World, see_lane_ends: bool = True) -> FloatArray:
    """Noise-free FEATURES (B, N_FEATURES) float64 from the world's ground truth.

    see_lane_ends: the end of a lane (an on-ramp's) reads like a stationary car in that lane's front
    gap, as a camera sees the end of the markings or the barrier. Without it a ramp's end is
    invisible until the ego is off the road."""
    road = world.road
    b = world.batch
    lane = world.ego_lane()
    s_e, v_e = world.s[:, EGO], world.v[:, EGO]
    lanes = np.stack([lane, lane + 1, lane - 1], axis=1)  # own, left, right
    exists = np.stack(
        [np.ones(b, dtype=bool), road.lane_exists(lane + 1, s_e), road.lane_exists(lane - 1, s_e)],
        axis=1,
    )
    front_gap, front_v, rear_gap, rear_v = world.ego_neighbours(lanes)
    if see_lane_ends and road.has_lane_ends:
        front_gap, front_v = _with_lane_ends(world, lanes, front_gap, front_v)
    front_seen = exists & (front_gap < SENSOR_RANGE_M)
    rear_seen = exists & (rear_gap < SENSOR_RANGE_M)
    fg = np.where(front_seen, np.maximum(front_gap, 0.0), SENSOR_RANGE_M)
    rg = np.where(rear_seen, np.maximum(rear_gap, 0.0), SENSOR_RANGE_M)
    fr = np.where(front_seen, front_v - v_e[:, None], 0.0)
    rr = np.where(rear_seen, rear_v - v_e[:, None], 0.0)
    out = np.empty((b, N_FEATURES))
    out[:, 0] = v_e
    out[:, 1] = world.a[:, EGO]
    out[:, 2] = front_seen[:, 0]
    out[:, 3] = fg[:, 0]
    out[:, 4] = fr[:, 0]
    out[:, 5] = world.d[:, EGO] - lane * road.lane_width
    out[:, 6] = world.ego_psi
    out[:, 7] = world.ego_yaw_rate
    out[:, 8] = world.ego_curvature
    out[:, 9] = exists[:, 1]
    out[:, 10] = exists[:, 2]
    out[:, 11], out[:, 12], out[:, 13], out[:, 14] = fg[:, 1], fr[:, 1], rg[:, 1], rr[:, 1]
    out[:, 15], out[:, 16], out[:, 17], out[:, 18] = fg[:, 2], fr[:, 2], rg[:, 2], rr[:, 2]
    return out


def with_nominal_noise(truth: FloatArray, unit_noise: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """The sensors' nominal reading (..., N_FEATURES) float32 of true features, given standard normal
    `unit_noise` of the same shape: absolute noise per feature, gaps also relative to the gap."""
    sigma = NOMINAL_SIGMA + np.zeros_like(truth, dtype=np.float32)
    sigma[..., _GAP_COLS] += (_GAP_SIGMA_REL * truth[..., _GAP_COLS]).astype(np.float32)
    # Nothing detected -> the sensor reports exactly range / zero, with no noise.
    # In FEATURES every gap column is directly followed by its rel-speed column.
    nothing = truth[..., _GAP_COLS] >= SENSOR_RANGE_M
    sigma[..., _GAP_COLS] = np.where(nothing, 0.0, sigma[..., _GAP_COLS])
    sigma[..., _GAP_COLS + 1] = np.where(nothing, 0.0, sigma[..., _GAP_COLS + 1])
    obs = truth + sigma * unit_noise
    obs[..., _GAP_COLS] = np.clip(obs[..., _GAP_COLS], 0.0, SENSOR_RANGE_M)
    return obs.astype(np.float32)


class Sensors:
    """Noisy, possibly faulty FEATURES for every episode of a world, one sample per step."""

    def __init__(
        self, world: World, seeds: Sequence[int], fault: FaultConfig | None = None, see_lane_ends: bool = True
    ) -> None:
        if len(seeds) != world.batch:
            raise ValueError("one seed per episode is required")
        self.world = world
        self.fault = fault or FaultConfig()
        self.see_lane_ends = see_lane_ends
        b = world.batch
        self.onset = np.broadcast_to(np.asarray(self.fault.onset_s, dtype=np.float64), (b,)).copy()
        self.fault_end = self.onset + np.broadcast_to(np.asarray(self.fault.duration_s, dtype=np.float64), (b,))
        # Separate streams: nominal noise must not depend on whether a fault is configured.
        streams = [np.random.SeedSequence([int(sd), 0x5E45]).spawn(2) for sd in seeds]
        self._noise_rngs = [np.random.Generator(np.random.PCG64(st[0])) for st in streams]
        self._fault_rngs = [np.random.Generator(np.random.PCG64(st[1])) for st in streams]
        self._block_index = -1
        self._noise = np.zeros((b, _BLOCK, N_FEATURES), dtype=np.float32)
        self._frozen: npt.NDArray[np.float32] | None = None
        self._was_active = np.zeros(b, dtype=bool)
        self._cache_step = -1
        self._cache: npt.NDArray[np.float32] = np.zeros((b, N_FEATURES), dtype=np.float32)
        self._true_step = -1
        self._true: FloatArray = np.zeros((b, N_FEATURES))

    def true(self) -> FloatArray:
        """Ground-truth features at the current step (cached per step)."""
        if self._true_step != self.world.step_index:
            self._true = true_features(self.world, self.see_lane_ends)
            self._true_step = self.world.step_index
        return self._true

    def _unit_noise(self, step: int) -> npt.NDArray[np.float32]:
        block, row = divmod(step, _BLOCK)
        if block < self._block_index:
            raise RuntimeError("sensor noise cannot go back in time")
        while self._block_index < block:  # skipped blocks are still drawn, to stay reproducible
            self._noise = np.stack(
                [g.standard_normal((_BLOCK, N_FEATURES), dtype=np.float32) for g in self._noise_rngs]
            )
            self._block_index += 1
        return self._noise[:, row, :]

    def observe(self) -> npt.NDArray[np.float32]:
        """FEATURES (B, N_FEATURES) float32 for the current step."""
        step = self.world.step_index
        if step == self._cache_step:
            return self._cache.copy()
        obs = with_nominal_noise(self.true(), self._unit_noise(step))
        out = self._apply_fault(obs)
        self._cache_step, self._cache = step, out
        return out.copy()

    def _apply_fault(self, obs: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        kind, t = self.fault.kind, self.world.t
        active = (t >= self.onset) & (t < self.fault_end)
        if kind == "none" or not active.any():
            return obs
        rows = active[:, None]
        if kind == "dropout":
            return np.where(rows, np.float32(0.0), obs)
        if kind == "unit_mismatch":
            scaled = obs.copy()
            scaled[:, _SPEED_COLS] *= np.float32(KMH_PER_MS)
            return np.where(rows, scaled, obs)
        if kind == "stuck":
            if self._frozen is None:
                self._frozen = obs.copy()
            # An episode freezes at its first sample at or after its own onset.
            self._frozen = np.where(rows & ~self._was_active[:, None], obs, self._frozen)
            self._was_active = self._was_active | active
            return np.where(rows, self._frozen, obs)
        # noise_burst: draw only for bursting episodes, so other episodes' streams are untouched
        burst = obs.copy()
        for i in np.flatnonzero(active):
            noise = self._fault_rngs[i].standard_normal(N_FEATURES, dtype=np.float32)
            burst[i] += BURST_SIGMA * noise
        return burst
