"""Expert driver with ground-truth access: the teacher for training data and the built-in planner.

Two rates, like the product: plan() runs every 200 ms (lane-change decision, behaviour, target
speed), act() runs every 5 ms step (IDM-style longitudinal control with emergency braking, pure
pursuit on a smooth lane-change reference). Everything is vectorised over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sim.schema import ACCEL_MAX, ACCEL_MIN, BEHAVIOURS, STEER_MAX, STEER_MIN, label_from_accel, make_plan
from sim.world import EGO, World

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


def expert_idm(
    v: FloatArray, v0: FloatArray, gap: FloatArray, v_lead: FloatArray, p: ExpertParams,
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

    def __init__(self, world: World, cruise_speed: FloatArray, params: ExpertParams | None = None) -> None:
        self.world = world
        self.p = params or ExpertParams()
        b = world.batch
        self.cruise = np.broadcast_to(np.asarray(cruise_speed, dtype=np.float64), (b,)).copy()
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
        v, s, d = w.v[:, EGO], w.s[:, EGO], w.d[:, EGO]
        width = w.road.lane_width

        done = self.changing & (t - self.lc_start >= p.lane_change_s) & (
            np.abs(d - self.target_lane * width) < 0.3
        )
        self.changing &= ~done
        self.last_change_end = np.where(done, t, self.last_change_end)

        lanes = np.stack([lane, lane + 1, lane - 1], axis=1)
        fg, fv, rg, rv = self._front(lanes)
        own_end = self._lane_end_gap(lane[:, None])[:, 0]
        must_merge = own_end < p.merge_horizon_m
        a_cur = expert_idm(v, self.cruise, fg[:, 0], fv[:, 0], p)

        best_gain = np.full(b, -np.inf)
        best_dir = np.zeros(b, dtype=np.int64)
        for k, direction in ((1, 1), (2, -1)):
            exists = w.road.lane_exists(lane + direction, s) & (
                self._lane_end_gap((lane + direction)[:, None])[:, 0] > p.merge_horizon_m
            )
            has_rear = np.isfinite(rg[:, k])
            a_new = expert_idm(v, self.cruise, fg[:, k], fv[:, k], p)
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

        # Not from a standstill: behind a stopped car the own lane's leader holds the expert at 0 m/s,
        # and pure pursuit at 0 m/s steered at full lock for the rest of the drive (14 of 24
        # stopped_vehicle_ahead episodes, a quarter of their samples, labelled with full-lock steering).
        can_start = (~self.changing & (t - self.last_change_end >= p.cooldown_s) & (t >= 1.0)
                     & (v >= p.min_change_speed))
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
        direction = self.target_lane - lane
        # Once across the lane boundary the plan says "keep" (offset 0) while the manoeuvre settles on
        # the new lane's centre, as the behaviour planner's plans do: a plan that kept the change's
        # behaviour there taught the executor a "finish the change" it then missed with a planner.
        self.behaviour = np.where(
            stop, STOP, np.where(direction > 0, LEFT, np.where(direction < 0, RIGHT, KEEP))
        )
        self.target_speed = np.where(stop, 0.0, self.cruise)
        self.plan_vector = make_plan(self.target_speed, direction * width, self.behaviour)
        return self.plan_vector

    # ---- 5 ms: controls ---------------------------------------------------------------------
    def act(self) -> tuple[FloatArray, FloatArray]:
        """Controls (accel m/s^2, steer rad), each (B,), for the current state."""
        w, p = self.world, self.p
        t = w.t
        lane = w.ego_lane()
        v, d, psi = w.v[:, EGO], w.d[:, EGO], w.ego_psi
        width = w.road.lane_width
        lanes = np.stack([lane, self.target_lane], axis=1)
        fg, fv, _, _ = self._front(lanes)
        accel = np.minimum(
            expert_idm(v, self.cruise, fg[:, 0], fv[:, 0], p),
            expert_idm(v, self.cruise, fg[:, 1], fv[:, 1], p),
        )
        # Merge preparation: slot in behind the nearest car of the lane we must merge into.
        own_end = self._lane_end_gap(lane[:, None])[:, 0]
        merging = (own_end < p.merge_horizon_m) & ~self.changing
        if merging.any():
            adj_lane = np.clip(lane + 1, 0, w.road.n_lanes - 1)[:, None]
            ag, av, _, _ = self._front(adj_lane)
            a_merge = expert_idm(v, self.cruise, ag[:, 0], av[:, 0], p, time_gap=p.merge_time_gap)
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
