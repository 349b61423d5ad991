"""The plan of a session without a valid plan (executor.default_plan): the card's plan_default, its
target speed raised to the newest measured ego speed for a card that says so; the same in the live
tick, the vectorised replay, a candidate beside a live model of the other rule, and training rows."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dualloop.controller.training.driving_card import build_test_model
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.default_plan import DefaultPlan
from dualloop.executor.lockstep_batch import run_lockstep
from dualloop.executor.model_card import ModelCard, ModelFileError, Normalisation, parse_card
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Check, Clock, Observation, PlanState, Snapshot
from dualloop.models import DEFAULT_GATES
from dualloop.ood.gatefile import load_gate
from dualloop.sim import schema

MS = 1_000_000
SPEED = schema.FEATURE_INDEX["ego_speed"]
TARGET = schema.PLAN_INDEX["target_speed"]
KEEP_SPEED = {"target_speed": "ego_speed"}


@pytest.fixture(scope="module")
def keep_speed_model(tmp_path_factory: pytest.TempPathFactory) -> DecisionModel:
    path = tmp_path_factory.mktemp("default_plan") / "keep_speed.onnx"
    build_test_model(path, plan_default_at_least=KEEP_SPEED)
    return DecisionModel(path)


def motorway(n: int = 120, plan_from: int | None = 60) -> list[Observation]:
    """A drive from 20 to 40 m/s at 10 ms; a plan (target 30 m/s, valid 200 ms) from observation
    `plan_from` on, which then expires."""
    rng = np.random.default_rng(3)
    out = []
    for k in range(n):
        x = np.zeros(schema.N_FEATURES, np.float32)
        x[SPEED] = 20.0 + 20.0 * k / n
        x[schema.FEATURE_INDEX["lead_present"]] = 1.0
        x[schema.FEATURE_INDEX["lead_distance"]] = 40.0 + rng.normal(0, 0.5)
        x[schema.FEATURE_INDEX["lead_rel_speed"]] = rng.normal(0, 0.2)
        obs = Observation(seq=k + 1, timestamp_ns=10 * MS * (k + 1), features=x)
        if k == plan_from:
            plan = schema.make_plan(30.0, 0.0, 0)
            obs = replace(obs, plan_id="p", plan_values=plan, plan_valid_for_ns=200 * MS)
        out.append(obs)
    return out


def expected_decision_vector(model: DecisionModel, obs: Observation, plan: np.ndarray) -> np.ndarray:
    norm = Normalisation.of(model.card)
    xn, pn, _ = norm.apply(obs.features[None].copy(), plan[None].astype(np.float32).copy())
    return model.forward(xn, pn, None).decision_vector[0]


def test_rows_raise_the_target_to_the_measured_ego_speed_never_below_the_default() -> None:
    rule = DefaultPlan.named(schema.no_plan(), schema.PLAN_NAMES, schema.FEATURE_NAMES, KEEP_SPEED)
    x = np.zeros((5, schema.N_FEATURES), np.float32)
    x[:, SPEED] = [37.0, np.nan, 41.0, 12.0, 0.0]
    present = np.ones_like(x, bool)
    present[2, SPEED] = False  # the profile does not measure it: whatever the client sent means nothing
    rows = rule.rows(x, present)
    default = schema.NO_PLAN_TARGET_SPEED
    # below 25 m/s the target stays 25: near standstill it must not look like a stop plan's 0 m/s
    assert rows[:, TARGET].tolist() == [37.0, default, default, default, default]
    others = np.delete(rows, TARGET, axis=1)
    assert (others == np.delete(schema.no_plan(), TARGET)).all()
    fixed = DefaultPlan.named(schema.no_plan(), schema.PLAN_NAMES, schema.FEATURE_NAMES, {})
    assert fixed.fixed and (fixed.rows(x) == schema.no_plan()).all()
    # training rows of drives without a plan are these rows
    assert (schema.no_plan_rows(x, present) == rows).all()


def test_a_card_naming_an_unknown_plan_field_or_feature_is_refused(keep_speed_model: DecisionModel) -> None:
    raw = keep_speed_model.card.model_dump()
    for bad in ({"target_speed": "speed"}, {"cruise": "ego_speed"}):
        with pytest.raises(ValueError, match="plan_default_at_least"):
            ModelCard.model_validate(raw | {"plan_default_at_least": bad})
    with pytest.raises(ModelFileError, match="m.onnx: invalid .* plan_default_at_least"):
        parse_card(json.dumps(raw | {"plan_default_at_least": {"x": "y"}}), "m.onnx")


def test_cards_without_the_field_are_written_and_hashed_as_before(test_model: DecisionModel) -> None:
    assert test_model.card.plan_default_at_least == {} and "plan_default_at_least" not in test_model.card.to_json()
    assert DefaultPlan.of(test_model.card).fixed


def test_a_session_without_a_plan_decides_with_the_target_raised_to_its_speed(keep_speed_model: DecisionModel) -> None:
    ex = Executor(keep_speed_model, ExecutorConfig(max_plan_age_ms=300.0))
    ex.open_session("s", Clock.LOCKSTEP, include_decision_vector=True)
    drive = motorway()
    fresh = {}
    for obs in drive:
        for snap in ex.advance_lockstep("s", obs):
            if not snap.observation_held:
                fresh[snap.observation_seq] = snap
    by_seq = {o.seq: o for o in drive}
    checked = {PlanState.NONE: 0, PlanState.VALID: 0, PlanState.EXPIRED: 0}
    for seq, snap in fresh.items():
        obs = by_seq[seq]
        if snap.plan_state is PlanState.VALID:
            plan = schema.make_plan(30.0, 0.0, 0)
        else:  # none yet, or expired: never slower than the speed it drives at
            plan = schema.no_plan()
            plan[TARGET] = max(obs.features[SPEED], schema.NO_PLAN_TARGET_SPEED)
        assert snap.decision_vector is not None
        assert np.array_equal(snap.decision_vector, expected_decision_vector(keep_speed_model, obs, plan)), seq
        checked[snap.plan_state] += 1
    assert min(checked.values()) > 0, checked


def test_live_and_vectorised_replay_agree(keep_speed_model: DecisionModel, test_model: DecisionModel) -> None:
    drive = motorway()
    live_ex = Executor(keep_speed_model, ExecutorConfig(max_plan_age_ms=300.0))
    live_ex.open_session("s", Clock.LOCKSTEP)
    live = [snap for obs in drive for snap in live_ex.advance_lockstep("s", obs)]
    batch_ex = Executor(keep_speed_model, ExecutorConfig(max_plan_age_ms=300.0))
    batch_ex.open_session("s", Clock.LOCKSTEP)
    fast = run_lockstep(batch_ex, "s", drive).snapshots()

    def view(s: Snapshot) -> tuple:
        return (s.tick, s.plan_state, s.input_hash, s.proposed_index, s.confidence, s.applied.index)

    assert [view(s) for s in fast] == [view(s) for s in live]
    # the rule changed what the model saw: the same weights with a fixed default plan (the test model)
    # decide on other plans without a valid plan, and on the same ones with it
    fixed_ex = Executor(test_model, ExecutorConfig(max_plan_age_ms=300.0))
    fixed_ex.open_session("s", Clock.LOCKSTEP)
    fixed = [snap for obs in drive for snap in fixed_ex.advance_lockstep("s", obs)]
    speed = {o.seq: float(o.features[SPEED]) for o in drive}
    no_plan = [i for i, s in enumerate(live) if s.plan_state is not PlanState.VALID]
    differ = [live[i].input_hash != fixed[i].input_hash for i in no_plan]
    # ... where the speed is above the fixed default's 25 m/s
    assert differ == [speed[live[i].observation_seq] > schema.NO_PLAN_TARGET_SPEED for i in no_plan]
    assert 0 < sum(differ) < len(no_plan)
    valid = [i for i, s in enumerate(live) if s.plan_state is PlanState.VALID]
    assert valid and all(live[i].input_hash == fixed[i].input_hash for i in valid)


def test_a_candidate_decides_with_its_own_default_plan(
    keep_speed_model: DecisionModel, test_model: DecisionModel
) -> None:
    """The live model reads "no plan" as a fixed 25 m/s, the candidate as "never slower than now": the
    candidate's proposals are those it makes as the live model."""
    drive = motorway(plan_from=None)
    alone = Executor(keep_speed_model, ExecutorConfig())
    alone.open_session("s", Clock.LOCKSTEP)
    own = [s for obs in drive for s in alone.advance_lockstep("s", obs)]
    beside = Executor(test_model, ExecutorConfig())
    beside.candidate = beside.prepare_candidate(keep_speed_model, [])
    beside.open_session("s", Clock.LOCKSTEP)
    shadowed = [s for obs in drive for s in beside.advance_lockstep("s", obs)]
    assert [s.candidate.index for s in shadowed] == [s.proposed_index for s in own]
    assert [s.candidate.confidence for s in shadowed] == [s.confidence for s in own]


def test_the_range_checks_judge_the_raised_plan_live_and_in_the_replay(keep_speed_model: DecisionModel) -> None:
    # the shipped input gate's plan range ends at 38 m/s; the drive without a plan reaches 40
    gate = load_gate(str(DEFAULT_GATES[1]))
    drive = motorway(plan_from=None)
    config = ExecutorConfig(max_plan_age_ms=300.0)
    live_ex = Executor(keep_speed_model, config, gate=[gate])
    live_ex.open_session("s", Clock.LOCKSTEP)
    live = [snap for obs in drive for snap in live_ex.advance_lockstep("s", obs)]
    batch_ex = Executor(keep_speed_model, config, gate=[gate])
    batch_ex.open_session("s", Clock.LOCKSTEP)
    fast = run_lockstep(batch_ex, "s", drive).snapshots()
    at = list(live[0].check_kinds).index(Check.PLAN_RANGE)
    assert [s.checks.tobytes() for s in fast] == [s.checks.tobytes() for s in live]
    speed = {o.seq: float(o.features[SPEED]) for o in drive}
    above = [speed[s.observation_seq] > gate.feature_range.context_high[TARGET] for s in live]
    assert 0 < sum(above) < len(live)
    assert [bool(s.checks[at]["veto"]) for s in fast] == above
