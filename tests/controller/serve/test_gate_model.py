"""A gate file records the model it was fitted on; the serving path refuses it in front of another
model (naming the refit command), and a gate file from before (the shipped ones) only warns."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import numpy as np
import pytest

from dualloop import ood
from dualloop.controller.cli import main
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.serve.config import ConfigError, ServerConfig
from dualloop.controller.serve.lifecycle import ServerThread
from dualloop.controller.training.driving_card import build_test_model
from dualloop.executor.gating import gate_feature_names
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Same card schema, other weights (seeds): same feature names, other versions."""
    folder = tmp_path_factory.mktemp("models")
    a, b = folder / "a.onnx", folder / "b.onnx"
    build_test_model(a, seed=1)
    build_test_model(b, seed=2)
    return a, b


def fitted_gate(model: DecisionModel, stamp: bool = True) -> ood.Gate:
    names = gate_feature_names(model, "decision_vector")
    rng = np.random.default_rng(5)
    x = rng.normal(size=(1200, len(names)))
    gate = ood.fit_gate(
        ood.FeatureRows(x[:800]),
        ood.FeatureRows(x[800:]),
        ood.FeatureSchema(tuple(names), "decision_vector"),
        "synthetic, seed 5",
        ood.GateFitSettings(alpha=0.01),
    )
    if not stamp:
        return gate
    card = model.card
    return dataclasses.replace(gate, model=ood.ModelRef(card.name, card.version, card.schema_hash()))


def test_the_model_survives_the_file_and_is_part_of_its_hash(two_models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = DecisionModel(two_models[0], warmup_batches=())
    gate = fitted_gate(model)
    unstamped = fitted_gate(model, stamp=False)
    path = tmp_path / "g.npz"
    digest = gate.save(path)
    assert digest != unstamped.version_hash  # the model is in the content hash: editing it is detected
    loaded = load_gate_for_model(path, model)
    assert loaded.model == gate.model and loaded.version_hash == digest


def test_a_gate_for_other_weights_refuses_to_serve(two_models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    a, b = (DecisionModel(p, warmup_batches=()) for p in two_models)
    assert a.card.schema_hash() == b.card.schema_hash() and a.card.version != b.card.version
    path = tmp_path / "a.gate.npz"
    fitted_gate(a).save(path)
    with pytest.raises(ood.GateFileError, match=rf"fitted on model dualloop-test {a.card.version}, this is"):
        load_gate_for_model(path, b)
    # into a file of the model's own, never over the one named (found by QA: a shipped gate overwritten)
    own = Path(two_models[1]).with_suffix(".gate.npz")
    refit = f"dualloop gate fit --model {two_models[1]} --source decision_vector --out {own}"
    with pytest.raises(ConfigError) as err, ServerThread(ServerConfig(model=two_models[1], port=0, gates=[path])):
        pass
    assert refit in str(err.value)
    assert load_gate_for_model(path, a).model == ood.ModelRef(a.card.name, a.card.version, a.card.schema_hash())


@pytest.mark.timeout(120)  # were it to start, it would serve until killed
def test_dualloop_serve_refuses_to_start(two_models, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "a.gate.npz"
    fitted_gate(DecisionModel(two_models[0], warmup_batches=())).save(path)
    argv = ["serve", "--model", str(two_models[1]), "--gate", str(path), "--port", "0"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    said = " ".join((captured.out + captured.err).split())
    assert "fitted on model dualloop-test" in said and "dualloop gate fit --model" in said


def test_a_gate_for_another_feature_schema_refuses(two_models, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model = DecisionModel(two_models[0], warmup_batches=())
    gate = fitted_gate(model)
    assert gate.model is not None
    other = dataclasses.replace(gate, model=dataclasses.replace(gate.model, schema_hash="0123456789abcdef"))
    path = tmp_path / "g.npz"
    other.save(path)
    with pytest.raises(ood.GateFileError, match=r"feature schema 0123456789abcdef, this model .* has schema .*; refit"):
        load_gate_for_model(path, model)


def test_gate_names_mismatch_says_how_to_refit(tmp_path: Path) -> None:
    base = DecisionModel(BASE_MODEL_PATH, warmup_batches=())
    path = tmp_path / "g.npz"
    gate = fitted_gate(base, stamp=False)
    narrow = ood.fit_gate(
        ood.FeatureRows(np.random.default_rng(1).normal(size=(400, 3))),
        ood.FeatureRows(np.random.default_rng(2).normal(size=(400, 3))),
        ood.FeatureSchema(("a", "b", "c"), gate.schema.source),
        "synthetic",
        ood.GateFitSettings(alpha=0.01),
    )
    narrow.save(path)
    with pytest.raises(ood.GateFileError, match=r"feature schema mismatch.*; refit it: dualloop gate fit --model"):
        load_gate_for_model(path, base)


def test_the_shipped_gates_record_the_shipped_model() -> None:
    base = DecisionModel(BASE_MODEL_PATH, warmup_batches=())
    for path in DEFAULT_GATES:
        gate = load_gate_for_model(path, base)
        assert gate.model is not None and gate.model.version == base.card.version, path


def test_a_gate_without_a_model_record_loads_with_a_warning(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Gate files written before they recorded their model: the shipped ones, stripped of it."""
    base = DecisionModel(BASE_MODEL_PATH, warmup_batches=())
    paths = []
    for i, shipped in enumerate(DEFAULT_GATES):
        path = tmp_path / f"old-{i}.gate.npz"
        dataclasses.replace(ood.load_gate(shipped), model=None).save(str(path))
        paths.append(path)
    with caplog.at_level(logging.WARNING, logger="dualloop.gates"):
        gates = [load_gate_for_model(p, base) for p in paths]
    assert all(g.model is None for g in gates)
    warned = [r.getMessage() for r in caplog.records if r.name == "dualloop.gates"]
    assert len(warned) == len(paths)
    assert all("does not record the model" in w and "dualloop gate fit --model" in w for w in warned)
