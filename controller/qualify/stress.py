"""Step (b) of `dualloop qualify`: the stress set, against the simulated expert's actions.

Each scenario is driven by the expert on fixed seeds and fed, tick by tick, through the model and
its gates exactly as `dualloop gate eval` does (`controller.gates.evaluation.score_episodes`): the
nominal scenarios, the OOD scenarios (sensor dropout, stuck sensor, noise burst, km/h, low friction,
speed out of range: from each fault's onset), and missing signals (nominal cruise seen by a
longitudinal-only sensor stack, sim.realism.LONGITUDINAL_FEATURES, the others NaN). On nominal and
on stressed ticks: top-1 accuracy against the expert, mean confidence (softmax at the card's
temperature, as the executor computes it), ECE (controller.training.calibration) and the
reliability curve; and the gate's detection per OOD scenario (AUROC where the fault is observable,
detected share, delay) and its nominal false vetoes. A model whose confidence stays high where its
accuracy falls shows as overconfidence (confidence minus accuracy) under stress.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from dualloop import ood
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.gates.evaluation import false_vetoes, score_episodes, separation
from dualloop.controller.gates.scores import ScenarioScores, fault_active
from dualloop.controller.qualify.checks import Check, no_worse, not_judged
from dualloop.controller.qualify.criteria import StressCriteria
from dualloop.controller.training.calibration import expected_calibration_error, nll, probabilities
from dualloop.executor.model_runner import DecisionModel
from dualloop.sim.env import ExpertData, run_expert_batch
from dualloop.sim.realism import LONGITUDINAL_FEATURES
from dualloop.sim.scenarios import NOMINAL_SCENARIOS, OOD_SCENARIOS, SCENARIOS

STEP: Final = "stress"
# Disjoint from the gate evaluation's (700_000-) and the training splits' seeds.
STRESS_SEED0: Final = 730_000
MISSING: Final = "missing_signals"  # nominal_cruise, longitudinal sensors only
BINS: Final = 10  # reliability diagram


@dataclass
class Calibration:
    """Top-1 accuracy and confidence on a set of ticks, and the reliability curve."""

    ticks: int
    accuracy: float
    confidence: float
    ece: float
    nll: float
    bin_accuracy: list[float | None]
    bin_confidence: list[float | None]
    bin_count: list[int]

    @classmethod
    def of(cls, logits: np.ndarray, labels: np.ndarray, temperature: float) -> Calibration:
        if len(labels) == 0:
            nan = float("nan")
            return cls(0, nan, nan, nan, nan, [None] * BINS, [None] * BINS, [0] * BINS)
        p = probabilities(logits, temperature)
        conf, correct = p.max(axis=1), (p.argmax(axis=1) == labels)
        bins = np.clip(np.ceil(conf * BINS).astype(np.int64) - 1, 0, BINS - 1)
        count = np.bincount(bins, minlength=BINS)
        acc_sum = np.bincount(bins, weights=correct.astype(np.float64), minlength=BINS)
        conf_sum = np.bincount(bins, weights=conf, minlength=BINS)
        with np.errstate(invalid="ignore", divide="ignore"):
            acc_b, conf_b = acc_sum / count, conf_sum / count
        return cls(
            int(len(labels)),
            float(correct.mean()),
            float(conf.mean()),
            expected_calibration_error(p, labels),
            nll(logits, labels, temperature),
            [float(v) if c else None for v, c in zip(acc_b, count)],
            [float(v) if c else None for v, c in zip(conf_b, count)],
            count.tolist(),
        )

    @property
    def overconfidence(self) -> float:
        return self.confidence - self.accuracy

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["overconfidence"] = self.overconfidence
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()}


@dataclass
class StressResult:
    """One model on the stress set."""

    model: str
    seeds: list[int]
    nominal: Calibration
    stressed: Calibration
    per_scenario: dict[str, Calibration]  # on the scenario's judged ticks (OOD: the fault active)
    gate: dict[str, dict[str, Any]]  # OOD scenario -> controller.gates.evaluation.separation
    false_vetoes: dict[str, float]
    missing_vetoed: float  # share of the missing-signals ticks the gates vetoed
    gates: int
    threshold: float  # of the gates' score: 1.0 when several are compared by score / threshold
    scores: dict[str, ScenarioScores] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "seeds": self.seeds,
            "gates": self.gates,
            "nominal": self.nominal.as_dict(),
            "stressed": self.stressed.as_dict(),
            "per_scenario": {k: v.as_dict() for k, v in self.per_scenario.items()},
            "gate_detection": self.gate,
            "false_vetoes_nominal": self.false_vetoes,
            "missing_signals_vetoed": self.missing_vetoed,
        }


def _judged(s: ScenarioScores) -> np.ndarray:
    """The ticks a scenario is judged on: every valid tick, or from the fault's onset while it lasts."""
    return fault_active(s) if s.ood else s.valid


def run_stress(
    model: DecisionModel,
    gates: Sequence[ood.Gate],
    seeds: Sequence[int],
    scenarios: Sequence[str] | None = None,
    expert: dict[str, ExpertData] | None = None,
    **params: Any,
) -> StressResult:
    """The model and its gates on the stress set (`scenarios`: a subset of the OOD ones; default all).
    params go to the scenarios (e.g. duration_s for a short run). expert: scenario name -> its
    episodes, filled on the first call and reused by the next model's (the same seeds and params:
    driving the expert is most of the cost)."""
    expert = {} if expert is None else expert
    names = list(OOD_SCENARIOS if scenarios is None else scenarios)
    unknown = [n for n in names if n not in OOD_SCENARIOS]
    if unknown:
        raise ValueError(f"unknown stress scenario(s) {unknown}; choose from {', '.join(OOD_SCENARIOS)}")
    present = np.isin(np.array(model.card.feature_names), LONGITUDINAL_FEATURES)
    scores: dict[str, ScenarioScores] = {}
    for name in (*NOMINAL_SCENARIOS, *names):
        if name not in expert:
            expert[name] = run_expert_batch(name, list(seeds), **params)[1]
        scores[name] = score_episodes(model, list(gates), name, seeds, expert=expert[name], **params)
    scores[MISSING] = score_episodes(
        model, list(gates), "nominal_cruise", seeds, present=present, expert=expert["nominal_cruise"], **params
    )
    late = [n for n in names if not fault_active(scores[n]).any()]
    if late:
        raise ConfigError(
            f"--stress-duration {params.get('duration_s')}: the episodes end before the fault's onset in {late} "
            "(faults start 5-10 s in); give at least 11 s"
        )
    t = model.card.temperature

    def calibration(keys: Sequence[str]) -> Calibration:
        logits = np.concatenate([scores[k].logits[_judged(scores[k])] for k in keys])
        labels = np.concatenate([scores[k].label[_judged(scores[k])] for k in keys])
        return Calibration.of(logits, labels, t)

    nominal = [scores[n] for n in NOMINAL_SCENARIOS]
    missing = scores[MISSING]
    return StressResult(
        model=f"{model.card.name} {model.card.version}",
        seeds=[int(s) for s in seeds],
        nominal=calibration(NOMINAL_SCENARIOS),
        stressed=calibration([*names, MISSING]),
        per_scenario={k: calibration([k]) for k in [*names, MISSING]},
        gate={n: _detection(nominal, scores[n], n, params.get("duration_s")) for n in names},
        false_vetoes=false_vetoes(nominal),
        missing_vetoed=float(missing.alarm[missing.valid].mean()) if missing.valid.any() else float("nan"),
        gates=len(gates),
        threshold=gates[0].threshold if len(gates) == 1 and gates[0].actuation is None else 1.0,
        scores=scores,
    )


def _detection(
    nominal: list[ScenarioScores], faulty: ScenarioScores, name: str, duration_s: float | None
) -> dict[str, Any]:
    """separation() of the scenario; with `not_judged` saying why when no tick is judged (low friction
    is judged only where the car is asked to brake or accelerate, which a short episode may not ask)."""
    r = separation(nominal, faulty, SCENARIOS[name].observable)
    if not r["judged_ticks"]:
        longer = f"episodes longer than {duration_s:g} s" if duration_s is not None else "more seeds"
        what = "with a braking or acceleration demand " if SCENARIOS[name].observable == "under_demand" else ""
        r["not_judged"] = f"no tick {what}after the fault's onset in {name}'s episodes; give {longer}"
    return r


def stress_checks(cand: StressResult, base: StressResult, c: StressCriteria) -> list[Check]:
    out = [
        no_worse(
            STEP, "nominal accuracy vs expert", cand.nominal.accuracy, base.nominal.accuracy, c.accuracy_drop, True
        ),
        no_worse(STEP, "nominal ECE", cand.nominal.ece, base.nominal.ece, c.ece_rise, False),
        no_worse(STEP, "stressed ECE", cand.stressed.ece, base.stressed.ece, c.ece_rise, False),
        no_worse(
            STEP,
            "stressed overconfidence (confidence - accuracy)",
            cand.stressed.overconfidence,
            base.stressed.overconfidence,
            c.overconfidence_rise,
            False,
        ),
        no_worse(
            STEP,
            "nominal false vetoes per tick",
            cand.false_vetoes["per_tick"],
            base.false_vetoes["per_tick"],
            c.false_veto_rise,
            False,
        ),
    ]
    for name, r in cand.gate.items():
        b = base.gate.get(name)
        why = r.get("not_judged") or (b or {}).get("not_judged")
        if why:  # the same episodes for both models: neither has a tick to judge on
            out.append(not_judged(STEP, f"gate AUROC on {name} ({r['judged_on']})", why))
            continue
        out.append(
            no_worse(
                STEP,
                f"gate AUROC on {name} ({r['judged_on']})",
                r["auroc_judged"],
                float("nan") if b is None else b["auroc_judged"],
                c.auroc_drop,
                True,
            )
        )
    return out
