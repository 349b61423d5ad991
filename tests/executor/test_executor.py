"""The executor in-process: batching, decision rules, reason codes, conflation, LOCKSTEP grid."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dualloop.controller.contract.wire import snapshot_to_proto
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.safety import SafetyConfig
from dualloop.executor.sessions import InvalidObservation, SessionError
from dualloop.executor.snapshot import Clock, Observation, Reason, SafetyState

MS = 1_000_000


def features(rng: np.random.Generator, n: int = 19) -> np.ndarray:
    x = rng.normal(0, 1, n).astype(np.float32)
    x[0] = 20 + 5 * x[0]
    return x


def obs(seq: int, x: np.ndarray, ts: int = 0) -> Observation:
    return Observation(seq=seq, timestamp_ns=ts, features=x)


def test_batch_equals_one_by_one(test_model):
    rng = np.random.default_rng(1)
    inputs = {f"s{i}": features(rng) for i in range(8)}
    batched = Executor(test_model)
    for sid in inputs:
        batched.open_session(sid, include_decision_vector=True)
    together = {s.session_id: s for s in batched.step({k: obs(1, v) for k, v in inputs.items()}, now_ns=0)}
    assert len(together) == 8
    for sid, x in inputs.items():
        alone = Executor(test_model)
        alone.open_session(sid, include_decision_vector=True)
        (single,) = alone.step({sid: obs(1, x)}, now_ns=0)
        both = together[sid]
        assert single.proposed_index == both.proposed_index
        np.testing.assert_allclose(single.probabilities, both.probabilities, rtol=0, atol=1e-6)
        np.testing.assert_allclose(single.proposed_controls, both.proposed_controls, rtol=0, atol=1e-6)
        np.testing.assert_allclose(single.decision_vector, both.decision_vector, rtol=0, atol=1e-5)
        assert single.input_hash == both.input_hash


def test_snapshot_content(test_model):
    ex = Executor(test_model)
    ex.open_session("a")
    (s,) = ex.step({"a": obs(7, features(np.random.default_rng(2)))}, now_ns=1000)
    assert s.observation_seq == 7 and s.model_version == test_model.card.version
    assert s.probabilities.shape == (4,) and abs(float(s.probabilities.sum()) - 1) < 1e-5
    assert s.confidence == pytest.approx(float(s.probabilities.max()))
    top2 = np.sort(s.probabilities)[-2:]
    assert s.margin == pytest.approx(float(top2[1] - top2[0]), abs=1e-6)
    lo = np.array([c.min for c in test_model.card.controls])
    hi = np.array([c.max for c in test_model.card.controls])
    assert np.all(s.proposed_controls >= lo) and np.all(s.proposed_controls <= hi)
    assert s.decision_vector is None  # not asked for


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_input_holds_last_valid_action(test_model, bad):
    rng = np.random.default_rng(3)
    # without the lane keeper's steering bound, the hold is exactly the last valid action
    ex = Executor(test_model, ExecutorConfig(min_margin=0.0, safety=SafetyConfig(lane_keeping=None)))
    ex.open_session("a")
    (good,) = ex.step({"a": obs(1, features(rng))}, now_ns=0)
    assert good.reasons == () and good.safety_state is SafetyState.NOMINAL
    x = features(rng)
    x[4] = bad
    (held,) = ex.step({"a": obs(2, x)}, now_ns=5 * MS)
    assert Reason.INVALID_INPUT in held.reasons
    assert held.applied.index == good.applied.index
    np.testing.assert_array_equal(held.applied.controls, good.applied.controls)
    assert np.all(np.isfinite(held.applied.controls)) and held.proposed_index == -1


def test_non_finite_first_input_applies_safe_default(test_model):
    ex = Executor(test_model)
    ex.open_session("a")
    x = np.full(19, np.nan, np.float32)
    (s,) = ex.step({"a": obs(1, x)}, now_ns=0)
    assert set(s.reasons) == {Reason.INVALID_INPUT, Reason.SAFE_DEFAULT}
    safe = np.array(test_model.card.safe_action.controls, np.float32)
    # the safe action's steering; its braking entered at the jerk limit from nothing applied before
    step = ex.config.safety.jerk_limit * ex.period_ns / 1e9
    assert s.applied.controls[1] == safe[1] and s.applied.controls[0] == pytest.approx(-step)
    assert s.applied.name == "keep"  # the band of what was applied, not the safe action's name


def test_low_margin_abstains(test_model):
    rng = np.random.default_rng(4)
    ex = Executor(test_model, ExecutorConfig(min_margin=0.0))
    ex.open_session("a")
    (first,) = ex.step({"a": obs(1, features(rng))}, now_ns=0)
    ex.config = ExecutorConfig(min_margin=1.0)  # nothing can clear this margin
    (second,) = ex.step({"a": obs(2, features(rng))}, now_ns=5 * MS)
    assert Reason.LOW_MARGIN in second.reasons and second.proposed_index >= 0
    assert second.applied.index == first.applied.index


def test_stale_observation_is_judged_against_the_declared_period(test_model):
    ex = Executor(test_model, ExecutorConfig(max_observation_age_ms=15))
    ex.open_session("a", observation_period_ns=10 * MS)  # a 100 Hz sensor
    ex.step({"a": obs(1, features(np.random.default_rng(5)))}, now_ns=0)
    ticks = {}
    for k in range(1, 7):
        (s,) = ex.tick(k * 5 * MS)
        ticks[s.observation_age_ns] = s
    assert all(s.observation_held and s.observation_period_ns == 10 * MS for s in ticks.values())
    assert Reason.STALE_OBSERVATION not in ticks[25 * MS].reasons  # period 10 + allowance 15
    assert Reason.STALE_OBSERVATION in ticks[30 * MS].reasons


def test_period_is_measured_when_not_declared(test_model):
    ex = Executor(test_model, ExecutorConfig(max_observation_age_ms=15, assumed_observation_period_ms=100))
    ex.open_session("a")
    rng = np.random.default_rng(5)
    (first,) = ex.step({"a": obs(1, features(rng), ts=0)}, now_ns=0)
    assert first.observation_period_ns == 100 * MS and not first.observation_held  # assumed until measured
    # a 20 Hz sensor: one interval of 50 ms measures the period
    (s,) = ex.step({"a": obs(2, features(rng), ts=50 * MS)}, now_ns=50 * MS)
    assert s.observation_period_ns == 50 * MS
    late = [ex.tick(t * MS)[0] for t in range(55, 125, 5)]
    stale = [s.observation_age_ns for s in late if Reason.STALE_OBSERVATION in s.reasons]
    assert min(stale) == 70 * MS  # older than 50 + 15 ms
    # one lost observation (a double interval) does not move the median of the recent intervals
    for k, ts in enumerate((100, 150, 200, 300, 350), start=3):
        (s,) = ex.step({"a": obs(k, features(rng), ts=ts * MS)}, now_ns=ts * MS)
    assert s.observation_period_ns == 50 * MS


def test_late_observation_holds_and_the_next_fresh_one_blends_back_without_a_dwell(test_model):
    ex = Executor(test_model, ExecutorConfig(max_observation_age_ms=15, min_margin=0.0))
    ex.open_session("a", observation_period_ns=100 * MS)  # 10 Hz
    rng = np.random.default_rng(8)
    states = []
    x = features(rng)
    for k in range(16):  # 10 Hz observations at 4 m/s, one 60 ms late; from it on the scene stands still
        t_obs = k * 100 * MS + (60 * MS if k == 3 else 0)
        x = features(rng) if k < 3 else x
        x[0] = 4.0  # slow: the recovery turns the wheel back faster than the keeper may
        (s,) = ex.step({"a": obs(k + 1, x, ts=t_obs)}, now_ns=t_obs)
        states.append((t_obs // MS, s.safety_state, Reason.STALE_OBSERVATION in s.reasons, s.applied))
        for t in range(t_obs + 5 * MS, (k + 1) * 100 * MS + (60 * MS if k == 2 else 0), 5 * MS):
            (s,) = ex.tick(t)
            states.append((t // MS, s.safety_state, Reason.STALE_OBSERVATION in s.reasons, s.applied))
    held = [(t, st) for t, st, stale, _ in states if stale]
    assert held and all(st is SafetyState.VETO_HOLD for _, st in held), "a late observation holds"
    assert held[0][0] == 320  # the third observation (t=200 ms) is late after 115 ms
    # no dwell after lateness: the model's command is blended in at the jerk limit (its steering
    # at the lane keeper's rate) from the first fresh tick (t=365), and NOMINAL returns once both meet
    after = [(st, a) for t, st, _, a in states if t > 360]
    step = ex.config.safety.jerk_limit * 0.005
    blend = [st for st, _ in after].index(SafetyState.NOMINAL)
    assert all(st is SafetyState.RECOVERING for st, _ in after[:blend])
    assert all(st is SafetyState.NOMINAL for st, _ in after[blend:]), "no recovery dwell after lateness"
    first_nominal = [t for t, st, _, _ in states if t > 360 and st is SafetyState.NOMINAL][0]
    applied = np.array([a.controls for t, _, _, a in states if 315 <= t <= first_nominal], np.float64)
    assert np.all(np.abs(np.diff(applied[:, 0])) <= step)
    # the steering returns at the lateral jerk's rate at 4 m/s (faster than the keeper's 0.2 rad/s)
    lk = ex.config.safety.lane_keeping
    assert lk is not None
    steer_step = max(lk.max_steer_rate, lk.max_lateral_jerk * lk.wheelbase_m / 4.0**2) * 0.005
    blended = np.array([a.controls[1] for t, _, _, a in states if 355 <= t <= first_nominal], np.float64)
    assert np.abs(np.diff(blended)).max() == pytest.approx(steer_step, rel=1e-4)
    # the hold applied the last action from before the lateness
    before = [a for t, st, stale, a in states if t < 320][-1]
    assert all(a.controls[0] == before.controls[0] for _, st, stale, a in states if stale)  # steer: bounded


def test_lateness_past_the_hold_timeout_is_a_lost_sensor(test_model):
    ex = Executor(test_model, ExecutorConfig(max_observation_age_ms=15, safety=SafetyConfig(hold_timeout_ms=300)))
    ex.open_session("a", observation_period_ns=100 * MS)
    ex.step({"a": obs(1, features(np.random.default_rng(9)))}, now_ns=0)
    states = {t: ex.tick(t * MS)[0].safety_state for t in range(5, 600, 5)}
    assert states[110] is SafetyState.NOMINAL and states[120] is SafetyState.VETO_HOLD
    assert states[420] is SafetyState.FALLBACK_ACTIVE


def test_sensor_profile_masks_missing_features(test_model):
    ex = Executor(test_model)
    names = test_model.card.feature_names
    ex.open_session("five", provided_features=names[:5])
    ex.open_session("all")
    x = features(np.random.default_rng(3))
    x_missing = x.copy()
    x_missing[5:] = np.nan
    snaps = {s.session_id: s for s in ex.step({"five": obs(1, x_missing), "all": obs(1, x_missing)}, now_ns=0)}
    assert Reason.INVALID_INPUT not in snaps["five"].reasons and snaps["five"].proposed_index >= 0
    assert Reason.INVALID_INPUT in snaps["all"].reasons  # NaN in a measured feature is invalid
    bad = x_missing.copy()
    bad[0] = np.nan
    snaps = {s.session_id: s for s in ex.step({"five": obs(2, bad)}, now_ns=5 * MS)}
    assert Reason.INVALID_INPUT in snaps["five"].reasons
    with pytest.raises(SessionError, match="provided_features names 'speed'"):
        ex.open_session("typo", provided_features=["speed"])
    # a name given twice is a list built wrongly: refused, naming it, rather than guessed at
    with pytest.raises(SessionError, match=f"provided_features names '{names[0]}' more than once"):
        ex.open_session("twice", provided_features=[names[0], names[1], names[0]])
    assert sorted(ex.sessions) == ["all", "five"]


def test_model_error_degrades_without_nan(test_model):
    ex = Executor(test_model)
    session = ex.open_session("a")
    ex.step({"a": obs(1, features(np.random.default_rng(6)))}, now_ns=0)
    # a broken plan makes the forward pass produce NaN (set past the checks that refuse it on the wire)
    ex.set_plan("a", np.full(session.plan.shape, np.nan, np.float32), "broken", 0)
    (s,) = ex.step({"a": obs(2, features(np.random.default_rng(7)))}, now_ns=5 * MS)
    assert Reason.MODEL_ERROR in s.reasons
    assert np.all(np.isfinite(s.applied.controls))
    assert ex.stats.model_errors == 1


def test_conflation_keeps_newest_and_counts(test_model):
    rng = np.random.default_rng(8)
    ex = Executor(test_model)
    ex.open_session("a")
    ex.submit("a", obs(1, features(rng)))
    ex.submit("a", obs(2, features(rng)))
    ex.submit("a", obs(3, features(rng)))
    (s,) = ex.tick(0)
    assert s.observation_seq == 3 and s.observations_dropped == 2


def test_observation_contract_errors(test_model):
    ex = Executor(test_model)
    ex.open_session("a")
    with pytest.raises(InvalidObservation, match="Observation.features has 18 values; expected 19"):
        ex.submit("a", obs(1, np.zeros(18, np.float32)))
    # in process, a list of the right length (found by QA: an AttributeError from inside the executor)
    with pytest.raises(InvalidObservation, match="has 19 values in a list, not a numpy array; expected 19"):
        ex.submit("a", obs(1, [0.0] * 19))  # type: ignore[arg-type]
    ex.submit("a", obs(5, np.zeros(19, np.float32)))
    with pytest.raises(InvalidObservation, match="not after the previous seq 5"):
        ex.submit("a", obs(5, np.zeros(19, np.float32)))
    with pytest.raises(SessionError, match="already open"):
        ex.open_session("a")
    with pytest.raises(SessionError, match="no open session"):
        ex.submit("b", obs(1, np.zeros(19, np.float32)))


def test_lockstep_grid(test_model):
    rng = np.random.default_rng(9)
    ex = Executor(test_model)
    ex.open_session("a", clock=Clock.LOCKSTEP)
    t0 = 1_000 * MS
    first = ex.advance_lockstep("a", obs(1, features(rng), t0))
    assert [(s.tick, s.observation_age_ns) for s in first] == [(0, 0)]
    later = ex.advance_lockstep("a", obs(2, features(rng), t0 + 10 * MS))
    # the tick between the two observations uses the older one, 5 ms old
    assert [(s.tick, s.observation_seq, s.observation_age_ns) for s in later] == [(1, 1, 5 * MS), (2, 2, 0)]
    off_grid = ex.advance_lockstep("a", obs(3, features(rng), t0 + 12 * MS))
    assert off_grid == []  # its tick is at 15 ms, due when time reaches it
    nxt = ex.advance_lockstep("a", obs(4, features(rng), t0 + 15 * MS))
    assert [(s.tick, s.observation_seq) for s in nxt] == [(3, 4)]
    assert nxt[0].observations_dropped == 1  # seq 3 was never used by a tick
    with pytest.raises(InvalidObservation, match="LOCKSTEP time must strictly increase"):
        ex.advance_lockstep("a", obs(5, features(rng), t0 + 15 * MS))
    with pytest.raises(InvalidObservation, match="lockstep_max_gap_s"):
        ex.advance_lockstep("a", obs(6, features(rng), t0 + 60_000 * MS))


@pytest.mark.parametrize("previous_ns", [5 * MS, 7 * MS], ids=["previous-on-the-grid", "previous-off-the-grid"])
def test_lockstep_gap_limit_is_measured_from_the_previous_observation(test_model, previous_ns):
    """docs/contract.md: an observation more than lockstep_max_gap_s (10 s) after the previous one is
    refused, measured from that observation's timestamp (not from the next grid tick), and the
    message gives that jump. 10 s is accepted, 10 s + 1 ns is not, on the grid or off it."""
    rng = np.random.default_rng(5)
    for gap, refused in ((10_000 * MS, False), (10_000 * MS + 1, True), (10_005 * MS - 1, True), (10_005 * MS, True)):
        ex = Executor(test_model)
        ex.open_session("a", clock=Clock.LOCKSTEP)
        ex.advance_lockstep("a", obs(1, features(rng), 0))
        ex.advance_lockstep("a", obs(2, features(rng), previous_ns))
        if not refused:
            ticks = ex.advance_lockstep("a", obs(3, features(rng), previous_ns + gap))
            assert len(ticks) <= ex.max_lockstep_ticks == 2000
            continue
        with pytest.raises(InvalidObservation) as err:
            ex.advance_lockstep("a", obs(3, features(rng), previous_ns + gap))
        assert str(err.value) == (
            f"observation seq 3 jumps {gap / 1e9:.9f} s past the previous one's timestamp; LOCKSTEP refuses "
            "jumps over lockstep_max_gap_s=10.0 s (SessionLimits.lockstep_max_gap_ns = 10000000000)"
        )


def test_realtime_sessions_do_not_tick_lockstep_ones(test_model):
    ex = Executor(test_model)
    ex.open_session("rt")
    ex.open_session("ls", clock=Clock.LOCKSTEP)
    ex.advance_lockstep("ls", obs(1, np.zeros(19, np.float32), 0))
    snaps = ex.step({"rt": obs(1, np.zeros(19, np.float32))}, now_ns=0)
    assert [s.session_id for s in snaps] == ["rt"]


def test_client_plan_conditions_from_its_timestamp(test_model):
    rng = np.random.default_rng(10)
    ex = Executor(test_model)
    ex.open_session("a", clock=Clock.LOCKSTEP)
    x = features(rng)
    (base,) = ex.advance_lockstep("a", obs(1, x, 0))
    assert base.plan_id == ""
    plan = np.array([10.0, 3.5, 0, 1, 0, 0], np.float32)
    later = ex.advance_lockstep(
        "a", Observation(seq=2, timestamp_ns=10 * MS, features=x, plan_id="p1", plan_values=plan)
    )
    assert [(s.plan_id, s.plan_age_ns) for s in later] == [("", 0), ("p1", 0)]
    assert later[0].input_hash == base.input_hash  # same features, old plan
    assert later[1].input_hash != base.input_hash  # the plan is part of the input
    (aged,) = ex.advance_lockstep("a", obs(3, x, 15 * MS))
    assert aged.plan_id == "p1" and aged.plan_age_ns == 5 * MS
    with pytest.raises(InvalidObservation, match="Observation.plan.values \\(plan 'bad'\\) has 2 values; expected 6"):
        ex.advance_lockstep(
            "a",
            Observation(seq=4, timestamp_ns=20 * MS, features=x, plan_id="bad", plan_values=np.zeros(2, np.float32)),
        )
    # a non-finite plan is a content error: not adopted (p1 stays), the tick says INVALID_INPUT, the
    # session goes on
    nan_plan = np.full(6, np.nan, np.float32)
    (bad,) = ex.advance_lockstep(
        "a", Observation(seq=5, timestamp_ns=20 * MS, features=x, plan_id="nan", plan_values=nan_plan)
    )
    assert bad.plan_id == "p1" and Reason.INVALID_INPUT in bad.reasons and bad.invalid_input == ("plan",)
    assert bad.input_hash == aged.input_hash  # the same features and the same (kept) plan
    (after,) = ex.advance_lockstep("a", obs(6, x, 25 * MS))
    assert after.plan_id == "p1" and after.invalid_input == () and np.array_equal(ex.sessions["a"].plan, plan)


def test_input_hashes_are_per_row_and_see_every_bit():
    from dualloop.executor.snapshot import input_hashes

    rng = np.random.default_rng(5)
    x, p = rng.normal(size=(64, 19)).astype(np.float32), rng.normal(size=(64, 4)).astype(np.float32)
    h = input_hashes(x, p)
    assert len(set(h.tolist())) == 64
    assert all(input_hashes(x[i : i + 1], p[i : i + 1])[0] == h[i] for i in range(64))  # batch size does not matter
    for j in range(23):  # one ulp anywhere in the features or the plan changes the hash
        x2, p2 = x.copy(), p.copy()
        target = x2 if j < 19 else p2
        target[7, j % 19 if j < 19 else j - 19] = np.nextafter(
            target[7, j % 19 if j < 19 else j - 19], np.float32(np.inf)
        )
        assert input_hashes(x2, p2)[7] != h[7]


def test_order_rules_and_time_accounting(test_model):
    """seq 0 is refused by the live and the vectorised LOCKSTEP paths alike; REALTIME time may stand
    still, not go back; a REALTIME snapshot counts the grid ticks its session skipped, and carries
    the transport delay when its observation said when it was sent."""
    from dualloop.executor.lockstep_batch import run_lockstep

    rng = np.random.default_rng(10)
    ex = Executor(test_model)
    ex.open_session("ls", clock=Clock.LOCKSTEP)
    with pytest.raises(InvalidObservation, match="observation seq 0: seq starts at 1"):
        ex.advance_lockstep("ls", obs(0, features(rng)))
    ex.open_session("batch", clock=Clock.LOCKSTEP)
    with pytest.raises(InvalidObservation, match="observation seq 0: seq starts at 1"):
        run_lockstep(ex, "batch", [obs(0, features(rng)), obs(1, features(rng), 5 * MS)])

    ex.open_session("rt")
    ex.submit("rt", obs(1, features(rng), 100 * MS))
    ex.submit("rt", obs(2, features(rng), 100 * MS))
    with pytest.raises(InvalidObservation, match=r"timestamp 99000000 ns, before the previous observation's \(seq 2\)"):
        ex.submit("rt", obs(3, features(rng), 99 * MS))
    (first,) = ex.tick(0, tick_index=7)
    (after_gap,) = ex.tick(20 * MS, tick_index=11)
    assert first.ticks_missed_since_previous == 0 and after_gap.ticks_missed_since_previous == 3
    assert first.transport_delay_ns is None and first.observation_age_with_transport_ns is None
    sent = Observation(seq=4, timestamp_ns=200 * MS, features=features(rng), arrival_ns=21 * MS)
    sent.sent_time_ns, sent.received_wall_ns = 1_000 * MS, 1_030 * MS
    ex.submit("rt", sent)
    (snap,) = ex.tick(25 * MS, tick_index=12)
    assert snap.transport_delay_ns == 30 * MS and snap.observation_age_ns == 4 * MS
    assert snap.observation_age_with_transport_ns == 34 * MS


def test_a_session_that_overflows_the_model_does_not_cost_the_others_their_tick(base_model):
    """One batch for every session: a row whose finite but huge input overflows the model is that
    session's MODEL_ERROR only; the other rows are proposed as a batch of their own would be, and no
    snapshot carries a decision vector of the failed row (found by tests/fuzz: the whole tick was
    MODEL_ERROR)."""
    rng = np.random.default_rng(7)
    clean = features(rng)
    ex = Executor(base_model, ExecutorConfig())
    ex.open_session("clean", Clock.REALTIME)
    ex.open_session("huge", Clock.REALTIME, include_decision_vector=True)
    now = 1_000_000_000
    with warnings.catch_warnings():  # reported in the snapshot, not as numpy's overflow warning on stderr
        warnings.simplefilter("error", RuntimeWarning)
        snaps = {s.session_id: s for s in ex.step({"clean": obs(1, clean), "huge": obs(1, np.full(19, 3e37))}, now)}
    alone = Executor(base_model, ExecutorConfig())
    alone.open_session("clean", Clock.REALTIME)
    (reference,) = alone.step({"clean": obs(1, clean)}, now)
    assert Reason.MODEL_ERROR in snaps["huge"].reasons and snaps["huge"].decision_vector is None
    assert Reason.MODEL_ERROR not in snaps["clean"].reasons
    assert snaps["clean"].proposed_index == reference.proposed_index >= 0
    np.testing.assert_allclose(snaps["clean"].probabilities, reference.probabilities, atol=1e-6)


def test_a_sent_time_at_int64s_edge_gives_a_saturated_transport_delay(test_model):
    """sent_time_ns = -2**63 (a broken client clock): the delay and the age with it are sent saturated
    at int64's limit, not overflowed (found by tests/fuzz)."""
    ex = Executor(test_model)
    ex.open_session("s", Clock.REALTIME)
    o = obs(1, features(np.random.default_rng(3)))
    o.sent_time_ns, o.received_wall_ns = -(2**63), 1_700_000_000_000_000_000
    (snap,) = ex.step({"s": o}, now_ns=0)
    assert snap.transport_delay_ns == snap.observation_age_with_transport_ns == 2**63 - 1
    message = snapshot_to_proto(snap)
    assert message.transport_delay_ns == 2**63 - 1


def test_a_replay_stacks_observation_features_as_np_stack_does() -> None:
    """`lockstep_batch._stacked_features` (np.array) against np.stack(...).astype(float32): the same
    bytes for float32 and float64 features, NaN, -0.0, one observation; ragged shapes refused by both."""
    from dualloop.executor.lockstep_batch import _stacked_features

    rng = np.random.default_rng(0)
    for n, dtype in ((1, np.float32), (7, np.float64), (500, np.float32)):
        rows = rng.normal(0, 1e3, (n, 5)).astype(dtype)
        rows[rng.random((n, 5)) < 0.1] = np.nan
        rows[0, 0] = -0.0
        obs = [Observation(seq=i + 1, timestamp_ns=i, features=r.copy()) for i, r in enumerate(rows)]
        assert _stacked_features(obs).tobytes() == np.stack([o.features for o in obs]).astype(np.float32).tobytes()
    ragged = [
        Observation(seq=1, timestamp_ns=0, features=np.zeros(5)),
        Observation(seq=2, timestamp_ns=1, features=np.zeros(4)),
    ]
    with pytest.raises(ValueError):
        np.stack([o.features for o in ragged])
    with pytest.raises(ValueError):
        _stacked_features(ragged)


def _plans_one_by_one(ex: Executor, observations: list[Observation]) -> tuple:
    """`lockstep_batch._plans`' definition, observation by observation (as `Executor.set_plan`)."""
    n = len(observations)
    values = np.empty((n, ex.model.n_plan), np.float32)
    ids: list[str] = []
    created, valid_for, has = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, bool)
    current, plan_id, since, validity, any_plan = ex.plan_default, "", 0, 0, False
    for i, o in enumerate(observations):
        if o.plan_values is not None and not (o.plan_id and o.plan_id == plan_id):
            current, plan_id, any_plan = o.plan_values, o.plan_id, True
            since, validity = o.plan_created_ns or o.timestamp_ns, o.plan_valid_for_ns or ex.reasons.max_plan_age_ns
        values[i] = current
        ids.append(plan_id)
        created[i], valid_for[i], has[i] = since, validity, any_plan
    return values, ids, created, valid_for, has


@pytest.mark.parametrize("seed", range(4))
def test_a_replay_follows_the_plan_in_force_as_set_plan_does(test_model, seed: int) -> None:
    """Plans now and then, repeated ids (no change), empty ids (always a change), no creation time or
    validity (defaults), float64 values; no plan at all, a plan on the first observation, one observation."""
    from dualloop.executor.lockstep_batch import _plans

    ex = Executor(test_model)
    rng = np.random.default_rng(seed)
    n_plan = ex.model.n_plan
    for n in (1, 2, 300):
        obs = []
        for i in range(n):
            o = Observation(seq=i + 1, timestamp_ns=1000 * i, features=np.zeros(ex.model.n_features, np.float32))
            if rng.random() < (0.0 if seed == 0 else 0.1) or (seed == 3 and i == 0):
                o.plan_values = rng.normal(size=n_plan).astype(np.float64 if seed == 2 else np.float32)
                o.plan_id = str(rng.choice(["", "a", "b"]))
                o.plan_created_ns = int(rng.choice([0, max(0, 1000 * i - 500)]))
                o.plan_valid_for_ns = int(rng.choice([0, 10_000]))
            obs.append(o)
        got, ref = _plans(ex, obs), _plans_one_by_one(ex, obs)
        assert got[1] == ref[1]
        for a, b in zip(got[:1] + got[2:], ref[:1] + ref[2:]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
