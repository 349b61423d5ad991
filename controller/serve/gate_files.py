"""Gate files as the serving path loads them: checked against the model they will watch."""

from __future__ import annotations

from pathlib import Path

from dualloop import ood
from dualloop.executor.gating import gate_feature_names
from dualloop.executor.model_runner import DecisionModel


def load_gate_for_model(path: Path, model: DecisionModel) -> ood.Gate:
    """Load a gate file and check it against the model (the executor checks the names again)."""
    gate = ood.load_gate(path)
    ood.load_gate(path, expected_feature_names=gate_feature_names(model, gate.schema.source))
    return gate
