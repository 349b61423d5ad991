"""Vectorised highway world: a batch of independent episodes stepped together with numpy.

Layout: every per-vehicle array is (B, M): B episodes, M = 1 + traffic vehicles, column 0 is the
ego. Keeping the ego inside the traffic arrays means traffic car-following and lane-change safety
see the ego like any other car, with no special cases. The ego alone has a kinematic bicycle model
with actuator lag; traffic follows IDM along the road with MOBIL lane changes executed as smooth
lateral moves. The last columns may be `Followers`: human drivers behind the ego who see their
leader late (a reaction delay), so braking the ego did not need has a cost. Any traffic car may be
handed to an outside driver instead (`drive_traffic`): it then takes that acceleration command through
the ego's actuator lag, keeps its lane and makes no lane change of its own. Nothing here draws random
numbers: all randomness is in the initial state, so a world is a pure function of its construction
arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from dualloop.sim.road import Road
from dualloop.sim.schema import ACCEL_MAX, ACCEL_MIN, STEER_MAX, STEER_MIN

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DT: float = 0.005
EGO: int = 0
_EGO_INTENT_S = 1.0  # how far ahead traffic reads the ego's lateral motion when it changes lanes
_FOLLOWER_MARGIN_M = 2.0  # the gap a follower braking hard aims to keep to the car it stops behind


@dataclass(frozen=True)
class VehicleParams:
    length: float = 5.0
    width: float = 2.0
    wheelbase: float = 2.7
    rear_to_cg: float = 1.35  # the slip angle uses lr / wheelbase
    tau_accel: float = 0.15  # first-order lag of the longitudinal actuator, s
    tau_steer: float = 0.08  # first-order lag of the steering actuator, s


@dataclass(frozen=True)
class IdmParams:
    time_gap: float = 1.5
    min_gap: float = 2.0
    a_max: float = 1.5
    b_comf: float = 2.0
    max_decel: float = 9.0  # physical braking limit of traffic cars


@dataclass(frozen=True)
class TrafficDrivers:
    """A population of traffic drivers (training data): IDM parameters per vehicle (B, M) in place of
    the shared IdmParams, and a slow wave on each driver's desired speed, v0 * (1 + amplitude *
    sin(2 pi t / period + phase)), which makes leaders speed up and slow down as real traffic does
    (stop-and-go when the amplitude is large). The ego's column is unused: the ego is driven."""

    time_gap: FloatArray
    min_gap: FloatArray
    a_max: FloatArray
    b_comf: FloatArray
    wave_amplitude: FloatArray
    wave_period_s: FloatArray
    wave_phase: FloatArray
    max_decel: float = 9.0

    def desired_speed(self, v0: FloatArray, t: float) -> FloatArray:
        wave = 1.0 + self.wave_amplitude * np.sin(2.0 * np.pi * t / self.wave_period_s + self.wave_phase)
        return np.maximum(v0 * wave, 0.1)


@dataclass(frozen=True)
class MobilParams:
    politeness: float = 0.3
    threshold: float = 0.25  # m/s^2 of net advantage needed to bother changing
    b_safe: float = 2.5  # new follower may be asked to brake at most this much
    b_safe_ego: float = 1.0  # be gentler when the new follower is the ego (nobody cuts in rudely)
    min_gap: float = 4.0
    period_s: float = 1.0
    duration_s: float = 3.0


@dataclass(frozen=True)
class Followers:
    """Human drivers in the last F columns of the world (B, F each), usually just behind the ego.

    Each drives IDM with its own parameters on what it perceives: its leader's position, speed and
    acceleration as they were `reaction_s` ago, carried forward at that acceleration (a driver
    anticipates that a car keeps doing what it does, but notices a change only after perceiving and
    reacting to it: Treiber's Human Driver Model, temporal anticipation). Their own speed is current.
    While the leader keeps its acceleration they see the truth: the delay costs only at a change,
    such as the onset of braking. Behind hard braking they brake as hard as it takes, up to
    `max_decel`. They stay in their lane (they follow the ego, they do not overtake it) unless that
    lane ends; once the ego has left their lane they follow the car ahead of them.
    """

    time_gap: FloatArray
    min_gap: FloatArray
    a_max: FloatArray
    b_comf: FloatArray
    max_decel: FloatArray  # the hardest braking this driver applies in an emergency, positive
    reaction_s: FloatArray

    @property
    def count(self) -> int:
        return int(self.time_gap.shape[1])


class IdmLike(Protocol):
    """IDM parameters, scalars or arrays broadcasting against the vehicles they apply to."""

    @property
    def time_gap(self) -> float | FloatArray: ...
    @property
    def min_gap(self) -> float | FloatArray: ...
    @property
    def a_max(self) -> float | FloatArray: ...
    @property
    def b_comf(self) -> float | FloatArray: ...
    @property
    def max_decel(self) -> float | FloatArray: ...


def idm_accel(v: FloatArray, v0: FloatArray, gap: FloatArray, v_lead: FloatArray, p: IdmLike) -> FloatArray:
    """Intelligent Driver Model acceleration; gap = inf means a free road."""
    dv = v - v_lead
    s_star = p.min_gap + np.maximum(0.0, v * p.time_gap + v * dv / (2.0 * np.sqrt(p.a_max * p.b_comf)))
    x = v / v0
    x2 = x * x
    inter = s_star / np.maximum(gap, 0.1)
    # ufuncs instead of np.clip: np.clip's Python wrapper dominates on arrays this small
    return np.maximum(np.minimum(p.a_max * (1.0 - x2 * x2 - inter * inter), p.a_max), -p.max_decel)


@dataclass
class Friction:
    """Reduced actuator effectiveness (low-mu road) from an onset time, per episode."""

    onset_s: FloatArray  # (B,) inf = never
    brake_gain: FloatArray  # (B,) fraction of the braking command that is achieved
    max_decel: FloatArray  # (B,) positive, tyre limit in m/s^2
    drive_gain: FloatArray  # (B,)

    @classmethod
    def nominal(cls, batch: int) -> Friction:
        return cls(np.full(batch, np.inf), np.ones(batch), np.full(batch, -ACCEL_MIN), np.ones(batch))


@dataclass
class TrafficScript:
    """Scenario events on traffic cars: forced accelerations and forced lane changes."""

    accel_start: FloatArray  # (B, M) inf = no override
    accel_end: FloatArray
    accel_value: FloatArray
    lane_change_time: FloatArray  # (B, M) inf = none
    lane_change_dir: IntArray  # (B, M) +1 left, -1 right

    @classmethod
    def empty(cls, batch: int, m: int) -> TrafficScript:
        inf = np.full((batch, m), np.inf)
        return cls(inf.copy(), inf.copy(), np.zeros((batch, m)), inf.copy(), np.zeros((batch, m), np.int64))


@dataclass
class World:
    road: Road
    s: FloatArray  # (B, M) along-road position of vehicle centres, m
    d: FloatArray  # (B, M) lateral position, m
    v: FloatArray  # (B, M) speed, m/s
    v0: FloatArray  # (B, M) desired speed of traffic drivers
    politeness: FloatArray  # (B, M)
    ego_psi: FloatArray  # (B,) heading error
    dt: float = DT
    vehicle: VehicleParams = field(default_factory=VehicleParams)
    idm: IdmParams = field(default_factory=IdmParams)
    mobil: MobilParams = field(default_factory=MobilParams)
    friction: Friction | None = None
    script: TrafficScript | None = None
    drivers: TrafficDrivers | None = None  # None: every traffic car drives with `idm`
    followers: Followers | None = None  # the last columns are human drivers with a reaction delay
    neighbour_refresh_steps: int = 4  # leaders are re-identified every 20 ms, gaps every step

    def __post_init__(self) -> None:
        b, m = self.s.shape
        self.batch, self.m = b, m
        self.a = np.zeros((b, m))
        self.ego_delta = np.zeros(b)
        self.ego_yaw_rate = np.zeros(b)
        self.ego_curvature = self.road.curvature(self.s[:, EGO])
        self.lane_target = self.road.lane_of(self.d)
        self.lc_from = self.d.copy()
        self.lc_start = np.full((b, m), -np.inf)
        self.changing = np.zeros((b, m), dtype=bool)
        self.in_collision = np.zeros(b, dtype=bool)
        self.collision_count = np.zeros(b, dtype=np.int64)
        self.off_road = np.zeros(b, dtype=bool)
        self.crashed = np.zeros(b, dtype=bool)
        self.t = 0.0
        self.step_index = 0
        if self.friction is None:
            self.friction = Friction.nominal(b)
        if self.script is None:
            self.script = TrafficScript.empty(b, m)
        self._has_overrides = bool(np.isfinite(self.script.accel_start).any())
        self._next_forced = float(self.script.lane_change_time.min())
        self._friction_onset = float(self.friction.onset_s.min())
        self._row_base = (np.arange(b) * m)[:, None]
        self._upper = np.triu(np.ones((m, m), dtype=bool), 1)
        self._lane_centres = np.arange(self.road.n_lanes) * self.road.lane_width
        self._occ_threshold = 0.5 * (self.road.lane_width + self.vehicle.width) - 0.2
        self._mobil_every = max(1, int(round(self.mobil.period_s / self.dt)))
        self._mobil_count = 0
        self._road_middle = 0.5 * (self.road.n_lanes - 1) * self.road.lane_width
        self._road_half_width = 0.5 * self.road.n_lanes * self.road.lane_width
        self._is_traffic = np.ones((b, m), dtype=bool)
        self._is_traffic[:, EGO] = False
        self.rear_end_count = np.zeros(b, dtype=np.int64)
        self._in_rear_end = np.zeros(b, dtype=bool)
        self.driven = np.zeros((b, m), dtype=bool)  # traffic cars an outside driver commands (drive_traffic)
        self._driven_cmd = np.zeros((b, m))
        self.d_dot = np.zeros((b, m))  # lateral speed over the last step, m/s
        self._is_follower = np.zeros((b, m), dtype=bool)
        if self.followers is not None:
            self._init_followers(self.followers)
        self._refresh_leaders()

    def _init_followers(self, fol: Followers) -> None:
        b, m, n = self.batch, self.m, fol.count
        if fol.time_gap.shape != (b, n) or not 0 < n < m:
            raise ValueError(f"followers: parameters of shape (batch, F) with 0 < F < {m} needed")
        self._f0 = m - n
        self._is_follower[:, self._f0 :] = True
        # Followers decide at the neighbour refresh (every 20 ms, quick enough for a human) and hold
        # their acceleration in between: their work costs a quarter of a per-step update.
        self._f_every = self.neighbour_refresh_steps
        slot_s = self._f_every * self.dt
        self._delay = np.maximum(np.rint(fol.reaction_s / slot_s).astype(np.int64), 1)  # (B, F) slots
        self._late = self._delay * slot_s
        # A ring of every car's (s, v, a), one slot per decision, over the longest delay; filled before
        # t = 0 as if every car had driven at its initial speed (which is what a driver would have seen).
        depth = int(self._delay.max()) + 1
        back = (np.arange(depth) * slot_s)[:, None, None]
        ring = (-np.arange(depth)) % depth
        self._ring = np.zeros((depth, 3, b, m))
        self._ring[ring, 0] = self.s[None] - self.v[None] * back
        self._ring[ring, 1] = self.v[None]
        self._ring_flat = self._ring.reshape(-1)
        self._slot_size = 3 * b * m
        self._cell = (np.arange(b) * m)[:, None]  # + column: a car's cell in one (B, M) plane
        self._follower_a = np.zeros((b, n))

    # ---- neighbour search -------------------------------------------------------------------
    def occupancy(self) -> BoolArray:
        """(B, M, L): vehicle occupies lane (its body intrudes) or is heading into it."""
        occ = np.abs(self.d[:, :, None] - self._lane_centres) < self._occ_threshold
        occ |= self.lane_target[:, :, None] == np.arange(self.road.n_lanes)
        return occ

    def _refresh_leaders(self) -> None:
        occ = self.occupancy()
        occ_f = occ.astype(np.float32)
        share = np.matmul(occ_f, occ_f.transpose(0, 2, 1)) > 0.0  # (B, M, M) i and j share a lane
        ds = self.s[:, None, :] - self.s[:, :, None]  # ds[b, i, j] = s_j - s_i
        ahead = share & ((ds > 0.0) | ((ds == 0.0) & self._upper))
        cand = np.where(ahead, ds, np.inf)
        leader = np.argmin(cand, axis=2)
        has_leader = ahead.any(axis=2)
        if self.followers is not None:
            # The ego's lane_target stays the lane it started in, and traffic keeps following it
            # there. A follower whose lanes the ego's body has left follows the car ahead of it.
            f0 = self._f0
            ego_body = np.abs(self.d[:, EGO, None] - self._lane_centres) < self._occ_threshold  # (B, L)
            ego_there = (occ[:, f0:, :] & ego_body[:, None, :]).any(axis=2)  # (B, F)
            if not ego_there.all():
                ahead_f = ahead[:, f0:, :].copy()
                ahead_f[:, :, EGO] &= ego_there
                leader[:, f0:] = np.argmin(np.where(ahead_f, ds[:, f0:, :], np.inf), axis=2)
                has_leader[:, f0:] = ahead_f.any(axis=2)
        self._has_leader = has_leader
        self._leader = leader
        self._leader_flat = (leader + self._row_base).ravel()

    def leader_gap(self) -> tuple[FloatArray, FloatArray]:
        """Bumper gap and speed of each vehicle's current leader (inf gap when none)."""
        lead_s = self.s.ravel()[self._leader_flat].reshape(self.s.shape)
        lead_v = self.v.ravel()[self._leader_flat].reshape(self.s.shape)
        gap = np.where(self._has_leader, lead_s - self.s - self.vehicle.length, np.inf)
        return self._lane_ends(gap, lead_v, slice(None))

    def _lane_ends(self, gap: FloatArray, lead_v: FloatArray, cols: slice) -> tuple[FloatArray, FloatArray]:
        """The end of a merge lane behaves like a parked car at the end of the lane."""
        if not self.road.has_lane_ends:
            return gap, lead_v
        rows = np.arange(self.batch)[:, None]
        end_gap = self.road.lane_end_s[rows, self.lane_target[:, cols]] - self.s[:, cols] - 0.5 * self.vehicle.length
        closer = end_gap < gap
        return np.where(closer, end_gap, gap), np.where(closer, 0.0, lead_v)

    def _followers_accel(self, v0: FloatArray) -> FloatArray:
        """The followers' accelerations from what they perceive (see Followers)."""
        fol = self.followers
        assert fol is not None  # only called with followers
        depth, plane = self._ring.shape[0], self.batch * self.m
        slot = self.step_index // self._f_every
        now = self._ring[slot % depth]
        now[0], now[1], now[2] = self.s, self.v, self.a
        f0 = self._f0
        # what each follower saw `delay` slots ago of its current leader: one gather for s, v and a
        cell = ((slot - self._delay) % depth) * self._slot_size + self._cell + self._leader[:, f0:]
        s_then, v_then, seen_a = self._ring_flat[cell], self._ring_flat[cell + plane], self._ring_flat[cell + 2 * plane]
        # carried forward at the acceleration it saw (a braking car stops)
        late = self._late
        seen_v = np.maximum(v_then + seen_a * late, 0.0)
        stopped = seen_v <= 0.0
        moved = np.where(stopped, v_then * v_then / (2.0 * np.maximum(-seen_a, 1e-9)), (v_then + seen_v) * 0.5 * late)
        s = self.s[:, f0:]
        car_gap = np.where(self._has_leader[:, f0:], s_then + moved - s - self.vehicle.length, np.inf)
        gap, lead_v = self._lane_ends(car_gap, seen_v, slice(f0, None))
        v = self.v[:, f0:]
        a = idm_accel(v, v0[:, f0:], gap, lead_v, fol)
        # IDM answers the closing speed, not the braking it sees: behind a car braking hard it
        # brakes late and ramps up slowly. A driver who sees hard braking brakes as hard as it takes
        # to stop behind that car where it will stop (with a margin), up to the driver's limit.
        emergency = seen_a < -fol.b_comf
        if not emergency.any():
            return a
        room = car_gap - _FOLLOWER_MARGIN_M + seen_v * seen_v / (-2.0 * np.minimum(seen_a, -0.5))
        need = v * v / (2.0 * np.maximum(room, 0.1))
        emergency &= need > fol.b_comf
        return np.where(emergency, np.maximum(np.minimum(a, -need), -fol.max_decel), a)

    def drive_traffic(self, driven: BoolArray, accel_cmd: FloatArray) -> None:
        """From the next step on, the traffic cars in `driven` (B, M) take `accel_cmd` (B, M, m/s^2) as
        the ego takes its command (clipped to the control range, through the actuator lag) instead of
        their own IDM; they keep their lane: no MOBIL or scripted lane change starts for them, and no
        scripted acceleration overrides them. The ego's column is ignored: step() commands the ego."""
        driven = np.asarray(driven, dtype=bool) & self._is_traffic
        cmd = np.asarray(accel_cmd, dtype=np.float64)
        if driven.shape != (self.batch, self.m) or cmd.shape != (self.batch, self.m):
            raise ValueError(f"drive_traffic: arrays of shape {(self.batch, self.m)} needed")
        self.driven = driven
        self._driven_cmd = np.maximum(np.minimum(cmd, ACCEL_MAX), ACCEL_MIN)

    @property
    def driven_command(self) -> FloatArray:
        """(B, M) the acceleration command the driven cars take (drive_traffic's, clipped)."""
        return self._driven_cmd

    # ---- traffic decisions ------------------------------------------------------------------
    def _start_lane_change(self, mask: BoolArray, new_lane: IntArray) -> None:
        self.lane_target = np.where(mask, new_lane, self.lane_target)
        self.lc_from = np.where(mask, self.d, self.lc_from)
        self.lc_start = np.where(mask, self.t, self.lc_start)
        self.changing |= mask

    def _forced_lane_changes(self) -> None:
        sc = self.script
        assert sc is not None  # __post_init__ fills it
        due = (sc.lane_change_time <= self.t) & ~self.driven
        new_lane = np.clip(self.lane_target + sc.lane_change_dir, 0, self.road.n_lanes - 1)
        self._start_lane_change(due, new_lane)
        sc.lane_change_time = np.where(due, np.inf, sc.lane_change_time)
        self._next_forced = float(sc.lane_change_time.min())

    def _mobil(self, a_current: FloatArray) -> None:
        """One MOBIL round; left and right alternate so two cars never merge into one gap at once."""
        direction = 1 if self._mobil_count % 2 == 0 else -1
        self._mobil_count += 1
        p, idm, veh = self.mobil, self.idm, self.vehicle
        n_lanes = self.road.n_lanes
        occ = self.occupancy()
        # Drivers see the ego drifting towards a lane before its body is in it: for their lane
        # changes it is also where it will be in a second, so no car moves into the lane the ego is
        # entering from the other side (docs/design-notes/sim.md).
        ego_ahead_d = self.d[:, EGO] + self.v[:, EGO] * np.sin(self.ego_psi) * _EGO_INTENT_S
        occ[:, EGO, :] |= np.abs(ego_ahead_d[:, None] - self._lane_centres) < self._occ_threshold
        ds = self.s[:, None, :] - self.s[:, :, None]
        not_self = ~np.eye(self.m, dtype=bool)
        front_ok = (((ds >= 0.0) & not_self)[..., None]) & occ[:, None, :, :]  # (B, M, M, L)
        rear_ok = (ds < 0.0)[..., None] & occ[:, None, :, :]
        front_d = np.where(front_ok, ds[..., None], np.inf)
        rear_d = np.where(rear_ok, -ds[..., None], np.inf)
        front_j = np.argmin(front_d, axis=2)  # (B, M, L)
        rear_j = np.argmin(rear_d, axis=2)
        front_d = front_d.min(axis=2) - veh.length
        rear_d = rear_d.min(axis=2) - veh.length

        lane = self.lane_target
        new_lane = lane + direction
        safe_lane = np.clip(new_lane, 0, n_lanes - 1)
        rows = np.arange(self.batch)[:, None]
        cols = np.arange(self.m)[None, :]
        end_of_new = self.road.lane_end_s[rows, safe_lane]
        assert self.script is not None  # __post_init__ fills it
        eligible = (
            self._is_traffic
            & ~self.driven
            & ~self.changing
            & (new_lane >= 0)
            & (new_lane < n_lanes)
            & np.isinf(end_of_new)  # never move into a lane that ends (on-ramps)
            & ~np.isfinite(self.script.accel_start)  # scripted cars do only what the script says
            & ~np.isfinite(self.script.lane_change_time)
            & (self.v > 1.0)
            # followers keep their lane (behind the ego, or where it left them) unless it ends
            & (~self._is_follower | np.isfinite(self.road.lane_end_s[rows, lane]))
        )
        if not eligible.any():
            return
        v_flat, v0_flat = self.v.ravel(), self.v0.ravel()
        base = self._row_base

        nf_gap = front_d[rows, cols, safe_lane]
        nf_v = v_flat[front_j[rows, cols, safe_lane] + base]
        nr_gap = rear_d[rows, cols, safe_lane]
        nr_idx = rear_j[rows, cols, safe_lane]
        has_nr = np.isfinite(nr_gap)
        nr_v, nr_v0 = v_flat[nr_idx + base], v0_flat[nr_idx + base]
        of_gap = front_d[rows, cols, lane]
        of_v = v_flat[front_j[rows, cols, lane] + base]
        or_gap = rear_d[rows, cols, lane]
        or_idx = rear_j[rows, cols, lane]
        has_or = np.isfinite(or_gap)
        or_v, or_v0 = v_flat[or_idx + base], v0_flat[or_idx + base]

        own_v0, own_idm = self._traffic_idm()
        a_self_new = idm_accel(self.v, own_v0, nf_gap, nf_v, own_idm)
        a_nr_new = np.where(has_nr, idm_accel(nr_v, nr_v0, nr_gap, self.v, idm), 0.0)
        a_nr_old = np.where(has_nr, idm_accel(nr_v, nr_v0, nr_gap + nf_gap + veh.length, nf_v, idm), 0.0)
        a_or_old = np.where(has_or, idm_accel(or_v, or_v0, or_gap, self.v, idm), 0.0)
        a_or_new = np.where(has_or, idm_accel(or_v, or_v0, or_gap + of_gap + veh.length, of_v, idm), 0.0)
        incentive = a_self_new - a_current + self.politeness * (a_nr_new - a_nr_old + a_or_new - a_or_old)
        b_safe = np.where(nr_idx == EGO, p.b_safe_ego, p.b_safe)
        safe = (a_nr_new >= -b_safe) & (nf_gap > p.min_gap) & (nr_gap > p.min_gap)
        go = eligible & safe & (incentive > p.threshold)
        if go.any():
            self._start_lane_change(go, safe_lane)

    # ---- stepping ---------------------------------------------------------------------------
    def _traffic_idm(self) -> tuple[FloatArray, IdmParams | TrafficDrivers]:
        """Each car's desired speed now and its IDM parameters."""
        if self.drivers is None:
            return self.v0, self.idm
        return self.drivers.desired_speed(self.v0, self.t), self.drivers

    def step(self, accel_cmd: npt.ArrayLike, steer_cmd: npt.ArrayLike) -> None:
        """Advance every episode by dt with the ego commands (B,) or scalars (broadcast)."""
        dt, veh = self.dt, self.vehicle
        if self.step_index % self.neighbour_refresh_steps == 0:
            self._refresh_leaders()
        gap, lead_v = self.leader_gap()
        v0, idm = self._traffic_idm()
        a = idm_accel(self.v, v0, gap, lead_v, idm)
        if self.followers is not None:
            f0 = self._f0
            if self.step_index % self._f_every == 0:
                self._follower_a = self._followers_accel(v0)
            a[:, f0:] = self._follower_a
        if self._has_overrides:
            sc = self.script
            assert sc is not None  # __post_init__ fills it
            active = (self.t >= sc.accel_start) & (self.t < sc.accel_end)
            a = np.where(active, sc.accel_value, a)
        if self.driven.any():
            a = self._driven_accel(a)
        if self.t >= self._next_forced:
            self._forced_lane_changes()
        if self.step_index % self._mobil_every == self._mobil_every - 1:
            self._mobil(a)
        d_before = self.d.copy()
        if self.changing.any():
            tau = np.clip((self.t - self.lc_start) / self.mobil.duration_s, 0.0, 1.0)
            blend = 0.5 - 0.5 * np.cos(np.pi * tau)
            target_d = self.lane_target * self.road.lane_width
            self.d = np.where(self.changing, self.lc_from + (target_d - self.lc_from) * blend, self.d)
            self.changing &= tau < 1.0

        # Ego: commands -> actuator (friction, lag) -> kinematic bicycle in the Frenet frame.
        cmd_a = np.maximum(np.minimum(accel_cmd, ACCEL_MAX), ACCEL_MIN)
        cmd_d = np.maximum(np.minimum(steer_cmd, STEER_MAX), STEER_MIN)
        if self.t >= self._friction_onset:
            fr = self.friction
            assert fr is not None  # __post_init__ fills it
            slippery = self.t >= fr.onset_s
            reduced = np.maximum(np.where(cmd_a < 0.0, cmd_a * fr.brake_gain, cmd_a * fr.drive_gain), -fr.max_decel)
            cmd_a = np.where(slippery, reduced, cmd_a)
        ego_a = self.a[:, EGO] + (cmd_a - self.a[:, EGO]) * (dt / veh.tau_accel)
        self.ego_delta = self.ego_delta + (cmd_d - self.ego_delta) * (dt / veh.tau_steer)
        tan_delta = np.tan(self.ego_delta)
        beta = np.arctan(veh.rear_to_cg / veh.wheelbase * tan_delta)
        ego_v, ego_s, ego_d = self.v[:, EGO], self.s[:, EGO], self.d[:, EGO]
        yaw_rate = ego_v * np.cos(beta) * tan_delta / veh.wheelbase
        kappa = self.road.curvature(ego_s)
        heading = self.ego_psi + beta
        s_dot = ego_v * np.cos(heading) / (1.0 - kappa * ego_d)
        d_dot = ego_v * np.sin(heading)
        self.ego_psi = self.ego_psi + (yaw_rate - kappa * s_dot) * dt
        new_ego_v = np.maximum(ego_v + ego_a * dt, 0.0)
        # A car held at standstill by its brakes does not keep decelerating.
        ego_a = np.where(new_ego_v <= 0.0, np.maximum(ego_a, 0.0), ego_a)
        self.ego_yaw_rate, self.ego_curvature = yaw_rate, kappa

        # Traffic: semi-implicit Euler along the road; then overwrite the ego column.
        self.v = np.maximum(self.v + a * dt, 0.0)
        self.s = self.s + self.v * dt
        self.a = a
        self.a[:, EGO] = ego_a
        self.v[:, EGO] = new_ego_v
        self.s[:, EGO] = ego_s + s_dot * dt
        self.d[:, EGO] = ego_d + d_dot * dt
        self.d_dot = (self.d - d_before) * (1.0 / dt)

        self._check_collisions()
        self.step_index += 1
        self.t = self.step_index * dt  # no accumulated float drift over long episodes

    def _driven_accel(self, a: FloatArray) -> FloatArray:
        """The driven cars' accelerations this step: their command through the actuator lag, from the
        acceleration they had (a car held at standstill by its brakes does not keep decelerating)."""
        lagged = self.a + (self._driven_cmd - self.a) * (self.dt / self.vehicle.tau_accel)
        lagged = np.where(self.v + lagged * self.dt <= 0.0, np.maximum(lagged, 0.0), lagged)
        return np.where(self.driven, lagged, a)

    def _check_collisions(self) -> None:
        veh, road = self.vehicle, self.road
        ds = self.s[:, 1:] - self.s[:, :1]
        dd = self.d[:, 1:] - self.d[:, :1]
        overlap = (np.abs(ds) < veh.length) & (np.abs(dd) < veh.width)
        hit = overlap.any(axis=1)
        # A rear-end: a car whose centre is behind the ego's runs into it, closing at the first touch
        # (the ego moving sideways into a slower car behind it is not one).
        if hit.any() or self._in_rear_end.any():  # rare: most steps touch nothing
            behind = overlap & (ds < 0.0)
            touched = behind.any(axis=1)
            closing = (behind & (self.v[:, 1:] > self.v[:, :1])).any(axis=1)
            self.rear_end_count += touched & ~self._in_rear_end & closing
            self._in_rear_end = np.asarray(touched, dtype=bool)
        ego_d = self.d[:, EGO]
        # Off road once the ego's centre leaves the paved width (|d - middle| > half the width).
        off = np.abs(ego_d - self._road_middle) > self._road_half_width
        if road.has_lane_ends:
            lane = road.lane_of(ego_d)
            end = road.lane_end_s[np.arange(self.batch), lane]
            off |= self.s[:, EGO] > end
        self.off_road |= off
        now = hit | off
        self.collision_count += now & ~self.in_collision
        self.in_collision = now
        self.crashed |= now

    # ---- ego-centred queries used by sensors and the expert -----------------------------------
    def ego_lane(self) -> IntArray:
        return self.road.lane_of(self.d[:, EGO])

    def ego_neighbours(
        self, lanes: IntArray, include_intent: bool = False
    ) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Nearest vehicle ahead and behind the ego in each requested lane.

        lanes: (B, K) lane indices (may be off the road: then nothing is found). Returns front_gap,
        front_v, rear_gap, rear_v, each (B, K); gaps are bumper-to-bumper, inf when none. A car
        alongside (overlapping in s) counts as in front with a gap <= 0.
        """
        occ = np.abs(self.d[:, None, 1:] - lanes[:, :, None] * self.road.lane_width) < self._occ_threshold
        if include_intent:  # ground truth only the expert has: where a car is about to go
            occ |= self.lane_target[:, None, 1:] == lanes[:, :, None]
        ds = (self.s[:, 1:] - self.s[:, :1])[:, None, :]
        front = np.where(occ & (ds >= 0.0), ds, np.inf)
        rear = np.where(occ & (ds < 0.0), -ds, np.inf)
        fi = np.argmin(front, axis=2)
        ri = np.argmin(rear, axis=2)
        rows = np.arange(self.batch)[:, None]
        v = self.v[:, 1:]
        length = self.vehicle.length
        front_gap = front[rows, np.arange(lanes.shape[1])[None, :], fi] - length
        rear_gap = rear[rows, np.arange(lanes.shape[1])[None, :], ri] - length
        return front_gap, v[rows, fi], rear_gap, v[rows, ri]

    def ego_threat(self, margin_m: float = 2.0) -> tuple[FloatArray, FloatArray]:
        """Ground truth of what lies ahead of the ego: (required deceleration m/s^2, TTC s), (B,) each.

        Over every car ahead that shares a lane with the ego's body, its own lane or the one it is
        moving into (a cut-in counts from its start), and the end of a lane the ego is in (a parked
        car): the smallest constant deceleration that keeps `margin_m` of bumper gap, the largest of
        (closing speed)^2 / (2 (gap - margin)) for a car holding its speed and, for a car braking
        harder than 0.5 m/s^2, v_ego^2 / (2 (gap - margin + its stopping distance)); and the least
        time to collision at the current closing speeds (inf if nothing closes).
        """
        veh = self.vehicle
        body = np.abs(self.d[:, EGO, None] - self._lane_centres) < self._occ_threshold  # (B, L)
        shared = (self.occupancy()[:, 1:, :] & body[:, None, :]).any(axis=2)  # (B, M-1)
        ds = self.s[:, 1:] - self.s[:, :1]
        ahead = shared & (ds > 0.0)
        gap = ds - veh.length
        v_e, v_l, a_l = self.v[:, :1], self.v[:, 1:], self.a[:, 1:]
        closing = v_e - v_l
        room = np.maximum(gap - margin_m, 0.01)
        hold = np.where(closing > 0.0, closing * closing / (2.0 * room), 0.0)
        stop_l = v_l * v_l / (2.0 * np.maximum(-a_l, 0.5))
        stop = np.where(a_l < -0.5, v_e * v_e / (2.0 * np.maximum(gap - margin_m + stop_l, 0.01)), 0.0)
        need = np.where(ahead, np.maximum(hold, stop), 0.0).max(axis=1, initial=0.0)
        ttc = np.where(ahead & (closing > 0.0), np.maximum(gap, 0.0) / np.maximum(closing, 1e-9), np.inf)
        ttc = ttc.min(axis=1, initial=np.inf)
        if self.road.has_lane_ends:
            ego_s, ego_v = self.s[:, EGO], self.v[:, EGO]
            end_gap = self.road.lane_end_s - ego_s[:, None] - 0.5 * veh.length  # (B, L)
            end_need = ego_v[:, None] ** 2 / (2.0 * np.maximum(end_gap - margin_m, 0.01))
            need = np.maximum(need, np.where(body, end_need, 0.0).max(axis=1))
            end_ttc = np.where(body & (ego_v[:, None] > 0.0), end_gap / np.maximum(ego_v[:, None], 1e-9), np.inf)
            ttc = np.minimum(ttc, end_ttc.min(axis=1))
        return need, ttc

    def ego_rear(self) -> tuple[FloatArray, FloatArray]:
        """Ground truth of the car behind the ego in its lane: (bumper gap, closing speed), (B,) each;
        inf gap and 0 closing when there is none. Cheaper than ego_neighbours for this one question."""
        centre = self.road.lane_centre(self.ego_lane())
        behind = self.s[:, :1] - self.s[:, 1:]
        behind = np.where(
            (np.abs(self.d[:, 1:] - centre[:, None]) < self._occ_threshold) & (behind > 0.0), behind, np.inf
        )
        j = np.argmin(behind, axis=1)
        rows = np.arange(self.batch)
        gap = behind[rows, j]
        found = np.isfinite(gap)
        closing = np.where(found, self.v[rows, j + 1] - self.v[:, EGO], 0.0)
        return np.where(found, gap - self.vehicle.length, np.inf), closing
