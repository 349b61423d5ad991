"""Fit an OOD gate for a model from simulated nominal driving (the basis of `dualloop gate fit`).

The gate library (ood/) knows only feature matrices; this module produces them: expert-driven
nominal episodes from the simulator, run through the model's forward pass exactly as the executor
does (same normalisation), giving either the decision vectors or the raw input features.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

import ood
from executor.core import GATE_SOURCES, gate_feature_names
from executor.model_card import Normalisation
from executor.model_runner import DecisionModel
from sim.env import ActionNoise, run_expert_batch
from sim.scenarios import NOMINAL_SCENARIOS
from sim.sensors import TRAINING_SEES_LANE_ENDS

FIT_SEEDS = range(100_000, 100_012)  # disjoint from training, validation and demo seeds
CALIBRATION_SEEDS = range(110_000, 110_012)


def forward_rows(model: DecisionModel, features: np.ndarray, plan: np.ndarray, batch: int = 4096):
    """The model's outputs for many rows, normalised with the card as the executor does (NaN rows
    are zeroed for the forward pass, as the executor substitutes them)."""
    norm = Normalisation.of(model.card)
    parts = []
    for a in range(0, len(features), batch):
        x, p, _ = norm.apply(np.asarray(features[a:a + batch], np.float32), np.asarray(plan[a:a + batch], np.float32))
        parts.append(model.forward(x, p))
    return (np.concatenate([o.logits for o in parts]), np.concatenate([o.controls for o in parts]),
            np.concatenate([o.decision_vector for o in parts]))


def model_features(model: DecisionModel, features: np.ndarray, plan: np.ndarray, source: str,
                   batch: int = 4096) -> np.ndarray:
    """What the executor's gate sees for these inputs: decision vectors or raw features."""
    if source == "input_features":
        return features.astype(np.float32)
    return forward_rows(model, features, plan, batch)[2]


def nominal_inputs(seeds: Sequence[int], every: int = 4, scenarios: Sequence[str] = NOMINAL_SCENARIOS,
                   noise: ActionNoise | None = ActionNoise(), **params) -> tuple[np.ndarray, np.ndarray]:
    """(features, plan) rows from expert-driven nominal episodes, valid rows only.

    With the same executed-action noise as the training data by default: the states a learned
    driver visits are a little off the expert's path, and a gate fitted on the clean path vetoed the
    model's own hard braking behind a braking lead."""
    feats, plans = [], []
    for name in scenarios:
        _, data = run_expert_batch(name, list(seeds), every=every, noise=noise,
                                   see_lane_ends=TRAINING_SEES_LANE_ENDS, **params)
        feats.append(data.features[data.valid])
        plans.append(data.plan[data.valid])
    return np.concatenate(feats), np.concatenate(plans)


def _both(seeds: Sequence[int], every: int, params: dict) -> tuple[np.ndarray, np.ndarray]:
    clean = nominal_inputs(seeds, every, noise=None, **params)
    noisy = nominal_inputs(seeds, every, **params)
    return np.concatenate([clean[0], noisy[0]]), np.concatenate([clean[1], noisy[1]])


def fit_gate_for_model(model: DecisionModel, source: str = "decision_vector", variant: str = "single",
                       alpha: float = 1e-3, norm_alpha: float = 1e-4, fit_seeds: Sequence[int] = FIT_SEEDS,
                       calibration_seeds: Sequence[int] = CALIBRATION_SEEDS, every: int = 4,
                       filter_settings: dict | None = None, **scenario_params) -> ood.Gate:
    if source not in GATE_SOURCES:
        raise ValueError(f"source must be one of {GATE_SOURCES}, got {source!r}")
    # Nominal driving both ways: the expert's own clean path, and the noise-injected roll-outs the
    # model was trained on (a learned driver visits both). Fitted on noisy roll-outs only, the gate
    # vetoed the clean expert's merge from an ending on-ramp (0.35% false vetoes per tick).
    x_fit, p_fit = _both(fit_seeds, every, scenario_params)
    x_cal, p_cal = _both(calibration_seeds, every, scenario_params)
    card = model.card
    return ood.fit_gate(
        model_features(model, x_fit, p_fit, source), model_features(model, x_cal, p_cal, source),
        variant=variant, alpha=alpha, norm_alpha=norm_alpha,
        feature_names=gate_feature_names(model, source), source=source,
        data_description=(f"simulated nominal driving ({', '.join(NOMINAL_SCENARIOS)}), expert driver, fit seeds "
                          f"{fit_seeds.start}-{fit_seeds.stop - 1}, calibration seeds "
                          f"{calibration_seeds.start}-{calibration_seeds.stop - 1}, every {every} ticks; "
                          f"model {card.name} {card.version}") if isinstance(fit_seeds, range) else "simulated nominal",
        filter=filter_settings,
    )


def load_gate_for_model(path: Path, model: DecisionModel) -> ood.Gate:
    """Load a gate file and check it against the model (the executor checks the names again)."""
    gate = ood.load_gate(path)
    ood.load_gate(path, expected_feature_names=gate_feature_names(model, gate.schema.source))
    return gate
