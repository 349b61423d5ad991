"""A lead braking hard while the ego's gap sensor sticks (its reading repeats bit for bit, the
relative speed stays healthy), in closed loop with the shipped model and both gates: what reaches the
actuators. A QA pass found the fallback meeting it at 3 m/s^2 and the car hitting the lead; the threat
assessor now reckons the stuck gap from the relative speed (executor/threat.py)."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.demo.closed_loop import InProcessDecider, run_closed_loop
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim.env import make_scenario
from dualloop.sim.schema import FEATURE_INDEX
from dualloop.v2 import controller_pb2 as pb

GAP = FEATURE_INDEX["lead_distance"]


class StuckGap(InProcessDecider):
    """The controller in this process, fed lead_distance frozen at its reading at `onset_ns`."""

    def __init__(self, executor: Executor, session_id: str, onset_ns: int) -> None:
        super().__init__(executor, session_id)
        self.onset_ns, self.held = onset_ns, np.nan

    def decide(self, seq, timestamp_ns, features, plan_id, plan, actual=None):  # type: ignore[no-untyped-def]
        if timestamp_ns >= self.onset_ns:
            features = features.copy()
            self.held = features[GAP] if np.isnan(self.held) else self.held
            features[GAP] = self.held
        return super().decide(seq, timestamp_ns, features, plan_id, plan, actual)


@pytest.fixture(scope="module")
def shipped() -> tuple[DecisionModel, list]:
    model = DecisionModel(BASE_MODEL_PATH)
    return model, [load_gate_for_model(g, model) for g in DEFAULT_GATES]


def _drive(shipped, seed: int, config: ExecutorConfig):  # type: ignore[no-untyped-def]
    model, gates = shipped
    env = make_scenario("lead_brakes_hard", seed)
    brake_at = float(env.instance.world.script.accel_start[0, 1])  # the lead's own braking starts
    decider = StuckGap(Executor(model, config, gates), f"stuck-gap-{seed}", int(brake_at * 1e9))
    return run_closed_loop(env, decider, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [104, 108])
def test_a_lead_braking_behind_a_stuck_gap_is_braked_for(shipped, seed: int) -> None:
    run = _drive(shipped, seed, ExecutorConfig())
    assert run.metrics.collisions == 0
    assert run.ticks_with(pb.REASON_CODE_THREAT_BRAKING) > 50
    assert run.metrics.min_lead_gap_m > 1.0  # the assessor aims at 2 m; it reacts after the gap_repeat veto


@pytest.mark.slow
def test_without_the_reckoned_gap_the_car_hits_the_lead(shipped) -> None:
    """The same drive with reckoning switched off: what the rule prevents, so the test above can fail."""
    config = ExecutorConfig.model_validate({"safety": {"threat": {"stuck_gap_reckon_s": 0.0}}})
    run = _drive(shipped, 104, config)
    assert run.metrics.collisions == 1
    assert run.ticks_with(pb.REASON_CODE_THREAT_BRAKING) == 0
