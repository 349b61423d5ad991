"""One lead reading failing while the lead brakes hard, in closed loop with the shipped model and both
gates (the closed-loop tests of the lead's stand-ins): the controller in this process, fed one feature
altered from an onset on, and a `lead_brakes_hard` drive with it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dualloop.controller.demo.closed_loop import ClosedLoopRun, InProcessDecider, run_closed_loop
from dualloop.controller.replay.lockstep import run_replay
from dualloop.executor.config import ExecutorConfig
from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Observation, Reason, Snapshot
from dualloop.sim.env import make_scenario
from dualloop.sim.schema import FEATURE_INDEX


def frozen(reading: float, first: float) -> float:
    """Stuck: the reading at the onset, bit for bit."""
    return first


def flipped(reading: float, first: float) -> float:
    """The sign flipped."""
    return -reading


def in_kmh(reading: float, first: float) -> float:
    """Read in km/h instead of m/s."""
    return reading * 3.6


class OneReading(InProcessDecider):
    """The controller in this process, fed `feature` as `fault` makes it from `onset_ns` on."""

    def __init__(
        self, executor: Executor, session_id: str, feature: str, onset_ns: int, fault: Callable[[float, float], float]
    ) -> None:
        super().__init__(executor, session_id)
        self.column, self.onset_ns, self.fault, self.first = FEATURE_INDEX[feature], onset_ns, fault, np.nan
        self.sent: list[Observation] = []  # what the controller was given, for a replay

    def decide(self, seq, timestamp_ns, features, plan_id, plan, actual=None):
        if timestamp_ns >= self.onset_ns:
            features = features.copy()
            self.first = features[self.column] if np.isnan(self.first) else self.first
            features[self.column] = self.fault(features[self.column], self.first)
        obs = Observation(seq=seq, timestamp_ns=timestamp_ns, features=features, plan_id=plan_id, plan_values=plan)
        if actual is not None:
            obs.actual_index, obs.actual_controls = actual
        self.sent.append(obs)
        return super().decide(seq, timestamp_ns, features, plan_id, plan, actual)


def drive_braking_lead(
    shipped: tuple[DecisionModel, list],
    feature: str,
    fault: Callable[[float, float], float],
    seed: int,
    offset_s: float,
    config: ExecutorConfig,
    sent: list[Observation] | None = None,
) -> ClosedLoopRun:
    """`lead_brakes_hard` with `feature` failed from the lead's own braking onset + `offset_s`."""
    model, gates = shipped
    env = make_scenario("lead_brakes_hard", seed)
    script = env.instance.world.script
    assert script is not None  # the scenario scripts the lead's braking
    brake_at = float(script.accel_start[0, 1])  # the lead's own braking starts
    onset_ns = int((brake_at + offset_s) * 1e9)
    decider = OneReading(Executor(model, config, gates), f"{fault.__name__}-{seed}", feature, onset_ns, fault)
    run = run_closed_loop(env, decider, seed)
    if sent is not None:
        sent += decider.sent
    return run


def replayed_both_ways(shipped: tuple[DecisionModel, list], sent: list[Observation]) -> list[Snapshot]:
    """A drive's observations replayed vectorised (which follows the lead's runs and trend over clean
    stretches in one step) and observation by observation (the live tick's path): asserts they apply
    the same commands with the same reasons and states on every tick; the reference's snapshots."""
    model, gates = shipped
    fast, reference = (
        run_replay(Executor(model, ExecutorConfig(), gates), "replayed", sent, fast=f)[0] for f in (True, False)
    )
    assert len(fast) == len(reference)
    for a, b in zip(fast, reference):
        assert a.applied.controls.tobytes() == b.applied.controls.tobytes(), a.tick
        assert (a.reasons, a.safety_state) == (b.reasons, b.safety_state), a.tick
    assert sum(Reason.THREAT_BRAKING in s.reasons for s in reference) > 50
    return reference
