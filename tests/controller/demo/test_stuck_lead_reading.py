"""A lead braking hard while one of the ego's lead readings sticks (the gap or the relative speed
repeats bit for bit, the other stays healthy), in closed loop with the shipped model and both gates:
what reaches the actuators. A QA pass found the fallback meeting it at 3 m/s^2 and the car hitting the
lead; the threat assessor now reads the healthy one and what it says of the stuck one
(executor/stuck_lead.py)."""

from __future__ import annotations

import pytest

from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Observation
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.v2 import controller_pb2 as pb
from tests.controller.demo.one_reading import drive_braking_lead, frozen, replayed_both_ways


@pytest.fixture(scope="module")
def shipped() -> tuple[DecisionModel, list]:
    model = DecisionModel(BASE_MODEL_PATH)
    return model, [load_gate_for_model(g, model) for g in DEFAULT_GATES]


def _drive(shipped, feature: str, seed: int, config: ExecutorConfig, sent: list | None = None):  # type: ignore[no-untyped-def]
    return drive_braking_lead(shipped, feature, frozen, seed, 0.0, config, sent)


CASES = [("lead_distance", 104), ("lead_distance", 108), ("lead_rel_speed", 107)]


@pytest.mark.slow
@pytest.mark.parametrize(("feature", "seed"), CASES)
def test_a_lead_braking_behind_a_stuck_reading_is_braked_for(shipped, feature: str, seed: int) -> None:
    run = _drive(shipped, feature, seed, ExecutorConfig())
    assert run.metrics.collisions == 0
    assert run.ticks_with(pb.REASON_CODE_THREAT_BRAKING) > 50
    assert run.metrics.min_lead_gap_m > 1.0  # the assessor aims at 2 m; it reacts after the gap_repeat veto


@pytest.mark.slow
@pytest.mark.parametrize(("feature", "seed"), [CASES[0], CASES[2]])
def test_without_the_stand_in_the_car_hits_the_lead(shipped, feature: str, seed: int) -> None:
    """The same drives with a stuck reading doubting the whole lead: what the rule prevents, so the
    test above can fail."""
    config = ExecutorConfig.model_validate({"safety": {"threat": {"stuck_stand_in": False}}})
    run = _drive(shipped, feature, seed, config)
    assert run.metrics.collisions == 1
    assert run.ticks_with(pb.REASON_CODE_THREAT_BRAKING) == 0


@pytest.mark.slow
@pytest.mark.parametrize(("feature", "seed"), [CASES[0], CASES[2]])
def test_the_replay_stands_in_for_a_stuck_reading_as_the_live_tick_does(shipped, feature: str, seed: int) -> None:
    """The drive's observations replayed: the vectorised replay, which follows the runs of repeated
    readings over clean stretches in one step, brakes for the threat on the same ticks and applies
    the same commands as the observation-by-observation reference (the live tick's path)."""
    sent: list[Observation] = []
    _drive(shipped, feature, seed, ExecutorConfig(), sent)
    replayed_both_ways(shipped, sent)
