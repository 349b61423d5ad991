"""Any vehicle's view of the world: the ego's FEATURES computed for traffic cars, so a model that drives
the ego can drive them too (sim.world.World.drive_traffic applies its commands), and the collisions
between any two vehicles.

A traffic car has no bicycle model: it sits on its lane (or moves between two lanes along the
simulator's blend), so its heading error is its lateral speed over its speed and its yaw rate the
road's plus the change of that heading. Its neighbours are found as the ego's are (sim.world
ego_neighbours: a car whose body is in the lane, alongside counted in front), the end of a lane it
is in reads as a parked car (see_lane_ends), and its sensors add the ego sensors' nominal noise from
a generator of its own per episode and car, so a run is a pure function of the seeds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import N_FEATURES, SENSOR_RANGE_M
from dualloop.sim.sensors import with_nominal_noise
from dualloop.sim.world import World

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_NOISE_STREAM = 0x7EA1  # each car's generator: default_rng([episode seed, _NOISE_STREAM, column])


def _neighbours(world: World, cols: IntArray, lanes: IntArray) -> tuple[FloatArray, ...]:
    """For the cars `cols` (K,) of every episode: the nearest vehicle ahead and behind in each of
    `lanes` (B, K, 3); (front gap, front v, rear gap, rear v), each (B, K, 3), inf gaps when none."""
    occ = np.abs(world.d[:, None, None, :] - lanes[..., None] * world.road.lane_width) < world._occ_threshold
    occ[:, np.arange(cols.size), :, cols] = False  # a car is not its own neighbour
    ds = (world.s[:, None, :] - world.s[:, cols, None])[:, :, None, :]  # (B, K, 1, M)
    front = np.where(occ & (ds >= 0.0), ds, np.inf)
    rear = np.where(occ & (ds < 0.0), -ds, np.inf)
    fi, ri = np.argmin(front, axis=3), np.argmin(rear, axis=3)
    rows = np.arange(world.batch)[:, None, None]
    length = world.vehicle.length
    front_gap = np.take_along_axis(front, fi[..., None], axis=3)[..., 0] - length
    rear_gap = np.take_along_axis(rear, ri[..., None], axis=3)[..., 0] - length
    return front_gap, world.v[rows, fi], rear_gap, world.v[rows, ri]


def vehicle_features(world: World, cols: Sequence[int], see_lane_ends: bool = True) -> FloatArray:
    """Noise-free FEATURES (B, K, N_FEATURES) float64 of the vehicles in columns `cols` (traffic cars;
    the ego's own are sim.sensors.true_features), in the order of sim.schema.FEATURES."""
    c = np.asarray(cols, dtype=np.int64)
    road, w = world.road, world.road.lane_width
    rows = np.arange(world.batch)[:, None]
    s, d, v = world.s[:, c], world.d[:, c], world.v[:, c]
    lane = road.lane_of(d)
    lanes = np.stack([lane, lane + 1, lane - 1], axis=2)  # own, left, right
    safe = np.clip(lanes, 0, road.n_lanes - 1)
    end = road.lane_end_s[rows[..., None], safe]  # (B, K, 3)
    exists = (lanes == safe) & (s[..., None] < end)
    exists[..., 0] = True
    front_gap, front_v, rear_gap, rear_v = _neighbours(world, c, lanes)
    if see_lane_ends and road.has_lane_ends:
        end_gap = end - s[..., None] - 0.5 * world.vehicle.length
        closer = exists & (end_gap < front_gap)
        front_gap, front_v = np.where(closer, end_gap, front_gap), np.where(closer, 0.0, front_v)
    front_seen = exists & (front_gap < SENSOR_RANGE_M)
    rear_seen = exists & (rear_gap < SENSOR_RANGE_M)
    fg = np.where(front_seen, np.maximum(front_gap, 0.0), SENSOR_RANGE_M)
    rg = np.where(rear_seen, np.maximum(rear_gap, 0.0), SENSOR_RANGE_M)
    fr = np.where(front_seen, front_v - v[..., None], 0.0)
    rr = np.where(rear_seen, rear_v - v[..., None], 0.0)
    kappa = road.curvature(s)
    heading = np.arctan2(world.d_dot[:, c], np.maximum(v, 0.1))
    out = np.empty(s.shape + (N_FEATURES,))
    out[..., 0], out[..., 1] = v, world.a[:, c]
    out[..., 2], out[..., 3], out[..., 4] = front_seen[..., 0], fg[..., 0], fr[..., 0]
    out[..., 5] = d - lane * w
    out[..., 6] = heading
    out[..., 7] = v * kappa  # the lane's yaw rate; a lane change's own turn is too short to matter here
    out[..., 8] = kappa
    out[..., 9], out[..., 10] = exists[..., 1], exists[..., 2]
    out[..., 11], out[..., 12], out[..., 13], out[..., 14] = fg[..., 1], fr[..., 1], rg[..., 1], rr[..., 1]
    out[..., 15], out[..., 16], out[..., 17], out[..., 18] = fg[..., 2], fr[..., 2], rg[..., 2], rr[..., 2]
    return out


class VehicleSensors:
    """Noisy FEATURES of a fixed set of vehicles (columns) of every episode, one sample per step: each
    car's noise comes from its own generator, drawn once per step whatever is asked."""

    def __init__(self, world: World, seeds: Sequence[int], cols: Sequence[int], see_lane_ends: bool = True) -> None:
        if len(seeds) != world.batch:
            raise ValueError("one seed per episode is required")
        bad = [c for c in cols if not 0 < int(c) < world.m]
        if bad:
            raise ValueError(f"traffic columns are 1..{world.m - 1}; got {bad}")
        self.world, self.cols, self.see_lane_ends = world, [int(c) for c in cols], see_lane_ends
        self._rngs = [[np.random.default_rng([int(sd), _NOISE_STREAM, c]) for c in self.cols] for sd in seeds]
        self._step = -1
        self._out = np.zeros((world.batch, len(self.cols), N_FEATURES), dtype=np.float32)

    def observe(self) -> npt.NDArray[np.float32]:
        """FEATURES (B, K, N_FEATURES) float32 of the vehicles at the current step."""
        if self._step != self.world.step_index:
            noise = np.stack([[g.standard_normal(N_FEATURES, dtype=np.float32) for g in row] for row in self._rngs])
            self._out = with_nominal_noise(vehicle_features(self.world, self.cols, self.see_lane_ends), noise)
            self._step = self.world.step_index
        return self._out.copy()


def overlapping(world: World) -> BoolArray:
    """(B, M, M): vehicles i < j whose bodies overlap now (the ego's collision test, every pair)."""
    veh = world.vehicle
    ds = np.abs(world.s[:, :, None] - world.s[:, None, :])
    dd = np.abs(world.d[:, :, None] - world.d[:, None, :])
    return (ds < veh.length) & (dd < veh.width) & world._upper


def past_lane_end(world: World) -> BoolArray:
    """(B, M): vehicles past the end of the lane they are in (off the road, as the ego's check has it)."""
    lane = world.road.lane_of(world.d)
    return world.s > world.road.lane_end_s[np.arange(world.batch)[:, None], lane]
