"""The behaviour planner's compiled rollout (planner/_rollout.c, chosen by planner.compiled) gives the
numpy path's bits, which stays the reference: the same Candidates (cost, feasible, end speed, least
gap, blocked and every cost term) and the same plans, on random features, features from simulated
drives, sessions with 1, 2 or 3 lanes, mid lane change, stopped, with no leader, above hold_above,
beside a car that may cut in, in batches of 1 to 100, and over sequences of periods where the previous
plan and the lane-change memory matter. The comparison itself is shown to fail on a one-ulp
difference. And where a C compiler exists, the module must have built and be in use, so a bench never
measures the fallback without saying so."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest

from dualloop.controller.bench.plan_cost import bench_features, compare_paths, planner_pair, simulated_features
from dualloop.planner import compiled as planner_compiled
from dualloop.planner.behaviour import BehaviourPlanner, Candidates, _Outcome
from dualloop.planner.plan import Plan, PlanRequest
from dualloop.sim.schema import FEATURE_INDEX, N_FEATURES, SENSOR_RANGE_M
from tests.planner.test_batch import _PAIRS, random_features

F = FEATURE_INDEX
PERIOD_NS = 200_000_000
needs_compiled = pytest.mark.skipif(
    not planner_compiled.available(), reason="planner._rollout did not build (no C compiler)"
)


def _planners() -> tuple[BehaviourPlanner, BehaviourPlanner]:
    """(compiled, numpy)"""
    fast, reference = planner_pair()
    assert fast.is_compiled and not reference.is_compiled
    return fast, reference


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.view(np.int64) if a.dtype == np.float64 else a


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(_bits(a), _bits(b))


def _differences(a: Candidates, b: Candidates) -> list[str]:
    """The fields and cost terms of two candidate tables that differ in any bit."""
    out = [
        f
        for f in ("lane", "target_speed", "cost", "feasible", "end_speed", "min_gap", "blocked")
        if not _same(getattr(a, f), getattr(b, f))
    ]
    if a.terms.keys() != b.terms.keys():
        return [*out, "terms' names"]
    return out + [f"terms[{k!r}]" for k in a.terms if not _same(a.terms[k], b.terms[k])]


def _outcome_differences(a: _Outcome, b: _Outcome) -> list[str]:
    return [f for f in a.__dataclass_fields__ if not _same(getattr(a, f), getattr(b, f))]


def _compare(
    fast: BehaviourPlanner, reference: BehaviourPlanner, requests: Sequence[PlanRequest]
) -> list[Plan | Exception]:
    """Evaluates and plans the batch on both paths: every bit the same; the compiled path's plans."""
    x = np.stack([np.asarray(r.features, dtype=np.float64) for r in requests])
    good = [i for i, p in enumerate(reference._problems(x)) if not p]
    if good:
        x, batch = x[good], [requests[i] for i in good]
        _, got = fast._evaluate(x, batch)
        _, want = reference._evaluate(x, batch)
        assert _differences(got, want) == []
        sit = reference._situation(x)
        traffic = reference._traffic(sit, reference._columns(sit))
        assert _outcome_differences(fast._outcome_compiled(traffic), reference._outcome(traffic)) == []
    plans, reference_plans = fast.plan_many(requests), reference.plan_many(requests)
    assert len(plans) == len(reference_plans)
    for p, q in zip(plans, reference_plans):
        assert p == q if isinstance(q, Plan) else (type(p) is type(q) and str(p) == str(q))
    assert fast._last_change_ns == reference._last_change_ns
    return plans


def _free_road(v: float = 25.0, left: bool = True, right: bool = True) -> np.ndarray:
    x = np.zeros(N_FEATURES, np.float32)
    x[F["ego_speed"]] = v
    for gap, _ in _PAIRS:
        x[F[gap]] = SENSOR_RANGE_M
    x[F["left_lane_exists"]], x[F["right_lane_exists"]] = float(left), float(right)
    return x


def _situations(rng: np.random.Generator) -> list[np.ndarray]:
    """Hand-made corner cases, each with random traffic around it."""
    out = []
    for lanes in ((False, False), (True, False), (False, True), (True, True)):  # 1, 2 and 3 lanes
        x = random_features(rng)
        x[F["left_lane_exists"]], x[F["right_lane_exists"]] = lanes
        out.append(x)
    for v in (0.0, -0.0, -0.4, 0.5, 2.9):  # stopped or crawling (below min_change_speed)
        x = random_features(rng)
        x[F["ego_speed"]] = v
        out.append(x)
    stopped_behind = random_features(rng)  # stopped 2.5 m behind a stopped car
    stopped_behind[F["ego_speed"]], stopped_behind[F["lead_distance"]], stopped_behind[F["lead_rel_speed"]] = 0, 2.5, 0
    out.append(stopped_behind)
    touching = random_features(rng)  # a leader at 0 m: every candidate collides
    touching[F["lead_distance"]] = 0.0
    out.append(touching)
    for v in (31.5, 40.0, 69.9):  # above hold_above (up to max_speed)
        x = random_features(rng)
        x[F["ego_speed"]] = v
        out.append(x)
    out.append(_free_road())  # no leader anywhere
    out.append(_free_road(right=False))
    for side in ("left", "right"):  # a slower car close ahead in the next lane: may cut in
        x = _free_road(25.0)
        x[F[f"{side}_front_gap"]], x[F[f"{side}_front_rel_speed"]] = rng.uniform(5.0, 40.0), rng.uniform(-15.0, -1.0)
        out.append(x)
    both_sides = _free_road(20.0)
    both_sides[F["left_front_gap"]], both_sides[F["left_front_rel_speed"]] = 12.0, -6.0
    both_sides[F["right_front_gap"]], both_sides[F["right_front_rel_speed"]] = 30.0, -3.0
    out.append(both_sides)
    close_rear = random_features(rng)  # a fast follower close behind in both next lanes
    close_rear[F["left_rear_gap"]], close_rear[F["left_rear_rel_speed"]] = 4.0, 8.0
    close_rear[F["right_rear_gap"]], close_rear[F["right_rear_rel_speed"]] = 20.0, 12.0
    out.append(close_rear)
    curve = random_features(rng)  # a sharp curve: a low cruise speed
    curve[F["road_curvature"]] = 0.05
    out.append(curve)
    return out


@pytest.fixture(scope="module")
def simulated() -> np.ndarray:
    """Feature vectors as the simulator's sensors report them while the expert drives, every 200 ms."""
    return simulated_features(seeds=(4, 5))


def test_the_compiled_module_is_built_and_in_use_where_a_compiler_exists(c_compiler: str | None) -> None:
    if c_compiler is None:
        pytest.skip("no C compiler here: the numpy path is the one installed")
    if os.environ.get("DUALLOOP_PLANNER_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("DUALLOOP_PLANNER_PURE_PYTHON asks for the numpy path")
    assert planner_compiled.available(), (
        "a C compiler exists but planner._rollout did not build: reinstall (pip install -e .)"
    )
    assert BehaviourPlanner().is_compiled
    before = planner_compiled.use_compiled(False)
    try:
        assert not BehaviourPlanner().is_compiled
    finally:
        planner_compiled.use_compiled(before)
    assert BehaviourPlanner().is_compiled


@needs_compiled
def test_the_environment_variable_asks_for_the_numpy_path() -> None:
    code = "from dualloop.planner.behaviour import BehaviourPlanner; print(BehaviourPlanner().is_compiled)"
    env = {**os.environ, "DUALLOOP_PLANNER_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@needs_compiled
@pytest.mark.parametrize("size", [1, 7, 32, 100])
def test_compiled_equals_numpy_on_random_features(size: int) -> None:
    rng = np.random.default_rng(size)
    fast, reference = _planners()
    for k in range(max(3, 200 // size)):
        features = [bench_features(rng) if i % 2 else random_features(rng) for i in range(size)]
        _compare(fast, reference, [PlanRequest(f"s{i}", x, k * PERIOD_NS) for i, x in enumerate(features)])


@needs_compiled
def test_compiled_equals_numpy_on_corner_cases() -> None:
    rng = np.random.default_rng(1)
    fast, reference = _planners()
    for k in range(10):
        cases = _situations(rng)
        _compare(fast, reference, [PlanRequest(f"s{i}", x, k * PERIOD_NS) for i, x in enumerate(cases)])
        for x in cases:  # alone, too
            _compare(fast, reference, [PlanRequest("alone", x, k * PERIOD_NS)])


@needs_compiled
def test_compiled_equals_numpy_mid_lane_change() -> None:
    """Previous plans changing left or right, the ego either side of the lane boundary, some of the
    sessions remembered as having changed lane just before (the cooldown)."""
    rng = np.random.default_rng(11)
    fast, reference = _planners()
    for planner_ in (fast, reference):
        for i in range(0, 64, 3):
            planner_._remember_change(f"s{i}", 0)
    requests = []
    for i in range(64):
        behaviour = ("change_left", "change_right", "keep", "stop")[i % 4]
        offset = {"change_left": 3.5, "change_right": -3.5}.get(behaviour, 0.0)
        previous = Plan(f"p{i}", f"s{i}", 0, 10**9, "behaviour", behaviour, float(rng.uniform(0.0, 30.0)), offset)
        x = random_features(rng)
        x[F["left_lane_exists"]] = x[F["right_lane_exists"]] = 1.0
        x[F["lane_offset"]] = np.float32(rng.uniform(-1.75, 1.75))
        requests.append(PlanRequest(f"s{i}", x, PERIOD_NS, previous))
    plans = _compare(fast, reference, requests)
    assert {p.behaviour for p in plans if isinstance(p, Plan)} >= {"keep", "change_left", "change_right"}


@needs_compiled
@pytest.mark.parametrize("size", [1, 7, 32, 100])
def test_compiled_equals_numpy_on_simulated_features(simulated: np.ndarray, size: int) -> None:
    rng = np.random.default_rng(100 + size)
    fast, reference = _planners()
    for k in range(max(3, 300 // size)):
        rows = rng.choice(len(simulated), size=size)
        _compare(fast, reference, [PlanRequest(f"s{i}", simulated[r], k * PERIOD_NS) for i, r in enumerate(rows)])


@needs_compiled
def test_compiled_equals_numpy_over_periods() -> None:
    """A changing population planned every period, each session's request carrying its previous plan
    (the compiled path's, which must be the numpy path's): lane changes start, go on and end."""
    rng = np.random.default_rng(5)
    fast, reference = _planners()
    previous: dict[str, Plan] = {}
    changes = mid_change = 0
    for k in range(60):
        n = int(rng.integers(1, 48))
        requests = []
        for i in rng.choice(64, size=n, replace=False):
            s = f"car-{int(i)}"
            x = random_features(rng) if i % 3 else bench_features(rng)
            requests.append(PlanRequest(s, x, k * PERIOD_NS, previous.get(s)))
            mid_change += s in previous and previous[s].behaviour.startswith("change_")
        for r, p in zip(requests, _compare(fast, reference, requests)):
            if isinstance(p, Plan):
                previous[r.session_id] = p
                changes += p.behaviour.startswith("change_")
    assert changes > 20 and mid_change > 20


@needs_compiled
def test_compiled_equals_numpy_for_other_params() -> None:
    """The constants reach the C code: a shorter horizon, a longer lane change, other gaps."""
    import dataclasses

    from dualloop.planner.behaviour import BehaviourParams

    params = dataclasses.replace(
        BehaviourParams(),
        horizon_s=4.0,
        lane_change_s=5.0,
        min_gap=3.0,
        time_gap=1.2,
        merge_time_gap=0.6,
        b_max=6.0,
        rear_min_gap=8.0,
        cut_in_min_gap_m=3.0,
    )
    before = planner_compiled.use_compiled(True)
    fast = BehaviourPlanner(params)
    planner_compiled.use_compiled(False)
    reference = BehaviourPlanner(params)
    planner_compiled.use_compiled(before)
    rng = np.random.default_rng(9)
    for k in range(10):
        features = [random_features(rng) for _ in range(20)] + _situations(rng)
        _compare(fast, reference, [PlanRequest(f"s{i}", x, k * PERIOD_NS) for i, x in enumerate(features)])


@needs_compiled
@pytest.mark.parametrize("where", ["cost", "term", "v0", "side_v"])
def test_the_comparison_fails_on_a_one_ulp_difference(where: str) -> None:
    rng = np.random.default_rng(3)
    fast, reference = _planners()
    x = np.stack([random_features(rng).astype(np.float64) for _ in range(16)])
    requests = [PlanRequest(f"s{i}", x[i], 0) for i in range(16)]
    if where in ("cost", "term"):
        _, got = fast._evaluate(x, requests)
        _, want = reference._evaluate(x, requests)
        assert _differences(got, want) == []
        j = int(rng.integers(got.cost.size))
        if where == "cost":
            got.cost[j] = np.nextafter(got.cost[j], np.inf)
            assert _differences(got, want) == ["cost"]
        else:
            got.terms["headway"][j] = np.nextafter(got.terms["headway"][j], np.inf)
            assert _differences(got, want) == ["terms['headway']"]
        return
    # a one-ulp change of one column's input shows in the compiled outcome
    sit = fast._situation(x)
    traffic = fast._traffic(sit, fast._columns(sit))
    want = fast._outcome_compiled(traffic)
    assert _outcome_differences(want, reference._outcome(traffic)) == []
    if where == "v0":
        traffic.v0[3] = np.nextafter(traffic.v0[3], np.inf)
    else:
        # a car that may cut in, with a risk below the cap of 1: its speed, one ulp up
        j = int(np.argmax(np.where(want.cut_in < 1.0, want.cut_in, 0.0)))
        assert 0.0 < want.cut_in[j] < 1.0, "no car that may cut in: pick another seed"
        side = 0 if traffic.near[0][j] else 1
        traffic.side_v[side][j] = np.nextafter(traffic.side_v[side][j], np.inf)
    differences = _outcome_differences(fast._outcome_compiled(traffic), want)
    assert differences == ["cut_in"] if where == "side_v" else len(differences) > 3


@needs_compiled
def test_the_module_refuses_what_it_cannot_read() -> None:
    fast, _ = _planners()
    x = np.stack([random_features(np.random.default_rng(0)).astype(np.float64)])
    sit = fast._situation(x)
    tr = fast._traffic(sit, fast._columns(sit))
    module = fast._compiled
    args = [
        fast._constants,
        fast._t,
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
    ]
    out = np.empty((_Outcome.ROWS, tr.v0.size))
    module.outcome(*args, out)
    with pytest.raises(TypeError):
        module.outcome(*args)  # no out
    with pytest.raises(TypeError, match="float64"):
        module.outcome(*args[:3], tr.target.astype(np.float32), *args[4:], out)
    with pytest.raises(TypeError, match="bool"):
        module.outcome(*args[:4], tr.changing.astype(np.float64), *args[5:], out)
    with pytest.raises(ValueError, match="items"):
        module.outcome(*args[:5], tr.cruise[:-1], *args[6:], out)
    with pytest.raises(ValueError, match="items"):
        module.outcome(*args, out[:, :-1].copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        module.outcome(*args[:6], tr.own_gap.repeat(2)[::2], *args[7:], out)
    with pytest.raises(ValueError, match="C-contiguous"):
        module.outcome(*args, np.empty((tr.v0.size, _Outcome.ROWS)).T)


@pytest.mark.slow
@needs_compiled
def test_the_cost_bench_compares_both_paths_on_the_same_batches() -> None:
    result = compare_paths(sizes=(3,), batches=6, warmup=1, seeds=(1,))
    row = result["batch_3"]
    for path in ("compiled", "numpy"):
        assert 0.0 < row[path]["p50_us"] <= row[path]["p99_us"]
    assert row["ratio_p50"] == row["numpy"]["p50_us"] / row["compiled"]["p50_us"]
