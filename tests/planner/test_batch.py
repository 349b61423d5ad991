"""BehaviourPlanner.plan_many: one vectorised rollout for many sessions, the same plans as plan() one by one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dualloop.planner.behaviour import BehaviourPlanner
from dualloop.planner.plan import Plan, PlanRequest
from dualloop.sim.env import make_batch
from dualloop.sim.schema import FEATURE_INDEX, N_FEATURES, SENSOR_RANGE_M

F = FEATURE_INDEX
PERIOD_NS = 200_000_000
_PAIRS = (
    ("lead_distance", "lead_rel_speed"),
    ("left_front_gap", "left_front_rel_speed"),
    ("left_rear_gap", "left_rear_rel_speed"),
    ("right_front_gap", "right_front_rel_speed"),
    ("right_rear_gap", "right_rear_rel_speed"),
)


def random_features(rng: np.random.Generator) -> np.ndarray:
    """A valid feature vector: any lanes, cars anywhere (or nothing there), curves, off-centre."""
    x = np.zeros(N_FEATURES, np.float32)
    x[F["ego_speed"]] = rng.uniform(-0.5, 35.0)
    x[F["ego_accel"]] = rng.uniform(-5.0, 2.0)
    x[F["road_curvature"]] = 0.0 if rng.random() < 0.5 else rng.uniform(-0.02, 0.02)
    x[F["lane_offset"]] = rng.uniform(-2.0, 2.0)
    x[F["left_lane_exists"]], x[F["right_lane_exists"]] = rng.integers(2, size=2)
    for gap, rel in _PAIRS:
        x[F[gap]] = SENSOR_RANGE_M if rng.random() < 0.3 else rng.uniform(0.0, SENSOR_RANGE_M)
        x[F[rel]] = rng.uniform(-25.0, 10.0)
    x[F["lead_present"]] = float(x[F["lead_distance"]] < SENSOR_RANGE_M)
    return x


def one_by_one(planner: BehaviourPlanner, requests: list[PlanRequest]) -> list[Plan | Exception]:
    out: list[Plan | Exception] = []
    for r in requests:
        try:
            out.append(planner.plan(r))
        except Exception as err:  # noqa: BLE001 - compared with plan_many's slot
            out.append(err)
    return out


def assert_same(batched: list[Plan | Exception], single: list[Plan | Exception]) -> None:
    assert len(batched) == len(single)
    for b, s in zip(batched, single):
        if isinstance(s, Exception):
            assert type(b) is type(s) and str(b) == str(s)
        else:
            assert b == s  # behaviour, target speed, offset, plan id, times: everything


class Twins:
    """Two planners fed the same requests, one in batches, one request at a time; each session's
    next request carries the previous plan, so lane-change hysteresis and cooldown memory matter."""

    def __init__(self) -> None:
        self.batched, self.single = BehaviourPlanner(), BehaviourPlanner()
        self.previous: dict[str, Plan] = {}
        self.seen = {"mid_change": 0, "cooldown": 0, "changes": 0}

    def step(self, features: dict[str, np.ndarray], now_ns: int) -> list[Plan | Exception]:
        requests = [PlanRequest(s, x, now_ns, self.previous.get(s)) for s, x in features.items()]
        self._note_situations(requests)
        got = self.batched.plan_many(requests)
        assert_same(got, one_by_one(self.single, requests))
        assert self.batched._last_change_ns == self.single._last_change_ns  # the same memory, same order
        for r, p in zip(requests, got):
            if isinstance(p, Plan):
                self.previous[r.session_id] = p
                self.seen["changes"] += p.behaviour.startswith("change_")
        return got

    def _note_situations(self, requests: list[PlanRequest]) -> None:
        cooldown_ns = self.single.params.cooldown_s * 1e9
        for r in requests:
            if r.previous is not None and r.previous.behaviour.startswith("change_"):
                self.seen["mid_change"] += 1
            else:
                last = self.single._last_change_ns.get(r.session_id)
                self.seen["cooldown"] += last is not None and 0 <= r.now_ns - last < cooldown_ns


def test_plan_many_equals_plan_on_random_situations():
    rng = np.random.default_rng(5)
    twins = Twins()
    for k in range(30):
        # a changing population: sessions come and go, batch sizes vary
        n = int(rng.integers(1, 40))
        features = {f"car-{int(i)}": random_features(rng) for i in rng.choice(48, size=n, replace=False)}
        twins.step(features, k * PERIOD_NS)
    # the situations that need memory did occur (or the equality above would prove little)
    assert twins.seen["changes"] > 20 and twins.seen["mid_change"] > 20 and twins.seen["cooldown"] > 10


def test_plan_many_equals_plan_mid_lane_change():
    """Previous plans changing left or right, with the ego before and past the lane boundary."""
    rng = np.random.default_rng(11)
    requests = []
    for i in range(64):
        behaviour = ("change_left", "change_right")[i % 2]
        previous = Plan(
            f"p{i}", f"s{i}", 0, 10**9, "behaviour", behaviour, 25.0, 3.5 if behaviour == "change_left" else -3.5
        )
        x = random_features(rng)
        x[F["left_lane_exists"]] = x[F["right_lane_exists"]] = 1.0
        x[F["lane_offset"]] = np.float32(rng.uniform(-1.75, 1.75))  # either side of the boundary
        requests.append(PlanRequest(f"s{i}", x, PERIOD_NS, previous))
    got = BehaviourPlanner().plan_many(requests)
    assert_same(got, one_by_one(BehaviourPlanner(), requests))
    assert {p.behaviour for p in got} >= {"keep", "change_left", "change_right"}


def test_plan_many_equals_plan_with_cooldown_memory():
    """Sessions that changed lane recently (remembered by the planner) next to ones that did not."""
    rng = np.random.default_rng(3)
    batched, single = BehaviourPlanner(), BehaviourPlanner()
    for planner in (batched, single):
        for i in range(0, 96, 2):  # even sessions changed lane 1 s ago, odd ones never did
            planner._remember_change(f"s{i}", 0)
    requests = [PlanRequest(f"s{i}", random_features(rng), 10**9) for i in range(96)]
    assert_same(batched.plan_many(requests), one_by_one(single, requests))
    # and the memory does change the outcome: without it some even session plans differently
    fresh = BehaviourPlanner().plan_many(requests)
    assert any(a != b for a, b in zip(batched.plan_many(requests), fresh))


@pytest.mark.slow
@pytest.mark.parametrize(
    "names",
    [("cut_in", "dense_traffic", "slow_merge"), ("stopped_vehicle_ahead", "sensor_dropout", "unit_mismatch_kmh")],
)
def test_plan_many_equals_plan_in_simulated_traffic(names):
    """Feature vectors as the simulator's sensors report them while the expert drives, every 200 ms."""
    envs = {name: make_batch(name, [1, 2, 3]) for name in names}
    twins = Twins()
    for step in range(1200):  # 6 s of sim time
        if step % 40 == 0:
            features = {f"{name}-{b}": x for name, env in envs.items() for b, x in enumerate(env.observe()[0])}
            twins.step(features, step * 5_000_000)
        for env in envs.values():
            if not env.done:
                env.step(*env.expert_action())
    assert twins.seen["changes"] > 0


def test_a_nan_request_fails_alone():
    rng = np.random.default_rng(7)
    requests = [PlanRequest(f"s{i}", random_features(rng), 0) for i in range(8)]
    bad = requests[3].features.copy()
    bad[F["left_front_gap"]] = np.nan
    requests[3] = dataclasses.replace(requests[3], features=bad)
    inf = requests[6].features.copy()
    inf[F["ego_speed"]] = np.inf
    requests[6] = dataclasses.replace(requests[6], features=inf)
    got = BehaviourPlanner().plan_many(requests)
    for i in (3, 6):
        assert isinstance(got[i], ValueError) and "NaN or Inf" in str(got[i])
        with pytest.raises(ValueError, match="NaN or Inf"):
            BehaviourPlanner().plan(requests[i])
    assert_same(got, one_by_one(BehaviourPlanner(), requests))
    assert all(isinstance(got[i], Plan) for i in (0, 1, 2, 4, 5, 7))
    assert all(isinstance(p, ValueError) for p in BehaviourPlanner().plan_many(requests[3:4]))
    assert BehaviourPlanner().plan_many([]) == []


def test_a_session_twice_in_one_batch_is_planned_in_order():
    """The second request sees the memory the first one left, as with two plan() calls."""
    free_right = np.zeros(N_FEATURES, np.float32)
    free_right[F["ego_speed"]] = 25.0
    for gap, _ in _PAIRS:
        free_right[F[gap]] = SENSOR_RANGE_M
    free_right[F["left_lane_exists"]] = free_right[F["right_lane_exists"]] = 1.0
    # a lead 5 m/s slower 60 m ahead: either free lane gains, the right one is preferred
    free_right[F["lead_present"]], free_right[F["lead_distance"]], free_right[F["lead_rel_speed"]] = 1.0, 60.0, -5.0
    overtake = free_right.copy()  # a slow lead 30 m ahead and no right lane: overtake on the left
    overtake[F["lead_present"]], overtake[F["lead_distance"]], overtake[F["lead_rel_speed"]] = 1.0, 30.0, -10.0
    overtake[F["right_lane_exists"]] = 0.0
    requests = [
        PlanRequest("a", overtake, 0),
        PlanRequest("b", free_right, 0),
        PlanRequest("a", free_right, PERIOD_NS),
        PlanRequest("a", free_right, 2 * PERIOD_NS),
    ]
    got = BehaviourPlanner().plan_many(requests)
    assert_same(got, one_by_one(BehaviourPlanner(), requests))
    assert got[0].behaviour == "change_left" and got[1].behaviour == "change_right"
    # "a" would move right like "b" did, but its lane change earlier in the same batch holds it
    # (the hysteresis of the previous plan is not in play: these requests carry none)
    assert got[2].behaviour == got[3].behaviour == "keep"


def test_evaluate_is_the_batch_of_one():
    rng = np.random.default_rng(2)
    planner = BehaviourPlanner()
    x = random_features(rng)
    cands = planner.evaluate(x)
    per_lane = 1 + len(planner.params.speed_steps)  # "stop" and the ladder of target speeds
    assert (
        cands.lane.size
        == cands.cost.size
        == per_lane * (1 + int(x[F["left_lane_exists"]]) + int(x[F["right_lane_exists"]]))
    )
    p = planner.plan(PlanRequest("s", x, 0))
    assert p.target_speed in (0.0, float(cands.target_speed[cands.best]))
    with pytest.raises(ValueError, match="NaN or Inf"):
        planner.evaluate(np.full(N_FEATURES, np.nan))


def test_plan_values_are_make_plan():
    """Plan.values() builds the vector directly (the tick loop applies a batch of plans at once)."""
    from dualloop.sim.schema import BEHAVIOURS, make_plan

    for i, behaviour in enumerate(BEHAVIOURS):
        for speed, offset in ((0.0, 0.0), (12.345678, -3.5), (25.0, 3.5)):
            v = Plan("id", "s", 0, 1, "t", behaviour, speed, offset).values()
            expected = make_plan(speed, offset, i)
            assert v.dtype == expected.dtype and v.shape == expected.shape
            np.testing.assert_array_equal(v, expected)
