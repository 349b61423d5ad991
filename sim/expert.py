"""Expert driver with ground-truth access: the teacher for training data and the built-in planner.

Two rates, like the product: plan() runs every 200 ms (lane-change decision, behaviour, target
speed), act() runs every 5 ms step (IDM-style longitudinal control with emergency braking, pure
pursuit on a smooth lane-change reference). Everything is vectorised over the batch.

The target speed it follows (and states in its plan) is the drive's cruise speed, or with
TargetSteps one that changes within the drive: with the traffic, as the behaviour planner's does, or
at random times among lower speeds. The executor learns from those drives to follow a plan's target
wherever it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.sim.schema import ACCEL_MAX, ACCEL_MIN, BEHAVIOURS, STEER_MAX, STEER_MIN, label_from_accel, make_plan
from dualloop.sim.world import EGO, World

FloatArray = npt.NDArray[np.float64]

KEEP, LEFT, RIGHT, STOP = (BEHAVIOURS.index(b) for b in ("keep", "change_left", "change_right", "stop"))


@dataclass(frozen=True)
class ExpertParams:
    time_gap: float = 1.6
    min_gap: float = 3.0
    a_max: float = 1.5
    b_comf: float = 2.5
    emergency_ttc_s: float = 3.0
    plan_period_s: float = 0.2
    lane_change_s: float = 4.0
    min_change_speed: float = 3.0  # m/s: no lane change is started slower than this
    cooldown_s: float = 4.0
    politeness: float = 0.2
    threshold: float = 0.4
    b_safe: float = 1.5
    b_safe_mandatory: float = 3.0
    merge_horizon_m: float = 300.0  # start the mandatory merge when the own lane ends this close
    merge_time_gap: float = 0.8  # accepted headway behind the car we merge behind
    lookahead_s: float = 0.9
    min_lookahead_m: float = 6.0


@dataclass(frozen=True)
class DriverStyle:
    """The expert's car-following style per episode (B,), in place of ExpertParams' time_gap,
    min_gap, a_max and b_comf: a population of drivers for the training drives (sim.realism)."""

    time_gap: FloatArray
    min_gap: FloatArray
    a_max: FloatArray
    b_comf: FloatArray


@dataclass(frozen=True)
class TargetSchedule:
    """What TargetSteps drew for a batch: segment k of episode b runs from starts[b, k] (starts[b, 0]
    is 0, unused slots are +inf) at speeds[b, k]; where follow[b], the target follows the traffic."""

    starts: FloatArray  # (B, K)
    speeds: FloatArray  # (B, K)
    follow: npt.NDArray[np.bool_]  # (B,)
    steps: TargetSteps


@dataclass(frozen=True)
class TargetSteps:
    """How a drive's target speed changes, drawn per episode from the episode's seed (so an episode
    does not depend on its batch). Three kinds of drive:

    - follow (share `follow`): the target says what the lane allows, as the behaviour planner's does
      (planner.behaviour): the speed of a slower leader within reach in the lane the expert is in or
      moving to, rounded up to a step of 0.1 x the cruise speed (never below low_fraction x it), the
      cruise speed with the lane free or its leader pulling away;
    - random steps (share `share`): segments of dwell_s (uniform), each at the cruise speed with
      probability at_cruise, else uniform in [max(lowest, low_fraction * cruise), cruise], so the
      executor also sees targets that have nothing to do with the traffic (a planner slowing down
      beside a car that may cut in);
    - the others keep their cruise speed throughout.

    Why steps: an executor trained on one target per drive steers off its lane centre on any other.
    Why not all at random: the gates are fitted on the same roll-outs, and must still see drives at
    cruise speed past stopped cars and in traffic (docs/design-notes/sim.md).
    """

    follow: float = 0.5
    share: float = 0.3
    dwell_s: tuple[float, float] = (3.0, 8.0)
    at_cruise: float = 0.4
    low_fraction: float = 0.3
    lowest: float = 5.0
    step_fraction: float = 0.1  # the follow targets' rounding, as the planner's ladder
    reach_s: float = 5.0  # a leader closer than this many seconds at the ego's speed (or reach_m) limits
    reach_m: float = 50.0
    # A leader faster than the ego by this many m/s, and by this fraction of the ego's speed, is
    # pulling away (starting off after a stop) and does not limit, as in the planner.
    pull_away: float = 1.0
    pull_away_fraction: float = 0.3
    hysteresis_mps: float = 1.0
    seed: int = 0

    def sample(self, seeds: Sequence[int], cruise: npt.ArrayLike, duration_s: float) -> TargetSchedule:
        cruise = np.broadcast_to(np.asarray(cruise, dtype=np.float64), (len(seeds),))
        rows: list[tuple[list[float], list[float]]] = []
        follow = np.zeros(len(seeds), dtype=bool)
        for b, (seed, top) in enumerate(zip(seeds, cruise)):
            rng = np.random.default_rng([int(seed), self.seed, 0x7A6E7])
            low = min(max(self.lowest, self.low_fraction * top), top)
            kind = rng.random()
            follow[b] = kind < self.follow
            if follow[b] or kind >= self.follow + self.share:  # no random steps
                rows.append(([0.0], [float(top)]))
                continue
            starts, speeds, t = [], [], 0.0
            while t < duration_s:
                starts.append(t)
                speeds.append(float(top) if rng.random() < self.at_cruise else float(rng.uniform(low, top)))
                t += float(rng.uniform(*self.dwell_s))
            rows.append((starts, speeds))
        k = max(len(st) for st, _ in rows)
        starts_arr = np.full((len(seeds), k), np.inf)
        speeds_arr = np.repeat(cruise[:, None], k, axis=1).astype(np.float64)
        for b, (st, sp) in enumerate(rows):
            starts_arr[b, : len(st)], speeds_arr[b, : len(sp)] = st, sp
        return TargetSchedule(starts_arr, speeds_arr, follow, self)

    def allowed(
        self, cruise: FloatArray, v: FloatArray, gap: FloatArray, v_lead: FloatArray, current: FloatArray
    ) -> FloatArray:
        """The follow target: what the lane allows, on the planner's ladder. A stationary obstacle is
        not traffic to follow (it is a stop or a lane to leave). The current target stays while it is
        still the allowed speed rounded up, give or take hysteresis_mps: a leader's speed hovering at a
        step would otherwise flip the target every 200 ms."""
        reach = np.maximum(self.reach_m, self.reach_s * v)
        near = gap < np.where(current < cruise - 1e-6, 1.3 * reach, reach)  # hysteresis, as below
        pulling_away = v_lead - v > np.maximum(self.pull_away, self.pull_away_fraction * v)
        limited = near & (v_lead < cruise) & (v_lead > 0.5) & ~pulling_away
        limit = np.where(limited, v_lead, cruise)
        step = self.step_fraction * cruise
        low = self.low_fraction * cruise
        up = np.clip(np.ceil(limit / step - 1e-9) * step, low, cruise)
        keep = (current >= np.minimum(limit, up) - 1e-9) & (current <= up + self.hysteresis_mps) & (current >= low)
        return np.where(keep & (current <= cruise), current, up)

    def alternatives(self, seeds: Sequence[int], cruise: npt.ArrayLike, n: int) -> FloatArray:
        """(B, n) other target speeds from the same distribution, one per recorded step of each
        episode (its own stream of the episode's seed): the plan a planner might have switched to."""
        cruise = np.broadcast_to(np.asarray(cruise, dtype=np.float64), (len(seeds),))
        out = np.empty((len(seeds), n))
        for b, (seed, top) in enumerate(zip(seeds, cruise)):
            rng = np.random.default_rng([int(seed), self.seed, 0xA17])
            low = min(max(self.lowest, self.low_fraction * top), top)
            out[b] = np.where(rng.random(n) < self.at_cruise, top, rng.uniform(low, top, n))
        return out


def expert_idm(
    v: FloatArray,
    v0: FloatArray,
    gap: FloatArray,
    v_lead: FloatArray,
    p: ExpertParams | DriverStyle,
    time_gap: float | None = None,
) -> FloatArray:
    """IDM whose free-road term never brakes harder than b_comf (smooth when far above v0)."""
    tg = p.time_gap if time_gap is None else time_gap
    dv = v - v_lead
    s_star = p.min_gap + np.maximum(0.0, v * tg + v * dv / (2.0 * np.sqrt(p.a_max * p.b_comf)))
    x = v / np.maximum(v0, 0.1)
    free = np.maximum(p.a_max * (1.0 - x**4), -p.b_comf)
    inter = s_star / np.maximum(gap, 0.1)
    return free - p.a_max * inter * inter


class Expert:
    """Drives every episode of a World from ground truth; holds its current plan."""

    def __init__(
        self,
        world: World,
        cruise_speed: FloatArray,
        params: ExpertParams | None = None,
        schedule: TargetSchedule | None = None,
        style: DriverStyle | None = None,
    ) -> None:
        """schedule: from TargetSteps.sample; None: the cruise speed throughout. style: how this
        episode's driver follows (None: ExpertParams')."""
        self.world = world
        self.p = params or ExpertParams()
        self.style: ExpertParams | DriverStyle = self.p if style is None else style
        b = world.batch
        self.cruise = np.broadcast_to(np.asarray(cruise_speed, dtype=np.float64), (b,)).copy()
        self.schedule = schedule
        self.desired = self.cruise.copy()  # the speed it drives towards: the cruise or the schedule's
        self.target_lane = world.ego_lane().copy()
        self.lc_from = world.d[:, EGO].copy()
        self.lc_start = np.full(b, -np.inf)
        self.changing = np.zeros(b, dtype=bool)
        self.last_change_end = np.full(b, -np.inf)
        self.behaviour = np.full(b, KEEP, dtype=np.int64)
        self.target_speed = self.cruise.copy()
        self.plan_vector = make_plan(self.cruise, 0.0, self.behaviour)
        self.plan()

    # ---- ground truth helpers ---------------------------------------------------------------
    def _lane_end_gap(self, lanes: npt.NDArray[np.int64]) -> FloatArray:
        w = self.world
        safe = np.clip(lanes, 0, w.road.n_lanes - 1)
        end = w.road.lane_end_s[np.arange(w.batch)[:, None], safe]
        return end - w.s[:, EGO, None] - 0.5 * w.vehicle.length

    def _front(self, lanes: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray]:
        """Front/rear gaps and speeds per lane (B, K); lane ends act as parked cars in front."""
        fg, fv, rg, rv = self.world.ego_neighbours(lanes, include_intent=True)
        end_gap = self._lane_end_gap(lanes)
        closer = end_gap < fg
        return np.where(closer, end_gap, fg), np.where(closer, 0.0, fv), rg, rv

    # ---- 200 ms: decisions ------------------------------------------------------------------
    def plan(self) -> npt.NDArray[np.float32]:
        w, p = self.world, self.p
        b, t = w.batch, w.t
        lane = w.ego_lane()
        v, d = w.v[:, EGO], w.d[:, EGO]
        width = w.road.lane_width
        if self.schedule is not None:
            k = (self.schedule.starts <= t + 1e-9).sum(axis=1) - 1
            self.desired = self.schedule.speeds[np.arange(b), np.maximum(k, 0)]

        done = self.changing & (t - self.lc_start >= p.lane_change_s) & (np.abs(d - self.target_lane * width) < 0.3)
        self.changing &= ~done
        self.last_change_end = np.where(done, t, self.last_change_end)

        lanes = np.stack([lane, lane + 1, lane - 1], axis=1)
        fg, fv, rg, rv = self._front(lanes)
        own_end = self._lane_end_gap(lane[:, None])[:, 0]
        must_merge = own_end < p.merge_horizon_m
        # Lane-change gains are judged at the cruise speed whatever the target: the expert changes
        # lanes as often with a low target as with the cruise, so the data has every target during
        # lane changes too.
        a_cur = expert_idm(v, self.cruise, fg[:, 0], fv[:, 0], self.style)

        best_dir = self._best_change(lane, must_merge, (fg, fv, rg, rv), a_cur)

        # Not from a standstill: pure pursuit at 0 m/s steers at full lock, and those labels would teach
        # the model to (docs/design-notes/sim.md).
        can_start = ~self.changing & (t - self.last_change_end >= p.cooldown_s) & (t >= 1.0) & (v >= p.min_change_speed)
        start = can_start & (best_dir != 0)
        self.target_lane = np.where(start, lane + best_dir, np.where(self.changing, self.target_lane, lane))
        self.lc_from = np.where(start, d, self.lc_from)
        self.lc_start = np.where(start, t, self.lc_start)
        self.changing |= start

        # Stop when a stopped obstacle is close in the lane we will stay in and we are not leaving.
        tgt_idx = np.where(self.target_lane > lane, 1, np.where(self.target_lane < lane, 2, 0))
        rows = np.arange(b)
        obstacle_stopped = (fv[rows, tgt_idx] < 0.5) & (fg[rows, tgt_idx] < 80.0)
        stop = ~self.changing & obstacle_stopped
        change_dir = self.target_lane - lane
        # Once across the lane boundary the plan says "keep" (offset 0) while the manoeuvre settles on
        # the new lane's centre, as the behaviour planner's plans do: a plan that kept the change's
        # behaviour there taught the executor a "finish the change" it then missed with a planner.
        self.behaviour = np.where(stop, STOP, np.where(change_dir > 0, LEFT, np.where(change_dir < 0, RIGHT, KEEP)))
        if self.schedule is not None:
            # A random target does not hold on a lane that ends: alongside the slow lane at its speed
            # the expert found no gap and stopped at the end of the ramp (slow_merge, 1 in 24 drives).
            self.desired = np.where(must_merge & ~self.schedule.follow, self.cruise, self.desired)
        if self.schedule is not None and self.schedule.follow.any():
            # the lane it is in or moving to; on a lane that ends, the one it has to merge into
            limiting = np.where(must_merge & (tgt_idx == 0), 1, tgt_idx)
            allowed = self.schedule.steps.allowed(self.cruise, v, fg[rows, limiting], fv[rows, limiting], self.desired)
            self.desired = np.where(self.schedule.follow, allowed, self.desired)
        self.target_speed = np.where(stop, 0.0, self.desired)
        self.plan_vector = make_plan(self.target_speed, change_dir * width, self.behaviour)
        return self.plan_vector

    def _best_change(
        self,
        lane: npt.NDArray[np.int64],
        must_merge: npt.NDArray[np.bool_],
        neighbours: tuple[FloatArray, FloatArray, FloatArray, FloatArray],
        a_cur: FloatArray,
    ) -> npt.NDArray[np.int64]:
        """Per car, the lane change (+1 left, -1 right, 0 none) with the best MOBIL gain that is safe:
        `neighbours` are the front gap and speed and the rear gap and speed in the own, left and right
        lanes (`_front`), `a_cur` the acceleration staying put."""
        w, p, b = self.world, self.p, self.world.batch
        v = w.v[:, EGO]
        fg, fv, rg, rv = neighbours
        best_gain = np.full(b, -np.inf)
        best_dir = np.zeros(b, dtype=np.int64)
        for k, direction in ((1, 1), (2, -1)):
            exists = w.road.lane_exists(lane + direction, w.s[:, EGO]) & (
                self._lane_end_gap((lane + direction)[:, None])[:, 0] > p.merge_horizon_m
            )
            has_rear = np.isfinite(rg[:, k])
            a_new = expert_idm(v, self.cruise, fg[:, k], fv[:, k], self.style)
            # The follower is judged with its own speed as desired speed: we only ask "how hard
            # would it have to brake", not what it wants.
            a_f_new = np.where(has_rear, expert_idm(rv[:, k], rv[:, k] + 1.0, rg[:, k], v, p), 0.0)
            a_f_old = np.where(
                has_rear,
                expert_idm(rv[:, k], rv[:, k] + 1.0, rg[:, k] + fg[:, k] + w.vehicle.length, fv[:, k], p),
                0.0,
            )
            b_safe = np.where(must_merge, p.b_safe_mandatory, p.b_safe)
            closing_rear = np.maximum(rv[:, k] - v, 0.0)
            safe = (
                exists
                & (fg[:, k] > np.maximum(p.min_gap + 2.0, 0.3 * v))
                & (rg[:, k] > np.maximum(5.0, 3.0 * closing_rear))
                & (a_f_new >= -b_safe)
                & (a_new >= np.where(must_merge, -3.0, -1.0))
            )
            gain = a_new - a_cur + p.politeness * (a_f_new - a_f_old)
            gain = np.where(must_merge, gain + 10.0, gain)
            ok = safe & (gain > p.threshold) & (gain > best_gain)
            best_gain = np.where(ok, gain, best_gain)
            best_dir = np.where(ok, direction, best_dir)

        return best_dir

    # ---- 5 ms: controls ---------------------------------------------------------------------
    def act(self, desired: FloatArray | None = None) -> tuple[FloatArray, FloatArray]:
        """Controls (accel m/s^2, steer rad), each (B,), for the current state; with `desired`, what
        they would be with that target speed instead of the current one (the steering is the same)."""
        w, p = self.world, self.p
        desired = self.desired if desired is None else desired
        t = w.t
        lane = w.ego_lane()
        v, d, psi = w.v[:, EGO], w.d[:, EGO], w.ego_psi
        width = w.road.lane_width
        lanes = np.stack([lane, self.target_lane], axis=1)
        fg, fv, _, _ = self._front(lanes)
        accel = np.minimum(
            expert_idm(v, desired, fg[:, 0], fv[:, 0], self.style),
            expert_idm(v, desired, fg[:, 1], fv[:, 1], self.style),
        )
        # Merge preparation: slot in behind the nearest car of the lane we must merge into.
        own_end = self._lane_end_gap(lane[:, None])[:, 0]
        merging = (own_end < p.merge_horizon_m) & ~self.changing
        if merging.any():
            adj_lane = np.clip(lane + 1, 0, w.road.n_lanes - 1)[:, None]
            ag, av, _, _ = self._front(adj_lane)
            a_merge = expert_idm(v, desired, ag[:, 0], av[:, 0], self.style, time_gap=p.merge_time_gap)
            accel = np.where(merging, np.minimum(accel, a_merge), accel)

        # Emergency: brake for the deceleration that cancels the closing speed before contact.
        gap = np.minimum(fg[:, 0], fg[:, 1])
        lead_v = np.where(fg[:, 0] <= fg[:, 1], fv[:, 0], fv[:, 1])
        closing = v - lead_v
        ttc = np.where(closing > 0.0, gap / np.maximum(closing, 1e-6), np.inf)
        needed = -(closing**2) / (2.0 * np.maximum(gap - 1.0, 0.2)) * 1.3
        emergency = (ttc < p.emergency_ttc_s) & (closing > 0.0)
        accel = np.where(emergency, np.minimum(accel, needed), accel)
        accel = np.clip(accel, ACCEL_MIN, ACCEL_MAX)

        # Lateral: pure pursuit towards a cosine lane-change reference, seen lookahead ahead.
        v_safe = np.maximum(v, 1.0)
        ld = np.maximum(p.min_lookahead_m, v * p.lookahead_s)
        tau = np.clip((t + ld / v_safe - self.lc_start) / p.lane_change_s, 0.0, 1.0)
        target_d = self.target_lane * width
        blend = 0.5 - 0.5 * np.cos(np.pi * tau)
        d_ref = np.where(self.changing, self.lc_from + (target_d - self.lc_from) * blend, target_d)
        kappa = w.road.curvature(w.s[:, EGO] + 0.5 * ld)
        alpha = np.arctan2(d_ref - d + 0.5 * kappa * ld * ld, ld) - psi
        steer = np.arctan(2.0 * w.vehicle.wheelbase * np.sin(alpha) / ld)
        steer = np.clip(steer, STEER_MIN, STEER_MAX)
        return accel, steer

    @staticmethod
    def label(accel: FloatArray) -> npt.NDArray[np.int64]:
        return label_from_accel(accel)
