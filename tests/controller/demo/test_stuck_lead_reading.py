"""A lead braking hard while one of the ego's lead readings sticks (the gap or the relative speed
repeats bit for bit, the other stays healthy), in closed loop with the shipped model and both gates:
what reaches the actuators. A QA pass found the fallback meeting it at 3 m/s^2 and the car hitting the
lead; the threat assessor now reads the healthy one and what it says of the stuck one
(executor/stuck_lead.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.demo.closed_loop import InProcessDecider, run_closed_loop
from dualloop.controller.replay.lockstep import run_replay
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Observation, Reason
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim.env import make_scenario
from dualloop.sim.schema import FEATURE_INDEX
from dualloop.v2 import controller_pb2 as pb


class StuckReading(InProcessDecider):
    """The controller in this process, fed one feature frozen at its reading at `onset_ns`."""

    def __init__(self, executor: Executor, session_id: str, feature: str, onset_ns: int) -> None:
        super().__init__(executor, session_id)
        self.column, self.onset_ns, self.held = FEATURE_INDEX[feature], onset_ns, np.nan

        self.sent: list[Observation] = []  # what the controller was given, for a replay

    def decide(self, seq, timestamp_ns, features, plan_id, plan, actual=None):  # type: ignore[no-untyped-def]
        if timestamp_ns >= self.onset_ns:
            features = features.copy()
            self.held = features[self.column] if np.isnan(self.held) else self.held
            features[self.column] = self.held
        obs = Observation(seq=seq, timestamp_ns=timestamp_ns, features=features, plan_id=plan_id, plan_values=plan)
        if actual is not None:
            obs.actual_index, obs.actual_controls = actual
        self.sent.append(obs)
        return super().decide(seq, timestamp_ns, features, plan_id, plan, actual)


@pytest.fixture(scope="module")
def shipped() -> tuple[DecisionModel, list]:
    model = DecisionModel(BASE_MODEL_PATH)
    return model, [load_gate_for_model(g, model) for g in DEFAULT_GATES]


def _drive(shipped, feature: str, seed: int, config: ExecutorConfig, sent: list | None = None):  # type: ignore[no-untyped-def]
    model, gates = shipped
    env = make_scenario("lead_brakes_hard", seed)
    brake_at = float(env.instance.world.script.accel_start[0, 1])  # the lead's own braking starts
    decider = StuckReading(Executor(model, config, gates), f"stuck-{seed}", feature, int(brake_at * 1e9))
    run = run_closed_loop(env, decider, seed)
    if sent is not None:
        sent += decider.sent
    return run


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
    model, gates = shipped
    fast, reference = (
        run_replay(Executor(model, ExecutorConfig(), gates), "replayed", sent, fast=f)[0] for f in (True, False)
    )
    assert sum(Reason.THREAT_BRAKING in s.reasons for s in reference) > 50
    assert len(fast) == len(reference)
    for a, b in zip(fast, reference):
        assert a.applied.controls.tobytes() == b.applied.controls.tobytes(), a.tick
        assert (a.reasons, a.safety_state) == (b.reasons, b.safety_state), a.tick
