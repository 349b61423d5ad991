"""Gate files as the serving path loads them: checked against the model they will watch."""

from __future__ import annotations

import logging
from pathlib import Path

from dualloop import ood
from dualloop.executor.gating import gate_feature_names
from dualloop.executor.model_runner import DecisionModel

log = logging.getLogger("dualloop.gates")


def _refit(path: Path, gate: ood.Gate, model: DecisionModel) -> str:
    """The command that fits this model its own gate, into a file named after the model (as the
    shipped base.gate.npz, base.inputs.gate.npz): never over the file named, which may serve another."""
    source = gate.schema.source
    out = Path(model.path).with_suffix(".inputs.gate.npz" if source == "input_features" else ".gate.npz")
    return f"refit it: dualloop gate fit --model {model.path} --source {source} --out {out}"


def check_gate_model(path: Path, gate: ood.Gate, model: DecisionModel) -> None:
    """Refuse a gate fitted on another model (version or feature schema); a gate file from before
    gates recorded their model (the shipped ones were fitted on models/base.onnx) only warns: its
    feature names are still checked, and refusing it would break every existing deployment."""
    card = model.card
    refit = _refit(path, gate, model)
    if gate.model is None:
        log.warning("gate file %s does not record the model it was fitted on (older file); %s", path, refit)
        return
    fitted = gate.model
    if fitted.schema_hash != card.schema_hash():
        raise ood.GateFileError(
            f"gate file {path}: fitted on model {fitted.name} {fitted.version} with feature schema "
            f"{fitted.schema_hash}, this model {card.name} {card.version} has schema {card.schema_hash()}; {refit}"
        )
    if fitted.version != card.version:
        raise ood.GateFileError(
            f"gate file {path}: fitted on model {fitted.name} {fitted.version}, this is {card.name} "
            f"{card.version} (same feature schema, other weights: its decision vectors differ); {refit}"
        )


def load_gate_for_model(path: Path, model: DecisionModel) -> ood.Gate:
    """Load a gate file and check it against the model (the executor checks the names again)."""
    gate = ood.load_gate(path)
    check_gate_model(path, gate, model)
    try:
        ood.load_gate(path, expected_feature_names=gate_feature_names(model, gate.schema.source))
    except ood.GateFileError as err:
        raise ood.GateFileError(f"{err}; {_refit(path, gate, model)}") from None
    return gate
