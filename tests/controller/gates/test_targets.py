"""The sim targets `dualloop gate eval` checks: AUROC where each fault is observable, false vetoes."""

from __future__ import annotations

import numpy as np

from dualloop.controller.gates.evaluation import JUDGED_ON, separation, targets
from dualloop.controller.gates.scores import ScenarioScores
from dualloop.sim.scenarios import OOD_SCENARIOS, SCENARIOS


def _result(auroc: dict[str, tuple[float, str]], false_veto_rate: float) -> dict:
    return {
        "ood": {n: {"auroc_judged": a, "judged_on": JUDGED_ON[o]} for n, (a, o) in auroc.items()},
        "false_vetoes_nominal": {"per_tick": false_veto_rate},
    }


def test_only_low_friction_is_judged_under_demand() -> None:
    """A sensor fault shows on every tick after onset; low friction only while the car brakes or accelerates."""
    assert {n for n in OOD_SCENARIOS if SCENARIOS[n].observable == "under_demand"} == {"low_friction"}
    assert all(SCENARIOS[n].observable == "always" for n in OOD_SCENARIOS if n != "low_friction")


def test_targets_name_each_failure() -> None:
    ok = _result({"stuck_sensor": (0.9996, "always"), "low_friction": (1.0, "under_demand")}, 0.0002)
    assert targets(ok)["failed"] == []
    bad = _result({"stuck_sensor": (0.98, "always"), "low_friction": (float("nan"), "under_demand")}, 0.002)
    failed = targets(bad)["failed"]
    assert len(failed) == 3
    assert failed[0].startswith("stuck_sensor: AUROC 0.9800 < 0.99 (every tick after onset)")
    assert failed[1].startswith("low_friction") and "with a demand" in failed[1]  # NaN (no such tick) fails
    assert "0.200% per tick > 0.1%" in failed[2]


def _scores(score: np.ndarray, onset: int, demand: np.ndarray) -> ScenarioScores:
    b, t = score.shape
    return ScenarioScores(
        name="made",
        ood=onset < t,
        t=np.arange(t) * 0.005,
        score=score,
        alarm=score > 1.0,
        immediate=np.zeros((b, t), bool),
        valid=np.ones((b, t), bool),
        onset_tick=np.full(b, onset),
        end_tick=np.full(b, t),
        demand=demand,
    )


def test_under_demand_judges_the_ticks_with_a_demand() -> None:
    """A fault that raises the score only while the car is asked to brake: perfectly separated on those
    ticks, not over every tick after onset."""
    rng = np.random.default_rng(0)
    nominal = _scores(rng.uniform(0.0, 0.9, (2, 400)), 400, np.zeros((2, 400), bool))
    demand = np.zeros((2, 400), bool)
    demand[:, 300:] = True
    score = rng.uniform(0.0, 0.9, (2, 400))
    score[:, 300:] += 2.0
    faulty = _scores(score, 100, demand)
    always = separation([nominal], faulty, "always")
    judged = separation([nominal], faulty, "under_demand")
    assert always["auroc_judged"] == always["auroc"] < 0.8
    assert judged["auroc_judged"] == judged["auroc_demand"] == 1.0
    assert judged["judged_on"] == JUDGED_ON["under_demand"]
