"""The one plan rule (docs/contract.md#plans): no plan, an expired plan and a repeated plan id, the
same in the live LOCKSTEP tick, the vectorised replay (lockstep_batch) and REALTIME."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dualloop.controller.contract.wire import observation_from_proto
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import REAL_DRIVE
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.sessions import InvalidObservation
from dualloop.executor.snapshot import Clock, Observation, PlanState, Reason, Snapshot

MS = 1_000_000
T0 = 1_000_000_000  # sensor time of the first observation
PERIOD = 7 * MS  # off the 5 ms tick grid: held ticks between observations, and some dropped
PLAN_A = np.array([20.0, 0.0, 1, 0, 0, 0], np.float32)
PLAN_B = np.array([10.0, 0.5, 0, 1, 0, 0], np.float32)
CONFIG = ExecutorConfig(max_plan_age_ms=300.0)


@pytest.fixture(scope="module")
def drive() -> list[Observation]:
    """200 real observations (1.4 s at 7 ms): the comma2k19 fixture's features."""
    data = read_log(REAL_DRIVE)
    return [
        replace(observation_from_proto(m, 0), seq=k + 1, timestamp_ns=T0 + k * PERIOD)
        for k, m in enumerate(data.observations[:200])
    ]


def with_plans(observations: list[Observation]) -> list[Observation]:
    """No plan for the first 40 observations (280 ms); plan "a" valid 200 ms; "a" again (other values,
    a long validity: ignored); a gap in which "a" expires; "b" made 50 ms before the observation that
    carries it, with the default validity (300 ms), which then expires too."""
    out = [replace(o) for o in observations]
    for k, plan_id, values, valid_for, created in (
        (40, "a", PLAN_A, 200 * MS, 0),
        (60, "a", PLAN_B, 10_000 * MS, 0),
        (100, "b", PLAN_B, 0, T0 + 100 * PERIOD - 50 * MS),
    ):
        out[k] = replace(
            out[k], plan_id=plan_id, plan_values=values, plan_valid_for_ns=valid_for, plan_created_ns=created
        )
    return out


def live(model: DecisionModel, observations: list[Observation], require_plan: bool) -> list[Snapshot]:
    ex = Executor(model, CONFIG)
    ex.open_session("s", Clock.LOCKSTEP, require_plan=require_plan)
    return [snap for obs in observations for snap in ex.advance_lockstep("s", obs)]


def batch(model: DecisionModel, observations: list[Observation], require_plan: bool) -> list[Snapshot]:
    ex = Executor(model, CONFIG)
    ex.open_session("s", Clock.LOCKSTEP, require_plan=require_plan)
    return run_lockstep(ex, "s", observations).snapshots()


def plan_view(s: Snapshot) -> tuple:
    return (s.tick, s.observation_seq, s.plan_id, s.plan_state, s.plan_age_ns, s.plan_valid_for_ns, s.reasons)


def by_observation(snaps: list[Snapshot]) -> dict[int, Snapshot]:
    """The fresh tick of each observation (the one that first used it)."""
    return {s.observation_seq: s for s in snaps if not s.observation_held}


@pytest.mark.parametrize("require_plan", [False, True])
def test_live_and_batch_agree_on_every_plan_case(base_model, drive, require_plan: bool) -> None:
    observations = with_plans(drive)
    plain, fast = live(base_model, observations, require_plan), batch(base_model, observations, require_plan)
    assert [plan_view(s) for s in fast] == [plan_view(s) for s in plain]
    assert [(s.applied.index, s.safety_state, s.input_hash) for s in fast] == [
        (s.applied.index, s.safety_state, s.input_hash) for s in plain
    ]
    fresh = by_observation(plain)
    ts = {o.seq: o.timestamp_ns for o in observations}

    def state(seq: int) -> PlanState:
        return fresh[seq].plan_state

    # no plan yet: NONE from the first tick; STALE_PLAN only when the session requires plans
    before = [k for k in range(1, 41) if k in fresh]
    assert all(state(k) is PlanState.NONE and fresh[k].plan_id == "" for k in before)
    assert all((Reason.STALE_PLAN in fresh[k].reasons) is require_plan for k in before)
    # "a": valid while its age (observation timestamps) is at most 200 ms, through the repeat
    a_created = ts[41]
    for k in (k for k in range(41, 101) if k in fresh):
        age = ts[k] - a_created
        assert fresh[k].plan_id == "a" and fresh[k].plan_age_ns == age and fresh[k].plan_valid_for_ns == 200 * MS
        assert state(k) is (PlanState.VALID if age <= 200 * MS else PlanState.EXPIRED), k
        assert (Reason.STALE_PLAN in fresh[k].reasons) is (require_plan and age > 200 * MS)
    # the repeated id changed nothing: same plan input as before it (hash over features and plan)
    assert state(61) is PlanState.VALID
    # "b": created 50 ms before its observation, the default validity
    assert fresh[101].plan_id == "b" and fresh[101].plan_age_ns == 50 * MS
    assert fresh[101].plan_valid_for_ns == CONFIG.max_plan_age_ms * MS and state(101) is PlanState.VALID
    b_created = ts[101] - 50 * MS
    for k in range(101, 201):
        if k in fresh:
            assert state(k) is (PlanState.VALID if ts[k] - b_created <= 300 * MS else PlanState.EXPIRED), k
    assert state(max(fresh)) is PlanState.EXPIRED
    if not require_plan:  # no valid plan: no reason, no veto from the plan
        assert not any(Reason.STALE_PLAN in s.reasons for s in plain)


def test_a_repeated_plan_id_neither_replaces_values_nor_extends_validity(base_model, drive) -> None:
    observations = with_plans(drive)
    without_repeat = [replace(o, plan_id="", plan_values=None) if o.seq == 61 else o for o in observations]
    a, b = live(base_model, observations, False), live(base_model, without_repeat, False)
    assert [(plan_view(x), x.input_hash) for x in a] == [(plan_view(y), y.input_hash) for y in b]
    assert any(s.plan_state is PlanState.EXPIRED and s.plan_id == "a" for s in a)


def test_an_expired_plan_is_the_no_plan_default_without_require_plan(base_model, drive) -> None:
    """Without require_plan, ticks past a plan's validity see exactly what a plan-less session sees."""
    observations = with_plans(drive)
    never = [replace(o, plan_id="", plan_values=None) for o in observations]
    with_plan, plan_less = (
        by_observation(live(base_model, observations, False)),
        by_observation(live(base_model, never, False)),
    )
    expired = [k for k, s in with_plan.items() if s.plan_state is PlanState.EXPIRED]
    assert expired
    for k in expired:
        assert with_plan[k].input_hash == plan_less[k].input_hash
        assert with_plan[k].proposed_index == plan_less[k].proposed_index
        assert plan_less[k].plan_state is PlanState.NONE


@pytest.mark.parametrize("require_plan", [False, True])
def test_realtime_and_lockstep_judge_plans_by_the_same_timestamps(base_model, drive, require_plan: bool) -> None:
    """REALTIME ticks on the server's clock, here one far from the sensor's: plan age is sensor time in
    both clocks, so each observation gets the same plan state, age and STALE_PLAN verdict."""
    observations = with_plans(drive)
    lockstep = by_observation(live(base_model, observations, require_plan))
    ex = Executor(base_model, CONFIG)
    ex.open_session("rt", Clock.REALTIME, require_plan=require_plan)
    server_ns = 987_654_321_000_000  # unrelated to the sensor clock
    realtime: dict[int, Snapshot] = {}
    for k, obs in enumerate(observations):
        now = server_ns + k * 5 * MS + (k % 3) * MS  # jitter: it must not matter
        (snap,) = ex.step({"rt": replace(obs, arrival_ns=now)}, now)
        realtime[obs.seq] = snap
    seen = set()
    for seq, rt in realtime.items():
        if seq not in lockstep:  # an off-grid observation no LOCKSTEP tick used
            continue
        ls = lockstep[seq]
        assert (rt.plan_id, rt.plan_state, rt.plan_age_ns, rt.plan_valid_for_ns) == (
            ls.plan_id,
            ls.plan_state,
            ls.plan_age_ns,
            ls.plan_valid_for_ns,
        ), seq
        assert (Reason.STALE_PLAN in rt.reasons) == (Reason.STALE_PLAN in ls.reasons), seq
        seen.add(rt.plan_state)
    assert seen == {PlanState.NONE, PlanState.VALID, PlanState.EXPIRED}


def test_plans_with_invalid_timing_are_refused(base_model, drive) -> None:
    ex = Executor(base_model, CONFIG)
    ex.open_session("s", Clock.LOCKSTEP)
    first = drive[0]
    with pytest.raises(InvalidObservation, match="valid_for_ns -1"):
        ex.advance_lockstep("s", replace(first, plan_id="p", plan_values=PLAN_A, plan_valid_for_ns=-1))
    with pytest.raises(InvalidObservation, match="created_ns .* after the observation's timestamp_ns"):
        ex.advance_lockstep(
            "s", replace(first, plan_id="p", plan_values=PLAN_A, plan_created_ns=first.timestamp_ns + 1)
        )
    ex2 = Executor(base_model, CONFIG)  # the replay refuses with the same message
    ex2.open_session("s", Clock.LOCKSTEP)
    bad = [replace(o) for o in drive[:5]]
    bad[3] = replace(bad[3], plan_id="p", plan_values=PLAN_A, plan_valid_for_ns=-5)
    with pytest.raises(InvalidObservation, match="valid_for_ns -5"):
        run_lockstep(ex2, "s", bad)


def test_created_ns_0_means_the_observations_timestamp_also_before_sensor_time_0(base_model, drive) -> None:
    """Sensor time may be negative (a clock whose epoch is later): created_ns 0 still stands for the
    observation's own timestamp, live and in the vectorised replay (found by tests/fuzz)."""
    early = [replace(o, timestamp_ns=o.timestamp_ns - 10 * T0) for o in drive[:6]]
    early[2] = replace(early[2], plan_id="p", plan_values=PLAN_A)
    assert early[2].timestamp_ns < 0 and early[2].plan_created_ns == 0
    live = Executor(base_model, CONFIG)
    live.open_session("s", Clock.LOCKSTEP)
    snaps = [snap for o in early for snap in live.advance_lockstep("s", o)]
    replay = Executor(base_model, CONFIG)
    replay.open_session("s", Clock.LOCKSTEP)
    replayed = run_lockstep(replay, "s", early).snapshots()
    for snaps_of in (snaps, replayed):
        planned = [s for s in snaps_of if s.observation_seq >= early[2].seq]
        assert planned and all(s.plan_id == "p" and s.plan_state == PlanState.VALID for s in planned)
        assert planned[0].plan_age_ns == 0


def test_a_plan_created_at_int64s_minimum_is_expired_not_an_overflow(base_model, drive) -> None:
    """created_ns = -2**63: its age is beyond int64; saturated, the plan is expired, live and replayed
    alike (found by tests/fuzz: the live tick raised OverflowError, the replay's int64 age wrapped
    round to 0 and called the plan valid)."""
    first = replace(drive[0], plan_id="p", plan_values=PLAN_A, plan_created_ns=-(2**63))
    observations = [first, *drive[1:4]]
    live = Executor(base_model, CONFIG)
    live.open_session("s", Clock.LOCKSTEP)
    snaps = [snap for o in observations for snap in live.advance_lockstep("s", o)]
    replay = Executor(base_model, CONFIG)
    replay.open_session("s", Clock.LOCKSTEP)
    replayed = run_lockstep(replay, "s", observations).snapshots()
    for run in (snaps, replayed):
        assert run and all(s.plan_state == PlanState.EXPIRED and s.plan_age_ns == 2**63 - 1 for s in run)
