"""Model cards for the highway schema of the built-in simulator (sim/schema.py), and the bundled test model.

The test model has fixed random weights from a seed (no training, no download) and a complete
card, so the executor, server and tests run before any model has been trained.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dualloop.executor.history import SPECS as HISTORY_SPECS
from dualloop.executor.model_card import ControlSpec, FeatureSpec, ModelCard, SafeAction
from dualloop.executor.onnx_export import export_mlp, random_mlp
from dualloop.models import TEST_MODEL_PATH
from dualloop.sim import schema

TEST_MODEL_SEED = 20261130

# Comfortable deceleration in lane: the minimal-risk choice when nothing valid is known.
SAFE_ACTION = SafeAction(action="brake", controls=[-2.0, 0.0])


def _rough_scale(name: str, unit: str) -> tuple[float, float]:
    """Order-of-magnitude normalisation for an untrained model (training fits the real one)."""
    if unit == "bool":
        return 0.5, 0.5
    if unit == "m":
        return (50.0, 50.0) if name != "lane_offset" else (0.0, 1.0)
    if name in ("ego_speed", "target_speed"):
        return 25.0, 8.0
    if unit == "m/s":
        return 0.0, 5.0
    return 0.0, 1.0


def driving_card(
    name: str,
    size_class: str,
    decision_vector_size: int,
    feature_stats: tuple[np.ndarray, np.ndarray] | None = None,
    plan_stats: tuple[np.ndarray, np.ndarray] | None = None,
    temperature: float = 1.0,
    training_metrics: dict[str, float | str] | None = None,
    mask_input: bool = False,
    plan_default_at_least: dict[str, str] | None = None,
    history: tuple[tuple[str, ...], np.ndarray, np.ndarray] | None = None,
) -> ModelCard:
    """The plan of a session that has none is schema.no_plan() with plan_default_at_least (default:
    schema.NO_PLAN_AT_LEAST), the plan recorded drives are trained with: every model the project builds
    reads "no plan" the same way, so replays of one log with two of them see the same inputs.
    history: (names, mean, std) of the history features (executor.history) the model takes after
    the wire features."""

    def specs(fields, stats):
        out = []
        for i, f in enumerate(fields):
            mean, std = (float(stats[0][i]), float(stats[1][i])) if stats is not None else _rough_scale(f.name, f.unit)
            out.append(FeatureSpec(name=f.name, unit=f.unit, mean=mean, std=max(std, 1e-6)))
        return out

    return ModelCard(
        name=name,
        size_class=size_class,
        features=specs(schema.FEATURES, feature_stats),
        plan=specs(schema.PLAN, plan_stats),
        plan_default=schema.no_plan().tolist(),
        plan_default_at_least=dict(schema.NO_PLAN_AT_LEAST) if plan_default_at_least is None else plan_default_at_least,
        actions=list(schema.ACTIONS),
        controls=[ControlSpec(name=c.name, unit=c.unit, min=c.low, max=c.high) for c in schema.CONTROLS],
        safe_action=SAFE_ACTION,
        decision_vector_size=decision_vector_size,
        temperature=temperature,
        training_metrics=training_metrics or {},
        mask_input=mask_input,
        history_features=[
            FeatureSpec(name=n, unit=HISTORY_SPECS[n].unit, mean=float(m), std=max(float(sd), 1e-6))
            for n, m, sd in zip(*history)
        ]
        if history is not None
        else [],
    )


def build_test_model(
    path: Path = TEST_MODEL_PATH,
    seed: int = TEST_MODEL_SEED,
    history: tuple[str, ...] = (),
    plan_default_at_least: dict[str, str] | None = None,
) -> ModelCard:
    """history: names of history features to take (then also mask inputs), for tests of them;
    plan_default_at_least: as the card's (None: none, a fixed default plan, as the shipped test model's)."""
    hidden = (64, 64)
    n = len(history)
    card = driving_card(
        "dualloop-test",
        "test",
        decision_vector_size=hidden[-1],
        training_metrics={"note": "fixed random weights, untrained"},
        mask_input=bool(history),
        history=(history, np.zeros(n), np.ones(n)) if history else None,
        plan_default_at_least=plan_default_at_least or {},
    )
    weights = random_mlp(card.input_width + schema.N_PLAN, hidden, schema.N_ACTIONS, len(schema.CONTROLS), seed)
    return export_mlp(weights, card, path)
