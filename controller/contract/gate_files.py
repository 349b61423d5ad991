"""Gate files as the serving path loads them: checked against the model they will watch."""

from __future__ import annotations

import logging
import zipfile
from functools import lru_cache
from pathlib import Path

from dualloop import ood
from dualloop.executor.gating import gate_feature_names
from dualloop.executor.model_card import unreadable
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH

log = logging.getLogger("dualloop.gates")


NO_REFIT = "gates fit only models on the simulator schema (docs/operations.md): serve this model without gates"


@lru_cache(maxsize=1)
def _simulator_schema() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(feature names, plan names) of the simulator's schema, read from the shipped model's card (trained
    on the simulator): the serving path may not import dualloop.sim (pyproject's import contracts)."""
    card = DecisionModel(BASE_MODEL_PATH, warmup_batches=()).card
    return tuple(card.feature_names), tuple(p.name for p in card.plan)


def on_simulator_schema(model: DecisionModel) -> bool:
    """Whether `dualloop gate fit` can fit this model a gate: it drives the simulator, whose observations
    a model with other features (or another plan) cannot read."""
    card = model.card
    return (tuple(card.feature_names), tuple(p.name for p in card.plan)) == _simulator_schema()


def _refit(path: Path, gate: ood.Gate, model: DecisionModel) -> str:
    """The command that fits this model its own gate, into a file named after the model (as the
    shipped base.gate.npz, base.inputs.gate.npz): never over the file named, which may serve another.
    A model off the simulator schema gets none: the fit would fail after a minute of driving."""
    if not on_simulator_schema(model):
        return NO_REFIT
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


def read_gate(path: Path) -> ood.Gate:
    """ood.load_gate, with a missing file, a folder or a file that is no .npz archive said as the other
    refusals are ("gate file PATH: ..."): numpy said a raw [Errno 2], or "pickled (object) data" of
    random bytes (ood.gatefile reads it with allow_pickle=False)."""
    path = Path(path)
    if not path.exists():
        raise ood.GateFileError(f"gate file {path}: no such file; give a gate written by dualloop gate fit")
    if path.is_dir():
        raise ood.GateFileError(f"gate file {path}: is a folder, not a gate file; give the .npz file in it")
    try:  # opened first: zipfile.is_zipfile says False, "not an .npz archive", for a file it cannot open
        with open(path, "rb") as stream:
            zip_start = stream.read(4) == b"PK\x03\x04"
        archive = zipfile.is_zipfile(path)
    except PermissionError as err:  # a server in a container runs as another user than the file's owner
        raise ood.GateFileError(f"gate file {path}: {unreadable(path, err)}") from None
    except OSError as err:
        raise ood.GateFileError(f"gate file {path}: unreadable ({err.strerror})") from None
    if not archive and zip_start:  # an .npz whose end is missing: a copy cut short, a full disk
        raise ood.GateFileError(
            f"gate file {path}: unreadable, a damaged or cut .npz archive (its end is missing); copy it again "
            f"or write it again with dualloop gate fit"
        )
    if not archive:
        raise ood.GateFileError(
            f"gate file {path}: not a gate file (not an .npz archive); give a gate written by dualloop gate fit"
        )
    return ood.load_gate(path)


def load_gate_for_model(path: Path, model: DecisionModel) -> ood.Gate:
    """Load a gate file and check it against the model (the executor checks the names again)."""
    gate = read_gate(path)
    check_gate_model(path, gate, model)
    try:
        ood.check_feature_names(path, gate, gate_feature_names(model, gate.schema.source))
    except ood.GateFileError as err:
        raise ood.GateFileError(f"{err}; {_refit(path, gate, model)}") from None
    return gate
