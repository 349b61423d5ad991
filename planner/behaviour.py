"""The built-in behaviour planner: score candidate manoeuvres over a 6 s look-ahead, pick the cheapest.

Unlike the 5 ms executor, which reacts to the present, this looks ahead: for every candidate
(lane in {keep, left, right} x a ladder of target speeds) it rolls the ego forward with an IDM-like
longitudinal model behind the predicted leader(s) of the lane it will be in, against traffic
predicted at constant velocity from the observation features, and adds up costs for collision risk,
progress, comfort and rules of the road.

plan_many() plans a batch of sessions at once: every candidate of every session is one column of
the same arrays (shape (steps, candidates of all sessions)), so the Python loop runs over the 60
time steps once per batch, not once per session. Each numpy call costs about a microsecond
whatever its length here, so 32 sessions cost little more than one. plan() is a batch of one, and
every column is computed with the same elementwise operations whatever batch it is in, so a
session's plan does not depend on which other sessions were planned with it.

It sees only what a server sees (one feature vector per session), so everything it knows about the
neighbouring lanes comes from the front/rear gap and relative-speed features. Where those say more
than 6 s of rollout can, it looks further: a lane with a stationary obstacle still ahead at the end
of the horizon (a stopped car, or the end of an on-ramp, which the sensors report as one) is a dead
end to leave through the first safe gap, and a slower car close ahead in the next lane is one that
may cut in, to be passed without speeding up. Its target speeds are a ladder of fractions of the
cruise speed (BehaviourParams.speed_steps): the executor was trained on targets that step within a
drive over that range (sim.expert.TargetSteps).
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from dualloop.planner import compiled
from dualloop.planner.plan import Plan, PlanRequest, make_plan_id
from dualloop.sim.schema import FEATURE_INDEX, SENSOR_RANGE_M

FloatArray = npt.NDArray[np.float64]

# Candidate lanes, indices into the per-lane traffic arrays below; their behaviour names.
KEEP_LANE, LEFT_LANE, RIGHT_LANE = 0, 1, 2
LANE_BEHAVIOUR: tuple[str, str, str] = ("keep", "change_left", "change_right")
LANE_SIGN: npt.NDArray[np.float64] = np.array([0.0, 1.0, -1.0])  # target lane offset / lane width

_F = FEATURE_INDEX
_FRONT_GAP = np.array([_F["lead_distance"], _F["left_front_gap"], _F["right_front_gap"]])
_FRONT_REL = np.array([_F["lead_rel_speed"], _F["left_front_rel_speed"], _F["right_front_rel_speed"]])
_REAR_GAP = np.array([_F["left_rear_gap"], _F["right_rear_gap"]])  # no rear sensor in the ego lane
_REAR_REL = np.array([_F["left_rear_rel_speed"], _F["right_rear_rel_speed"]])

# A gap this close to the sensor range means "nothing there" (the sensor caps gaps, then adds noise).
_NOTHING_THERE_M = SENSOR_RANGE_M - 3.0
_FAR_M = 1.0e4  # where an absent vehicle is put, so that it never interacts
_STOP = -1.0  # the ladder position of the "come to a stop" candidate (target speed 0)


# Each comment below says why a parameter is what it is; the closed-loop runs that set the values
# (scenarios, seeds, vetoed ticks) are recorded in docs/design-notes/planner.md.
@dataclass(frozen=True)
class BehaviourParams:
    cruise_speed: float = 25.0  # desired speed on a straight free road, m/s
    max_lateral_accel: float = 2.0  # caps the cruise speed in curves: v <= sqrt(a_lat / |curvature|)
    lane_width: float = 3.5
    horizon_s: float = 6.0
    step_s: float = 0.1
    # Target speeds: 0 (come to a stop) and these fractions of the cruise speed, so that the target
    # follows the traffic; the executor was trained on targets stepping over this range within a
    # drive (sim.expert.TargetSteps).
    speed_steps: tuple[float, ...] = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    # An ego faster than every target the executor was trained on (the expert cruises at up to
    # 31 m/s) is told to hold its speed: a target far below it makes the executor brake hard.
    hold_above: float = 31.0
    # No road vehicle's speed (252 km/h): a broken unit (km/h read as m/s) or sensor; the planner refuses.
    max_speed: float = 70.0
    valid_for_s: float = 1.0
    # Ego longitudinal model (IDM-like, as the executor was trained to drive).
    time_gap: float = 1.5
    min_gap: float = 2.5
    a_max: float = 1.5
    b_comf: float = 2.5
    b_max: float = 8.0  # physical braking limit
    jerk_ref: float = 2.0  # m/s^3 considered comfortable
    # Lane changes.
    lane_change_s: float = 4.0  # the executor's lateral manoeuvre time
    leaving_time_gap: float = 0.5  # headway still kept to the leader of the lane we are leaving
    # Headway accepted behind the new leader while the change is under way (opened back up to
    # time_gap afterwards), as the expert accepts when it merges: at time_gap, a change behind a
    # slower car looks like an emergency stop to the rollout.
    merge_time_gap: float = 0.8
    rear_min_gap: float = 5.0  # hard: the new follower never closer than this during the change
    rear_min_ttc_s: float = 2.0  # hard: nor closing on us faster than this
    cooldown_s: float = 4.0  # after a change, a new one has to earn this much more
    ttc_min_s: float = 4.0  # below this time-to-collision a leader is a risk
    stop_speed: float = 1.0  # a leader slower than this is a stationary obstacle
    stop_approach_speed: float = 5.0  # ending the horizon slower than this behind one means "stop"
    hard_braking: float = 2.5  # the ego braking harder than this (measured) behind a close leader is avoiding it
    # Cost weights (dimensionless; a speed deficit of the whole cruise speed for the whole horizon
    # costs w_progress).
    w_progress: float = 4.0
    w_accel: float = 0.3
    w_jerk: float = 0.1
    w_hard_brake: float = 1.0
    w_headway: float = 3.0
    w_ttc: float = 3.0
    w_change: float = 0.2
    w_left: float = 0.15  # a change to the left costs a little more: right is preferred when both gain
    # No bonus for moving right without a gain: the executor was trained only on lane changes made
    # for an advantage (the expert's MOBIL).
    w_right: float = 0.0
    w_continue: float = -0.5  # finishing a lane change already started (negative: a bonus)
    w_reverse: float = 3.0  # flipping back towards the lane we are leaving or just left
    w_cooldown: float = 1.0
    # A lane with a stationary obstacle ahead (a stopped car, the end of an on-ramp) is a dead end
    # beyond the horizon. Costs up to this much, more the closer the obstacle, so a safe gap to
    # leave is taken as soon as there is one instead of when the braking starts.
    w_dead_end: float = 3.5
    # Starting a lane change while braking hard behind a close leader: the executor was never shown
    # a lane change on top of an emergency stop.
    w_change_braking: float = 5.0
    # No lane change is started slower than this, as the expert never does
    # (sim.expert.ExpertParams.min_change_speed): the executor was never shown a change from a crawl
    # (the rollout would move the ego sideways at any speed). A change under way may go on.
    min_change_speed: float = 3.0
    # The target speed says what the executor should settle at: a target far above what the chosen
    # lane lets the ego reach within the horizon makes it press into the gap ahead, and a target
    # that moves with every small change of the costs is noise.
    w_target: float = 1.0
    # Per m/s the target moves from the previous plan's, over the cruise speed: enough that the
    # target does not flip between neighbouring steps every period, little enough that it still
    # follows a slowing leader.
    w_retarget: float = 1.5
    # A leader faster than the ego by pull_away m/s and by pull_away_fraction of the ego's speed is
    # pulling away (starting off after a stop) and does not cap the target; both conditions, so that
    # a leader barely faster than the ego does not make the target flip.
    pull_away: float = 1.0
    pull_away_fraction: float = 0.3
    # A slower car close ahead in a neighbouring lane may cut in: staying in lane is scored on the
    # braking that would take, so the planner does not speed up to pass it closely (the executor
    # reacts to a cut-in only once the car is in its lane).
    w_cut_in: float = 1.0
    cut_in_range_m: float = 40.0
    cut_in_min_gap_m: float = 5.0
    collision_cost: float = 1.0e3
    memory_sessions: int = 4096  # per-session lane-change memory is bounded (LRU)


@dataclass(frozen=True)
class _Situation:
    """What the planner knows about each session of a batch: (B,) or (B, 3 lanes) arrays."""

    v0: FloatArray  # ego speed, never negative
    a0: FloatArray
    cruise: FloatArray  # desired speed, capped in curves
    lane_offset: FloatArray
    exists: npt.NDArray[np.bool_]  # (B, 3): keep, left, right
    front_gap: FloatArray  # (B, 3) leaders, _FAR_M when there is none
    front_v: FloatArray
    rear_gap: FloatArray  # (B, 3) followers (none in the ego lane)
    rear_v: FloatArray


@dataclass(frozen=True)
class _Columns:
    """Every candidate of every session side by side, (N,) arrays; session b owns starts[b]:starts[b+1]."""

    owner: npt.NDArray[np.int64]  # index of the session in the batch
    lane: npt.NDArray[np.int64]
    target: FloatArray
    lowest: FloatArray  # the session's lowest non-zero target
    starts: npt.NDArray[np.int64]  # (B + 1,)


@dataclass(frozen=True)
class _Traffic:
    """What the rollout of every column needs, (N,) arrays: its session's situation seen from its lane."""

    v0: FloatArray
    target: FloatArray
    changing: npt.NDArray[np.bool_]  # a lane change (the candidate's lane is not the ego's)
    cruise: FloatArray
    own_gap: FloatArray  # the leader in the ego's lane, _FAR_M when there is none
    own_v: FloatArray
    new_gap: FloatArray  # the leader in the candidate's lane (the same one when keeping the lane)
    new_v: FloatArray
    rear_gap: FloatArray  # the follower in the candidate's lane (none when keeping the lane)
    rear_v: FloatArray
    # left, right: the leader in each neighbouring lane, and whether it is a slower car that may cut in
    side_gap: tuple[FloatArray, FloatArray]
    side_v: tuple[FloatArray, FloatArray]
    near: tuple[npt.NDArray[np.bool_], npt.NDArray[np.bool_]]


@dataclass(frozen=True)
class _Outcome:
    """What the rollout of every column comes to, (N,) arrays: all that _evaluate scores."""

    end_speed: FloatArray  # at the end of the horizon
    end_gap: FloatArray  # to the leader of the candidate's lane, at the end of the horizon
    end_lead_v: FloatArray  # of the leader that counts at the end of the horizon
    min_gap: FloatArray  # to the leader(s) that count, over the horizon
    headway: FloatArray  # mean of max(0, 1 - gap / desired gap)^2
    ttc_risk: FloatArray  # max of max(0, 1 - time-to-collision / ttc_min_s)^2
    rear_bad: npt.NDArray[np.bool_]  # a lane change whose new follower comes too close during it
    shortfall: FloatArray  # mean of max(cruise - speed, 0)
    accel_sq: FloatArray  # mean squared acceleration
    jerk_sq: FloatArray  # mean squared jerk (within the rollout)
    hard_brake: FloatArray  # mean braking beyond b_comf
    cut_in: FloatArray  # _side_risk

    ROWS = 12  # the compiled path's (ROWS, N) output, in field order (rear_bad as 0.0 / 1.0)

    @classmethod
    def from_rows(cls, out: FloatArray) -> _Outcome:
        rows = list(out)
        rows[6] = rows[6] != 0.0
        return cls(*rows)


@dataclass
class Candidates:
    """The evaluated candidate table, (K,) arrays; exposed for tests and debugging."""

    lane: npt.NDArray[np.int64]
    target_speed: FloatArray
    cost: FloatArray
    feasible: npt.NDArray[np.bool_]
    end_speed: FloatArray
    min_gap: FloatArray
    blocked: npt.NDArray[np.bool_]  # ends the horizon crawling up to a stationary obstacle
    terms: dict[str, FloatArray] = field(default_factory=dict)

    @property
    def best(self) -> int:
        return int(np.argmin(self.cost))


class BehaviourPlanner:
    """PlanSource: lanes x target speeds, rolled out over horizon_s, cheapest feasible wins."""

    def __init__(self, params: BehaviourParams | None = None, name: str = "behaviour") -> None:
        self.params = params or BehaviourParams()
        self.name = name
        p = self.params
        self._n_steps = int(round(p.horizon_s / p.step_s))
        self._t = (np.arange(self._n_steps) + 1) * p.step_s  # time at the end of each step
        self._ladder = np.concatenate([[_STOP], np.asarray(p.speed_steps, dtype=np.float64)])
        # The rollout's path, chosen now (planner.compiled): the C module, or None for numpy's.
        self._compiled = compiled.module()
        # Its constants, in the order planner/_rollout.c reads them (enum Constant there).
        self._constants = np.array(
            [
                p.step_s,
                p.a_max,
                p.b_comf,
                p.b_max,
                p.min_gap,
                p.time_gap,
                p.leaving_time_gap,
                p.merge_time_gap,
                p.lane_change_s,
                0.5 * p.lane_change_s,
                2.0 * math.sqrt(p.a_max * p.b_comf),
                p.ttc_min_s,
                p.rear_min_gap,
                p.rear_min_ttc_s,
                p.cut_in_min_gap_m,
                _FAR_M,
            ],
            dtype=np.float64,
        )
        # When we last proposed a lane change, per session: the cooldown needs memory that the
        # previous plan alone cannot carry (after a change, the previous plan is already "keep").
        self._last_change_ns: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()  # serve_planner may call plan() from several gRPC threads

    @property
    def is_compiled(self) -> bool:
        """The rollout runs in the compiled module (planner._rollout), not numpy."""
        return self._compiled is not None

    # ---- PlanSource -------------------------------------------------------------------------
    def plan(self, request: PlanRequest) -> Plan:
        [result] = self.plan_many([request])
        if isinstance(result, Exception):
            raise result
        return result

    def plan_many(self, requests: Sequence[PlanRequest]) -> list[Plan | Exception]:
        """One plan per request, in order, from one vectorised rollout; a request that cannot be
        planned (non-finite features, an ego speed beyond max_speed) gets its exception in its slot
        and the others are planned.

        The result is the same as plan() called on each request in turn, lane-change memory
        included. The only exception is the memory's LRU bound: with more than memory_sessions
        sessions remembered, a batch evicts at its end instead of between requests."""
        results: list[Plan | Exception | None] = [None] * len(requests)
        # A session's memory is read before its batch and written after it, so a session planned
        # twice in one batch (the scheduler never does that) takes two rounds, in request order.
        for indices in _rounds(requests):
            batch = [requests[i] for i in indices]
            x = np.stack([np.asarray(r.features, dtype=np.float64) for r in batch])
            problems = self._problems(x)
            for i, problem in enumerate(problems):
                if problem:
                    results[indices[i]] = ValueError(problem)
            good = [i for i in range(len(batch)) if not problems[i]]
            if not good:
                continue
            cols, cands = self._evaluate(x[good], [batch[i] for i in good])
            for j, i in enumerate(good):
                try:
                    results[indices[i]] = self._decide(batch[i], cols, cands, j)
                except Exception as err:  # noqa: BLE001 - one bad plan must not sink the batch
                    results[indices[i]] = err
        return cast("list[Plan | Exception]", results)  # every slot was filled above

    def forget(self, session_id: str) -> None:
        with self._lock:
            self._last_change_ns.pop(session_id, None)

    def _decide(self, request: PlanRequest, cols: _Columns, cands: Candidates, b: int) -> Plan:
        """The plan for session b of an evaluated batch; remembers a lane change for the cooldown."""
        p = self.params
        lo, hi = int(cols.starts[b]), int(cols.starts[b + 1])
        best = lo + int(np.argmin(cands.cost[lo:hi]))
        lane = int(cands.lane[best])
        behaviour = LANE_BEHAVIOUR[lane]
        target_speed = float(cands.target_speed[best])
        offset = float(LANE_SIGN[lane] * p.lane_width)
        if cands.blocked[best] or target_speed == 0.0:
            # Even the best option ends up stopping behind a stationary obstacle (or is the stop
            # itself): say so (and stay in lane), so the executor brakes early and smoothly instead
            # of closing in at cruise intent.
            behaviour, target_speed, offset = "stop", 0.0, 0.0
        # Remember the latest lane change, ours or one the previous plan (from any source) was making.
        changed_ns = request.now_ns if behaviour.startswith("change_") else None
        prev = request.previous
        if changed_ns is None and prev is not None and prev.behaviour.startswith("change_"):
            changed_ns = prev.created_ns
        if changed_ns is not None:
            self._remember_change(request.session_id, changed_ns)
        return Plan(
            plan_id=make_plan_id(self.name, request.session_id, request.now_ns),
            session_id=request.session_id,
            created_ns=request.now_ns,
            valid_for_ns=int(p.valid_for_s * 1e9),
            source=self.name,
            behaviour=behaviour,
            target_speed=target_speed,
            target_lane_offset=offset,
        )

    def _remember_change(self, session_id: str, changed_ns: int) -> None:
        with self._lock:
            self._last_change_ns[session_id] = changed_ns
            self._last_change_ns.move_to_end(session_id)
            while len(self._last_change_ns) > self.params.memory_sessions:
                self._last_change_ns.popitem(last=False)

    # ---- the evaluation ---------------------------------------------------------------------
    def cruise_speed(self, features: npt.NDArray[np.floating]) -> float:
        curvature = abs(float(features[_F["road_curvature"]]))
        return min(self.params.cruise_speed, math.sqrt(self.params.max_lateral_accel / max(curvature, 1e-9)))

    def evaluate(
        self,
        features: npt.NDArray[np.floating],
        previous: Plan | None = None,
        now_ns: int = 0,
        session_id: str = "",
    ) -> Candidates:
        """The candidate table of one session (what plan() chooses from), for tests and debugging."""
        x = np.asarray(features, dtype=np.float64)
        [problem] = self._problems(x[None, :])
        if problem:
            raise ValueError(problem)
        request = PlanRequest(session_id, np.asarray(features, dtype=np.float32), now_ns, previous)
        _, cands = self._evaluate(x[None, :], [request])
        return cands

    def _problems(self, x: FloatArray) -> list[str]:
        """Why each row of (B, N_FEATURES) x cannot be planned, "" when it can. Beyond max_speed no
        target is one the executor was trained to follow, and an ego speed like that is more often
        a broken unit than a real speed: the planner refuses, and the executor degrades with
        STALE_PLAN instead of following a plan made from garbage."""
        finite = cast("npt.NDArray[np.bool_]", np.isfinite(x).all(axis=1))  # (B,); the stubs allow a scalar
        speed = np.where(finite, x[:, _F["ego_speed"]], 0.0)
        limit = self.params.max_speed
        return [
            "features contain NaN or Inf"
            if not ok
            else f"ego speed {v:.1f} m/s is beyond the planner's {limit:.0f} m/s"
            if v > limit
            else ""
            for ok, v in zip(finite, speed)
        ]

    def _evaluate(self, x: FloatArray, requests: Sequence[PlanRequest]) -> tuple[_Columns, Candidates]:
        """Rolls out and scores every candidate of the (B, N_FEATURES) finite batch x; requests[b]
        gives session b's previous plan, time and id (for the hysteresis)."""
        p = self.params
        sit = self._situation(x)
        cols = self._columns(sit)
        lane, own, changing = cols.lane, cols.owner, cols.lane != KEEP_LANE
        traffic = self._traffic(sit, cols)
        # The rollout and what it comes to per candidate: compiled (planner._rollout) or numpy, the same bits.
        out = self._outcome_compiled(traffic) if self._compiled is not None else self._outcome(traffic)

        collides = out.min_gap <= 0.0
        rear_unsafe = changing & (out.rear_bad | (traffic.rear_gap < p.rear_min_gap))
        too_slow = changing & (sit.v0[own] < p.min_change_speed) & ~self._under_way(sit, requests)[own, lane]
        cruise = traffic.cruise
        progress = out.shortfall / np.maximum(cruise, 1.0)
        accel_cost = out.accel_sq / p.b_comf**2
        jerk_cost = out.jerk_sq / p.jerk_ref**2
        cut_in = self._cut_in_risk(cols, out.cut_in)

        # ---- beyond the horizon: a stationary obstacle still ahead in the final lane ----
        stationary = traffic.new_v < p.stop_speed
        closeness = np.clip(1.0 - out.end_gap / SENSOR_RANGE_M, 0.0, 1.0)
        dead_end = np.where(stationary & (out.end_gap < SENSOR_RANGE_M), closeness, 0.0)
        # The target the plan will state, against the speed the rollout actually ends at.
        faster = sit.front_v[own, lane] - sit.v0[own]
        pulling_away = (sit.front_gap[own, lane] < _FAR_M) & (
            faster > np.maximum(p.pull_away, p.pull_away_fraction * sit.v0[own])
        )
        reach = np.where(pulling_away, cruise, np.maximum(out.end_speed, cols.lowest))
        overshoot = np.maximum(cols.target - reach, 0.0)

        # ---- rules of the road ----
        rules = np.where(changing, p.w_change, 0.0)
        rules += np.where(changing & self._braking_for_leader(sit)[own], p.w_change_braking, 0.0)
        rules += np.where(lane == LEFT_LANE, p.w_left, 0.0) + np.where(lane == RIGHT_LANE, p.w_right, 0.0)
        rules += self._hysteresis(sit, requests)[own, lane]
        rules += p.w_retarget * self._retarget(cols, requests) / np.maximum(cruise, 1.0)

        terms = {
            "progress": p.w_progress * progress,
            "accel": p.w_accel * accel_cost,
            "jerk": p.w_jerk * jerk_cost,
            "hard_brake": p.w_hard_brake * out.hard_brake,
            "headway": p.w_headway * out.headway,
            "ttc": p.w_ttc * out.ttc_risk,
            "rules": rules,
            "dead_end": p.w_dead_end * dead_end,
            "cut_in": p.w_cut_in * cut_in,
            "target": p.w_target * overshoot / np.maximum(cruise, 1.0),
            "collision": np.where(collides, p.collision_cost, 0.0),
            "rear_unsafe": np.where(rear_unsafe, p.collision_cost, 0.0),
            "too_slow": np.where(too_slow, p.collision_cost, 0.0),
        }
        cost = np.sum(list(terms.values()), axis=0)
        blocked = (out.end_lead_v < p.stop_speed) & (out.end_speed < p.stop_approach_speed)
        cands = Candidates(
            lane=lane,
            target_speed=cols.target,
            cost=cost,
            feasible=~(collides | rear_unsafe | too_slow),
            end_speed=out.end_speed,
            min_gap=out.min_gap,
            blocked=blocked,
            terms=terms,
        )
        return cols, cands

    def _traffic(self, sit: _Situation, cols: _Columns) -> _Traffic:
        """What the rollout of each column needs: its session's situation, seen from its lane."""
        p = self.params
        lane, own = cols.lane, cols.owner
        keep = lane == KEEP_LANE
        v0 = sit.v0[own]
        side_gap, side_v, near = [], [], []
        for side in (LEFT_LANE, RIGHT_LANE):
            gap0, v_side = sit.front_gap[own, side], sit.front_v[own, side]
            side_gap.append(gap0)
            side_v.append(v_side)
            # a moving car slower than the ego, close ahead in the next lane: it may cut in (a
            # stopped one is not going to pull out)
            near.append(
                keep
                & sit.exists[own, side]
                & (gap0 > 0.0)
                & (gap0 < p.cut_in_range_m)
                & (v_side < v0)
                & (v_side >= p.stop_speed)
            )
        return _Traffic(
            v0=v0,
            target=cols.target,
            changing=~keep,
            cruise=sit.cruise[own],
            own_gap=sit.front_gap[own, KEEP_LANE],
            own_v=sit.front_v[own, KEEP_LANE],
            new_gap=sit.front_gap[own, lane],
            new_v=sit.front_v[own, lane],
            rear_gap=sit.rear_gap[own, lane],
            rear_v=sit.rear_v[own, lane],
            side_gap=(side_gap[0], side_gap[1]),
            side_v=(side_v[0], side_v[1]),
            near=(near[0], near[1]),
        )

    def _outcome(self, tr: _Traffic) -> _Outcome:
        """The numpy rollout and what it comes to per column: the reference the compiled path
        (planner._rollout) reproduces bit for bit."""
        p = self.params
        changing = tr.changing
        # Leader positions over time (steps, N), measured from the ego's front bumper at t = 0.
        t = self._t[:, None]
        own_lead = tr.own_gap + tr.own_v * t
        new_lead = tr.new_gap + tr.new_v * t
        # Before the ego crosses into the new lane it must respect both leaders.
        both = changing[None, :] & (t < 0.5 * p.lane_change_s)
        new_time_gap = np.where(changing[None, :] & (t < p.lane_change_s), p.merge_time_gap, p.time_gap)
        s_hist, v_hist, a_hist = self._rollout(tr.v0, tr.target, changing, own_lead, new_lead, tr.own_v, tr.new_v, both)

        # ---- collision risk (leaders) ----
        gap_new = new_lead - s_hist
        gap_own = np.where(both, own_lead - s_hist, _FAR_M)
        gap = np.minimum(gap_new, gap_own)
        lead_v = np.where(gap_own < gap_new, tr.own_v, tr.new_v)
        desired = p.min_gap + np.where(gap_own < gap_new, p.leaving_time_gap, new_time_gap) * v_hist
        headway = np.mean(np.maximum(0.0, 1.0 - gap / desired) ** 2, axis=0)
        closing = v_hist - lead_v
        ttc = np.where(closing > 1e-3, np.maximum(gap, 0.0) / np.maximum(closing, 1e-3), np.inf)
        ttc_risk = np.max(np.maximum(0.0, 1.0 - ttc / p.ttc_min_s) ** 2, axis=0)

        # ---- hard constraint on the new follower while the change is under way ----
        during = t <= p.lane_change_s
        rear_g = tr.rear_gap + s_hist - tr.rear_v * t
        rear_closing = tr.rear_v - v_hist
        rear_ttc = np.where(rear_closing > 1e-3, rear_g / np.maximum(rear_closing, 1e-3), np.inf)
        rear_bad = during & ((rear_g < p.rear_min_gap) | (rear_ttc < p.rear_min_ttc_s))

        # ---- progress and comfort ----
        # The plan's own smoothness: the step from the measured acceleration to the rollout's first
        # one is not the plan's doing (the executor chooses its acceleration every tick), and
        # counting it made "stop" the cheapest plan whenever the executor happened to brake hard.
        jerk = np.diff(a_hist, axis=0) / p.step_s
        return _Outcome(
            end_speed=v_hist[-1],
            end_gap=gap_new[-1],
            end_lead_v=lead_v[-1],
            min_gap=gap.min(axis=0),
            headway=headway,
            ttc_risk=ttc_risk,
            rear_bad=changing & rear_bad.any(axis=0),
            shortfall=np.mean(np.maximum(tr.cruise - v_hist, 0.0), axis=0),
            accel_sq=np.mean(a_hist**2, axis=0),
            jerk_sq=np.mean(jerk**2, axis=0),
            hard_brake=np.mean(np.maximum(0.0, -a_hist - p.b_comf), axis=0),
            cut_in=self._side_risk(tr, s_hist, v_hist),
        )

    def _outcome_compiled(self, tr: _Traffic) -> _Outcome:
        """_outcome in one call of the compiled module (planner._rollout): the same bits."""
        assert self._compiled is not None
        out = np.empty((_Outcome.ROWS, tr.v0.size))
        self._compiled.outcome(
            self._constants,
            self._t,
            tr.v0,
            tr.target,
            tr.changing,
            tr.cruise,
            tr.own_gap,
            tr.own_v,
            tr.new_gap,
            tr.new_v,
            tr.rear_gap,
            tr.rear_v,
            tr.near[0],
            tr.side_gap[0],
            tr.side_v[0],
            tr.near[1],
            tr.side_gap[1],
            tr.side_v[1],
            out,
        )
        return _Outcome.from_rows(out)

    def _braking_for_leader(self, sit: _Situation) -> npt.NDArray[np.bool_]:
        """(B,) the ego brakes hard (measured) with its leader close: avoiding it, not manoeuvring."""
        p = self.params
        gap, closing = sit.front_gap[:, KEEP_LANE], sit.v0 - sit.front_v[:, KEEP_LANE]
        close = (gap < p.min_gap + p.time_gap * sit.v0) | ((closing > 0.0) & (gap < p.ttc_min_s * closing))
        return (sit.a0 < -p.hard_braking) & close

    def _side_risk(self, tr: _Traffic, s_hist: FloatArray, v_hist: FloatArray) -> FloatArray:
        """(N,) risk of staying in lane next to the slower cars close ahead in the neighbouring lanes
        (tr.near), each predicted at constant velocity: (braking a cut-in would need / b_comf)^2, at
        most 1; 0 where no car is near."""
        p = self.params
        risk = np.zeros(tr.v0.size)
        for near, gap0, v_side in zip(tr.near, tr.side_gap, tr.side_v):
            gap = gap0 + v_side * self._t[:, None] - s_hist
            closing = np.maximum(v_hist - v_side, 0.0)
            # The braking a cut-in would ask for, while the car is still ahead; every pass goes
            # through a small gap, so what tells passes apart is the closing speed.
            braking = closing**2 / (2.0 * np.maximum(gap, p.cut_in_min_gap_m))
            side_risk = np.max(np.where(gap > 0.0, np.minimum(braking / p.b_comf, 1.0) ** 2, 0.0), axis=0)
            risk = np.maximum(risk, np.where(near, side_risk, 0.0))
        return risk

    def _cut_in_risk(self, cols: _Columns, risk: FloatArray) -> FloatArray:
        """(N,) the cut-in risk of each keep candidate (_side_risk) above its session's least risky
        keep candidate; 0 for lane changes."""
        # Relative to the session's least risky keep candidate: it decides how fast to pass, not
        # whether to leave the lane (passing slower cars in the next lane is everyday driving).
        moving = (cols.lane == KEEP_LANE) & (cols.target > 0.0)  # slowing to a stop is no way to pass a car
        least = np.minimum.reduceat(np.where(moving, risk, np.inf), cols.starts[:-1])
        return np.where(moving, risk - least[cols.owner], 0.0)

    def _situation(self, x: FloatArray) -> _Situation:
        """Traffic per session and lane (keep, left, right), predicted at constant velocity.
        Python's max(a, b)/min(a, b) are written as np.where so a -0.0 stays what plan() always saw."""
        p = self.params
        speed = x[:, _F["ego_speed"]]
        v0 = np.where(speed < 0.0, 0.0, speed)
        curvature = np.abs(x[:, _F["road_curvature"]])
        curve_speed = np.sqrt(p.max_lateral_accel / np.where(curvature < 1e-9, 1e-9, curvature))
        cruise = np.where(curve_speed < p.cruise_speed, curve_speed, p.cruise_speed)
        ones = np.ones(x.shape[0], dtype=bool)
        exists = np.stack([ones, x[:, _F["left_lane_exists"]] > 0.5, x[:, _F["right_lane_exists"]] > 0.5], axis=1)
        front_gap = x[:, _FRONT_GAP]
        front_v = np.maximum(v0[:, None] + x[:, _FRONT_REL], 0.0)
        # Trust the gap over lead_present: a faulty flag must not hide a car 20 m ahead.
        no_front = front_gap >= _NOTHING_THERE_M
        front_gap = np.where(no_front, _FAR_M, front_gap)
        front_v = np.where(no_front, np.where(cruise > v0, cruise, v0)[:, None], front_v)
        rear_gap = np.concatenate([np.full((x.shape[0], 1), _FAR_M), x[:, _REAR_GAP]], axis=1)
        rear_v = np.concatenate([np.zeros((x.shape[0], 1)), np.maximum(v0[:, None] + x[:, _REAR_REL], 0.0)], axis=1)
        rear_gap = np.where(rear_gap >= _NOTHING_THERE_M, _FAR_M, rear_gap)
        return _Situation(
            v0=v0,
            a0=x[:, _F["ego_accel"]],
            cruise=cruise,
            lane_offset=x[:, _F["lane_offset"]],
            exists=exists,
            front_gap=front_gap,
            front_v=front_v,
            rear_gap=rear_gap,
            rear_v=rear_v,
        )

    def _columns(self, sit: _Situation) -> _Columns:
        """Candidates: existing lanes x target speeds, session by session, lane by lane (the order
        plan() has always used: argmin ties go to the first). A missing lane is never a candidate."""
        n_frac = self._ladder.size
        mask = np.repeat(sit.exists, n_frac, axis=1).reshape(-1)  # (B * 3 * n_frac,)
        flat = np.flatnonzero(mask)
        owner = flat // (3 * n_frac)
        lane = (flat // n_frac) % 3
        step = self._ladder[flat % n_frac]
        cruise = sit.cruise[owner]
        v = sit.v0[owner]
        hold = v > self.params.hold_above
        lowest = np.where(hold, v, min(self.params.speed_steps) * cruise)
        target = np.where(step == _STOP, 0.0, np.where(hold, v, step * cruise))
        per_session = sit.exists.sum(axis=1) * n_frac
        starts = np.concatenate([[0], np.cumsum(per_session)])
        return _Columns(owner=owner, lane=lane, target=target, lowest=lowest, starts=starts)

    def _rollout(
        self,
        v0: FloatArray,
        target: FloatArray,
        changing: npt.NDArray[np.bool_],
        own_lead: FloatArray,
        new_lead: FloatArray,
        v_own: FloatArray,
        v_new: FloatArray,
        both: npt.NDArray[np.bool_],
    ) -> tuple[FloatArray, FloatArray, FloatArray]:
        """IDM-like ego behind the leader(s) of each candidate: position, speed and acceleration
        histories, (steps, N). The only Python loop of a batch."""
        p = self.params
        n = v0.size
        s = np.zeros(n)
        v = v0.copy()
        s_hist = np.empty((self._n_steps, n))
        v_hist = np.empty((self._n_steps, n))
        a_hist = np.empty((self._n_steps, n))
        dt = p.step_s
        v0_target = np.maximum(target, 0.1)
        sqrt_ab = 2.0 * math.sqrt(p.a_max * p.b_comf)
        # While leaving, the old leader only has to be kept at a short headway, not followed: the
        # ego is already moving out from behind it.
        own_time_gap = np.where(changing, p.leaving_time_gap, p.time_gap)
        merge_time_gap = np.where(changing, p.merge_time_gap, p.time_gap)  # to the new leader, during a change
        any_both = cast("npt.NDArray[np.bool_]", both.any(axis=1))  # (steps,); the stubs allow a scalar
        for i in range(self._n_steps):
            free = self._idm_free(v, v0_target)
            new_time_gap = merge_time_gap if self._t[i] < p.lane_change_s else p.time_gap
            a = self._idm(v, free, new_lead[i] - s, v_new, sqrt_ab, new_time_gap)
            if any_both[i]:  # past the first half of a change only the new leader counts: skip the work
                a_own = self._idm(v, free, own_lead[i] - s, v_own, sqrt_ab, own_time_gap)
                a = np.where(both[i], np.minimum(a, a_own), a)
            a = np.minimum(np.maximum(a, -p.b_max), p.a_max)
            v_next = np.maximum(v + a * dt, 0.0)
            a = (v_next - v) / dt  # what actually happened once the ego stopped
            s += 0.5 * (v + v_next) * dt
            v = v_next
            s_hist[i], v_hist[i], a_hist[i] = s, v, a
        return s_hist, v_hist, a_hist

    def _idm_free(self, v: FloatArray, v0: FloatArray) -> FloatArray:
        # The free-road term never asks for more than comfortable braking: lowering the target
        # speed means "slow down smoothly", braking hard is the interaction term's job.
        # ratio**4 as two squarings: numpy's power is SVML's pow on AVX-512 machines and libm's
        # elsewhere (they differ in the last bit in ~5 % of cases); two products are the same bits
        # everywhere, and what the compiled path (planner._rollout) computes.
        p = self.params
        ratio = v / v0
        r2 = ratio * ratio
        return np.maximum(p.a_max * (1.0 - r2 * r2), -p.b_comf)

    def _idm(
        self,
        v: FloatArray,
        free: FloatArray,
        gap: FloatArray,
        v_lead: FloatArray,
        sqrt_ab: float,
        time_gap: FloatArray | float,
    ) -> FloatArray:
        p = self.params
        s_star = p.min_gap + np.maximum(0.0, v * time_gap + v * (v - v_lead) / sqrt_ab)
        inter = s_star / np.maximum(gap, 0.1)
        return free - p.a_max * inter * inter

    def _retarget(self, cols: _Columns, requests: Sequence[PlanRequest]) -> FloatArray:
        """(N,) how far each candidate's target speed moves the previous plan's (0 after a stop,
        or without one): a target that flips with every small change of the costs is noise."""
        prev = np.array(
            [
                r.previous.target_speed if r.previous is not None and r.previous.behaviour != "stop" else np.nan
                for r in requests
            ]
        )[cols.owner]
        moving = cols.target > 0.0
        return np.where(np.isfinite(prev) & moving, np.abs(cols.target - np.nan_to_num(prev)), 0.0)

    def _change_in_progress(self, sit: _Situation, b: int, previous: Plan | None) -> tuple[int, int, bool] | None:
        """For a session whose previous plan was a lane change: (the lane candidate that continues
        it, the one that reverses it, whether the ego has crossed the lane boundary); else None."""
        if previous is None or previous.behaviour not in ("change_left", "change_right"):
            return None
        sign = 1.0 if previous.behaviour == "change_left" else -1.0
        # Past the lane boundary the ego's "current lane" is already the new one: the ego sits on the
        # far side of its centre, and keeping the lane is how the change finishes.
        crossed = sign * float(sit.lane_offset[b]) < -0.25 * self.params.lane_width
        continuing = KEEP_LANE if crossed else (LEFT_LANE if sign > 0 else RIGHT_LANE)
        return continuing, (RIGHT_LANE if sign > 0 else LEFT_LANE), crossed

    def _under_way(self, sit: _Situation, requests: Sequence[PlanRequest]) -> npt.NDArray[np.bool_]:
        """(B, 3 lanes): the lane candidate that goes on with a change the previous plan started."""
        out = np.zeros((len(requests), 3), bool)
        for b, request in enumerate(requests):
            change = self._change_in_progress(sit, b, request.previous)
            if change is not None:
                out[b, change[0]] = True
        return out

    def _hysteresis(self, sit: _Situation, requests: Sequence[PlanRequest]) -> FloatArray:
        """(B, 3 lanes) costs that make the planner finish what it started and not flip back."""
        p = self.params
        cost = np.zeros((len(requests), 3))
        with self._lock:  # one look at the memory for the whole batch
            last = [self._last_change_ns.get(r.session_id) for r in requests]
        for b, request in enumerate(requests):
            change = self._change_in_progress(sit, b, request.previous)
            if change is not None:
                continuing, reverse, crossed = change
                cost[b, continuing] = p.w_continue
                cost[b, reverse] = p.w_reverse
                if not crossed:  # aborting is allowed when it must be, but it has to be worth it
                    cost[b, KEEP_LANE] = 0.5 * p.w_reverse
            elif (last_b := last[b]) is not None and 0 <= request.now_ns - last_b < p.cooldown_s * 1e9:
                cost[b, KEEP_LANE + 1 :] = p.w_cooldown
        return cost


def _rounds(requests: Sequence[PlanRequest]) -> list[list[int]]:
    """Indices of requests grouped so that no session appears twice in a group, in request order."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for i, request in enumerate(requests):
        k = seen.get(request.session_id, 0)
        seen[request.session_id] = k + 1
        if k == len(rounds):
            rounds.append([])
        rounds[k].append(i)
    return rounds
