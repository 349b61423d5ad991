"""Whether a freshly trained model may be written: its calibration against its own uncalibrated
logits and against the current default model, on the same test split.

Temperature scaling is fitted on the validation split; on the test split it can still make things
worse (a validation split unlike the test one, too few rows). A calibrated ECE or NLL worse than
the uncalibrated one, or than the shipped default model's on the very same rows, beyond a tolerance,
is a model `dualloop train` refuses to write unless --force is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualloop.controller.training.calibration import expected_calibration_error, nll, probabilities
from dualloop.controller.training.data import Normaliser, Split
from dualloop.executor.model_runner import DecisionModel


@dataclass(frozen=True)
class CalibrationGuard:
    reference: Path | None  # the current default model (None: compare with the uncalibrated logits only)
    ece_tolerance: float = 0.01
    nll_tolerance: float = 0.02
    force: bool = False


class CalibrationRefused(RuntimeError):
    """The trained model is worse calibrated than allowed; the message lists why and names --force."""


def reference_metrics(path: Path, split: Split) -> dict[str, float] | str:
    """The reference model's calibrated ECE and NLL on `split`, or why it cannot be compared."""
    model = DecisionModel(path, warmup_batches=())
    card = model.card
    if int(split.label.max(initial=0)) >= len(card.actions):
        return f"{path} has {len(card.actions)} actions, fewer than the labels of this training"
    norm = Normaliser.from_card(card)
    history = None
    if norm.history:
        if split.history.shape[1] != len(norm.history):
            return f"{path} takes history features {list(norm.history)}; this training's rows do not have them"
        history = split.history
    f, p = norm.apply(split.features, split.plan, split.present, history)
    present = norm.full_present(split.present, len(f)) if norm.history else split.present
    logits = model.forward(f, p, present).logits.astype(np.float64)
    return {
        "ece": expected_calibration_error(probabilities(logits, card.temperature), split.label),
        "nll": nll(logits, split.label, card.temperature),
    }


def calibration_problems(
    metrics: dict[str, float | str], reference: dict[str, float] | str | None, guard: CalibrationGuard
) -> list[str]:
    """What is worse than allowed (empty: the model may be written). metrics: the trainer's test_*."""
    after = {"ECE": float(metrics["test_ece_after"]), "NLL": float(metrics["test_nll_after"])}
    against = [("uncalibrated", {"ECE": float(metrics["test_ece_before"]), "NLL": float(metrics["test_nll_before"])})]
    if isinstance(reference, dict):
        against.append(("the default model's", {"ECE": reference["ece"], "NLL": reference["nll"]}))
    tolerance = {"ECE": guard.ece_tolerance, "NLL": guard.nll_tolerance}
    return [
        f"calibrated test {m} {after[m]:.4f} > {who} {values[m]:.4f} + {tolerance[m]}"
        for who, values in against
        for m in ("ECE", "NLL")
        if after[m] > values[m] + tolerance[m]
    ]
